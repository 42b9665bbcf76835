"""Optimizer config and construction: SGD with (Nesterov) momentum, or CNTK's AdaGrad."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

import torch

from asrdist.errors import ConfigError
from asrdist.optim.adagrad import CntkAdaGrad

OPTIMIZERS = ("sgd", "adagrad")
LR_SCALINGS = ("none", "linear", "sqrt")
DECAYS = ("none", "geometric")


def _number(name: str, value: object) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"optim.{name}: expected a finite number, got {value!r}")
    return float(value)


def _integer(name: str, value: object, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < minimum:
        raise ConfigError(f"optim.{name}: expected an integer >= {minimum}, got {value!r}")
    return value


@dataclass
class OptimConfig:
    name: str = "sgd"
    """sgd | adagrad (AdaGrad as in CNTK, DESIGN.md §5.2)."""
    lr: float = 0.1
    """Initial learning rate at `reference_batch`, before scaling, warmup, annealing and decay."""
    momentum: float = 0.0
    """Heavy-ball momentum in [0, 1); for adagrad it is applied to the normalized update."""
    nesterov: bool = False
    """Nesterov momentum (needs momentum > 0)."""
    weight_decay: float = 0.0
    """L2 coefficient added to the gradient before the update."""
    warmup_steps: int = 0
    """Linear warmup: lr x (step + 1) / warmup_steps for the first warmup_steps steps; 0 = none."""
    lr_scaling: str = "none"
    """none | linear | sqrt: multiply lr by global_batch / reference_batch or by its square root."""
    reference_batch: int = 256
    """The global batch `lr` was tuned for (same unit as data.batch_size)."""
    anneal_after_epoch: int | None = None
    """From epoch E+1 on (epochs counted from 1), multiply lr by anneal_factor once more per epoch; None = never."""
    anneal_factor: float = 1 / math.sqrt(2)
    """Per-epoch annealing factor in (0, 1]."""
    decay: str = "none"
    """none | geometric: lr decays geometrically from `lr` to `final_lr` over the whole run (Kaldi)."""
    final_lr: float | None = None
    """The learning rate of the last step with decay=geometric (scaled like `lr`)."""
    natural_gradient: bool = False
    """Precondition every affine layer's gradient with online natural gradient (Povey et al. 2015)."""
    max_change: bool = False
    """Kaldi's max-change: cap the per-minibatch parameter change per layer (0.75 hidden, 1.5 output) and in total (2.0)."""
    adagrad_skip_unseen: bool = False
    """adagrad only: average the per-element multipliers over the elements that have had a non-zero
    gradient, so a ReLU net's dead units cannot shrink their matrix's step (see `CntkAdaGrad`);
    false (the default) is CNTK's literal mean over all elements."""

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name: '{self.name}' is not one of {', '.join(OPTIMIZERS)}")
        if _number("lr", self.lr) <= 0:
            raise ConfigError(f"optim.lr: must be > 0, got {self.lr}")
        if not 0 <= _number("momentum", self.momentum) < 1:
            raise ConfigError(f"optim.momentum: must be in [0, 1), got {self.momentum}")
        for key in ("nesterov", "adagrad_skip_unseen"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"optim.{key}: expected true/false, got {getattr(self, key)!r}")
        if self.nesterov and self.momentum == 0:
            raise ConfigError("optim.nesterov: needs optim.momentum > 0")
        if _number("weight_decay", self.weight_decay) < 0:
            raise ConfigError(f"optim.weight_decay: must be >= 0, got {self.weight_decay}")
        _integer("warmup_steps", self.warmup_steps, 0)
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError(f"optim.lr_scaling: '{self.lr_scaling}' is not one of {', '.join(LR_SCALINGS)}")
        _integer("reference_batch", self.reference_batch, 1)
        if self.anneal_after_epoch is not None:
            _integer("anneal_after_epoch", self.anneal_after_epoch, 0)
        if not 0 < _number("anneal_factor", self.anneal_factor) <= 1:
            raise ConfigError(f"optim.anneal_factor: must be in (0, 1], got {self.anneal_factor}")
        if self.decay not in DECAYS:
            raise ConfigError(f"optim.decay: '{self.decay}' is not one of {', '.join(DECAYS)}")
        if self.decay == "geometric":
            if self.final_lr is None or _number("final_lr", self.final_lr) <= 0:
                raise ConfigError(f"optim.final_lr: decay=geometric needs a final_lr > 0, got {self.final_lr!r}")
        elif self.final_lr is not None:
            raise ConfigError("optim.final_lr: only used with optim.decay=geometric")


def build_optimizer(cfg: OptimConfig, params: Iterable) -> torch.optim.Optimizer:
    """The optimizer at lr = cfg.lr; an `LRSchedule` then sets the lr of every step."""
    if cfg.name == "adagrad":
        return CntkAdaGrad(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           weight_decay=cfg.weight_decay, skip_unseen=cfg.adagrad_skip_unseen)
    return torch.optim.SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           weight_decay=cfg.weight_decay)
