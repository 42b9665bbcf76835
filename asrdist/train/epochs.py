"""Whose epochs the trainer runs: each learner's own, or the job's.

Lock-step strategies (`LearnerEpochs`) keep per-learner samplers: checkpoints at any step, exact
resume mid-epoch. The others (`JobEpochs`) share a `JobEpochSampler`: a fast learner takes more
of the epoch, checkpoints fall at epoch ends, a resume starts the last completed epoch again.
The trainer calls each coordinator method once, in the same places for both; the job-store
protocols (`start/ready`, `start/go`, `progress/RANK`):
docs/data.md#whose-epochs-the-trainer-runs-trainepochspy."""
from __future__ import annotations

from typing import Any

from asrdist.data.job_sampler import JobEpochSampler
from asrdist.parallel.consensus import job_totals
from asrdist.parallel.membership import progress_key
from asrdist.train import checkpoint as ckpt

START_READY, START_GO = "start/ready", "start/go"


class LearnerEpochs:
    """Each learner's own epochs (lock-step strategies); the base of `JobEpochs`."""

    mid_epoch_checkpoints = True

    def __init__(self, strategy: Any, ctx: Any, base_batch_size: int = 0):
        self.strategy, self.ctx, self.base_batch_size = strategy, ctx, base_batch_size

    def tag(self, loop: Any) -> str:
        """The name of the checkpoint of loop state `loop`."""
        return ckpt.step_tag(loop.step)

    def resumed(self, loop: Any) -> None:
        """Said once the learner resumed from a checkpoint of `loop`."""

    def start(self) -> None:
        """Before the first epoch of this start."""

    def begin_epoch(self, sampler: Any) -> None:
        """At an epoch's start, after `strategy.start_epoch`."""

    def before_step(self, loop: Any, sampler: Any) -> None:
        """After the sampler handed out a minibatch, before it is trained."""

    def after_step(self, loop: Any) -> None:
        """After a step (`loop.step` counts it): the schedule's clock counts the minibatch as its
        size over the configured one (1 unless a batch search changed the size)."""
        size, base = loop.batch_size, self.base_batch_size
        loop.schedule_step += size / base if size and base else 1.0

    def shown_done(self, sampler: Any, done_steps: int) -> int:
        """Minibatches of the epoch done, for its progress display."""
        return done_steps

    def validation_before_step(self, sampler: Any, every: int) -> float | None:
        """The fraction of the epoch done when a validation within it (`train.validate_every`) is
        due before the minibatch just handed out is trained; None: none is."""
        return None

    def validation_after_step(self, done_steps: int, total: int, every: int) -> float | None:
        """The same, after the epoch's `done_steps`-th minibatch: every `every` of them, in lock
        step on every learner (its own sampler, as long as every other's); the epoch's end
        validates on its own."""
        if every and done_steps % every == 0 and done_steps < total:
            return done_steps / total
        return None

    def finished(self, stopped: bool, done_steps: int, total: int) -> bool:
        """Whether the epoch's data was used up (`stopped`: training stopped after a step of it)."""
        return done_steps >= total

    def end_epoch(self, record: dict, loop: Any, sampler: Any) -> None:
        """The epoch's record, on every learner inside `strategy.paused()`: the job's training loss,
        frame-weighted over the learners (a learner of a job's epoch may take few minibatches or
        none while it validates), the learners lost so far (`lost_learners`, when any) and what
        `_counts` adds to the same sum."""
        def totals(group, members):
            summed = job_totals([loop.epoch_loss_sum, loop.epoch_loss_frames, *self._counts(sampler, members)],
                                world_size=len(members), device=self.ctx.device, group=group,
                                timeout=self.ctx.timeout)
            return summed, members

        (loss_sum, frames, *counts), members = self.strategy.among_survivors(totals)
        record["train_loss"] = loss_sum / frames if frames > 0 else None
        # the learners lost so far, asked once: the record names them and counts their
        # minibatches from the same answer (a loss noticed later belongs to the next record)
        lost = [x["rank"] for x in self.strategy.lost_learners()]
        if lost:
            record["lost_learners"] = lost
        self._record_counts(record, counts, members, sampler)

    def _counts(self, sampler: Any, members: list[int]) -> list[float]:
        return []

    def _record_counts(self, record: dict, counts: list[float], members: list[int], sampler: Any) -> None:
        pass


