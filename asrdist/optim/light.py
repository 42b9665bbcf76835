"""Optimizers that start without `torch._dynamo`: `SGD` (torch's own arithmetic) and the base of
`CntkAdaGrad`.

In torch 2.13 every `torch.optim.Optimizer` imports `torch._dynamo` when it is built (its
`add_param_group` is wrapped to disable the compiler) and again in every `SGD.step`: about 1.9
CPU-seconds a process, as much as importing torch itself, paid by every learner of every job
(measured: docs/optimizers.md#optimizers-without-torch_dynamo-optimlightpy). asrdist compiles
nothing, so its optimizers keep what a training loop uses of `torch.optim.Optimizer`
(`param_groups`, `state`, `zero_grad`, `state_dict` / `load_state_dict` in torch's format, so that
checkpoints load either way) and step through torch's functional `torch.optim.sgd.sgd`, which is
what `torch.optim.SGD.step` calls: the same updates to the bit.
"""
from __future__ import annotations

from collections import defaultdict
from copy import deepcopy
from typing import Any, Callable, Iterable

import torch
from torch.optim.sgd import sgd as functional_sgd


class LightOptimizer:
    """`param_groups` (dicts of options with their "params"), `state` (parameter -> dict),
    `defaults`; subclasses define `step`."""

    def __init__(self, params: Iterable, defaults: dict[str, Any]):
        self.defaults = dict(defaults)
        self.state: defaultdict[torch.Tensor, dict[str, Any]] = defaultdict(dict)
        self.param_groups: list[dict[str, Any]] = []
        groups = list(params)
        if not groups:
            raise ValueError(f"{type(self).__name__} got an empty parameter list")
        if not isinstance(groups[0], dict):
            groups = [{"params": groups}]
        for group in groups:
            self.add_param_group(group)

    def add_param_group(self, group: dict[str, Any]) -> None:
        params = group["params"]
        params = [params] if isinstance(params, torch.Tensor) else list(params)
        seen = {id(p) for g in self.param_groups for p in g["params"]}
        if any(id(p) in seen for p in params):
            raise ValueError("some parameters appear in more than one parameter group")
        self.param_groups.append({**self.defaults, **group, "params": params})

    def zero_grad(self, set_to_none: bool = True) -> None:
        for group in self.param_groups:
            for p in group["params"]:
                if p.grad is None:
                    continue
                if set_to_none:
                    p.grad = None
                else:
                    p.grad.detach_().requires_grad_(False).zero_()

    def state_dict(self) -> dict[str, Any]:
        """torch.optim's layout: state by parameter index (in group order), groups with indices."""
        index: dict[int, int] = {}
        groups = []
        for group in self.param_groups:
            for p in group["params"]:
                index.setdefault(id(p), len(index))
            groups.append({**{k: v for k, v in group.items() if k != "params"},
                           "params": [index[id(p)] for p in group["params"]]})
        state = {index[id(p)]: s for p, s in self.state.items() if id(p) in index}
        return {"state": state, "param_groups": groups}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """A `state_dict` of this optimizer or of torch's, for the same parameters in the same groups."""
        saved = state_dict["param_groups"]
        if len(saved) != len(self.param_groups) or any(
                len(s["params"]) != len(g["params"]) for s, g in zip(saved, self.param_groups)):
            raise ValueError("loaded state dict has a different number of parameter groups or parameters")
        by_index = {i: p for s, g in zip(saved, self.param_groups) for i, p in zip(s["params"], g["params"])}
        self.state = defaultdict(dict)
        for i, values in state_dict["state"].items():
            p = by_index[int(i)]
            self.state[p] = {k: _like(v, p) for k, v in values.items()}
        for s, g in zip(saved, self.param_groups):
            g.update({k: deepcopy(v) for k, v in s.items() if k != "params"})

    def __repr__(self) -> str:
        options = ", ".join(f"{k}={v}" for k, v in self.defaults.items())
        return f"{type(self).__name__}({options})"


def _like(value: Any, param: torch.Tensor) -> Any:
    """A loaded state tensor on its parameter's device (and dtype, if floating), as torch.optim
    does, and a copy (torch.optim keeps the tensor it was given: two optimizers loaded from one
    state dict would step one buffer)."""
    if not isinstance(value, torch.Tensor):
        return deepcopy(value)
    if value.is_floating_point():
        return value.to(dtype=param.dtype, device=param.device, copy=True)
    return value.to(device=param.device, copy=True)


class SGD(LightOptimizer):
    """`torch.optim.SGD`'s options and updates (momentum, dampening, weight decay, Nesterov,
    maximize; `foreach` / `fused` as torch chooses them) without its compiler hooks."""

    def __init__(self, params: Iterable, lr: float = 1e-3, momentum: float = 0.0, dampening: float = 0.0,
                 weight_decay: float = 0.0, nesterov: bool = False, *, maximize: bool = False,
                 foreach: bool | None = None, fused: bool | None = None):
        if lr < 0.0 or momentum < 0.0 or weight_decay < 0.0:
            raise ValueError(f"SGD: lr, momentum and weight_decay must be >= 0, got {lr}, {momentum}, {weight_decay}")
        if nesterov and (momentum <= 0 or dampening != 0):
            raise ValueError("Nesterov momentum requires a momentum and zero dampening")
        super().__init__(params, {"lr": lr, "momentum": momentum, "dampening": dampening,
                                  "weight_decay": weight_decay, "nesterov": nesterov, "maximize": maximize,
                                  "foreach": foreach, "differentiable": False, "fused": fused})

    @torch.no_grad()
    def step(self, closure: Callable[[], Any] | None = None) -> Any:
        loss = None
        if closure is not None:
            with torch.enable_grad():
                loss = closure()
        for group in self.param_groups:
            params = [p for p in group["params"] if p.grad is not None]
            if not params:
                continue
            with_momentum = group["momentum"] != 0
            buffers = [self.state[p].get("momentum_buffer") for p in params] if with_momentum else []
            functional_sgd(params, [p.grad for p in params], buffers,
                           has_sparse_grad=any(p.grad.is_sparse for p in params), foreach=group["foreach"],
                           fused=group["fused"], weight_decay=group["weight_decay"], momentum=group["momentum"],
                           lr=group["lr"], dampening=group["dampening"], nesterov=group["nesterov"],
                           maximize=group["maximize"])
            if with_momentum:
                for p, buf in zip(params, buffers):
                    self.state[p]["momentum_buffer"] = buf
        return loss
