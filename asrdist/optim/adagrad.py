"""AdaGrad as CNTK implements it for 1-bit SGD (Seide et al. 2014; CNTK `Matrix::Adagrad`).

Per parameter tensor ("matrix") and minibatch, with G its gradient and A its running sum:
1. G <- G + weight_decay * W;  2. A <- A + G * G;  3. m <- 1 / sqrt(A + 1e-16);
4. U <- G * m / mean(m) (CNTK's "aveMultiplier": `lr` keeps plain SGD's scale);
5. optional momentum on U (an extension: 0 reproduces CNTK exactly);  6. W <- W - lr * U.
`skip_unseen=True` takes mean(m) over the elements that have had a non-zero gradient, where CNTK's
literal mean stalls a ReLU DNN. Why, and the scale of `lr`:
docs/optimizers.md#adagrad-as-cntk-has-it-optimadagradpy."""
from __future__ import annotations

from typing import Callable, Iterable

import torch

from asrdist.optim.light import LightOptimizer

FLOOR = 1e-16


class CntkAdaGrad(LightOptimizer):
    """An optimizer (`LightOptimizer`: torch.optim's interface without its compiler hooks) with
    per-tensor state `sum_sq` (A) and, with momentum, `momentum_buffer`."""

    def __init__(self, params: Iterable, lr: float = 0.01, momentum: float = 0.0, nesterov: bool = False,
                 weight_decay: float = 0.0, floor: float = FLOOR, skip_unseen: bool = False):
        if lr <= 0:
            raise ValueError(f"CntkAdaGrad: lr must be > 0, got {lr}")
        if not 0 <= momentum < 1:
            raise ValueError(f"CntkAdaGrad: momentum must be in [0, 1), got {momentum}")
        if nesterov and momentum == 0:
            raise ValueError("CntkAdaGrad: nesterov needs momentum > 0")
        if weight_decay < 0 or floor <= 0:
            raise ValueError("CntkAdaGrad: weight_decay must be >= 0 and floor > 0")
        super().__init__(params, dict(lr=lr, momentum=momentum, nesterov=nesterov, weight_decay=weight_decay,
                                      floor=floor, skip_unseen=skip_unseen))

    @torch.no_grad()
    def step(self, closure: Callable[[], float] | None = None):
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            lr, mu, wd, floor = group["lr"], group["momentum"], group["weight_decay"], group["floor"]
            for p in group["params"]:
                if p.grad is None:
                    continue
                grad = p.grad
                if grad.is_sparse:
                    raise RuntimeError("CntkAdaGrad does not support sparse gradients")
                if wd:
                    grad = grad.add(p, alpha=wd)
                state = self.state[p]
                if "sum_sq" not in state:
                    state["sum_sq"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                sum_sq = state["sum_sq"]
                sum_sq.addcmul_(grad, grad)
                multiplier = (sum_sq + floor).rsqrt_()
                update = grad * multiplier
                if group.get("skip_unseen", False):
                    seen = sum_sq > 0
                    count = int(seen.sum())
                    if count:  # else every element's update is 0 anyway
                        update.div_(multiplier.where(seen, 0.0).sum() / count)
                else:
                    update.div_(multiplier.mean())
                if mu:
                    if "momentum_buffer" not in state:
                        state["momentum_buffer"] = torch.zeros_like(p, memory_format=torch.preserve_format)
                    buf = state["momentum_buffer"]
                    buf.mul_(mu).add_(update)
                    update = update.add(buf, alpha=mu) if group["nesterov"] else buf
                p.add_(update, alpha=-lr)
        return loss
