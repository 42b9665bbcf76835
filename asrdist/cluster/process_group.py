"""The one process-group set-up of asrdist, and the one reader of torchrun's environment.

`JobEnv.from_environ()` reads what torchrun (or `torch.distributed.run`) tells a learner;
`start_learner(...)` joins the default process group through a c10d store, builds the job's
process groups in the same order on every rank, and returns the `LearnerContext` everything
below receives. Nothing else in asrdist calls `init_process_group` or reads RANK / WORLD_SIZE.

Groups (`ProcessGroups`): `world`; `node`, this learner's group of `group_size` consecutive ranks
(torchrun's LOCAL_WORLD_SIZE unless `train.group_size` says otherwise: the allreduce inside a
"super learner" of the hierarchical strategies); `leaders`, the first rank of every node (None
on other ranks and when there is only one node).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Mapping

import torch
import torch.distributed as dist

from asrdist.errors import ConfigError
from asrdist.parallel.base import LearnerContext

STORE_PREFIX = "asrdist/"
"""Keys asrdist writes to the job's store (job-wide epochs, checkpoint publication)."""
SURVIVE_ENV = "ASRDIST_SURVIVE_LOST"
NETWORK_ENV = "ASRDIST_NETWORK"
"""The link between the hosts of a job asrdist's launcher started (`loopback` on one machine, the
emulated hosts' rate otherwise), for summary.json; unset under torchrun on a real cluster."""
THREADS_ENV = "ASRDIST_THREADS_PER_LEARNER"
"""Torch threads per learner, set by asrdist's launcher, which knows how many learners share this
machine's cores: all of them, also on emulated nodes, where LOCAL_WORLD_SIZE counts one node's."""


@dataclass(frozen=True)
class JobEnv:
    """What the launcher tells one learner about itself."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart: int = 0
    """How many times torch's launcher restarted the job's learners (TORCHELASTIC_RESTART_COUNT)."""
    survive_lost: bool = False
    """asrdist's launcher goes on without lost learners (SURVIVE_ENV, set by `launch_learners`)."""

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "JobEnv":
        env = os.environ if environ is None else environ
        try:
            world = int(env["WORLD_SIZE"])
            return cls(rank=int(env["RANK"]), world_size=world, local_rank=int(env.get("LOCAL_RANK", 0)),
                       local_world_size=int(env.get("LOCAL_WORLD_SIZE", world)),
                       restart=int(env.get("TORCHELASTIC_RESTART_COUNT", 0)),
                       survive_lost=env.get(SURVIVE_ENV) == "1")
        except KeyError as e:
            raise ConfigError(f"learner: environment variable {e} not set (not started by torchrun?)") from e


