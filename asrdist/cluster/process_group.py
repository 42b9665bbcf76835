"""The one set-up of a learner, and the one reader of torchrun's environment.

`JobEnv.from_environ()` reads what torchrun (or `torch.distributed.run`) tells a learner;
`start_learner(...)` joins the job through a c10d store, has `asrdist.parallel.groups` build the
job's process groups (the one module that builds any), and returns the `LearnerContext`
everything below receives. Nothing else in asrdist reads RANK / WORLD_SIZE or asrdist's own
variables below (the launcher writes them): `run_learner` receives the `JobEnv`.
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping

import torch
import torch.distributed as dist

from asrdist.errors import ConfigError
from asrdist.parallel.base import DEFAULT_TIMEOUT_SECONDS, LearnerContext
from asrdist.parallel.groups import build_groups, check_group_size, init_job
from asrdist.parallel.membership import survival_wait
from asrdist.utils.environ import process_environment

STORE_PREFIX = "asrdist/"
"""Keys asrdist writes to the job's store (job-wide epochs, checkpoint publication)."""
SURVIVE_ENV = "ASRDIST_SURVIVE_LOST"
NETWORK_ENV = "ASRDIST_NETWORK"
"""The link between the hosts of a job asrdist's launcher started (`loopback` on one machine, the
emulated hosts' rate otherwise), for summary.json; unset under torchrun on a real cluster."""
CPU_QUOTA_ENV = "ASRDIST_HOST_CPU_QUOTA"
"""Cores this learner's emulated host may use (its cgroup's quota, `cpushare`); unset: not dedicated."""
QUOTA_SLOWDOWN_ENV = "ASRDIST_QUOTA_SLOWDOWN"
"""How many times slower than the job's cores per host this host's quota makes it (a straggler's
host); the learner then sleeps no stand-in for `train.straggler`."""
THREADS_ENV = "ASRDIST_THREADS_PER_LEARNER"
"""Torch threads per learner, set by asrdist's launcher, which knows how many learners share this
machine's cores: all of them, also on emulated nodes, where LOCAL_WORLD_SIZE counts one node's."""


