"""When a learner checkpoints, and how the job's checkpoint is published without a barrier.

The files and their format are `asrdist.train.checkpoint`'s; this is the engine's side of them,
with the two job-store protocols it uses:
- `checkpoint/TAG` (`checkpoint/TAG/members-0,2,3` once learners are lost): every learner adds 1
  after writing its file for TAG; the one whose add reaches the number of writers publishes the
  checkpoint (moves `latest`). No learner waits for another.
- `checkpoint/timed-interval/STEP` (`train.checkpoint_minutes`, learners in lock step): they must
  checkpoint at the same steps, so the interval is fixed in steps once per start. Rank 0 times the
  start's first TIMING_STEPS steps and sets the interval under the step its timing started at; the
  others read it there at the same step.
"""
from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

from asrdist.errors import TrainingError
from asrdist.train import checkpoint as ckpt

TIMING_STEPS = 20
"""Steps of a start that `train.checkpoint_minutes` times to fix its interval in steps."""


def written_key(tag: str, members: list[int] | None = None) -> str:
    """The counter of the learners that wrote their file of checkpoint `tag` (`members`: the
    survivors expected to write, when learners were lost)."""
    return f"checkpoint/{tag}" + (f"/members-{','.join(map(str, members))}" if members is not None else "")


def interval_key(first_step: int) -> str:
    """Where rank 0 leaves the timed interval of the start whose timing began after `first_step`."""
    return f"checkpoint/timed-interval/{first_step}"


class Checkpointer:
    """This learner's checkpoints: which steps are due, writing its file and publishing the job's
    checkpoint (module docstring), and loading it back on resume.

    `tag(loop_state)` names the checkpoint of a loop state (step-N or epoch-E: the epoch
    coordinator's). `mid_epoch`: whether checkpoints may fall inside an epoch (`every` steps,
    `minutes`) or only at epoch ends (learners out of lock step resume from an epoch's start)."""

    def __init__(self, run_dir: Path, strategy: Any, ctx: Any, *, epochs: int, tag: Callable[[Any], str],
                 mid_epoch: bool = True, every: int = 0, minutes: float = 0.0):
        self.run_dir, self.strategy, self.ctx, self.epochs = Path(run_dir), strategy, ctx, epochs
        self.tag, self.mid_epoch, self.every, self.minutes = tag, mid_epoch, every, minutes
        self._shared = ctx.store is not None and ctx.job_world_size > 1
        self._timed_from: tuple[int, float] | None = None  # (step, time) when this start's first step ended
        self._timed_every: tuple[int, int] | None = None  # (first step, interval in steps)

    def due(self, step: int) -> bool:
        """Whether a checkpoint is due inside the epoch after `step` (asked after every step)."""
        if not self.mid_epoch:
            return False
        timed = self._timed_due(step)  # asked at every step: it times the start's first steps
        return timed or bool(self.every and step % self.every == 0)

    def _timed_due(self, step: int) -> bool:
        if not self.minutes:
            return False
        if self._timed_from is None:
            self._timed_from = (step, time.perf_counter())
            return False
        first, started = self._timed_from
        if self._timed_every is None:
            if step - first < TIMING_STEPS:
                return False
            if self.ctx.job_rank == 0 or not self._shared:
                per_step = (time.perf_counter() - started) / (step - first)
                interval = max(1, round(self.minutes * 60 / max(per_step, 1e-9)))
                if self._shared:
                    self.ctx.store.set(interval_key(first), str(interval))
            else:
                interval = int(self.ctx.store.get(interval_key(first)))  # waits for rank 0, at most the job's timeout
            self._timed_every = (step, interval)
        anchor, interval = self._timed_every
        return step > anchor and (step - anchor) % interval == 0

    def save(self, loop: Any, learner_state: Callable[[], dict]) -> None:
        """This learner's file of the checkpoint of `loop` (its state from `learner_state()`, taken
        inside `strategy.paused()`), then the job's checkpoint published by whichever learner writes
        its last file. Once learners are lost (survival mode) the survivors agreed at the last sync
        point (the epoch end's) are the ones that must write; the checkpoint names them."""
        members = self.strategy.survivors()[1]
        lost = len(members) < self.ctx.job_world_size
        if self.ctx.job_rank not in members:
            return
        tag = self.tag(loop)
        with self.strategy.paused():
            state = learner_state()
        ckpt.save_learner(self.run_dir, tag, self.ctx.job_rank, state)
        key = written_key(tag, members if lost else None)
        written = int(self.ctx.store.add(key, 1)) if self.ctx.store is not None else 1
        if written == len(members):
            ckpt.publish(self.run_dir, tag, self.ctx.job_world_size, members=members if lost else None,
                         group_size=self.ctx.group_size if self.strategy.moves_by_node else 1,
                         progress={"epoch": loop.epoch, "epochs": self.epochs, "step": loop.step})

    def save_where_stopped(self, loop: Any, learner_state: Callable[[], dict]) -> None:
        """Training stopped inside an epoch (max_steps, the strategy): a learner that may checkpoint
        mid-epoch keeps where it stopped; the others resume from the epoch's start anyway."""
        if self.mid_epoch:
            self.save(loop, learner_state)

    def resume(self, restore: Callable[[dict], Any]) -> None:
        """Load this learner's file of the latest checkpoint through `restore(state) -> loop state`;
        a file that is not this run's, or holds another checkpoint, is one line saying what to do."""
        rank, learners = self.ctx.job_rank, self.ctx.job_world_size
        state = ckpt.load_learner(self.run_dir, rank, learners)
        checkpoint = ckpt.latest_step_dir(self.run_dir)
        path = checkpoint / f"rank-{rank}.pt"
        try:
            loop = restore(state)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
            # a readable archive with other contents (another run's file, a hand-edited one)
            what = f"no '{exc.args[0]}' entry" if isinstance(exc, KeyError) else \
                " ".join(str(exc).split())[:200] or type(exc).__name__
            raise TrainingError(f"{path}: not this run's checkpoint ({what}); "
                                f"{ckpt.resume_advice(self.run_dir, checkpoint, learners)}") from None
        holds = self.tag(loop)
        if holds != checkpoint.name:  # its learners would meet at different points and wait for each other
            raise TrainingError(f"{path}: holds {holds}, not {checkpoint.name}: a file of another checkpoint; "
                                f"{ckpt.resume_advice(self.run_dir, checkpoint, learners)}")