class JobEpochs(LearnerEpochs):
    """Epochs that belong to the job (`JobEpochSampler`; module docstring)."""

    mid_epoch_checkpoints = False

    def tag(self, loop: Any) -> str:
        return f"epoch-{loop.epoch:04d}"

    def resumed(self, loop: Any) -> None:
        if self.ctx.job_rank == 0:
            print(f"[asrdist] resuming at the start of epoch {loop.epoch + 1} (the last job checkpoint; "
                  f"an asynchronous strategy does not resume mid-epoch)", flush=True)

    def _shared(self) -> bool:
        return self.ctx.store is not None and self.ctx.job_world_size > 1

    def start(self) -> None:
        if self._shared():
            if int(self.ctx.store.add(START_READY, 1)) == self.ctx.job_world_size:
                self.ctx.store.set(START_GO, "1")
            self.ctx.store.wait([START_GO], self.ctx.timeout)

    def begin_epoch(self, sampler: JobEpochSampler) -> None:
        sampler.lockstep = self.strategy.lockstep_now  # a strategy's synchronous phase takes turns
        self._last_unit = -1

    _last_unit = -1
    """The unit of this epoch's order this learner (its group) claimed last."""

    def validation_before_step(self, sampler: JobEpochSampler, every: int) -> float | None:
        """At the job's minibatch (unit) b = j x every x groups of the epoch's order: each group's
        first claim at or past b validates before it trains. A learner waits there for the
        others, so the claims at or past b before it are one per group (b .. b + groups - 1):
        every learner crosses every b once, and b is used only when all of them fall inside the
        epoch (else the epoch's end validates instead)."""
        if not every:
            return None
        groups = sampler.learners // sampler.group_size
        span, units = every * groups, len(sampler) // sampler.group_size
        unit, last = sampler.claimed // sampler.group_size, self._last_unit
        self._last_unit = max(last, unit)
        boundary = unit // span * span
        if unit < 0 or boundary == 0 or unit // span <= last // span or boundary + groups > units // groups * groups:
            return None
        return boundary / units

    def validation_after_step(self, done_steps: int, total: int, every: int) -> float | None:
        return None  # (before the step: the claim says where the job is)

    def before_step(self, loop: Any, sampler: JobEpochSampler) -> None:
        loop.schedule_step = sampler.schedule_step()  # the job's clock: minibatches claimed by anyone

    def after_step(self, loop: Any) -> None:
        if self._shared():
            self.ctx.store.set(progress_key(self.ctx.job_rank), str(loop.step))

    def shown_done(self, sampler: JobEpochSampler, done_steps: int) -> int:
        return sampler.claimed + 1

    def finished(self, stopped: bool, done_steps: int, total: int) -> bool:
        return not stopped

    def end_epoch(self, record: dict, loop: Any, sampler: JobEpochSampler) -> None:
        record["minibatches"] = sampler.last_taken  # this learner's share of the job's epoch
        super().end_epoch(record, loop, sampler)

    def _counts(self, sampler: JobEpochSampler, members: list[int]) -> list[float]:
        # the minibatches of lost learners this one trained again (survival mode), and every
        # learner's share of the epoch: each adds its own count in its slot
        shares = [0.0] * len(members)
        shares[members.index(self.ctx.job_rank)] = float(sampler.last_taken)
        return [float(sampler.last_retrained), *shares]

    def _record_counts(self, record: dict, counts: list[float], members: list[int], sampler: JobEpochSampler) -> None:
        retrained, *shares = counts
        record["minibatches_by_learner"] = {str(rank): int(n) for rank, n in zip(members, shares)}
        if record.get("lost_learners"):
            self._record_lost_minibatches(record, int(retrained), sampler)

    def _record_lost_minibatches(self, record: dict, retrained: int, sampler: JobEpochSampler) -> None:
        """Survival mode: what the lost learners finished of this epoch joins their shares; the
        minibatches they held unfinished were trained again by survivors (`minibatches_retrained`)
        or, when their loss came too late in the epoch, not (`minibatches_lost`)."""
        finished, left = sampler.lost_shares(record["epoch"] - 1)  # the record's epochs count from 1
        shares = record["minibatches_by_learner"]
        for rank, n in finished.items():
            shares.setdefault(str(rank), n)
        record["minibatches_by_learner"] = {k: shares[k] for k in sorted(shares, key=int)}
        size = sampler.group_size  # a node takes whole units of its size: a remainder is never handed out
        record["minibatches_in_epoch"] = len(sampler) // size * size
        record["minibatches_retrained"], record["minibatches_lost"] = retrained, left


def epochs_for(sampler: Any, strategy: Any, ctx: Any, base_batch_size: int = 0) -> LearnerEpochs:
    """The coordinator of `sampler`'s epochs: the job's for a `JobEpochSampler`, else the learner's."""
    kind = JobEpochs if isinstance(sampler, JobEpochSampler) else LearnerEpochs
    return kind(strategy, ctx, base_batch_size)