@dataclass(frozen=True)
class JobEnv:
    """Who one learner is and how it joins its job: what its launcher tells it, from the launcher
    (torchrun, `launch_learners` and `run_learners` on it) to the learner (`start_learner`).
    Strategies see it as the `LearnerContext` that `start_learner` builds from it."""

    rank: int
    world_size: int
    local_rank: int
    local_world_size: int
    restart: int = 0
    """How many times torch's launcher restarted the job's learners (TORCHELASTIC_RESTART_COUNT)."""
    survive_lost: bool = False
    """asrdist's launcher goes on without lost learners (SURVIVE_ENV, set by `launch_learners`)."""
    node_rank: int = -1
    """This learner's host (torchrun's GROUP_RANK); -1: rank // local_world_size."""
    num_nodes: int = -1
    """Hosts of the job (torchrun's GROUP_WORLD_SIZE); -1: world_size // local_world_size."""
    master_addr: str = ""
    """Where the job's store is (MASTER_ADDR, MASTER_PORT); "" when the launcher did not say."""
    master_port: int = 0
    network: str | None = None
    """The link between the job's hosts as asrdist's launchers set it up ('loopback' on one
    machine, the emulated label otherwise; NETWORK_ENV); None: not asrdist's to know."""
    num_threads: int = 0
    """Torch threads for this learner, as its launcher shares out the machine's cores (THREADS_ENV);
    0: the launcher did not say."""
    cpu_quota: float = 0.0
    """Cores of this learner's dedicated host (CPU_QUOTA_ENV); 0: its host has no quota."""
    quota_slowdown: float = 1.0
    """How much slower its host's quota makes it (QUOTA_SLOWDOWN_ENV): > 1 on a straggler's host."""
    timeout_s: float = 0.0
    """How long the launcher gives the job (`run_learners`' learner functions wait that long for
    their peers: netem_launch's `--timeout`); 0: no deadline given."""

    def __post_init__(self):
        if self.node_rank < 0:
            object.__setattr__(self, "node_rank", self.rank // self.local_world_size)
        if self.num_nodes < 0:
            object.__setattr__(self, "num_nodes", self.world_size // self.local_world_size)

    @classmethod
    def from_environ(cls, environ: Mapping[str, str] | None = None) -> "JobEnv":
        """The learner torchrun (or asrdist's launcher, which sets the same variables) started."""
        env = process_environment() if environ is None else environ
        try:
            world = int(env["WORLD_SIZE"])
            local_world = int(env.get("LOCAL_WORLD_SIZE", world))
            threads = int(env.get(THREADS_ENV, 0) or 0) or cores_per_learner(local_world)
            return cls(rank=int(env["RANK"]), world_size=world, local_rank=int(env.get("LOCAL_RANK", 0)),
                       local_world_size=local_world,
                       restart=int(env.get("TORCHELASTIC_RESTART_COUNT", 0) or 0),
                       survive_lost=env.get(SURVIVE_ENV) == "1",
                       node_rank=int(env.get("GROUP_RANK", -1)), num_nodes=int(env.get("GROUP_WORLD_SIZE", -1)),
                       master_addr=env.get("MASTER_ADDR", ""), master_port=int(env.get("MASTER_PORT", 0)),
                       network=env.get(NETWORK_ENV), num_threads=threads,
                       cpu_quota=float(env.get(CPU_QUOTA_ENV, 0) or 0),
                       quota_slowdown=float(env.get(QUOTA_SLOWDOWN_ENV, 1) or 1))
        except KeyError as e:
            raise ConfigError(f"learner: environment variable {e} not set (not started by torchrun?)") from e

    def as_environ(self) -> dict[str, str]:
        """The variables torchrun gives this learner (`from_environ` reads them back), for a
        launcher that starts learners itself."""
        env = {"RANK": str(self.rank), "WORLD_SIZE": str(self.world_size), "LOCAL_RANK": str(self.local_rank),
               "LOCAL_WORLD_SIZE": str(self.local_world_size), "GROUP_RANK": str(self.node_rank),
               "GROUP_WORLD_SIZE": str(self.num_nodes), "MASTER_ADDR": self.master_addr,
               "MASTER_PORT": str(self.master_port), "TORCHELASTIC_RESTART_COUNT": str(self.restart)}
        if self.survive_lost:
            env[SURVIVE_ENV] = "1"
        return env


def cores_per_learner(local_world_size: int) -> int:
    """This process' cores over the learners of its node: a learner's threads where neither
    `train.threads` nor its launcher (THREADS_ENV) says."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    return max(1, cores // max(1, local_world_size))


def default_backend() -> str:
    return "nccl" if torch.cuda.is_available() and dist.is_nccl_available() else "gloo"


def device_for_backend(backend: str, local_rank: int) -> torch.device:
    """The device a learner computes on: its own GPU under NCCL, the CPU under gloo."""
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


def start_learner(env: JobEnv, *, seed: int, timeout: timedelta, store: dist.Store | None = None,
                  group_size: int = 0, backend: str | None = None) -> LearnerContext:
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
        store, _, _ = next(dist.rendezvous("env://", env.rank, env.world_size,
                                           timeout=timeout))
        if env.restart:  # the launcher's store outlives a restart: the earlier learners' keys stay behind
            store = dist.PrefixStore(f"restart-{env.restart}/", store)
    _wait_for_everyone(store, env, max(timeout, JOIN_TIMEOUT))
    backend = backend or default_backend()
    device = device_for_backend(backend, env.local_rank)
    init_job(backend, store, env.rank, env.world_size, timeout, device)
    groups = build_groups(env.rank, env.world_size, group_size, timeout,
                          node_timeout=survival_wait(timeout) if env.survive_lost else None)
    return LearnerContext(rank=env.rank, world_size=env.world_size, local_rank=env.local_rank,
                          local_world_size=env.local_world_size, device=device, timeout=timeout, seed=seed,
                          store=dist.PrefixStore(STORE_PREFIX, store), groups=groups, group_size=group_size,
                          survive_lost=env.survive_lost)


JOIN_TIMEOUT = timedelta(seconds=DEFAULT_TIMEOUT_SECONDS)
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
