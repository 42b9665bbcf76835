"""The Checkpointer alone, in one process: its two job-store protocols (the timed interval rank 0
shares, the count of written files that publishes a checkpoint without a barrier) and resume."""
from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from asrdist.errors import TrainingError
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.train import checkpoint as ckpt
from asrdist.train import checkpointer as checkpointer_module
from asrdist.train.checkpointer import TIMING_STEPS, Checkpointer, interval_key, written_key


class Members(Strategy):
    """A strategy whose survivors are `members` (all learners by default); counts `paused()`."""

    def __init__(self, ctx: LearnerContext, members: list[int] | None = None):
        super().__init__()
        self.setup(torch.nn.Linear(1, 1), None, ctx)
        self.members = list(range(ctx.job_world_size)) if members is None else members
        self.paused_calls = 0

    def survivors(self):
        return None, self.members

    @contextmanager
    def paused(self):
        self.paused_calls += 1
        yield


def _store() -> dist.HashStore:
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=10))  # a protocol that waits for a key nobody sets fails, not hangs
    return store


def _checkpointer(tmp_path, rank, world, store, *, members=None, **kw):
    ctx = LearnerContext(store=store, job_rank=rank, job_world_size=world)
    strategy = Members(ctx, members)
    tag = lambda loop: ckpt.step_tag(loop.step)  # noqa: E731
    return Checkpointer(tmp_path, strategy, ctx, epochs=3, tag=tag, **kw), strategy


class FakeClock:
    def __init__(self, seconds_per_step: float):
        self.now, self.per_step = 0.0, seconds_per_step

    def tick(self):
        self.now += self.per_step


def _due_steps(checkpointer, clock, monkeypatch, steps) -> list[int]:
    monkeypatch.setattr(checkpointer_module, "time", SimpleNamespace(perf_counter=lambda: clock.now))
    due = []
    for step in steps:
        clock.tick()
        if checkpointer.due(step):
            due.append(step)
    return due


def test_lock_step_learners_checkpoint_at_the_steps_rank_0_timed(tmp_path, monkeypatch):
    # rank 0 takes 1 s a step, rank 1 10 s: on its own rank 1 would checkpoint 10x as often, and the
    # learners would meet at different steps; the interval rank 0 shares makes them agree
    store = _store()
    leader, _ = _checkpointer(tmp_path, 0, 2, store, minutes=1.0)
    other, _ = _checkpointer(tmp_path, 1, 2, store, minutes=1.0)
    steps = range(5, 5 + TIMING_STEPS + 200)  # a resumed start: its first step is 5
    due_leader = _due_steps(leader, FakeClock(1.0), monkeypatch, steps)
    assert store.get(interval_key(5)) == b"60"  # 60 s / 1 s a step, under the start's first step
    due_other = _due_steps(other, FakeClock(10.0), monkeypatch, steps)
    assert due_leader == due_other == [5 + TIMING_STEPS + 60 * k for k in (1, 2, 3)]


def test_a_lone_learner_times_its_own_interval_and_shares_nothing(tmp_path, monkeypatch):
    store = _store()
    alone, _ = _checkpointer(tmp_path, 0, 1, store, minutes=0.5)
    due = _due_steps(alone, FakeClock(3.0), monkeypatch, range(1, 1 + TIMING_STEPS + 25))
    assert due == [1 + TIMING_STEPS + 10, 1 + TIMING_STEPS + 20]  # 30 s / 3 s a step
    assert not store.check([interval_key(1)])


def test_checkpoint_every_steps_and_none_inside_job_epochs(tmp_path):
    every, _ = _checkpointer(tmp_path, 0, 1, None, every=4)
    assert [s for s in range(1, 13) if every.due(s)] == [4, 8, 12]
    epoch_ends_only, _ = _checkpointer(tmp_path, 0, 1, None, every=4, minutes=1.0, mid_epoch=False)
    assert not any(epoch_ends_only.due(s) for s in range(1, 100))


def _loop(step: int):
    return SimpleNamespace(step=step, epoch=1)


def test_the_last_learner_to_write_publishes_the_checkpoint(tmp_path):
    store = _store()
    (first, s1), (last, s0) = _checkpointer(tmp_path, 1, 2, store), _checkpointer(tmp_path, 0, 2, store)
    first.save(_loop(8), lambda: {"who": 1})
    assert ckpt.latest_step_dir(tmp_path) is None and store.add(written_key("step-00000008"), 0) == 1
    last.save(_loop(8), lambda: {"who": 0})
    assert ckpt.latest_step_dir(tmp_path).name == "step-00000008"
    assert sorted(p.name for p in (tmp_path / "checkpoints" / "step-00000008").iterdir()) == ["rank-0.pt", "rank-1.pt"]
    assert s0.paused_calls == s1.paused_calls == 1  # each learner's state taken while paused


def test_survivors_publish_with_the_list_of_who_wrote_and_the_lost_write_nothing(tmp_path):
    store = _store()
    for rank in (2, 1, 0):  # rank 1 was lost: it writes nothing, and the survivors do not wait for it
        saver, _ = _checkpointer(tmp_path, rank, 3, store, members=[0, 2])
        saver.save(_loop(4), lambda: {"who": rank})
    d = ckpt.latest_step_dir(tmp_path)
    assert d.name == "step-00000004" and not (d / "rank-1.pt").exists()
    assert ckpt.survivors_of(d)["members"] == [0, 2] and ckpt.survivors_of(d)["lost"] == [1]
    assert store.add(written_key("step-00000004", [0, 2]), 0) == 2


def test_resume_loads_the_latest_and_refuses_a_file_of_another_checkpoint(tmp_path):
    saver, _ = _checkpointer(tmp_path, 0, 1, None)
    saver.save(_loop(6), lambda: {"loop": 6})
    assert saver.resume(lambda state: _loop(state["loop"])) is None
    with pytest.raises(TrainingError, match=r"rank-0.pt: holds step-00000007, not step-00000006"):
        saver.resume(lambda state: _loop(7))
    with pytest.raises(TrainingError, match=r"rank-0.pt: not this run's checkpoint \(no 'model' entry\)"):
        saver.resume(lambda state: state["model"])
