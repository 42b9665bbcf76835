"""One minibatch on one learner: the step every strategy, benchmark and test trains through.

learning rate (schedule x `strategy.lr_scale()`) -> forward/backward (or emulated compute; in
`train.accumulate` micro-batches, under bf16 autocast with `train.precision: bf16`) ->
strategy.note_samples -> strategy.after_backward -> strategy.note_loss ->
strategy.apply_update(max-change, optimizer.step, zero_grad) -> strategy.after_step -> straggler
delay. With `train.nonfinite: stop` the loss is read once, after the exchange, with the
gradients' check: on a GPU the host queues a step without waiting for the device in between. A
non-finite loss or gradient stops the run naming the step (`train.nonfinite: stop`) or drops the
minibatch on every learner of a lock-step exchange together (`skip`), up to `max_skips_in_a_row`.
"""
from __future__ import annotations

import contextlib
import math
import random
import time
from typing import Any

import torch

from asrdist.errors import TrainingError
from asrdist.train.loop import LoopConfig


def gradient_norms(params: list[torch.Tensor]) -> list[torch.Tensor]:
    """Each gradient's norm, by torch's multi-tensor kernel (as clip_grad_norm_ takes them)."""
    grads = [p.grad for p in params if p.grad is not None]
    return torch._foreach_norm(grads) if grads else []


def gradients_finite(params: list[torch.Tensor], norms: list[float] | None = None) -> bool:
    """Whether every gradient the update would use is finite (after the strategy's exchange);
    `norms`: `gradient_norms` already read, if they were."""
    # A norm is finite when every term is (NaN and inf propagate): on the common path one
    # multi-tensor kernel for all gradients; only a non-finite norm (or an overflowing one)
    # looks closer, element by element.
    if norms is None:
        tensors = gradient_norms(params)
        norms = torch.stack(tensors).tolist() if tensors else []
    if all(math.isfinite(norm) for norm in norms):
        return True
    return bool(torch.stack([torch.isfinite(p.grad).all() for p in params if p.grad is not None]).all())


