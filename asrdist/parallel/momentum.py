"""Momentum correction for compressed-gradient strategies (Lin et al., ICLR 2018, "Deep Gradient
Compression", §3.2; applied here to 1-bit quantization).

Each learner applies SGD's momentum, Nesterov and weight decay to its own gradient before it is
quantized: the mean of the learners' directions is the global one (it is linear in g), and the
quantization error enters the model once instead of circulating in the momentum buffer.
`MomentumCorrection.take_over(optimizer, params)` moves them out of an SGD (asrdist's or torch's;
None for other optimizers); `apply(params)` turns each p.grad into its direction in place.
Derivation: docs/strategies.md#momentum-correction-parallelmomentumpy."""
from __future__ import annotations

from typing import Any, Sequence

import torch

from asrdist.optim.light import SGD


class MomentumCorrection:
    """Per-learner momentum buffers applied to gradients before they are compressed."""

    def __init__(self, settings: Sequence[tuple[float, bool, float]]):
        self.settings = list(settings)  # (momentum, nesterov, weight_decay) per parameter
        self.buffers: list[torch.Tensor | None] = [None] * len(self.settings)

    @classmethod
    def take_over(cls, optimizer: torch.optim.Optimizer,
                  params: Sequence[torch.nn.Parameter]) -> "MomentumCorrection | None":
        """Move SGD's momentum / Nesterov / weight decay for `params` here; None when there is
        nothing to move or the optimizer is not plain SGD (`optim.light.SGD` or `torch.optim.SGD`)."""
        if type(optimizer) not in (SGD, torch.optim.SGD):
            return None
        group_of = {}
        for group in optimizer.param_groups:
            if group.get("dampening", 0) != 0 or group.get("maximize", False):
                return None
            for p in group["params"]:
                group_of[id(p)] = group
        settings = []
        for p in params:
            g = group_of.get(id(p))
            settings.append((float(g["momentum"]), bool(g["nesterov"]), float(g["weight_decay"])) if g else
                            (0.0, False, 0.0))
        if not any(m or wd for m, _, wd in settings):
            return None
        for group in optimizer.param_groups:
            group.update(momentum=0.0, nesterov=False, weight_decay=0.0)
        return cls(settings)

    def apply(self, params: Sequence[torch.nn.Parameter]) -> None:
        """p.grad ← this learner's momentum direction (a missing gradient counts as zero)."""
        for k, p in enumerate(params):
            momentum, nesterov, weight_decay = self.settings[k]
            if p.grad is None:
                if not (momentum or weight_decay):
                    continue
                p.grad = torch.zeros_like(p)
            d = p.grad
            if weight_decay:
                d.add_(p.detach(), alpha=weight_decay)
            if not momentum:
                continue
            buf = self.buffers[k]
            if buf is None:
                buf = self.buffers[k] = d.detach().clone()  # torch.optim.SGD's first step
            else:
                if buf.device != d.device:
                    buf = self.buffers[k] = buf.to(d.device)
                buf.mul_(momentum).add_(d)
            if nesterov:
                d.add_(buf, alpha=momentum)
            else:
                d.copy_(buf)

    def state_dict(self) -> dict[str, Any]:
        return {"buffers": [None if b is None else b.detach().cpu().clone() for b in self.buffers]}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        buffers = state["buffers"]
        if len(buffers) != len(self.buffers):
            raise ValueError(f"momentum correction: state has {len(buffers)} buffers, expected {len(self.buffers)}")
        self.buffers = [None if b is None else b.clone() for b in buffers]
