"""`train.validate_every`: validations within epochs. k minibatches give the expected points (and
the epoch ends theirs), validating leaves the trained model as it is (a validation that draws
random numbers and leaves the model in eval mode, against training that draws them too), a
resume keeps what was validated before its checkpoint, and learners of a job's epochs (not lock
step, one 3x slower) validate at the same points of the job."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch

from asrdist.data.job_sampler import JobEpochSampler
from asrdist.errors import ConfigError
from asrdist.parallel.base import Strategy
from asrdist.parallel.sync import SyncStrategy
from asrdist.train.loop import LoopConfig, StragglerConfig
from asrdist.train.trainer import Trainer, TrainerHooks
from tests.support.dist_utils import learner_context, run_distributed
from tests.support.engine_fixture import ListOrder, linear_model, linear_trainer, mse_loss


def dropout_loss(model, batch):
    """mse with dropout on the inputs: training draws from torch's generator every step."""
    return torch.nn.functional.mse_loss(model(torch.nn.functional.dropout(batch.inputs, 0.5)), batch.targets), \
        batch.num_frames


def greedy_validation(model):
    """A validation that draws random numbers and leaves the model in eval mode."""
    model.eval()
    with torch.no_grad():
        noise = torch.rand(1).item()
        loss = float(model(torch.ones(2, 4)).pow(2).mean())
    return {"valid_loss": loss + 0 * noise, "per": 0.5}


def test_every_k_minibatches_gives_the_expected_validations(tmp_path):
    calls = []
    tr = linear_trainer(tmp_path, Strategy(), ListOrder(10), validate=lambda m: calls.append(1) or {"valid_loss": 1.0},
                        epochs=2, validate_every=3)
    state = tr.fit()
    # 3, 6, 9 of each epoch's 10 minibatches, then its end
    assert [v["epoch_progress"] for v in state.validations] == [0.3, 0.6, 0.9, 1.0, 1.3, 1.6, 1.9, 2.0]
    assert [v["step"] for v in state.validations] == [3, 6, 9, 10, 13, 16, 19, 20]
    assert len(calls) == 8 and all(v["valid_loss"] == 1.0 for v in state.validations)
    walls = [v["wall_seconds"] for v in state.validations]
    assert walls == sorted(walls) and all(v["validation_seconds"] >= 0 for v in state.validations)
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "validation"] == [3, 6, 9, 13, 16, 19]
    assert [h["epoch"] for h in state.history] == [1, 2]  # the epochs' records as before (numbered from 1)


def test_off_by_default_and_a_multiple_of_the_epoch_validates_at_its_end_only(tmp_path):
    tr = linear_trainer(tmp_path / "a", Strategy(), ListOrder(6), validate=lambda m: {"valid_loss": 1.0}, epochs=2)
    assert tr.fit().validations == []
    tr = linear_trainer(tmp_path / "b", Strategy(), ListOrder(6), validate=lambda m: {"valid_loss": 1.0}, epochs=1,
                        validate_every=6)
    assert [v["epoch_progress"] for v in tr.fit().validations] == [1.0]


def test_validate_every_is_checked():
    with pytest.raises(ConfigError, match="validate_every >= 0"):
        LoopConfig(epochs=1, validate_every=-1)
    from asrdist.config import TrainConfig
    with pytest.raises(ConfigError, match="train.validate_every"):
        TrainConfig(validate_every=-2)
    with pytest.raises(ConfigError, match="train.validate_every"):
        TrainConfig(validate_every=1.5)


def _sync_weights(tmp_path: Path, every: int) -> torch.Tensor:
    strategy = SyncStrategy()
    tr = linear_trainer(tmp_path, strategy, ListOrder(12), validate=greedy_validation, loss=dropout_loss,
                        epochs=2, validate_every=every)
    torch.manual_seed(7)  # the same generator state before training, with validations or without
    state = tr.fit()
    assert len(state.validations) == (0 if every == 0 else 2 * (12 // every - (12 % every == 0)) + 2)
    return torch.cat([p.detach().flatten() for p in tr.model.parameters()])


def test_validating_within_epochs_does_not_change_the_trained_model(tmp_path):
    # the reference: sync on one learner without validations within epochs
    reference = _sync_weights(tmp_path / "off", 0)
    assert torch.equal(_sync_weights(tmp_path / "k5", 5), reference)
    assert torch.equal(_sync_weights(tmp_path / "k2", 2), reference)


def test_a_resume_keeps_the_validations_before_its_checkpoint(tmp_path):
    def trainer(**kw):
        return linear_trainer(tmp_path, Strategy(), ListOrder(10), validate=lambda m: {"valid_loss": 1.0},
                              epochs=2, validate_every=3, checkpoint_every=4, **kw)

    trainer(max_steps=14).fit()  # stops at step 14: its checkpoints at 4, 8, 10 (epoch end), 12 and 14
    state = trainer().fit(resume=True)
    assert [v["step"] for v in state.validations] == [3, 6, 9, 10, 13, 16, 19, 20]
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records if r["kind"] == "validation"] == [3, 6, 9, 13, 16, 19]


class Independent(Strategy):
    """Not lock-step and no communication at all: learners move at their own pace."""

    lockstep = False


def _job_learner(rank: int, world_size: int, run_dir: str) -> dict:
    ctx = learner_context()
    strategy = Independent()
    model, opt = linear_model(strategy, ctx)
    sampler = JobEpochSampler(ListOrder(40), ctx.store, world_size)
    hooks = TrainerHooks(loss_fn=mse_loss, lr_at=lambda s, e: 0.01, validate_fn=lambda m: {"valid_loss": 1.0})
    tr = Trainer(model, opt, strategy, sampler, hooks, ctx, Path(run_dir),
                 LoopConfig(epochs=2, progress=False, emulate_compute_ms=20.0, validate_every=4,
                            straggler=StragglerConfig(ranks=[1], slowdown=3.0)))
    state = tr.fit()
    return {"points": [v["epoch_progress"] for v in state.validations],
            "per_epoch": [h["minibatches"] for h in state.history]}


@pytest.mark.slow
def test_learners_of_a_jobs_epochs_validate_at_the_same_points_of_the_job(tmp_path):
    # 40 minibatches a job epoch, 2 learners: a global minibatch is 2 of them, so every 4 global
    # minibatches is every 8 of the order: 8, 16, 24, 32 (40 is the epoch's end)
    fast, slow = run_distributed(_job_learner, 2, tmp_path, str(tmp_path / "run"))
    expected = [0.2, 0.4, 0.6, 0.8, 1.0, 1.2, 1.4, 1.6, 1.8, 2.0]
    assert fast["points"] == slow["points"] == expected
    assert fast["per_epoch"][0] > slow["per_epoch"][0]  # no barrier but the validations: the fast one takes more
