"""The one training loop. It knows neither the strategy nor the speech task behind its inputs.

The loop composes the engine's parts, each in its own module with its job-store protocol:
`Stepper` (one minibatch: schedule -> forward/backward or emulated compute -> strategy hooks ->
straggler delay), the epoch coordinator (`LearnerEpochs` for lock-step strategies: per-learner
samplers, exact resume; `JobEpochs` otherwise: epochs that belong to the job), `Checkpointer`
(which steps, barrier-free publication, resume), `Validator` (the consensus model at epoch ends)
and `metrics` (metrics.jsonl, TensorBoard, the job's frames per second), and `EpochAverage` (the
last epochs' models kept for `train.average_last`: `averaged()` after `fit`). Every learner runs this
same loop; checkpoint, snapshot, restore and validation run inside `strategy.paused()`, and
`strategy.close(error)` runs on the way out. Epoch start (after the first epoch): an optional
`batch_search` hook may try minibatch sizes from an in-memory snapshot and install a sampler at
the size it picks (onebit's auto_batch_size).
"""
from __future__ import annotations

import copy
import math
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import torch

from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.train import checkpoint as ckpt
from asrdist.train.checkpointer import Checkpointer
from asrdist.train.epoch_average import Averaged, EpochAverage
from asrdist.train.epochs import epochs_for
from asrdist.train.loop import LoopConfig, Sampler
from asrdist.train.metrics import (
    MetricsLog,
    TrainWindow,
    epoch_line,
    numbered_from_one,
    read_metrics,
    warn_if_loss_rose,
)
from asrdist.train.progress import EpochProgress
from asrdist.train.step import Stepper
from asrdist.train.validator import Validator


@dataclass
class LoopState:
    epoch: int = 0
    step: int = 0
    frames: int = 0
    """Frames this learner has trained on."""
    train_seconds: float = 0.0
    epoch_loss_sum: float = 0.0
    epoch_loss_frames: int = 0
    history: list[dict] = field(default_factory=list)
    """Per-epoch records: epoch, train_loss, valid metrics."""
    batch_size: int = 0
    """Global minibatch size the sampler runs at; 0 = the configured one (set by a batch search)."""
    wall_seconds: float = 0.0
    """Wall time of the run up to this state, over every start (a resumed run counts the time
    of its earlier starts up to the checkpoint it resumed from)."""
    schedule_step: float = 0.0
    """Minibatches trained, each counted as its size over the configured size: the learning-rate
    schedule's clock, so warmup and decay follow the data seen when a batch search changes the
    size (equal to `step` otherwise)."""
    loop_seconds: float = 0.0
    """Wall time in the epoch loop (steps, exchanges, epoch ends: everything but set-up and the
    end of `fit`), over every start: the time the job's throughput is measured against, the same
    for learners that wait inside their steps (lock-step) and those that wait at epoch ends."""
    validations: list[dict] = field(default_factory=list)
    """With `train.validate_every`: every validation, within epochs and at their ends, in order
    (epoch, step, epoch_progress, wall_seconds, validation_seconds and the figures)."""
    validation_seconds: float = 0.0
    """Wall seconds this learner spent validating (and waiting for the consensus), over every start."""


@dataclass
class TrainerHooks:
    loss_fn: Callable[[torch.nn.Module, Any], tuple[torch.Tensor, int]]
    """(model, batch) -> (mean loss over the batch, frames in the batch)."""
    validate_fn: Callable[[torch.nn.Module], dict] | None = None
    """model -> metrics dict (rank 0 only); called at epoch ends with the consensus model."""
    lr_at: Callable[[float, int], float] = lambda step, epoch: 0.1
    """(schedule step, epoch) -> learning rate before the strategy's scale."""
    base_batch_size: int = 0
    """The configured global minibatch size, against which a searched size counts in
    `LoopState.schedule_step` (0: every minibatch counts 1)."""
    before_optimizer_step: Callable[[float], None] | None = None
    """Called with the learning rate after gradient communication, before optimizer.step() (max-change)."""
    extra_state: Callable[[], dict] | None = None
    """Additional learner state to checkpoint (e.g. natural-gradient statistics)."""
    load_extra_state: Callable[[dict], None] | None = None
    batch_search: Callable[["Trainer"], None] | None = None
    """Called at the start of every epoch after the first, before its first minibatch; may
    replace `trainer.sampler` and set `trainer.state.batch_size` (it must restore everything else)."""
    sampler_at: Callable[[int], Sampler] | None = None
    """Global batch size (0 = the configured one) -> a fresh sampler at that size; rebuilds the
    sampler when a loaded loop state has another batch_size (a sampler refuses another size's state)."""


