"""Hierarchical allreduce (the scheme of Horovod's): the links inside a node carry the data, the links
between nodes 1/L of it. For n = N nodes x L learners and a flat tensor of S values (S a multiple of L):
1. Reduce-scatter inside the node: local rank l holds part l (S/L values) of its node's sum.
2. Allreduce part l across nodes, in rail l. (onebit: the 1-bit stripe exchange runs here instead.)
3. All-gather inside the node: every learner holds the whole sum.
A tensor over `PIPELINE_CHUNK_BYTES` is pipelined in chunks (in-node steps behind the slow link).
Bytes, pipeline and `strategy.hierarchical`:
docs/strategies.md#hierarchical-allreduce-parallelhierarchical_allreducepy."""
from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import Any, Iterable, Sequence

import torch

from asrdist.errors import ConfigError
from asrdist.parallel import comm
from asrdist.parallel.base import CommCounters, LearnerContext
from asrdist.parallel.groups import build_rails

HIERARCHICAL_SETTINGS = ("auto", "true", "false")


def check_hierarchical(value: Any) -> str:
    """`strategy.hierarchical` as 'auto', 'true' or 'false' (YAML's booleans accepted)."""
    if isinstance(value, bool):
        value = "true" if value else "false"
    if value not in HIERARCHICAL_SETTINGS:
        raise ConfigError(f"strategy.hierarchical: expected auto, true or false, got {value!r}")
    return value


