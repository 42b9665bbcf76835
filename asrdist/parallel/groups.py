"""Every process group of asrdist is built here, and nowhere else.

torch requires every rank to create every group in the same order; a learner calls:
1. `init_job` (the whole job), then `build_groups` (one group per node, then one per *rail*);
2. at its strategy's `setup`, the strategy's private groups (`exchange_group`, `build_rails`,
   onebit's `copy_group`);
3. during training, only the survivors of a decentralized job build `survivors_group`.
`node_ranks` and `rail_ranks` are the one place the rank sets of both levels are computed.
Details: docs/process-groups.md#every-process-group-is-built-in-asrdistparallelgroupspy."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrdist.errors import ConfigError
from asrdist.parallel.comm import guarded


@dataclass(frozen=True)
class ProcessGroups:
    """The job's groups: `world`; `node`, this learner's group of `group_size` consecutive ranks
    (the allreduce inside a "super learner" of the hierarchical strategies); `leaders`, the first
    rank of every node (None on other ranks and when there is only one node)."""

    world: Any
    node: Any
    leaders: Any
    group_size: int
    node_timeout: timedelta | None = None
    """The node group's timeout, when not the job's (see `build_groups`)."""


def check_group_size(group_size: int, world_size: int, learners: str = "") -> None:
    """`group_size` splits `world_size` learners into equal groups; `learners` names them in the
    error (default "N learners")."""
    if group_size < 1 or world_size % group_size:
        raise ConfigError(f"train.group_size: {group_size} does not divide {learners or f'{world_size} learners'} "
                          f"into equal groups")


def node_ranks(world_size: int, group_size: int) -> list[list[int]]:
    """Node k: the ranks k·g, ..., k·g + g − 1 (g = group_size)."""
    return [list(range(first, first + group_size)) for first in range(0, world_size, group_size)]


def rail_ranks(world_size: int, group_size: int) -> list[list[int]]:
    """Rail l: the ranks with local rank l on every node, l, l + g, l + 2g, ... (g = group_size).
    Rail 0 is the nodes' leaders."""
    return [list(range(local, world_size, group_size)) for local in range(group_size)]


def init_job(backend: str, store: dist.Store, rank: int, world_size: int, timeout: timedelta,
             device: torch.device) -> None:
    """Join the job's default process group through `store`."""
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout,
                            device_id=device if backend == "nccl" else None)


def build_groups(rank: int, world_size: int, group_size: int, timeout: timedelta,
                 node_timeout: timedelta | None = None) -> ProcessGroups:
    """The job's node and leaders' groups (every rank calls this, right after `init_job`).
    `node_timeout`: a longer timeout inside the nodes, for a job that goes on without lost nodes
    (a node's learners wait for their leader while it waits out a hung peer of another node)."""
    check_group_size(group_size, world_size)
    world = dist.group.WORLD
    if group_size == world_size:
        return ProcessGroups(world=world, node=world, leaders=None, group_size=group_size)
    node = None
    for ranks in node_ranks(world_size, group_size):
        g = dist.new_group(ranks, timeout=node_timeout or timeout)
        if rank in ranks:
            node = g
    return ProcessGroups(world=world, node=node, leaders=across_nodes(rank, world_size, group_size, timeout),
                         group_size=group_size, node_timeout=node_timeout)


def build_rails(rank: int, world_size: int, group_size: int, timeout: timedelta, **kwargs) -> Any:
    """Create the group_size rail groups and return this rank's: one group per local rank, never
    one per pair. Every learner joins the group of its own place in the node, so that every
    learner is a member of as many groups as any other: torch names a group made with
    `use_local_synchronization` (`survivors_group`) after the number of groups its maker belongs
    to, and the survivors must agree on that name. `kwargs` go to `new_group` (e.g. backend)."""
    mine = None
    for ranks in rail_ranks(world_size, group_size):
        g = dist.new_group(ranks, timeout=timeout, **kwargs)
        if rank in ranks:
            mine = g
    return mine


def across_nodes(rank: int, world_size: int, group_size: int, timeout: timedelta, **kwargs) -> Any:
    """The leaders' group (rail 0) on a leader, None elsewhere; builds every rail (`build_rails`)."""
    mine = build_rails(rank, world_size, group_size, timeout, **kwargs)
    return mine if rank % group_size == 0 else None


def exchange_group(ranks: list[int] | None, timeout: timedelta, across: tuple[int, int, int] | None = None):
    """The gloo group adpsgd's pairwise exchanges travel on (every rank of the job must call this):
    over `ranks`, or with `across` = (rank, world size, group size) between the leaders of the
    nodes (None on the other learners). Its members connect within `timeout` (gloo's timeout of
    the group): a learner lost while the group forms fails it then, in one line, where a group
    made with the passives' wait of a day waited a day for it. Every wait on the group gives its
    own timeout."""
    def build():
        if across is not None:
            return across_nodes(*across, timeout=timeout, backend="gloo")
        return dist.new_group(ranks, timeout=timeout, backend="gloo")
    return guarded("building the exchange group", build)


def copy_group(group: Any, timeout: timedelta) -> Any:
    """A new group over the learners of `group` (None: the whole job): a strategy's private group,
    for collectives its own communication thread runs (onebit)."""
    ranks = None if group is None else dist.get_process_group_ranks(group)
    return dist.new_group(ranks, timeout=timeout)


def survivors_group(members: list[int], timeout: timedelta) -> Any:
    """The group of the survivors a decentralized job agreed on (`asrdist.parallel.membership`):
    only `members` take part in building it."""
    return guarded(f"building the group of the survivors {members}", lambda: dist.new_group(
        members, timeout=timeout, use_local_synchronization=True))
