"""The Validator alone, in one process: which epoch ends validate, who validates what, and how a
diverged verdict reaches learners that do not wait for the leader (the job store's run/diverged)."""
from __future__ import annotations

from contextlib import contextmanager
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from asrdist.errors import TrainingError
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.train.validator import DIVERGED_KEY, Validator


class Learner(Strategy):
    """Survivors `members`; lock step or not; records whether validation ran inside `paused()`."""

    def __init__(self, ctx, members, lockstep=True):
        super().__init__()
        self.setup(torch.nn.Linear(2, 1), None, ctx)
        self.members, self.lockstep, self.paused_now = members, lockstep, False

    def survivors(self):
        return None, self.members

    @contextmanager
    def paused(self):
        self.paused_now = True
        try:
            yield
        finally:
            self.paused_now = False


def _validator(rank, world, store, fn=None, *, members=None, lockstep=True, every=1):
    ctx = LearnerContext(store=store, job_rank=rank, job_world_size=world)
    strategy = Learner(ctx, list(range(world)) if members is None else members, lockstep)
    return Validator(fn, every, strategy, ctx), strategy


def test_validation_falls_every_n_epochs_and_at_the_last():
    every_2, _ = _validator(0, 1, None, lambda m: {}, every=2)
    assert [e for e in range(7) if every_2.due(e, last=e == 6)] == [1, 3, 5, 6]
    nothing, _ = _validator(0, 1, None, None)
    assert not nothing.due(0, last=True)


def test_the_leader_validates_the_model_while_paused_and_the_others_add_nothing():
    seen = []
    leader, strategy = _validator(0, 1, None, lambda m: seen.append((m, strategy.paused_now)) or {"valid_loss": 0.25})
    record = {"train_loss": 0.5}
    leader.validate(strategy.model, record, epoch=0)
    assert record == {"train_loss": 0.5, "valid_loss": 0.25} and seen == [(strategy.model, True)]
    # rank 0 was lost: the first survivor (rank 1) speaks for the job, rank 0 does not
    survivor, _ = _validator(1, 3, None, members=[1, 2])
    lost, _ = _validator(0, 3, None, members=[1, 2])
    assert survivor.leads() and not lost.leads()


def test_learners_out_of_lock_step_read_the_leaders_verdict_from_the_store():
    store = dist.HashStore()
    store.set_timeout(timedelta(seconds=10))  # a verdict never written fails the test, not hangs it
    leader, _ = _validator(0, 2, store, lockstep=False)
    other, _ = _validator(1, 2, store, lockstep=False)
    other.stop_if_told_diverged()  # no verdict yet: goes on
    other.stop_if_diverged({"train_loss": 0.7}, epoch=2)  # it validated nothing: nothing to say
    with pytest.raises(TrainingError) as said:
        leader.stop_if_diverged({"train_loss": 0.5, "valid_loss": float("nan")}, epoch=2)
    assert str(said.value) == ("rank 0: the model diverged in epoch 3: its validation loss is not finite "
                               "(train loss 0.5); lower optim.lr or check the data")
    assert store.get(DIVERGED_KEY).decode() == str(said.value).removeprefix("rank 0: ")
    with pytest.raises(TrainingError) as told:
        other.stop_if_told_diverged()
    assert str(told.value) == str(said.value).replace("rank 0", "rank 1", 1)


def test_learners_in_lock_step_agree_at_once_and_leave_nothing_in_the_store():
    store = dist.HashStore()
    alone, _ = _validator(0, 1, store, lockstep=True)
    with pytest.raises(TrainingError, match="diverged in epoch 1"):
        alone.stop_if_diverged({"train_loss": None, "valid_loss": float("inf")}, epoch=0)
    alone.stop_if_diverged({"train_loss": 0.1, "valid_loss": 0.2}, epoch=1)
    assert not store.check([DIVERGED_KEY])
