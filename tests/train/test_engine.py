"""The engine under the strategies: the hook contract, job-wide epochs, barrier-free checkpoints.

A recording fake strategy pins the order of the trainer's calls, `paused()` around every read and
write of the learner's state, and `close()` on success and failure. A fake strategy that is not
lock-step trains two real gloo learners, one 3x slower, on epochs that belong to the job: the fast
learner takes about three times as many minibatches, with no barrier inside the epoch.
"""
from __future__ import annotations

import json
from contextlib import contextmanager
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from asrdist.data.job_sampler import JobEpochSampler
from asrdist.errors import TrainingError
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.train import checkpoint as ckpt
from asrdist.train.loop import LoopConfig, StragglerConfig
from asrdist.train.trainer import Trainer, TrainerHooks
from tests.support.dist_utils import learner_context, run_distributed
from tests.support.engine_fixture import ListOrder, linear_model, linear_trainer, mse_loss


class Recorder(Strategy):
    """Records every call; `paused_now` tells whether the trainer is inside `paused()`."""

    def __init__(self, lockstep: bool = True):
        super().__init__()
        self.lockstep = lockstep
        self.calls: list[str] = []
        self.paused_now = False

    def _rec(self, name):
        self.calls.append(name + ("@paused" if self.paused_now else ""))

    def note_samples(self, n): self._rec("note_samples")
    def note_loss(self, loss): self._rec("note_loss")
    def after_backward(self): self._rec("after_backward")
    def after_step(self): self._rec("after_step")
    def should_stop(self): self._rec("should_stop"); return False
    def finalize(self): self._rec("finalize")

    def apply_update(self, step_fn):
        self._rec("apply_update")
        step_fn()

    @contextmanager
    def paused(self):
        assert not self.paused_now, "paused() entered twice"
        self.paused_now = True
        try:
            yield
        finally:
            self.paused_now = False

    def close(self, error=None):
        self._rec(f"close({type(error).__name__ if error else None})")

    def state_dict(self):
        self._rec("state_dict")
        return super().state_dict()

    def load_state_dict(self, state):
        self._rec("load_state_dict")
        super().load_state_dict(state)


def test_hooks_run_in_the_trainers_order_and_state_is_touched_only_while_paused(tmp_path):
    rec = Recorder()
    validated = []

    def validate(model):
        validated.append(rec.paused_now)
        return {"valid_metric": 1.0}

    tr = linear_trainer(tmp_path, rec, ListOrder(3), validate=validate, epochs=2, checkpoint_every=2)
    tr.fit()
    step = ["note_samples", "after_backward", "note_loss", "apply_update", "after_step", "should_stop"]
    calls = rec.calls
    assert calls[:6] == step
    assert calls.count("apply_update") == 6
    assert all(c.endswith("@paused") for c in calls if c.startswith(("state_dict", "load_state_dict")))
    assert calls.count("state_dict@paused") == 4  # checkpoints at steps 2 and 4, and at both epoch ends (3, 6)
    assert validated == [True, True]
    assert calls[-2:] == ["close(None)", "finalize"]
    snap = tr.snapshot()
    tr.restore_snapshot(snap)
    assert rec.calls[-2:] == ["state_dict@paused", "load_state_dict@paused"]


def test_close_gets_the_error_and_finalize_is_skipped_when_training_fails(tmp_path):
    rec = Recorder()

    def nan_loss(model, batch):
        loss, n = mse_loss(model, batch)
        return loss * float("nan"), n

    tr = linear_trainer(tmp_path, rec, ListOrder(3), loss=nan_loss, epochs=1)
    with pytest.raises(TrainingError, match="loss is nan"):
        tr.fit()
    assert rec.calls[-1] == "close(TrainingError)" and "finalize" not in rec.calls


def test_a_non_finite_validation_loss_stops_the_run_naming_the_epoch(tmp_path):
    # each minibatch's loss finite, the validated model's not: the weights ran off (averaging at a
    # large lr did this with a train loss of 2e22); the run must not end as if it had trained
    losses = iter([0.5, float("nan")])

    def validate(model):
        return {"valid_loss": next(losses)}

    tr = linear_trainer(tmp_path, Strategy(), ListOrder(3), validate=validate, epochs=3)
    with pytest.raises(TrainingError, match=r"rank 0: the model diverged in epoch 2: its validation loss is not "
                                            r"finite \(train loss [0-9.e+-]+\); lower optim.lr"):
        tr.fit()
    assert [h["epoch"] for h in tr.state.history] == [1]  # epoch 1 kept; the diverged one never recorded
    records = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["valid_loss"] for r in records if r["kind"] == "epoch"] == [0.5]


