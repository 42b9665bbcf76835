"""AdaGrad as CNTK implements it for 1-bit SGD (Seide et al. 2014; CNTK `Matrix::Adagrad`).

Per parameter tensor ("matrix") and minibatch, with G its gradient and A its running sum:
1. G <- G + weight_decay * W                 (L2, folded into the gradient first; 0 = off)
2. A <- A + G * G                             (elementwise)
3. m <- 1 / sqrt(A + 1e-16)                   (per-element multiplier)
4. U <- G * m / mean(m)                       CNTK returns mean(m) ("aveMultiplier") and scales the
                                              learning rate by 1/mean(m): the effective per-matrix
                                              lr = lr / mean(m), so the multipliers average to 1 and
                                              `lr` keeps plain SGD's scale.
5. optional momentum on U: B <- mu * B + U; U <- B (or U + mu * B with nesterov)
6. W <- W - lr * U

CNTK has no momentum on this path; it is an extension here (0 reproduces CNTK exactly).

An option, `skip_unseen=True` (default False, CNTK's literal mean): mean(m) runs over the elements whose
gradient has been non-zero at least once (A > 0). An element whose gradient has always been exactly
0 has m = 1e8 under CNTK's mean, which drags mean(m) up and shrinks the step of its whole matrix by
orders of magnitude. CNTK's DNNs were sigmoid, whose gradients are never exactly 0; a ReLU DNN
has dead units every minibatch (in the default DNN about 10% of the deeper layers' weight
gradients are exact zeros), and with CNTK's mean AdaGrad stalls on it. Such an element's own
update is 0 either way; when every element has seen a gradient the two means are identical.
Note also the scale: updates are G·m/mean(m), and mean(m) is dominated by the elements with the
smallest gradients, so a typical element moves several times less than under plain SGD at the
same `lr` (on the default DNN, lr 3.0 trains about as fast as SGD at 0.1 with momentum 0.9).
"""
from __future__ import annotations

from typing import Callable, Iterable

import torch

FLOOR = 1e-16


class CntkAdaGrad(torch.optim.Optimizer):
    """`torch.optim.Optimizer` with per-tensor state `sum_sq` (A) and, with momentum, `momentum_buffer`."""

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
