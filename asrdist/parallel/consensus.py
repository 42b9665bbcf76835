"""The consensus model: the average of every learner's parameters, for validation, the final
model of decentralized strategies, and the learners' spread (consensus distance)."""
from __future__ import annotations

import copy
from datetime import timedelta

import torch

from asrdist.parallel import comm
from asrdist.parallel.base import CommCounters


def _floats(module: torch.nn.Module) -> list[torch.Tensor]:
    return [t for t in list(module.parameters()) + list(module.buffers()) if t.is_floating_point()]


def average_into(module: torch.nn.Module, counters: CommCounters, *, group=None,
                 timeout: timedelta | None = None) -> None:
    """Replace `module`'s floating-point parameters and buffers by their mean over `group`."""
    with torch.no_grad():
        comm.allreduce_mean([t.data for t in _floats(module)], counters, group=group, timeout=timeout)


def consensus_copy(module: torch.nn.Module, *, world_size: int, group=None,
                   timeout: timedelta | None = None) -> torch.nn.Module:
    """A copy of `module` holding the learners' average (the module itself for one learner).
    Its traffic is not any strategy's: it goes to a throw-away counter."""
    if world_size == 1:
        return module
    averaged = copy.deepcopy(module)
    average_into(averaged, CommCounters(), group=group, timeout=timeout)
    return averaged


def job_totals(values: list[float], *, world_size: int, device: torch.device, group=None,
               timeout: timedelta | None = None) -> list[float]:
    """Each of `values` summed over the learners (float64; `values` itself for one learner)."""
    if world_size == 1:
        return list(values)
    total = torch.tensor(values, dtype=torch.float64, device=device)
    comm.allreduce(total, CommCounters(), group=group, timeout=timeout)
    return total.tolist()


def consensus_distance(module: torch.nn.Module, *, world_size: int, group=None,
                       timeout: timedelta | None = None) -> float:
    """mean_i ||x_i - x̄|| / ||x̄|| over the learners (0.0 for one learner)."""
    if world_size == 1:
        return 0.0
    with torch.no_grad():
        mine = torch.cat([t.detach().reshape(-1).double() for t in _floats(module)])
        mean = mine.clone()
        comm.allreduce(mean, CommCounters(), group=group, timeout=timeout)
        mean.div_(world_size)
        ratio = torch.tensor([float((mine - mean).norm() / mean.norm().clamp_min(1e-30))],
                             dtype=torch.float64, device=mine.device)
        comm.allreduce(ratio, CommCounters(), group=group, timeout=timeout)
        return float(ratio.item()) / world_size