def test_metrics_jsonl_writes_non_finite_figures_as_null(tmp_path):
    from asrdist.train.metrics import MetricsLog

    log = MetricsLog(tmp_path)
    log.log("epoch", 3, train_loss=float("inf"), valid_loss=float("nan"), by={"a": float("-inf"), "b": 1.5})
    log.close()
    line = (tmp_path / "metrics.jsonl").read_text()
    record = json.loads(line, parse_constant=lambda name: pytest.fail(f"bare {name} in metrics.jsonl"))
    assert record["train_loss"] is None and record["valid_loss"] is None and record["by"] == {"a": None, "b": 1.5}


def test_learners_out_of_lock_step_stop_on_the_leaders_verdict_from_the_job_store(tmp_path):
    # adpsgd's learners go on while the leader validates: it leaves its verdict in the job store,
    # and each of them stops at its next epoch end, before that epoch end's exchanges
    store = dist.HashStore()

    def learner(rank):
        strategy = Independent()
        model, opt = linear_model(strategy, LearnerContext(store=store, job_rank=rank, job_world_size=2))
        return Trainer(model, opt, strategy, ListOrder(3), TrainerHooks(loss_fn=mse_loss), strategy.ctx,
                       tmp_path / str(rank), LoopConfig(epochs=2, progress=False))

    leader, other = learner(0), learner(1)
    other.validator.stop_if_told_diverged()  # no verdict yet: goes on
    with pytest.raises(TrainingError) as said:
        leader.validator.stop_if_diverged({"train_loss": 0.5, "valid_loss": float("inf")}, epoch=0)
    assert str(said.value) == ("rank 0: the model diverged in epoch 1: its validation loss is not finite "
                               "(train loss 0.5); lower optim.lr or check the data")
    other.validator.stop_if_diverged({"train_loss": 0.7}, epoch=0)  # not the leader: nothing validated, nothing to say
    with pytest.raises(TrainingError) as said_too:
        other.validator.stop_if_told_diverged()
    assert str(said_too.value) == str(said.value).replace("rank 0", "rank 1", 1)


def _diverging_learner(rank: int, world_size: int, run_dir: str) -> str:
    from asrdist.parallel.sync import SyncStrategy

    ctx = learner_context()
    strategy = SyncStrategy()
    model, opt = linear_model(strategy, ctx)
    hooks = TrainerHooks(loss_fn=mse_loss, validate_fn=lambda m: {"valid_loss": float("nan")}, lr_at=lambda s, e: 0.01)
    tr = Trainer(model, opt, strategy, ListOrder(4), hooks, ctx, Path(run_dir) / f"r{rank}",
                 LoopConfig(epochs=2, progress=False))
    try:
        tr.fit()
    except TrainingError as e:
        return str(e)
    return "trained on"


@pytest.mark.slow
def test_every_learner_stops_on_the_leaders_diverged_validation(tmp_path):
    # only rank 0 validates: without agreeing on its verdict, rank 1 would wait in the next exchange
    said = run_distributed(_diverging_learner, 2, tmp_path, str(tmp_path))
    assert said[0].startswith("rank 0: the model diverged in epoch 1: its validation loss is not finite")
    assert said[1] == said[0].replace("rank 0", "rank 1", 1)  # the same verdict, the same train loss


def test_a_diverging_trial_returns_inf_instead_of_raising(tmp_path):
    def nan_loss(model, batch):
        loss, n = mse_loss(model, batch)
        return loss * float("nan"), n

    tr = linear_trainer(tmp_path, Strategy(), ListOrder(3), loss=nan_loss, epochs=1)
    tr.stepper.trial = True
    loss, frames = tr.train_step(ListOrder(1).batches[0])
    assert loss != loss and frames == 8  # NaN comes back to the search, which rejects the size


def test_job_sampler_hands_every_minibatch_out_once_across_learners():
    store = dist.HashStore()
    order = ListOrder(10)
    a, b = JobEpochSampler(order, store, 2), JobEpochSampler(order, store, 2)
    taken_a, taken_b = [], []
    ia, ib = iter(a), iter(b)
    for it, taken in [(ia, taken_a), (ib, taken_b), (ib, taken_b), (ia, taken_a)] * 5:
        batch = next(it, None)
        if batch is not None:
            taken.append(next(i for i, b in enumerate(order.batches) if b is batch))
    assert sorted(taken_a + taken_b) == list(range(10))
    assert next(ia, None) is None and next(ib, None) is None
    assert a.epoch == b.epoch == 1 and a.last_taken + b.last_taken == 10
    assert a.steps_per_epoch == 5


def test_job_checkpoint_is_published_by_the_last_writer(tmp_path):
    state = {"x": torch.ones(2)}
    store = dist.HashStore()
    for rank in (1, 0):
        ckpt.save_learner(tmp_path, "epoch-0001", rank, state)
        if int(store.add("checkpoint/epoch-0001", 1)) == 2:
            ckpt.publish(tmp_path, "epoch-0001", 2)
    assert ckpt.latest_step_dir(tmp_path).name == "epoch-0001"
    ckpt.save_learner(tmp_path, "epoch-0002", 0, state)  # a fast learner's next one, not yet complete
    ckpt.save_learner(tmp_path, "epoch-0003", 0, state)
    ckpt.publish(tmp_path, "epoch-0001", 1)
    assert (tmp_path / "checkpoints" / "epoch-0003").is_dir()  # newer ones are never pruned


