"""Strategy tests train through `Trainer.train_step`, the trainer's own step, never a copy of it.

    trainer = make_trainer(model, optimizer, strategy, lr=0.1)  # after strategy.setup(...)
    losses = train_steps(trainer, [(inputs, targets), ...], after_each=record)

The test sets the strategy up itself (it may load a state in between); the harness only builds
the `Trainer` around it, so every hook (note_samples, note_loss, after_backward, apply_update,
after_step) and the learning rate times `strategy.lr_scale()` come in the trainer's order.
"""
from __future__ import annotations

import tempfile
from typing import Any, Callable, Iterable

import torch
import torch.nn.functional as F

from asrdist.data.batch import Batch
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.train.loop import LoopConfig
from asrdist.train.trainer import Trainer, TrainerHooks


def default_loss(model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
    """Cross-entropy for class targets, mean squared error for real-valued ones."""
    outputs = model(batch.inputs)
    if batch.targets.is_floating_point():
        return F.mse_loss(outputs, batch.targets), batch.num_frames
    return F.cross_entropy(outputs, batch.targets), batch.num_frames


def as_batch(item: Batch | tuple[torch.Tensor, torch.Tensor]) -> Batch:
    """A `Batch`, or an (inputs, targets) pair counted as inputs.shape[0] frames."""
    if isinstance(item, Batch):
        return item
    inputs, targets = item
    return Batch(inputs=inputs, targets=targets, num_frames=int(inputs.shape[0]))


def make_trainer(model: torch.nn.Module, optimizer: torch.optim.Optimizer, strategy: Strategy, *,
                 ctx: LearnerContext | None = None, loss_fn=default_loss,
                 lr: float | Callable[[float, int], float] | None = None, **loop: Any) -> Trainer:
    """A Trainer for `train_step` alone: no sampler, nothing written to its run directory.

    `ctx`: the strategy's context by default. `lr`: a rate, or the trainer's `lr_at(step, epoch)`
    schedule; None keeps the optimizer's rate as it is now (pass it explicitly once a strategy
    with lr_scale() != 1 has stepped this optimizer). `loop`: `LoopConfig` fields (one epoch, no progress)."""
    base_lr = optimizer.param_groups[0]["lr"] if lr is None else lr
    lr_at = base_lr if callable(base_lr) else (lambda step, epoch: base_lr)
    hooks = TrainerHooks(loss_fn=loss_fn, lr_at=lr_at)
    return Trainer(model, optimizer, strategy, None, hooks, ctx or strategy.ctx, tempfile.gettempdir(),
                   LoopConfig(**{"epochs": 1, "progress": False, **loop}))


def train_steps(trainer: Trainer, batches: Iterable[Any],
                after_each: Callable[[], None] | None = None) -> list[float]:
    """`trainer.train_step` on each batch (see `as_batch`), advancing the step and schedule clock
    as the trainer's epoch loop does; `after_each()` runs after every step. Returns the losses."""
    losses = []
    for item in batches:
        loss, _ = trainer.train_step(as_batch(item))
        trainer.state.step += 1
        trainer.state.schedule_step += 1
        losses.append(loss)
        if after_each is not None:
            after_each()
    return losses