class Stepper:
    """The step of `Trainer.train_step`; `hooks` are the trainer's (loss_fn, lr_at, before_optimizer_step).
    It owns the step's counters (`skipped`, `compute_seconds`) and the batch search's `trial` mode."""

    def __init__(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Any, hooks: Any,
                 ctx: Any, config: LoopConfig):
        self.model, self.optimizer, self.strategy, self.hooks, self.ctx = model, optimizer, strategy, hooks, ctx
        self.config = config
        straggler = config.straggler
        self.slowdown = straggler.slowdown if ctx.rank in set(straggler.ranks) else 1.0
        self.jitter_rng = random.Random(ctx.seed * 1000 + ctx.rank)
        self.skipped = 0
        """Minibatches dropped for a non-finite loss or gradient (`nonfinite: skip`)."""
        self._skips_in_a_row = 0
        self.trial = False
        """Batch-size search trials: a non-finite loss is returned (the trial is rejected), not raised,
        so every learner still reaches the strategy's collectives."""
        self.compute_seconds = 0.0
        """Seconds in forward/backward (or its emulation), over this start's steps."""
        self._synthetic: list[torch.Tensor] | None = None
        self._synthetic_grads: list[torch.Tensor] | None = None
        self._device_type = torch.device(ctx.device).type
        """autocast's device type (`train.precision: bf16`)."""
        self._params = list(model.parameters())
        """The model's parameters, listed once (a model's modules are walked for each listing)."""

    def run(self, batch: Any, loop: Any, metrics: Any = None) -> tuple[float, int]:
        """Train `batch` at loop state `loop` (its step, epoch and schedule clock; not advanced
        here); returns (loss, frames). `metrics` records skipped minibatches."""
        lr = self.hooks.lr_at(loop.schedule_step, loop.epoch) * self.strategy.lr_scale()
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        if self.config.emulate_compute_ms <= 0 and self.config.nonfinite == "stop" and not self.trial:
            loss_value, frames, compute = self._read_once(batch, loop, lr)
        else:
            t0 = time.perf_counter()
            if self.config.emulate_compute_ms > 0:
                loss_value, frames = self._emulated_compute(batch)
            else:
                loss_value, frames = self._forward_backward(batch, loop)
            compute = time.perf_counter() - t0
            self.compute_seconds += compute
            self.strategy.note_samples(frames)
            self.strategy.after_backward()
            if math.isfinite(loss_value):
                self.strategy.note_loss(loss_value)
            if self.trial or self.config.emulate_compute_ms > 0 or gradients_finite(self._params):
                self._skips_in_a_row = 0
                self.strategy.apply_update(lambda: self._update_parameters(lr))
            else:
                self._skip_step(loss_value, loop, metrics)
        self.strategy.after_step()
        delay = (self.slowdown - 1.0) * compute
        if self.config.straggler.jitter > 0:
            delay += self.jitter_rng.uniform(0.0, self.config.straggler.jitter) * compute
        if delay > 0:
            time.sleep(delay)
        return loss_value, frames

    def _precision(self):
        """bf16 autocast with `train.precision: bf16`; nothing to enter otherwise (an autocast
        context costs the host microseconds a step even when it is off)."""
        if self.config.precision == "bf16":
            return torch.autocast(self._device_type, dtype=torch.bfloat16)
        return contextlib.nullcontext()

    def _read_once(self, batch: Any, loop: Any, lr: float) -> tuple[float, int, float]:
        """The step of `train.nonfinite: stop` (not a batch-size trial): forward and backward, the
        strategy's exchange, then the loss and the gradients' finiteness read together, the
        device's one wait of the step (on a GPU the host queues the step's kernels without waiting
        in between); a non-finite loss or gradient stops the run before the update. Returns (loss,
        frames, compute seconds: forward and backward, timed on the device where it queues)."""
        timer = _ComputeTimer(self._device_type)
        losses, frames = self._forward_backward_queued(batch)
        timer.stop()
        self.strategy.note_samples(frames)
        self.strategy.after_backward()
        # the gradients' norms read with the losses in one copy (stack promotes their dtypes)
        read = torch.stack([*(loss for loss, _, _ in losses), *gradient_norms(self._params)]).tolist()
        compute = timer.seconds()
        self.compute_seconds += compute
        loss_value = sum(weight * value for (_, weight, _), value in zip(losses, read))
        for (_, _, label), value in zip(losses, read):
            if not math.isfinite(value):
                raise self._loss_error(value, loop, label)
        self.strategy.note_loss(loss_value)
        if not gradients_finite(self._params, read[len(losses):]):
            self._skip_step(loss_value, loop, None)  # raises: nonfinite is stop
        self._skips_in_a_row = 0
        self.strategy.apply_update(lambda: self._update_parameters(lr))
        return loss_value, frames, compute

    def _micro_batches(self, batch: Any):
        """The model in training mode, then `batch` in `train.accumulate` micro-batches
        (`batch.split`): yields (module to call, micro-batch, its weight: its share of the batch's
        frames, its label for a message), each but the last inside the strategy's `no_sync()` while
        its caller goes on."""
        if not self.model.training:
            self.model.train()
        module = self.strategy.forward_module(self.model)
        parts = batch.split(self.config.accumulate) if self.config.accumulate > 1 else [batch]
        total = sum(part.num_frames for part in parts)
        for i, part in enumerate(parts):
            weight = part.num_frames / total if len(parts) > 1 and total > 0 else 1.0
            label = f" (micro-batch {i + 1} of {len(parts)})" if len(parts) > 1 else ""
            with contextlib.nullcontext() if i == len(parts) - 1 else self.strategy.no_sync():
                yield module, part, weight, label

    def _forward_backward_queued(self, batch: Any) -> tuple[list[tuple[torch.Tensor, float, str]], int]:
        """`_forward_backward` without reading a loss: each micro-batch's (loss tensor, weight, label)."""
        losses, frames = [], 0
        for module, part, weight, label in self._micro_batches(batch):
            with self._precision():
                loss, n = self.hooks.loss_fn(module, part)
            (loss if weight == 1.0 else loss * weight).backward()
            losses.append((loss.detach(), weight, label))
            frames += n
        return losses, frames

    def _forward_backward(self, batch: Any, loop: Any) -> tuple[float, int]:
        """Forward (under bf16 autocast with `train.precision: bf16`) and backward of `batch`, in
        `train.accumulate` micro-batches (`_micro_batches`), each loss weighted by its share of the
        batch's frames, so that p.grad sums to the gradient of the whole batch's mean loss; each
        loss read as it is made. Returns (the batch's loss, its frames)."""
        loss_value, frames = 0.0, 0
        with contextlib.closing(self._micro_batches(batch)) as parts:  # (leaves no_sync on a raise too)
            for module, part, weight, label in parts:
                with self._precision():
                    loss, n = self.hooks.loss_fn(module, part)
                # backward first, the loss read after: on a GPU the read waits for the device, and
                # backward's kernels are then already queued. A non-finite loss's gradients are NaN
                # (its factor is): an exchange that starts during backward hands every learner of
                # the step NaN, so all of them drop it, as `_poison_gradients` makes the others do
                factor = torch.where(loss.detach().isfinite(), weight, math.nan).to(loss.dtype)
                (loss * factor).backward()
                value = float(loss.detach())
                loss_value, frames = loss_value + weight * value, frames + n
                if math.isfinite(value):
                    continue
                if self.config.nonfinite == "skip" or self.trial:
                    self._poison_gradients()  # the rest of the batch is not computed: the step is dropped
                    return math.nan, int(batch.num_frames)
                raise self._loss_error(value, loop, label)
        return loss_value, frames

    def _loss_error(self, value: float, loop: Any, label: str) -> TrainingError:
        return TrainingError(f"rank {self.ctx.job_rank}: loss is {value} at step {loop.step} (epoch {loop.epoch + 1})"
                             f"{label}; lower optim.lr or check the data (or train.nonfinite=skip)")

    def _poison_gradients(self) -> None:
        """A non-finite loss becomes NaN gradients: a lock-step exchange (a sum) then hands every
        learner of the step a non-finite result, so all of them drop the minibatch together."""
        for p in self._params:
            if p.requires_grad:
                p.grad = torch.full_like(p, math.nan)

    def _skip_step(self, loss_value: float, loop: Any, metrics: Any) -> None:
        where = f"at step {loop.step} (epoch {loop.epoch + 1})"
        if self.config.nonfinite != "skip":
            raise TrainingError(f"rank {self.ctx.job_rank}: non-finite gradient {where} (loss {loss_value:g}); "
                                f"lower optim.lr or check the data (or train.nonfinite=skip)")
        self.skipped += 1
        self._skips_in_a_row += 1
        self.optimizer.zero_grad(set_to_none=True)
        self.strategy.discard_step()
        if metrics is not None:
            metrics.log("skipped", loop.step, epoch=loop.epoch + 1, loss=loss_value, skipped=self.skipped)
        if self._skips_in_a_row >= self.config.max_skips_in_a_row:
            raise TrainingError(f"rank {self.ctx.job_rank}: {self._skips_in_a_row} minibatches in a row had a "
                                f"non-finite loss or gradient (last {where}); train.nonfinite=skip gives up: "
                                f"lower optim.lr or check the data")

    def _update_parameters(self, lr: float) -> None:
        if self.hooks.before_optimizer_step is not None:
            self.hooks.before_optimizer_step(lr)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)

    def _emulated_compute(self, batch: Any) -> tuple[float, int]:
        time.sleep(self.config.emulate_compute_ms / 1000.0)
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


class _ComputeTimer:
    """Forward and backward's seconds: wall time on a CPU (its kernels run as they are called);
    CUDA events on a GPU (its kernels run after the call returns), read after the step's one wait."""

    def __init__(self, device_type: str):
        self._events = None
        if device_type == "cuda":
            self._events = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            self._events[0].record()
        self._t0, self._wall = time.perf_counter(), 0.0

    def stop(self) -> None:
        if self._events is not None:
            self._events[1].record()
        self._wall = time.perf_counter() - self._t0

    def seconds(self) -> float:
        if self._events is None:
            return self._wall
        self._events[1].synchronize()
        return self._events[0].elapsed_time(self._events[1]) / 1000.0
