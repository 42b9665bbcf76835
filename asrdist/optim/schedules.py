"""Learning-rate schedules: a pure function of the global step, so a resumed run is exact.

lr(step) = cfg.lr x scale x batch_scaling x warmup(step) x anneal(epoch) x decay(step): batch
scaling none | linear (Goyal et al. 2017) | sqrt, linear warmup, annealing by `anneal_factor` per
epoch after `anneal_after_epoch` (IBM), and Kaldi's geometric decay to `final_lr`. A run whose
minibatch size changes passes its epoch and counts steps at the configured size. Each factor:
docs/optimizers.md#learning-rate-schedules-optimschedulespy."""
from __future__ import annotations

import math
from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from asrdist.optim.build import OptimConfig


class LRSchedule:
    def __init__(self, cfg: "OptimConfig", steps_per_epoch: int, total_epochs: int, global_batch: int,
                 scale: float = 1.0):
        for name, value in (("steps_per_epoch", steps_per_epoch), ("total_epochs", total_epochs),
                            ("global_batch", global_batch)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"LRSchedule: {name} must be a positive integer, got {value!r}")
        if not scale > 0:
            raise ValueError(f"LRSchedule: scale must be > 0, got {scale}")
        self.cfg = cfg
        self.steps_per_epoch, self.total_epochs = steps_per_epoch, total_epochs
        self.total_steps = steps_per_epoch * total_epochs
        ratio = global_batch / cfg.reference_batch
        batch_scaling = {"none": 1.0, "linear": ratio, "sqrt": math.sqrt(ratio)}[cfg.lr_scaling]
        self.peak_lr = cfg.lr * scale * batch_scaling
        """The learning rate after scaling, before warmup, annealing and decay."""

    def lr_at(self, step: float, epoch: int | None = None) -> float:
        """The rate at global `step`; `epoch` (from 0), if given, is the one annealing uses."""
        if step < 0:
            raise ValueError(f"LRSchedule: negative step {step}")
        if epoch is not None and epoch < 0:
            raise ValueError(f"LRSchedule: negative epoch {epoch}")
        cfg = self.cfg
        lr = self.peak_lr
        if cfg.warmup_steps > 0:
            lr *= min(1.0, (step + 1) / cfg.warmup_steps)
        if cfg.anneal_after_epoch is not None:
            if epoch is None:
                epoch = step // self.steps_per_epoch
            lr *= cfg.anneal_factor ** max(0, epoch - cfg.anneal_after_epoch + 1)
        if cfg.decay == "geometric":
            progress = min(1.0, step / max(1, self.total_steps - 1))
            lr *= (cfg.final_lr / cfg.lr) ** progress
        return lr

    def apply(self, optimizer: torch.optim.Optimizer, step: int) -> float:
        """Set every param group's lr for `step` (times its optional `lr_multiplier`); return the lr."""
        lr = self.lr_at(step)
        for group in optimizer.param_groups:
            group["lr"] = lr * group.get("lr_multiplier", 1.0)
        return lr