class Independent(Strategy):
    """Not lock-step and no communication at all: learners move at their own pace."""

    lockstep = False


def _straggler_learner(rank: int, world_size: int, run_dir: str) -> dict:
    ctx = learner_context()
    strategy = Independent()
    model, opt = linear_model(strategy, ctx)
    sampler = JobEpochSampler(ListOrder(48), ctx.store, world_size)
    hooks = TrainerHooks(loss_fn=mse_loss, lr_at=lambda s, e: 0.01)
    tr = Trainer(model, opt, strategy, sampler, hooks, ctx, Path(run_dir),
                 LoopConfig(epochs=2, progress=False, emulate_compute_ms=50.0,
                            straggler=StragglerConfig(ranks=[1], slowdown=3.0)))
    state = tr.fit()
    return {"per_epoch": [h["minibatches"] for h in state.history], "steps": state.step}


@pytest.mark.slow
def test_a_fast_learner_takes_proportionally_more_minibatches_of_the_jobs_epoch(tmp_path):
    fast, slow = run_distributed(_straggler_learner, 2, tmp_path, str(tmp_path / "run"))
    for epoch in range(2):
        assert fast["per_epoch"][epoch] + slow["per_epoch"][epoch] == 48  # the job's epoch, used up once
        ratio = fast["per_epoch"][epoch] / max(slow["per_epoch"][epoch], 1)
        # 3x by design (50 ms + o against 150 ms + o per step), above 1.5 while a loaded machine adds
        # up to o = 150 ms of a step's own cost; lock-step learners would take 1x. No upper bound:
        # a loaded machine that stalls the slow process for a second (CI read 41 / 7) only raises it
        assert ratio >= 1.5, (fast, slow)
    assert slow["steps"] >= 2, (fast, slow)  # the straggler still takes its share, never starved
    assert ckpt.latest_step_dir(tmp_path / "run").name == "epoch-0002"  # published by the last writer
    files = sorted(p.name for p in (tmp_path / "run" / "checkpoints" / "epoch-0002").iterdir())
    assert files == ["rank-0.pt", "rank-1.pt"]


def _old_main_step(model, opt, strategy, batch, lr):
    """The step as main ran it before the contract grew (loss, backward, hooks, optimizer.step and
    zero_grad, after_step): the reference the new trainer must reproduce bit for bit. The update
    goes through `apply_update`, as every update does since (onebit's `finalize` applies its last
    pending gradient with the last update it was given)."""
    for group in opt.param_groups:
        group["lr"] = lr * strategy.lr_scale()
    loss, frames = mse_loss(model, batch)
    loss.backward()
    strategy.note_samples(frames)
    strategy.note_loss(float(loss))
    strategy.after_backward()

    def update():
        opt.step()
        opt.zero_grad(set_to_none=True)

    strategy.apply_update(update)
    strategy.after_step()


def _lockstep_learner(rank: int, world_size: int, name: str, config: dict, run_dir: str) -> list:
    from asrdist.parallel import build_strategy, strategy_config_class

    ctx = learner_context()
    finals = []
    for path in ("trainer", "reference"):
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 6), torch.nn.Tanh(), torch.nn.Linear(6, 1))
        opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9, nesterov=True)
        strategy = build_strategy(name, strategy_config_class(name)(**config))
        strategy.setup(model, opt, ctx)
        batches = ListOrder(12, seed=rank).batches
        if path == "trainer":
            hooks = TrainerHooks(loss_fn=mse_loss, lr_at=lambda s, e: 0.05)
            tr = Trainer(model, opt, strategy, ListOrder(1), hooks, ctx, Path(run_dir),
                         LoopConfig(epochs=1, progress=False))
            for batch in batches:
                tr.train_step(batch)
        else:
            for batch in batches:
                _old_main_step(model, opt, strategy, batch, 0.05)
        strategy.close(None)
        strategy.finalize()
        finals.append(torch.cat([p.detach().reshape(-1) for p in model.parameters()]))
    return finals


@pytest.mark.slow
@pytest.mark.parametrize("name,config", [("sync", {}), ("onebit", {"double_buffering": True}),
                                         ("onebit", {"double_buffering": False}),
                                         ("averaging", {"average_every": 16})])
def test_lockstep_strategies_step_exactly_as_before_the_contract_grew(tmp_path, name, config):
    for trainer_final, reference_final in run_distributed(_lockstep_learner, 2, tmp_path, name, config,
                                                          str(tmp_path / "run")):
        assert torch.equal(trainer_final, reference_final)
