"""Kaldi's max-change: cap how far one minibatch may move each layer and the whole model.

Per layer the norm of the change lr·g is capped at `hidden` (0.75) or, for the output layer,
`output` (1.5), then the whole model's at `total` (2.0), by scaling the gradients in place:
`clip_change` goes between backward (and the strategy's communication) and `optimizer.step()`.
With momentum the cap applies to this minibatch's contribution. What a layer is, and which is the
output layer: docs/optimizers.md#kaldis-max-change-optimmax_changepy."""
from __future__ import annotations

import math
from dataclasses import dataclass, field

import torch
from torch import nn

from asrdist.errors import ConfigError


@dataclass
class MaxChangeConfig:
    hidden: float = 0.75
    """Cap on ||lr·g||_F per hidden layer; 0 disables it."""
    output: float = 1.5
    """Cap on ||lr·g||_F for the output layer; 0 disables it."""
    total: float = 2.0
    """Cap on the whole model's ||change||_F after the per-layer caps; 0 disables it."""

    def __post_init__(self):
        for name in ("hidden", "output", "total"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not value >= 0:
                raise ConfigError(f"max_change.{name}: must be a number >= 0, got {value!r}")


@dataclass
class ChangeStats:
    """What `clip_change` did this minibatch."""

    layer_norms: list[float] = field(default_factory=list)
    """||lr·g||_F per layer before capping, in `parameter_layers` order."""
    layer_scales: list[float] = field(default_factory=list)
    """Per-layer factor applied (1.0 = not capped), before the global factor."""
    total_norm: float = 0.0
    """Norm of the whole change after the per-layer caps, before the global cap."""
    total_scale: float = 1.0

    @property
    def layers_capped(self) -> int:
        return sum(s < 1.0 for s in self.layer_scales)


def parameter_layers(model: nn.Module) -> list[tuple[str, nn.Module, list[nn.Parameter]]]:
    """(name, module, trainable parameters) of every module owning trainable parameters directly."""
    layers = []
    for name, module in model.named_modules():
        params = [p for p in module.parameters(recurse=False) if p.requires_grad]
        if params:
            layers.append((name, module, params))
    return layers


def output_layer_name(model: nn.Module) -> str | None:
    names = [name for name, m in model.named_modules() if isinstance(m, nn.Linear)]
    return names[-1] if names else None


def clip_change(model: nn.Module, lr: float, config: MaxChangeConfig | None = None,
                output_layer: str | None = None) -> ChangeStats:
    """Scale every p.grad so that lr·g respects the per-layer and whole-model caps; returns stats."""
    config = config or MaxChangeConfig()
    output_layer = output_layer if output_layer is not None else output_layer_name(model)
    stats = ChangeStats()
    layers = [(name, [p for p in params if p.grad is not None]) for name, _, params in parameter_layers(model)]
    layers = [(name, params) for name, params in layers if params]
    if not layers or lr <= 0:
        return stats
    # One host sync for all norms: stack the per-parameter norms, then read them at once.
    param_norms = torch.stack([torch.linalg.vector_norm(p.grad, dtype=torch.float64)
                               for _, params in layers for p in params]).tolist()
    position = 0
    for name, params in layers:
        sq = sum(v * v for v in param_norms[position:position + len(params)])
        position += len(params)
        norm = lr * math.sqrt(sq)
        cap = config.output if name == output_layer else config.hidden
        scale = cap / norm if cap > 0 and norm > cap else 1.0
        stats.layer_norms.append(norm)
        stats.layer_scales.append(scale)
    stats.total_norm = math.sqrt(sum((n * s) ** 2 for n, s in zip(stats.layer_norms, stats.layer_scales)))
    if config.total > 0 and stats.total_norm > config.total:
        stats.total_scale = config.total / stats.total_norm
    for (_, params), scale in zip(layers, stats.layer_scales):
        factor = scale * stats.total_scale
        if factor != 1.0:
            for p in params:
                p.grad.mul_(factor)
    return stats