class RunClock:
    """A run's wall seconds and its epoch loop's seconds (`LoopState.wall_seconds`, `loop_seconds`):
    this start's time plus what the loop state carried in from the run's earlier starts."""

    def __init__(self, wall_before: float = 0.0):
        self.started, self.wall_before = time.perf_counter(), wall_before
        self.loop_started: float | None = None  # when this start's epoch loop began
        self.loop_before = 0.0

    def wall(self) -> float:
        return self.wall_before + time.perf_counter() - self.started

    def enter_loop(self, loop_before: float) -> None:
        self.loop_started, self.loop_before = time.perf_counter(), loop_before

    def stamp(self, state: LoopState) -> None:
        """Bring `state`'s wall and loop seconds up to now."""
        state.wall_seconds = self.wall()
        if self.loop_started is not None:
            state.loop_seconds = self.loop_before + time.perf_counter() - self.loop_started


class Trainer:
    """One learner's training: the loop over its parts (module docstring). `train_step` is the one
    step benches and strategy tests train through; `fit` runs the epochs."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy,
                 sampler: Sampler, hooks: TrainerHooks, ctx: LearnerContext, run_dir: Path, config: LoopConfig):
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.sampler, self.hooks, self.ctx, self.run_dir = sampler, hooks, ctx, Path(run_dir)
        self.config = config
        self.stepper = Stepper(model, optimizer, strategy, hooks, ctx, config)
        """One minibatch's step; it owns the step's counters (`compute_seconds`, `skipped`) and `trial`."""
        self.coordinator = epochs_for(sampler, strategy, ctx, hooks.base_batch_size)
        self.checkpointer = Checkpointer(self.run_dir, strategy, ctx, epochs=config.epochs, tag=self.coordinator.tag,
                                         mid_epoch=self.coordinator.mid_epoch_checkpoints,
                                         every=config.checkpoint_every, minutes=config.checkpoint_minutes)
        self.validator = Validator(hooks.validate_fn, config.validate_every_epochs, strategy, ctx)
        self.epoch_average = EpochAverage(config.average_last, config.epochs)
        self.final_epoch = -1
        """The epoch (0-based) the model ends in after `fit`: the last one ended, or the one a
        stop (max_steps, the strategy) cut short."""
        self.progress = config.progress and ctx.job_rank == 0
        self.state = LoopState()
        self.metrics: MetricsLog | None = None
        self.clock = RunClock()

    def train_step(self, batch: Any) -> tuple[float, int]:
        """One minibatch on this learner; returns (loss, frames). Benchmarks call this too."""
        return self.stepper.run(batch, self.state, self.metrics)

    # -- the learner's state: checkpoints and snapshots ---------------------------------------
    def _learner_state(self) -> dict:
        self.clock.stamp(self.state)
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "strategy": self.strategy.state_dict(), "sampler": self.sampler.state_dict(),
                "loop": self.state.__dict__.copy(), "rng": ckpt.rng_state(self.ctx.device),
                "jitter_rng": self.stepper.jitter_rng.getstate(),
                "extra": self.hooks.extra_state() if self.hooks.extra_state else None,
                "epoch_average": self.epoch_average.state_dict()}

    def save_checkpoint(self) -> None:
        """This learner's file of the checkpoint of its state now (`Checkpointer.save`)."""
        self.checkpointer.save(self.state, self._learner_state)

    def snapshot(self) -> dict:
        """This learner's whole state (as a checkpoint holds it), copied in memory."""
        with self.strategy.paused():
            return copy.deepcopy(self._learner_state())

    def restore_snapshot(self, state: dict) -> LoopState:
        """Load a `snapshot()` or checkpoint dict; the tensors may be kept, so pass a copy to reuse
        one. Returns the loop state loaded."""
        with self.strategy.paused():
            self.model.load_state_dict(state["model"])
            self.optimizer.load_state_dict(state["optimizer"])
            self.strategy.load_state_dict(state["strategy"])
            loop = LoopState(**state["loop"])
            loop.history = numbered_from_one(loop.history)  # a checkpoint from before epochs counted from 1
            if "schedule_step" not in state["loop"]:  # a checkpoint from before the schedule clock
                loop.schedule_step = float(loop.step)
            if loop.batch_size != self.state.batch_size and self.hooks.sampler_at is not None:
                self.sampler = self.hooks.sampler_at(loop.batch_size)  # self.sampler runs at state.batch_size
            self.sampler.load_state_dict(state["sampler"])
            self.state = loop
            ckpt.set_rng_state(state["rng"], self.ctx.device)
            self.stepper.jitter_rng.setstate(state["jitter_rng"])
            if self.hooks.load_extra_state and state.get("extra") is not None:
                self.hooks.load_extra_state(state["extra"])
            self.epoch_average.load_state_dict(state.get("epoch_average"))  # absent: a checkpoint from before it
        return self.state

    def resume(self) -> None:
        self.checkpointer.resume(self.restore_snapshot)
        self.coordinator.resumed(self.state)

    # -- the loop -------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> LoopState:
        error: BaseException | None = None
        self.clock = RunClock()
        try:
            if resume:
                self.resume()
                self.clock.wall_before = self.state.wall_seconds
            self.metrics = MetricsLog(self.run_dir, enabled=self.ctx.job_rank == 0,
                                      resume_step=self.state.step if resume else None)
            self.coordinator.start()
            self.final_epoch = self.state.epoch - 1  # a resume of a run whose epochs all ended trains none
            self.clock.enter_loop(self.state.loop_seconds)
            self._train(mid_epoch=resume and self.sampler.state_dict().get("position", 0) > 0)
            self.clock.stamp(self.state)
        except BaseException as exc:
            error = exc
            raise
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self.strategy.close(error)
        self.strategy.finalize()
        self.state.wall_seconds = self.clock.wall()
        return self.state

    def averaged(self) -> Averaged | None:
        """After `fit`: the average of the last epochs' models (the final model, as `finalize`
        left it, standing for the last), or None when `train.average_last` is 1 or no earlier epoch
        of the window was reached; the model itself is left as it is."""
        return self.epoch_average.result(self.model, self.final_epoch)

    def _train(self, mid_epoch: bool) -> None:
        while self.state.epoch < self.config.epochs:
            self.strategy.start_epoch(self.state.epoch)
            self.coordinator.begin_epoch(self.sampler)
            if not mid_epoch:
                self.sampler.set_epoch(self.state.epoch)
                if self.hooks.batch_search is not None and self.state.epoch > 0:
                    self.hooks.batch_search(self)
            mid_epoch = False
            if not self._run_epoch():  # max_steps or the strategy stopped it mid-epoch
                self.final_epoch = self.state.epoch
                self.checkpointer.save_where_stopped(self.state, self._learner_state)
                break
            self.final_epoch = self.state.epoch
            self._end_epoch()
            if self._done():
                break

    def _done(self) -> bool:
        return (self.config.max_steps > 0 and self.state.step >= self.config.max_steps) or self.strategy.should_stop()

    def _run_epoch(self) -> bool:
        """Train until the epoch's data is used up (True) or training must stop (False)."""
        state, total = self.state, len(self.sampler)
        start = self.sampler.state_dict().get("position", 0)
        shown = EpochProgress(state.epoch, self.config.epochs, total, start, enabled=self.progress)
        window = TrainWindow(self.ctx.store)
        if start == 0:
            state.epoch_loss_sum, state.epoch_loss_frames = 0.0, 0
        stopped, done_steps = False, start
        every = self.config.validate_every if self.hooks.validate_fn else 0
        for batch in self.sampler:
            self.coordinator.before_step(state, self.sampler)
            due = self.coordinator.validation_before_step(self.sampler, every)
            if due is not None:
                self._validate_within_epoch(due)
            t0 = time.perf_counter()
            loss, frames = self.train_step(batch)
            state.train_seconds += time.perf_counter() - t0
            state.step += 1
            self.coordinator.after_step(state)
            state.frames += frames
            state.epoch_loss_sum += loss * frames
            state.epoch_loss_frames += frames
            window.add(loss, frames)
            done_steps += 1
            if state.step % self.config.log_every == 0:
                shown.window_rate(window.log(self.metrics, state.step, state.epoch + 1,
                                             self.optimizer.param_groups[0]["lr"]))
            so_far = state.epoch_loss_sum / state.epoch_loss_frames if state.epoch_loss_frames else None
            shown.update(self.coordinator.shown_done(self.sampler, done_steps), frames, so_far)
            due = self.coordinator.validation_after_step(done_steps, total, every)
            if due is not None:
                self._validate_within_epoch(due)
            if self.checkpointer.due(state.step) and done_steps < total:
                self.save_checkpoint()  # (the epoch's end saves its own)
            if self._done():
                stopped = True
                break
        shown.close()
        return self.coordinator.finished(stopped, done_steps, total)

    def _record_epochs_the_lost_leader_did_not(self) -> None:
        """Rank 0 lost after an epoch's end and before its record (while it validated, which only
        it does) leaves that epoch unrecorded: the learner taking over records it from its own
        history, the job's figures without the validation rank 0 did not finish."""
        recorded = {r.get("epoch") for r in read_metrics(self.run_dir) if r.get("kind") == "epoch"}
        for past in self.state.history:
            if past["epoch"] not in recorded:
                self.metrics.log("epoch", self.state.step, **past)
                print(f"[asrdist] note: epoch {past['epoch']}: recorded by rank {self.ctx.job_rank}, without "
                      f"validation: rank 0 was lost before it recorded the epoch", file=sys.stderr, flush=True)

    def _validation_point(self, progress: float) -> dict[str, Any]:
        """Where a validation falls: epoch, step, epochs done (`epoch_progress`), the run's wall
        seconds (as an epoch's record has them) and its seconds spent validating before it."""
        return {"epoch": self.state.epoch + 1, "step": self.state.step, "epoch_progress": round(progress, 4),
                "wall_seconds": round(self.clock.wall(), 3),
                "validation_seconds": round(self.state.validation_seconds, 3)}

    def _validate_within_epoch(self, done: float) -> None:
        """`train.validate_every`: the consensus validated as at an epoch's end (with the strategy's
        epoch-end figures: adpsgd's consensus distance), `done` of the epoch done; recorded in
        `state.validations` and metrics.jsonl (kind `validation`). The random number generators
        are left as they were: a run trains the same model with validations or without."""
        record = self._validation_point(self.state.epoch + done)
        devices = [self.ctx.device] if torch.device(self.ctx.device).type == "cuda" else []
        t0 = time.perf_counter()
        with torch.random.fork_rng(devices=devices):
            with self.strategy.paused():
                record.update(self.strategy.epoch_end_metrics())
            self.validator.validate(self.model, record, self.state.epoch)
        self.state.validation_seconds += time.perf_counter() - t0
        self.state.validations.append(record)
        self.metrics.log("validation", self.state.step, **{k: v for k, v in record.items() if k != "step"})

    def _end_epoch(self) -> None:
        state = self.state
        # wall_seconds: the job's time to this epoch's model (since training started, every start
        # summed), taken before validation: what `compare` reads time to a target from
        # records number epochs from 1, as the progress line and the checkpoints (epoch-N) do
        point = self._validation_point(float(state.epoch + 1))
        record: dict[str, Any] = {"epoch": state.epoch + 1, "train_loss": None, "wall_seconds": point["wall_seconds"]}
        last = state.epoch == self.config.epochs - 1 or self._done()
        with self.strategy.paused():
            self.coordinator.end_epoch(record, state, self.sampler)
            record.update(self.strategy.epoch_end_metrics())
        validated = None
        if self.validator.due(state.epoch, last):
            t0 = time.perf_counter()
            validated = self.validator.validate(self.model, record, state.epoch)
            state.validation_seconds += time.perf_counter() - t0
            if self.config.validate_every:
                state.validations.append({**point, **{k: v for k, v in record.items()
                                                      if k not in point and k != "minibatches_by_learner"}})
        if self.epoch_average.wants(state.epoch, last):  # the same epochs on every learner: a collective
            with self.strategy.paused():
                self.epoch_average.add(state.epoch, validated if validated is not None
                                       else self.validator.consensus(self.model))
        leads = self.validator.leads()
        if leads and not self.metrics.enabled:
            # the first survivor takes over the job's record from a lost rank 0: appended to, never
            # cut at this learner's own step count (the records are of rank 0's steps)
            self.metrics = MetricsLog(self.run_dir, resume_step=math.inf)
            self._record_epochs_the_lost_leader_did_not()
        warn_if_loss_rose(record, state.history, self.strategy, self.ctx.job_rank)
        state.history.append(record)
        self.metrics.log("epoch", state.step, **record)
        if leads:
            print(epoch_line(record), flush=True)
        state.epoch += 1
        self.save_checkpoint()