@dataclass(frozen=True)
class ProcessGroups:
    world: Any
    node: Any
    leaders: Any
    group_size: int
    node_timeout: timedelta | None = None
    """The node group's timeout, when not the job's (see `build_groups`)."""


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def device_for_backend(backend: str, local_rank: int) -> torch.device:
    """The device a learner computes on: its own GPU under NCCL, the CPU under gloo."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def check_group_size(group_size: int, world_size: int) -> None:
    if group_size < 1 or world_size % group_size:
        raise ConfigError(f"train.group_size: {group_size} does not divide {world_size} learners into equal groups")


def build_groups(rank: int, world_size: int, group_size: int, timeout: timedelta,
                 node_timeout: timedelta | None = None) -> ProcessGroups:
    """Every rank calls this in the same order (torch requires it for every new group).
    `node_timeout`: a longer timeout inside the nodes, for a job that goes on without lost nodes
    (a node's learners wait for their leader while it waits out a hung peer of another node)."""
    check_group_size(group_size, world_size)
    world = dist.group.WORLD
    if group_size == world_size:
        return ProcessGroups(world=world, node=world, leaders=None, group_size=group_size)
    node = None
    for first in range(0, world_size, group_size):
        g = dist.new_group(list(range(first, first + group_size)), timeout=node_timeout or timeout)
        if first <= rank < first + group_size:
            node = g
    return ProcessGroups(world=world, node=node, leaders=across_nodes(rank, world_size, group_size, timeout),
                         group_size=group_size, node_timeout=node_timeout)


def across_nodes(rank: int, world_size: int, group_size: int, timeout: timedelta, **kwargs) -> Any:
    """The leaders' group (the first learner of every node) on a leader, None elsewhere. Every
    learner joins the group of its own place in the node (the k-th learners of all nodes), so that
    every learner is a member of as many groups as any other: torch names a group made with
    `use_local_synchronization` (the survivors' group of `asrdist.parallel.membership`) after the
    number of groups its maker belongs to, and the survivors must agree on that name."""
    mine = None
    for k in range(group_size):
        g = dist.new_group(list(range(k, world_size, group_size)), timeout=timeout, **kwargs)
        if rank % group_size == k:
            mine = g
    return mine if rank % group_size == 0 else None


def start_learner(env: JobEnv, *, seed: int, timeout: timedelta, store: dist.Store | None = None,
                  init_method: str = "env://", group_size: int = 0, backend: str | None = None) -> LearnerContext:
    """Join the job and return this learner's context (one learner: no process group at all).

    The store is the launcher's own c10d store (`env://` under torchrun) unless a test passes one
    (a FileStore); asrdist's keys live under STORE_PREFIX in it.
    """
    group_size = group_size or env.local_world_size
    check_group_size(group_size, env.world_size)
    if env.world_size == 1 and store is None:  # one learner in this process: no process group
        device = device_for_backend(backend or default_backend(), env.local_rank)
        return LearnerContext(seed=seed, timeout=timeout, store=dist.HashStore(), group_size=1, device=device)
    if not 0 <= env.rank < env.world_size:
        raise ConfigError(f"learners: rank {env.rank} outside world size {env.world_size}")
    if store is None:
        store, _, _ = next(dist.rendezvous(init_method, env.rank, env.world_size, timeout=timeout))
        if env.restart:  # the launcher's store outlives a restart: the earlier learners' keys stay behind
            store = dist.PrefixStore(f"restart-{env.restart}/", store)
    _wait_for_everyone(store, env, max(timeout, JOIN_TIMEOUT))
    backend = backend or default_backend()
    device = device_for_backend(backend, env.local_rank)
    dist.init_process_group(backend, store=store, rank=env.rank, world_size=env.world_size, timeout=timeout,
                            device_id=device if backend == "nccl" else None)
    from asrdist.parallel.membership import survival_wait

    groups = build_groups(env.rank, env.world_size, group_size, timeout,
                          node_timeout=survival_wait(timeout) if env.survive_lost else None)
    return LearnerContext(rank=env.rank, world_size=env.world_size, local_rank=env.local_rank,
                          local_world_size=env.local_world_size, device=device, timeout=timeout, seed=seed,
                          store=dist.PrefixStore(STORE_PREFIX, store), groups=groups, group_size=group_size,
                          survive_lost=env.survive_lost)


JOIN_TIMEOUT = timedelta(seconds=120)
"""How long learners wait for each other to start: set-up on a loaded machine may take longer than
`train.timeout_seconds`, which is for a peer that stops answering once training runs."""


def _wait_for_everyone(store: dist.Store, env: JobEnv, timeout: timedelta) -> None:
    joined = dist.PrefixStore(f"{STORE_PREFIX}joined/", store)
    joined.set(str(env.rank), "1")
    joined.wait([str(r) for r in range(env.world_size)], timeout)


def stop_learner(group=None, destroy: bool = True) -> None:
    """Leave the job: nobody tears the group down while a peer is still inside a collective.
    `group`: the learners still there (a decentralized job that lost some); `destroy=False` leaves
    the groups as they are (a communication thread may still wait on a lost peer: the process
    then ends with os._exit)."""
    if dist.is_initialized():
        dist.barrier(group=group)
        if destroy:
            dist.destroy_process_group()
