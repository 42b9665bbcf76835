"""The one training loop. It knows neither the strategy nor the speech task behind its inputs.

Per minibatch: schedule -> forward/backward (or emulated compute) -> strategy.after_backward ->
strategy.apply_update(max-change, optimizer.step, zero_grad) -> strategy.after_step -> straggler
delay -> metrics / checkpoint. Epoch end: validation of the consensus model (the learners'
average) and a checkpoint. Every learner runs this same loop; checkpoint, snapshot, restore and
validation run inside `strategy.paused()`, and `strategy.close(error)` runs on the way out.

Lock-step strategies (`strategy.lockstep`) keep per-learner samplers and exact resume; the others
get a `JobEpochSampler` (epochs belong to the job), a checkpoint only at epoch ends, published
without a barrier when every rank has written its file (the job store counts them), and resume
from the start of the last completed epoch. Epoch start (after the first epoch): an optional
`batch_search` hook may try minibatch sizes from an in-memory snapshot and install a sampler at
the size it picks (onebit's auto_batch_size).
"""
from __future__ import annotations

import copy
import math
import random
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterable, Protocol

import torch

from asrdist.data.job_sampler import JobEpochSampler
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.consensus import consensus_copy, job_totals
from asrdist.parallel.membership import progress_key
from asrdist.train import checkpoint as ckpt
from asrdist.train.metrics import MetricsLog
from asrdist.train.progress import EpochProgress
from asrdist.utils.throughput import job_frames_per_second, learner_frames_per_second


class Sampler(Protocol):
    def set_epoch(self, epoch: int) -> None: ...
    def __iter__(self): ...
    def __len__(self) -> int: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


DIVERGED_KEY = "run/diverged"
"""Set in the job store by the leader of learners that do not move in lock step when the model
it validated had diverged."""


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