def use_hierarchical(setting: str, ctx: LearnerContext) -> bool:
    """Whether a strategy with this `strategy.hierarchical` setting runs hierarchically in `ctx`:
    auto when it works on the whole job and the job has more than one node. The same answer on
    every rank (it builds groups)."""
    if setting == "false" or not ctx.distributed:
        return False
    if ctx.groups is None or ctx.world_size != ctx.job_world_size:
        if setting == "true":
            raise ConfigError("strategy.hierarchical: true needs the job's node groups (start_learner) and a "
                              "strategy working on the whole job")
        return False
    # one learner per node: nothing to reduce inside a node, the steps would only add copies
    return setting == "true" or (ctx.groups.group_size > 1 and ctx.job_world_size // ctx.groups.group_size > 1)


@dataclass(frozen=True)
class Hierarchy:
    """This learner's place in a two-level job: its node group and its rail."""

    node: Any
    rail: Any
    """None when the job has one node (nothing crosses nodes)."""
    local_size: int
    local_rank: int
    num_nodes: int
    node_index: int


def build_hierarchy(ctx: LearnerContext) -> Hierarchy:
    """The node group from `ctx.groups` and newly built rails (every rank calls this; see
    `groups.build_rails`). Each call builds its own rails: a strategy's private groups."""
    size, rank, world = ctx.groups.group_size, ctx.job_rank, ctx.job_world_size
    num_nodes = world // size
    rail = build_rails(rank, world, size, ctx.timeout) if num_nodes > 1 else None
    return Hierarchy(node=ctx.groups.node, rail=rail, local_size=size, local_rank=rank % size,
                     num_nodes=num_nodes, node_index=rank // size)


def padded_numel(numel: int, hierarchy: Hierarchy | None) -> int:
    """`numel` rounded up to a multiple of the node size (the length a flat buffer needs)."""
    size = 1 if hierarchy is None else hierarchy.local_size
    return -(-numel // size) * size


# ---------------------------------------------------------------------------- allreduce

class HierarchicalPending:
    """A hierarchical allreduce in flight. `advance()` waits for the current step and launches the
    next; `wait()` finishes all three. Every rank must advance its pendings in the same order."""

    __slots__ = ("_flat", "_part", "_hierarchy", "_counters", "_timeout", "_step", "_pending")

    def __init__(self, flat, part, hierarchy: Hierarchy, counters: CommCounters, timeout, pending):
        self._flat, self._part, self._hierarchy = flat, part, hierarchy
        self._counters, self._timeout = counters, timeout
        self._step, self._pending = 1, pending

    @property
    def done(self) -> bool:
        return self._step > 3

    def advance(self, stalled: bool = True) -> bool:
        """Finish step 1, 2 or 3 and launch the next; True once all three are done."""
        if self.done:
            return True
        if self._pending is not None:
            self._pending.wait(stalled)
        self._step += 1
        h, kw = self._hierarchy, dict(async_op=True, timeout=self._timeout, stalled=stalled)
        self._pending = None
        if self._step == 2 and h.rail is not None:
            self._pending = comm.allreduce(self._part, self._counters, group=h.rail, **kw)
        elif self._step == 3 and h.local_size > 1:
            self._pending = comm.all_gather(self._flat, self._part, self._counters, group=h.node, **kw)
        return self.done

    def wait(self, stalled: bool = True) -> None:
        while not self.advance(stalled):
            pass


class PipelinedPending:
    """The chunks of one tensor's hierarchical allreduce; `advance()` moves every unfinished chunk
    one step on, in chunk order."""

    __slots__ = ("_chunks",)

    def __init__(self, chunks: list[HierarchicalPending]):
        self._chunks = chunks

    @property
    def done(self) -> bool:
        return all(c.done for c in self._chunks)

    def advance(self, stalled: bool = True) -> bool:
        for chunk in self._chunks:
            chunk.advance(stalled)
        return self.done

    def wait(self, stalled: bool = True) -> None:
        while not self.advance(stalled):
            pass


PIPELINE_CHUNK_BYTES = 2**20
"""Largest piece of a tensor that goes through the three steps as one (see the module docstring)."""


def chunk_bounds(numel: int, size: int, element_size: int, chunk_bytes: int = PIPELINE_CHUNK_BYTES) -> list[tuple[int, int]]:
    """[start, end) of the pipeline chunks of a tensor of `numel` values (a multiple of the node
    size `size`): equal lengths, each a multiple of `size`, at most `chunk_bytes` unless one group
    of `size` values is larger."""
    groups = numel // size
    per_chunk = max(1, chunk_bytes // (element_size * size))
    count = max(1, -(-groups // per_chunk))
    edges = [groups * c // count * size for c in range(count + 1)]
    return [(a, b) for a, b in zip(edges, edges[1:]) if b > a] or [(0, numel)]


def _start(flat: torch.Tensor, counters: CommCounters, hierarchy: Hierarchy, timeout, stalled: bool) -> HierarchicalPending:
    """Launch step 1 for one chunk."""
    if hierarchy.local_size == 1:
        return HierarchicalPending(flat, flat, hierarchy, counters, timeout, None)
    part = torch.empty(flat.numel() // hierarchy.local_size, dtype=flat.dtype, device=flat.device)
    pending = comm.reduce_scatter(part, flat, counters, group=hierarchy.node, async_op=True,
                                  timeout=timeout, stalled=stalled)
    return HierarchicalPending(flat, part, hierarchy, counters, timeout, pending)


def hierarchical_allreduce(flat: torch.Tensor, counters: CommCounters, hierarchy: Hierarchy, *,
                           timeout: timedelta | None = None, async_op: bool = False, stalled: bool = True,
                           chunk_bytes: int | None = None) -> HierarchicalPending | PipelinedPending | None:
    """Sum the 1-D `flat` in place over the job, steps 1-3 of the module docstring, pipelined over
    chunks of at most `chunk_bytes` (default `PIPELINE_CHUNK_BYTES`). Its length must be a multiple of the node size
    (`padded_numel`). `async_op`: return the pending allreduce with step 1 launched; `finish_all`
    or its `wait()` completes it."""
    size = hierarchy.local_size
    if flat.dim() != 1 or flat.numel() % size:
        raise ValueError(f"hierarchical_allreduce: expected a 1-D tensor whose length is a multiple of "
                         f"{size}, got shape {tuple(flat.shape)}")
    bounds = chunk_bounds(flat.numel(), size, flat.element_size(), chunk_bytes or PIPELINE_CHUNK_BYTES)
    chunks = [_start(flat[a:b], counters, hierarchy, timeout, stalled) for a, b in bounds]
    running = chunks[0] if len(chunks) == 1 else PipelinedPending(chunks)
    if async_op:
        return running
    running.wait(stalled)
    return None


def finish_all(pendings: Iterable[HierarchicalPending | PipelinedPending], stalled: bool = True) -> None:
    """Finish several hierarchical allreduces step by step (every one's step 1, then every one's
    step 2, ...), so that their cross-node allreduces are in flight together."""
    live = list(pendings)
    while live:
        live = [p for p in live if not p.advance(stalled)]


# ------------------------------------------------------- node steps for column compressors

def deal_columns(shapes: Sequence[tuple[int, int]], parts: int) -> list[list[tuple[int, int, int]]]:
    """Every matrix's columns cut into `parts` contiguous blocks, dealt round-robin in matrix order
    (as onebit deals its stripes, so one-column biases spread over the parts); per part its
    (slot, c0, c1) blocks in matrix order, empty blocks dropped."""
    dealt: list[list[tuple[int, int, int]]] = [[] for _ in range(parts)]
    turn = 0
    for slot, (_, cols) in enumerate(shapes):
        edges = [cols * b // parts for b in range(parts + 1)]
        for c0, c1 in zip(edges, edges[1:]):
            if c1 > c0:
                dealt[turn % parts].append((slot, c0, c1))
                turn += 1
    return dealt


class ColumnShards:
    """Steps 1 and 3 for a compressor that works on whole columns (onebit): the node's learners
    split the columns of every [rows, cols] matrix (`deal_columns`); local rank l's blocks are the
    l-th of L equal, zero-padded parts of one flat float32 buffer. `reduce_scatter` leaves the
    node mean of this learner's blocks in `shard_matrices`; the compressor exchanges them across
    nodes into `result_matrices`, and `all_gather` brings every part back into full matrices."""

    def __init__(self, shapes: Sequence[tuple[int, int]], hierarchy: Hierarchy, device: torch.device,
                 timeout: timedelta | None = None):
        self.hierarchy = h = hierarchy
        self.timeout = timeout
        self.blocks = deal_columns(shapes, h.local_size)
        sizes = [sum(shapes[j][0] * (c1 - c0) for j, c0, c1 in blocks) for blocks in self.blocks]
        self.part_numel = max(sizes, default=0)
        self.flat = torch.zeros(h.local_size * self.part_numel, device=device)
        self.shard = torch.zeros(self.part_numel, device=device)
        self.result = torch.zeros(self.part_numel, device=device)
        self._flat_views = [self._views(self.flat[l * self.part_numel:], shapes, blocks)
                            for l, blocks in enumerate(self.blocks)]
        mine = self.blocks[h.local_rank]
        self.shard_shapes = [(shapes[j][0], c1 - c0) for j, c0, c1 in mine]
        self.shard_matrices = self._views(self.shard, shapes, mine)
        self.result_matrices = self._views(self.result, shapes, mine)

    @staticmethod
    def _views(buffer: torch.Tensor, shapes, blocks) -> list[torch.Tensor]:
        views, offset = [], 0
        for j, c0, c1 in blocks:
            n = shapes[j][0] * (c1 - c0)
            views.append(buffer[offset:offset + n].view(shapes[j][0], c1 - c0))
            offset += n
        return views

    def reduce_scatter(self, sources: Sequence[torch.Tensor], counters: CommCounters,
                       stalled: bool = True) -> list[torch.Tensor]:
        """Step 1: the node mean of this learner's blocks of `sources` ([rows, cols] each)."""
        for blocks, views in zip(self.blocks, self._flat_views):
            for (j, c0, c1), view in zip(blocks, views):
                view.copy_(sources[j][:, c0:c1])
        if self.hierarchy.local_size == 1:
            self.shard.copy_(self.flat)
        elif self.part_numel:
            comm.reduce_scatter(self.shard, self.flat, counters, group=self.hierarchy.node,
                                timeout=self.timeout, stalled=stalled)
            self.shard.div_(self.hierarchy.local_size)
        return self.shard_matrices

    def all_gather(self, targets: Sequence[torch.Tensor], counters: CommCounters,
                   stalled: bool = True) -> None:
        """Step 3: every learner's `result_matrices` into the full [rows, cols] `targets`."""
        if self.hierarchy.local_size == 1:
            self.flat.copy_(self.result)
        elif self.part_numel:
            comm.all_gather(self.flat, self.result, counters, group=self.hierarchy.node,
                            timeout=self.timeout, stalled=stalled)
        for blocks, views in zip(self.blocks, self._flat_views):
            for (j, c0, c1), view in zip(blocks, views):
                targets[j][:, c0:c1].copy_(view)
