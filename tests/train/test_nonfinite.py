"""`train.nonfinite`: a NaN/inf loss or gradient stops the run naming the step (stop), or drops
the minibatch (skip) -- on every learner of a lock-step exchange together -- and too many skips in
a row stop the run with the reason."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F

from asrdist.config import config_from_tree
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.sync import SyncStrategy
from tests.support.dist_utils import learner_context, run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

STEPS = 5


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _batches(rank: int = 0) -> list[tuple[torch.Tensor, torch.Tensor]]:
    gen = torch.Generator().manual_seed(rank)
    return [(torch.randn(6, 4, generator=gen), torch.randint(0, 3, (6,), generator=gen)) for _ in range(STEPS)]


def _loss_bad_at(steps: set[int], value: float = math.nan):
    calls = {"n": 0}

    def loss_fn(model, batch):
        out = model(batch.inputs)
        loss = F.cross_entropy(out, batch.targets)
        if calls["n"] in steps:
            loss = loss * value
        calls["n"] += 1
        return loss, batch.num_frames
    return loss_fn


def _trainer(strategy: Strategy, loss_fn, nonfinite: str, ctx: LearnerContext | None = None, max_skips: int = 10):
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy.setup(model, opt, ctx or LearnerContext())
    trainer = make_trainer(model, opt, strategy, loss_fn=loss_fn, nonfinite=nonfinite, max_skips_in_a_row=max_skips)
    return trainer, model


def test_config_names_the_policy_and_its_bounds():
    assert config_from_tree({"train": {"nonfinite": "skip"}}).train.nonfinite == "skip"
    with pytest.raises(ConfigError, match="train.nonfinite"):
        config_from_tree({"train": {"nonfinite": "ignore"}})
    with pytest.raises(ConfigError, match="train.max_skips_in_a_row"):
        config_from_tree({"train": {"max_skips_in_a_row": 0}})


def test_stop_names_the_step():
    trainer, _ = _trainer(Strategy(), _loss_bad_at({2}), "stop")
    with pytest.raises(TrainingError, match=r"loss is nan at step 2 .*train.nonfinite=skip"):
        train_steps(trainer, _batches())


def test_skip_drops_exactly_the_bad_minibatch():
    reference, ref_model = _trainer(Strategy(), _loss_bad_at(set()), "skip")
    batches = _batches()
    train_steps(reference, batches[:2] + batches[3:])  # the run without minibatch 2
    trainer, model = _trainer(Strategy(), _loss_bad_at({2}, math.inf), "skip")
    train_steps(trainer, batches)
    assert trainer.stepper.skipped == 1
    for a, b in zip(model.parameters(), ref_model.parameters()):
        assert torch.equal(a, b)


def test_too_many_skips_in_a_row_stop_the_run():
    trainer, _ = _trainer(Strategy(), _loss_bad_at({1, 2, 3}), "skip", max_skips=3)
    with pytest.raises(TrainingError, match="3 minibatches in a row .* gives up"):
        train_steps(trainer, _batches())
    trainer, _ = _trainer(Strategy(), _loss_bad_at({1, 3}), "skip", max_skips=2)
    train_steps(trainer, _batches())  # not in a row
    assert trainer.stepper.skipped == 2


def _two_learners(rank: int, world_size: int) -> dict:
    out = {}
    for name, strategy in (("sync", SyncStrategy()), ("onebit", OneBitStrategy(OneBitConfig()))):
        bad = {2} if rank == 1 else set()  # only learner 1 sees a NaN loss at step 2
        trainer, model = _trainer(strategy, _loss_bad_at(bad), "skip", ctx=learner_context())
        train_steps(trainer, _batches(rank))
        residuals = getattr(strategy, "_residuals", None) or []
        out[name] = {"params": [p.detach().clone() for p in model.parameters()], "skipped": trainer.stepper.skipped,
                     "finite": all(bool(torch.isfinite(r.materialize()).all()) for r in residuals)}
    return out


@pytest.mark.slow
def test_a_nan_on_one_learner_is_dropped_by_every_learner_of_the_step(tmp_path):
    results = run_distributed(_two_learners, 2, tmp_path)
    for name in ("sync", "onebit"):
        assert [r[name]["skipped"] for r in results] == [1, 1], name
        assert all(r[name]["finite"] for r in results), name
        for a, b in zip(results[0][name]["params"], results[1][name]["params"]):
            assert torch.equal(a, b) and bool(torch.isfinite(a).all()), name


@pytest.mark.parametrize("poison, finite", [(None, True), (math.nan, False), (math.inf, False), (-math.inf, False),
                                            (3.0e38, True)])
def test_gradient_check_is_exact(poison, finite):
    """The trainer's gradient check: a finite norm of all gradients on the fast path; a non-finite
    or overflowing one (3e38 squared in float32) is looked at element by element."""
    from asrdist.train.step import gradients_finite

    model = _model()
    for p in model.parameters():
        p.grad = torch.randn_like(p)
    if poison is not None:
        model[0].weight.grad[1, 2] = poison
        model[0].weight.grad[3, 1] = poison if math.isnan(poison) else abs(poison)
    assert gradients_finite(list(model.parameters())) is finite