class Trainer:
    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy,
                 sampler: Sampler, hooks: TrainerHooks, ctx: LearnerContext, run_dir: Path, *,
                 epochs: int, max_steps: int = 0, log_every: int = 20, checkpoint_every: int = 0,
                 checkpoint_minutes: float = 0.0, validate_every_epochs: int = 1, emulate_compute_ms: float = 0.0,
                 straggler_ranks: Iterable[int] = (), straggler_slowdown: float = 1.0,
                 straggler_jitter: float = 0.0, progress: bool = True, nonfinite: str = "stop",
                 max_skips_in_a_row: int = 10):
        if log_every < 1 or validate_every_epochs < 1 or checkpoint_every < 0 or max_steps < 0:
            raise ConfigError("trainer: log_every and validate_every_epochs must be >= 1, "
                              "checkpoint_every and max_steps >= 0")
        self.model, self.optimizer, self.strategy = model, optimizer, strategy
        self.sampler, self.hooks, self.ctx, self.run_dir = sampler, hooks, ctx, Path(run_dir)
        self.epochs, self.max_steps, self.log_every = epochs, max_steps, log_every
        self.checkpoint_every, self.validate_every_epochs = checkpoint_every, validate_every_epochs
        self._timed = ckpt.TimedCheckpoints(checkpoint_minutes, ctx.store, ctx.job_rank, ctx.job_world_size)
        self.emulate_compute_ms = emulate_compute_ms
        self.slowdown = straggler_slowdown if ctx.rank in set(straggler_ranks) else 1.0
        self.jitter = straggler_jitter
        self._jitter_rng = random.Random(ctx.seed * 1000 + ctx.rank)
        self.progress = progress and ctx.job_rank == 0
        self.state = LoopState()
        self.nonfinite, self.max_skips_in_a_row = nonfinite, max_skips_in_a_row
        self.skipped = 0
        """Minibatches dropped for a non-finite loss or gradient (`nonfinite: skip`)."""
        self._skips_in_a_row = 0
        self.trial = False
        """Batch-size search trials: a non-finite loss is returned (the trial is rejected), not raised,
        so every learner still reaches the strategy's collectives."""
        self.metrics: MetricsLog | None = None
        self.compute_seconds = 0.0
        self._started, self._wall_before = time.perf_counter(), 0.0  # this start; earlier starts (resume)
        self._loop_started: float | None = None  # when this start's epoch loop began
        self._loop_before = 0.0
        self._synthetic: list[torch.Tensor] | None = None
        self._synthetic_grads: list[torch.Tensor] | None = None

    # -- one step -------------------------------------------------------------------------
    def train_step(self, batch: Any) -> tuple[float, int]:
        """One minibatch on this learner; returns (loss, frames). Benchmarks call this too."""
        lr = self.hooks.lr_at(self.state.schedule_step, self.state.epoch) * self.strategy.lr_scale()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        t0 = time.perf_counter()
        if self.emulate_compute_ms > 0:
            loss_value, frames = self._emulated_compute(batch)
        else:
            self.model.train()
            loss, frames = self.hooks.loss_fn(self.model, batch)
            loss_value = float(loss.detach())
            if math.isfinite(loss_value):
                loss.backward()
            elif self.nonfinite == "skip" or self.trial:
                self._poison_gradients()
            else:
                raise TrainingError(f"rank {self.ctx.job_rank}: loss is {loss_value} at step {self.state.step} "
                                    f"(epoch {self.state.epoch}); lower optim.lr or check the data "
                                    f"(or train.nonfinite=skip)")
        compute = time.perf_counter() - t0
        self.compute_seconds += compute
        self.strategy.note_samples(frames)
        if math.isfinite(loss_value):
            self.strategy.note_loss(loss_value)
        self.strategy.after_backward()
        if self.trial or self.emulate_compute_ms > 0 or self._gradients_finite():
            self._skips_in_a_row = 0
            self.strategy.apply_update(lambda: self._update_parameters(lr))
        else:
            self._skip_step(loss_value)
        self.strategy.after_step()
        delay = (self.slowdown - 1.0) * compute
        if self.jitter > 0:
            delay += self._jitter_rng.uniform(0.0, self.jitter) * compute
        if delay > 0:
            time.sleep(delay)
        return loss_value, frames

    # -- non-finite losses and gradients ------------------------------------------------------
    def _poison_gradients(self) -> None:
        """A non-finite loss becomes NaN gradients: a lock-step exchange (a sum) then hands every
        learner of the step a non-finite result, so all of them drop the minibatch together."""
        for p in self.model.parameters():
            if p.requires_grad:
                p.grad = torch.full_like(p, math.nan)

    def _gradients_finite(self) -> bool:
        """Whether every gradient the update would use is finite (after the strategy's exchange)."""
        grads = [p.grad for p in self.model.parameters() if p.grad is not None]
        # A sum is finite when every term is (NaN and inf propagate): one cheap reduction per
        # tensor on the common path; only a non-finite sum (or an overflowing one) looks closer.
        return (not grads or bool(torch.stack([g.sum() for g in grads]).isfinite().all())
                or bool(torch.stack([torch.isfinite(g).all() for g in grads]).all()))

    def _skip_step(self, loss_value: float) -> None:
        where = f"at step {self.state.step} (epoch {self.state.epoch})"
        if self.nonfinite != "skip":
            raise TrainingError(f"rank {self.ctx.job_rank}: non-finite gradient {where} (loss {loss_value:g}); "
                                f"lower optim.lr or check the data (or train.nonfinite=skip)")
        self.skipped += 1
        self._skips_in_a_row += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.strategy.discard_step()
        if self.metrics is not None:
            self.metrics.log("skipped", self.state.step, epoch=self.state.epoch, loss=loss_value,
                             skipped=self.skipped)
        if self._skips_in_a_row >= self.max_skips_in_a_row:
            raise TrainingError(f"rank {self.ctx.job_rank}: {self._skips_in_a_row} minibatches in a row had a "
                                f"non-finite loss or gradient (last {where}); train.nonfinite=skip gives up: "
                                f"lower optim.lr or check the data")

    def _update_parameters(self, lr: float) -> None:
        if self.hooks.before_optimizer_step is not None:
            self.hooks.before_optimizer_step(lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _emulated_compute(self, batch: Any) -> tuple[float, int]:
        time.sleep(self.emulate_compute_ms / 1000.0)
        params = [p for p in self.model.parameters() if p.requires_grad]
        if self._synthetic is None:
            # Drawn once: a fresh randn of a 46M-parameter model per step costs more than the
            # compute it emulates. Strategies write p.grad in place, so refill a separate buffer.
            gen = torch.Generator().manual_seed(self.ctx.seed * 7919 + self.ctx.rank * 104729)
            self._synthetic = [(torch.randn(p.shape, generator=gen) * 1e-3).to(p.device) for p in params]
            self._synthetic_grads = [torch.empty_like(p) for p in params]
        for p, g, buf in zip(params, self._synthetic, self._synthetic_grads):
            buf.copy_(g)
            p.grad = buf
        return 0.0, int(getattr(batch, "num_frames", 0))

    # -- checkpoints ----------------------------------------------------------------------
    def _clock_loop(self) -> None:
        if self._loop_started is not None:
            self.state.loop_seconds = self._loop_before + time.perf_counter() - self._loop_started

    def _learner_state(self) -> dict:
        self.state.wall_seconds = self._wall_before + time.perf_counter() - self._started
        self._clock_loop()
        return {"model": self.model.state_dict(), "optimizer": self.optimizer.state_dict(),
                "strategy": self.strategy.state_dict(), "sampler": self.sampler.state_dict(),
                "loop": self.state.__dict__.copy(), "rng": ckpt.rng_state(),
                "jitter_rng": self._jitter_rng.getstate(),
                "extra": self.hooks.extra_state() if self.hooks.extra_state else None}

    @property
    def job_epochs(self) -> bool:
        return isinstance(self.sampler, JobEpochSampler)

    def _checkpoint_tag(self) -> str:
        """The name of the checkpoint of this learner's state now: epoch-E (job epochs) or step-N."""
        return f"epoch-{self.state.epoch:04d}" if self.job_epochs else ckpt.step_tag(self.state.step)

    def save_checkpoint(self) -> None:
        """This learner's file, then the job checkpoint is published by whichever rank writes the
        last file for it (the job store counts them): no barrier. Once learners are lost (survival
        mode) the survivors agreed at the last sync point (the epoch end's) are the ones that must
        have written: their checkpoint is published with the list of who wrote it."""
        members = self.strategy.survivors()[1]
        lost = len(members) < self.ctx.job_world_size
        if self.ctx.job_rank not in members:
            return
        tag = self._checkpoint_tag()
        with self.strategy.paused():
            state = self._learner_state()
        ckpt.save_learner(self.run_dir, tag, self.ctx.job_rank, state)
        key = f"checkpoint/{tag}" + (f"/members-{','.join(map(str, members))}" if lost else "")
        written = int(self.ctx.store.add(key, 1)) if self.ctx.store is not None else 1
        if written == len(members):
            ckpt.publish(self.run_dir, tag, self.ctx.job_world_size, members=members if lost else None,
                         group_size=self.ctx.group_size if self.strategy.moves_by_node else 1,
                         progress={"epoch": self.state.epoch, "epochs": self.epochs, "step": self.state.step})

    def snapshot(self) -> dict:
        """This learner's whole state (as a checkpoint holds it), copied in memory."""
        with self.strategy.paused():
            return copy.deepcopy(self._learner_state())

    def restore_snapshot(self, state: dict) -> None:
        """Load a `snapshot()` or checkpoint dict; the tensors may be kept, so pass a copy to reuse one."""
        with self.strategy.paused():
            self._restore(state)

    def _restore(self, state: dict) -> None:
        self.model.load_state_dict(state["model"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.strategy.load_state_dict(state["strategy"])
        loop = LoopState(**state["loop"])
        if "schedule_step" not in state["loop"]:  # a checkpoint from before the schedule clock
            loop.schedule_step = float(loop.step)
        if loop.batch_size != self.state.batch_size and self.hooks.sampler_at is not None:
            self.sampler = self.hooks.sampler_at(loop.batch_size)  # self.sampler runs at state.batch_size
        self.sampler.load_state_dict(state["sampler"])
        self.state = loop
        ckpt.set_rng_state(state["rng"])
        self._jitter_rng.setstate(state["jitter_rng"])
        if self.hooks.load_extra_state and state.get("extra") is not None:
            self.hooks.load_extra_state(state["extra"])

    def _size_ratio(self) -> float:
        size, base = self.state.batch_size, self.hooks.base_batch_size
        return size / base if size and base else 1.0

    def resume(self) -> None:
        state = ckpt.load_learner(self.run_dir, self.ctx.job_rank, self.ctx.job_world_size)
        checkpoint = ckpt.latest_step_dir(self.run_dir)
        path = checkpoint / f"rank-{self.ctx.job_rank}.pt"
        try:
            self.restore_snapshot(state)
        except (KeyError, TypeError, ValueError, RuntimeError, AttributeError) as exc:
            # a readable archive with other contents (another run's file, a hand-edited one)
            what = f"no '{exc.args[0]}' entry" if isinstance(exc, KeyError) else \
                " ".join(str(exc).split())[:200] or type(exc).__name__
            raise TrainingError(f"{path}: not this run's checkpoint ({what}); "
                                f"{ckpt.resume_advice(self.run_dir, checkpoint, self.ctx.job_world_size)}") from None
        holds = self._checkpoint_tag()
        if holds != checkpoint.name:  # its learners would meet at different points and wait for each other
            raise TrainingError(f"{path}: holds {holds}, not {checkpoint.name}: a file of another checkpoint; "
                                f"{ckpt.resume_advice(self.run_dir, checkpoint, self.ctx.job_world_size)}")
        if self.job_epochs and self.ctx.job_rank == 0:
            print(f"[asrdist] resuming at the start of epoch {self.state.epoch + 1} (the last job checkpoint; "
                  f"an asynchronous strategy does not resume mid-epoch)", flush=True)

    # -- the loop -------------------------------------------------------------------------
    def fit(self, resume: bool = False) -> LoopState:
        error: BaseException | None = None
        self._started = time.perf_counter()
        try:
            if resume:
                self.resume()
                self._wall_before = self.state.wall_seconds
            self.metrics = MetricsLog(self.run_dir, enabled=self.ctx.job_rank == 0,
                                      resume_step=self.state.step if resume else None)
            self._start_line()
            self._loop_started, self._loop_before = time.perf_counter(), self.state.loop_seconds
            self._train(mid_epoch=resume and self.sampler.state_dict().get("position", 0) > 0)
            self._clock_loop()
        except BaseException as exc:
            error = exc
            raise
        finally:
            if self.metrics is not None:
                self.metrics.close()
            self.strategy.close(error)
        self.strategy.finalize()
        self.state.wall_seconds = self._wall_before + time.perf_counter() - self._started
        return self.state

    def _start_line(self) -> None:
        """Learners that move at their own pace start together (through the job store), so that
        one learner's slower set-up does not hand the first epoch to the others."""
        if self.job_epochs and self.ctx.store is not None and self.ctx.job_world_size > 1:
            if int(self.ctx.store.add("start/ready", 1)) == self.ctx.job_world_size:
                self.ctx.store.set("start/go", "1")
            self.ctx.store.wait(["start/go"], self.ctx.timeout)

    def _train(self, mid_epoch: bool) -> None:
        while self.state.epoch < self.epochs:
            self.strategy.start_epoch(self.state.epoch)
            if self.job_epochs:
                self.sampler.lockstep = self.strategy.lockstep_now
            if not mid_epoch:
                self.sampler.set_epoch(self.state.epoch)
                if self.hooks.batch_search is not None and self.state.epoch > 0:
                    self.hooks.batch_search(self)
            mid_epoch = False
            if not self._run_epoch():  # max_steps or the strategy stopped it mid-epoch
                if not self.job_epochs:
                    self.save_checkpoint()
                break
            self._end_epoch()
            if self._done():
                break

    def _done(self) -> bool:
        return (self.max_steps > 0 and self.state.step >= self.max_steps) or self.strategy.should_stop()

    def _run_epoch(self) -> bool:
        """Train until the epoch's data is used up (True) or training must stop (False)."""
        total = len(self.sampler)
        start = self.sampler.state_dict().get("position", 0)
        shown = EpochProgress(self.state.epoch, self.epochs, total, start, enabled=self.progress)
        window = _RateWindow(self.ctx.store)
        losses: list[float] = []
        if start == 0:
            self.state.epoch_loss_sum, self.state.epoch_loss_frames = 0.0, 0
        finished, done_steps = True, start
        for batch in self.sampler:
            if self.job_epochs:
                self.state.schedule_step = self.sampler.schedule_step()
            t0 = time.perf_counter()
            loss, frames = self.train_step(batch)
            self.state.train_seconds += time.perf_counter() - t0
            self.state.step += 1
            if not self.job_epochs:
                self.state.schedule_step += self._size_ratio()
            elif self.ctx.store is not None and self.ctx.job_world_size > 1:  # who was lost when
                self.ctx.store.set(progress_key(self.ctx.job_rank), str(self.state.step))
            self.state.frames += frames
            losses.append(loss)
            self.state.epoch_loss_sum += loss * frames
            self.state.epoch_loss_frames += frames
            window.add(frames)
            done_steps += 1
            if self.state.step % self.log_every == 0:
                learner_fps, job_fps = window.rates()
                mean_loss = sum(losses) / len(losses)
                shown.window_rate(job_fps)
                self.metrics.log("train", self.state.step, epoch=self.state.epoch, loss=mean_loss,
                                 frames_per_second=job_fps, learner_frames_per_second=learner_fps,
                                 lr=self.optimizer.param_groups[0]["lr"])
                losses = []
            so_far = self.state.epoch_loss_sum / self.state.epoch_loss_frames if self.state.epoch_loss_frames else None
            shown.update(self.sampler.claimed + 1 if self.job_epochs else done_steps, frames, so_far)
            every = self.checkpoint_every and self.state.step % self.checkpoint_every == 0
            timed = not self.job_epochs and self._timed.due(self.state.step)  # (lock step only)
            if (timed or every) and not self.job_epochs and done_steps < total:
                self.save_checkpoint()  # (the epoch's end saves its own)
            if self._done():
                finished = False
                break
        if not self.job_epochs:
            finished = done_steps >= total
        shown.close()
        return finished

    def _end_epoch(self) -> None:
        # wall_seconds: the job's time to this epoch's model (since training started, every start
        # summed), taken before validation: what `compare` reads time to a target from
        record: dict[str, Any] = {"epoch": self.state.epoch, "train_loss": None,
                                  "wall_seconds": round(self._wall_before + time.perf_counter() - self._started, 3)}
        if self.job_epochs:
            record["minibatches"] = self.sampler.last_taken  # this learner's share of the job's epoch
        last = self.state.epoch == self.epochs - 1 or self._done()
        with self.strategy.paused():
            # the job's loss, frame-weighted over the learners (a learner of a shared epoch may take
            # few minibatches or none while it validates)
            # and, in a job's epoch, every learner's share of it (each adds its own count in its slot)
            # (and the minibatches of lost learners it trained again, survival mode)
            def totals(group, members):
                shares = [0.0] * len(members) if self.job_epochs else []
                if shares:
                    shares[members.index(self.ctx.job_rank)] = float(self.sampler.last_taken)
                again = [float(self.sampler.last_retrained)] if self.job_epochs else []
                summed = job_totals([self.state.epoch_loss_sum, self.state.epoch_loss_frames, *again, *shares],
                                    world_size=len(members), device=self.ctx.device, group=group,
                                    timeout=self.ctx.timeout)
                return summed, members

            (loss_sum, frames, *shares), members = self.strategy.among_survivors(totals)
            record["train_loss"] = loss_sum / frames if frames > 0 else None
            if shares:
                retrained, *shares = shares
                record["minibatches_by_learner"] = {str(rank): int(n) for rank, n in zip(members, shares)}
                if self.strategy.lost_learners():
                    self._record_lost_minibatches(record, int(retrained))
            record.update(self.strategy.epoch_end_metrics())
        if self.hooks.validate_fn and ((self.state.epoch + 1) % self.validate_every_epochs == 0 or last):
            with self.strategy.paused():
                self._stop_if_told_diverged()
                model = self.strategy.among_survivors(lambda group, members: consensus_copy(
                    self.model, world_size=len(members), group=group, timeout=self.ctx.timeout))
                record.update(self.hooks.validate_fn(model) if self._leads() else {})
                self._stop_if_diverged(record)
        leads = self._leads()
        if leads and not self.metrics.enabled:
            # the first survivor takes over the job's record from a lost rank 0: appended to, never
            # cut at this learner's own step count (the records are of rank 0's steps)
            self.metrics = MetricsLog(self.run_dir, resume_step=math.inf)
        if lost := self.strategy.lost_learners():
            record["lost_learners"] = [x["rank"] for x in lost]
        self._warn_if_loss_rose(record)
        self.state.history.append(record)
        self.metrics.log("epoch", self.state.step, **record)
        if leads:
            shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                              if k != "minibatches_by_learner")  # one entry per learner: metrics.jsonl only
            print(f"[asrdist] {shown}", flush=True)
        self.state.epoch += 1
        self.save_checkpoint()

    def _record_lost_minibatches(self, record: dict, retrained: int) -> None:
        """Survival mode: what the lost learners finished of this epoch joins their shares; the
        minibatches they held unfinished were trained again by survivors (`minibatches_retrained`)
        or, when their loss came too late in the epoch, not (`minibatches_lost`)."""
        finished, left = self.sampler.lost_shares(self.state.epoch)
        shares = record["minibatches_by_learner"]
        for rank, n in finished.items():
            shares.setdefault(str(rank), n)
        record["minibatches_by_learner"] = {k: shares[k] for k in sorted(shares, key=int)}
        size = self.sampler.group_size  # a node takes whole units of its size: a remainder is never handed out
        record["minibatches_in_epoch"] = len(self.sampler) // size * size
        record["minibatches_retrained"], record["minibatches_lost"] = retrained, left

    def _verdict_agreed_at_once(self) -> bool:
        """Whether the learners agree on the leader's validation verdict right away: lock-step
        learners would wait for the leader in their next exchange anyway. Learners that go on while
        it validates (adpsgd) find its verdict in the job store at their next epoch end instead."""
        return self.strategy.lockstep_now or self.ctx.store is None or self.ctx.job_world_size == 1

    def _stop_if_told_diverged(self) -> None:
        """The leader's verdict of an earlier epoch end, from the job store, before this epoch end's
        exchanges (learners out of lock step)."""
        if not self._verdict_agreed_at_once() and self.ctx.store.check([DIVERGED_KEY]):
            raise TrainingError(f"rank {self.ctx.job_rank}: {self.ctx.store.get(DIVERGED_KEY).decode()}")

    def _stop_if_diverged(self, record: dict) -> None:
        """A non-finite validation loss means the model the job would keep has diverged (each
        minibatch's loss can stay finite while the weights grow without bound): every learner stops
        with the same line. The leader validates (`record` holds its figures)."""
        loss = record.get("valid_loss")
        diverged = loss is not None and not math.isfinite(loss)
        at_once = self._verdict_agreed_at_once()
        if at_once:
            diverged = self.strategy.among_survivors(lambda group, members: job_totals(
                [float(diverged)], world_size=len(members), device=self.ctx.device, group=group,
                timeout=self.ctx.timeout))[0] > 0
        if diverged:
            train_loss = record.get("train_loss")
            shown = f"{train_loss:.4g}" if train_loss is not None else "none"
            verdict = (f"the model diverged in epoch {self.state.epoch}: its validation loss is not finite "
                       f"(train loss {shown}); lower optim.lr or check the data")
            if not at_once:
                self.ctx.store.set(DIVERGED_KEY, verdict)
            raise TrainingError(f"rank {self.ctx.job_rank}: {verdict}")

    def _leads(self) -> bool:
        """Whether this learner speaks for the job: rank 0, or the first survivor once it is lost."""
        return self.ctx.job_rank == self.strategy.survivors()[1][0]

    def _warn_if_loss_rose(self, record: dict) -> None:
        """A strategy with advice for it (onebit) warns when an epoch's training loss is above the last one's."""
        advice = self.strategy.rising_loss_advice
        previous = self.state.history[-1]["train_loss"] if self.state.history else None
        if advice is None or previous is None or record["train_loss"] is None or not record["train_loss"] > previous:
            return
        record["loss_rose"] = True
        if self.ctx.job_rank == 0:
            print(f"[asrdist] warning: {self.strategy.name}: train loss rose from {previous:.4f} to "
                  f"{record['train_loss']:.4f} in epoch {record['epoch']}; {advice}", flush=True)


class _RateWindow:
    """Frames per second over a logging window: this learner's, and the job's (every learner adds
    its frames to one counter in the job store; rank 0's rate is the counter's growth over its
    window: the job's frames over wall seconds, `asrdist.utils.throughput`)."""

    def __init__(self, store):
        self.store, self.frames, self.t0 = store, 0, time.perf_counter()
        self.job0 = self._job_total(0)

    def _job_total(self, add: int) -> int | None:
        return int(self.store.add("frames", add)) if self.store is not None else None

    def add(self, frames: int) -> None:
        self.frames += frames

    def rates(self) -> tuple[float, float]:
        now = time.perf_counter()
        elapsed = max(now - self.t0, 1e-9)
        total = self._job_total(self.frames)
        learner = learner_frames_per_second(self.frames, elapsed)
        job = (job_frames_per_second([total - self.job0], [elapsed]) if total is not None and self.job0 is not None
               else learner)
        self.frames, self.t0, self.job0 = 0, now, total
        return learner, job
