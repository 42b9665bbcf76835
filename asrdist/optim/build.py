"""Optimizer config and construction: SGD with (Nesterov) momentum, or CNTK's AdaGrad."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Iterable

from asrdist.checks import check_field
from asrdist.errors import ConfigError
from asrdist.optim.adagrad import CntkAdaGrad
from asrdist.optim.light import SGD, LightOptimizer
from asrdist.optim.ngsgd import KERNEL_KINDS

OPTIMIZERS = ("sgd", "adagrad")
LR_SCALINGS = ("none", "linear", "sqrt")
DECAYS = ("none", "geometric")


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
    natural_gradient_kernel: str = "auto"
    """auto | native | python: natural gradient's preconditioner compiled (asrdist/native/ngsgd_kernel.cpp)
    or in Python; the same values (bit for bit in float64, to float32 rounding in float32).
    auto: compiled where it builds, else Python after one warning; native: an error where it
    cannot be built."""
    max_change: bool = False
    """Kaldi's max-change: cap the per-minibatch parameter change per layer (0.75 hidden, 1.5 output) and in total (2.0)."""
    adagrad_skip_unseen: bool = False
    """adagrad only: average the per-element multipliers over the elements that have had a non-zero
    gradient, so a ReLU net's dead units cannot shrink their matrix's step (see `CntkAdaGrad`);
    false (the default) is CNTK's literal mean over all elements."""

    def __post_init__(self):
        if self.name not in OPTIMIZERS:
            raise ConfigError(f"optim.name: '{self.name}' is not one of {', '.join(OPTIMIZERS)}")
        check_field("optim.lr", self.lr, float, above=0)
        check_field("optim.momentum", self.momentum, float, at_least=0, below=1)
        for key in ("nesterov", "adagrad_skip_unseen"):
            check_field(f"optim.{key}", getattr(self, key), bool)
        if self.nesterov and self.momentum == 0:
            raise ConfigError("optim.nesterov: needs optim.momentum > 0")
        check_field("optim.weight_decay", self.weight_decay, float, at_least=0)
        check_field("optim.warmup_steps", self.warmup_steps, at_least=0)
        if self.lr_scaling not in LR_SCALINGS:
            raise ConfigError(f"optim.lr_scaling: '{self.lr_scaling}' is not one of {', '.join(LR_SCALINGS)}")
        check_field("optim.reference_batch", self.reference_batch, at_least=1)
        if self.anneal_after_epoch is not None:
            check_field("optim.anneal_after_epoch", self.anneal_after_epoch, at_least=0)
        check_field("optim.anneal_factor", self.anneal_factor, float, above=0, at_most=1)
        if self.natural_gradient_kernel not in KERNEL_KINDS:
            raise ConfigError(f"optim.natural_gradient_kernel: '{self.natural_gradient_kernel}' is not one of "
                              f"{', '.join(KERNEL_KINDS)}")
        if self.decay not in DECAYS:
            raise ConfigError(f"optim.decay: '{self.decay}' is not one of {', '.join(DECAYS)}")
        if self.decay == "geometric":
            if self.final_lr is None:
                raise ConfigError("optim.final_lr: decay=geometric needs a final_lr > 0")
            check_field("optim.final_lr", self.final_lr, float, above=0)
        elif self.final_lr is not None:
            raise ConfigError("optim.final_lr: only used with optim.decay=geometric")


def build_optimizer(cfg: OptimConfig, params: Iterable) -> LightOptimizer:
    """The optimizer at lr = cfg.lr; an `LRSchedule` then sets the lr of every step."""
    if cfg.name == "adagrad":
        return CntkAdaGrad(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov,
                           weight_decay=cfg.weight_decay, skip_unseen=cfg.adagrad_skip_unseen)
    return SGD(params, lr=cfg.lr, momentum=cfg.momentum, nesterov=cfg.nesterov, weight_decay=cfg.weight_decay)
