"""Validation during training: at which epoch ends, on what model, and how its verdict is shared
(the same within epochs, `train.validate_every`: the trainer's `_validate_within_epoch`).

The model validated is the consensus (the average of the learners that are members now:
`strategy.survivors()`), taken by a collective among them; the leader (rank 0, or the first
survivor once it is lost) validates it, and speaks for the job. A non-finite validation loss means
the model the job would keep has diverged: every learner stops with the same line. How they learn
the leader's verdict depends on whether they wait for it:
- in lock step (or alone) at once, by a sum of the verdict over the members;
- otherwise (adpsgd's learners go on while the leader validates) through the job store: the leader
  sets `run/diverged` (DIVERGED_KEY) to its line, and each learner looks for it at its next
  validating epoch end, before that epoch end's exchanges.
"""
from __future__ import annotations

import math
from typing import Any, Callable

import torch

from asrdist.errors import TrainingError
from asrdist.parallel.consensus import consensus_copy, job_totals

DIVERGED_KEY = "run/diverged"
"""Set in the job store by the leader of learners that do not move in lock step when the model
it validated had diverged."""


class Validator:
    """`validate_fn(model) -> metrics` (run by the leader only) every `every_epochs` epochs and at
    the last one."""

    def __init__(self, validate_fn: Callable[[torch.nn.Module], dict] | None, every_epochs: int,
                 strategy: Any, ctx: Any):
        self.validate_fn, self.every_epochs, self.strategy, self.ctx = validate_fn, every_epochs, strategy, ctx

    def due(self, epoch: int, last: bool) -> bool:
        """Whether the end of `epoch` (the run's last when `last`) validates."""
        return bool(self.validate_fn) and ((epoch + 1) % self.every_epochs == 0 or last)

    def leads(self) -> bool:
        """Whether this learner speaks for the job: rank 0, or the first survivor once it is lost."""
        return self.ctx.job_rank == self.strategy.survivors()[1][0]

    def consensus(self, model: torch.nn.Module) -> torch.nn.Module:
        """The members' average of `model` (`model` itself for one learner), a collective among
        them: call it on every member, inside `strategy.paused()`."""
        return self.strategy.among_survivors(lambda group, members: consensus_copy(
            model, world_size=len(members), group=group, timeout=self.ctx.timeout))

    def validate(self, model: torch.nn.Module, record: dict, epoch: int) -> torch.nn.Module:
        """Validate the consensus of `model` into `record` (the leader's figures; the others add
        nothing), on every learner, inside `strategy.paused()`; raise on a diverged model. Returns
        the consensus it validated (for the epoch average: `asrdist.train.epoch_average`)."""
        with self.strategy.paused():
            self.stop_if_told_diverged()
            consensus = self.consensus(model)
            record.update(self.validate_fn(consensus) if self.leads() else {})
            self.stop_if_diverged(record, epoch)
        return consensus

    def _agreed_at_once(self) -> bool:
        """Whether the learners agree on the leader's verdict right away: lock-step learners would
        wait for the leader in their next exchange anyway."""
        return self.strategy.lockstep_now or self.ctx.store is None or self.ctx.job_world_size == 1

    def stop_if_told_diverged(self) -> None:
        """The leader's verdict of an earlier epoch end, from the job store (learners out of lock step)."""
        if not self._agreed_at_once() and self.ctx.store.check([DIVERGED_KEY]):
            raise TrainingError(f"rank {self.ctx.job_rank}: {self.ctx.store.get(DIVERGED_KEY).decode()}")

    def stop_if_diverged(self, record: dict, epoch: int) -> None:
        """Stop every learner when the leader's `record` of `epoch` has a non-finite validation loss
        (each minibatch's loss can stay finite while the weights grow without bound)."""
        loss = record.get("valid_loss")
        diverged = loss is not None and not math.isfinite(loss)
        at_once = self._agreed_at_once()
        if at_once:
            diverged = self.strategy.among_survivors(lambda group, members: job_totals(
                [float(diverged)], world_size=len(members), device=self.ctx.device, group=group,
                timeout=self.ctx.timeout))[0] > 0
        if diverged:
            train_loss = record.get("train_loss")
            shown = f"{train_loss:.4g}" if train_loss is not None else "none"
            verdict = (f"the model diverged in epoch {epoch + 1}: its validation loss is not finite "
                       f"(train loss {shown}); lower optim.lr or check the data")
            if not at_once:
                self.ctx.store.set(DIVERGED_KEY, verdict)
            raise TrainingError(f"rank {self.ctx.job_rank}: {verdict}")
