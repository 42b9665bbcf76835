"""Where every column of a 1-bit exchange goes: which learner owns which column block (the
stripes of DESIGN.md §5.2), and how the blocks are cut into pipeline chunks, each with its own
wire layout, and the bytes each chunk puts on the wire. Pure bookkeeping over shapes and int32
wire buffers; `onebit.py` does the exchange."""
from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Sequence

import torch

from asrdist.parallel import comm
from asrdist.parallel.hierarchical_allreduce import ColumnShards, Hierarchy
from asrdist.parallel.onebit_kernel import as_columns, packed_words, segment_numel, split_segment
from asrdist.parallel.sync import hierarchical_in_use


@dataclass(frozen=True)
class _Block:
    slot: int
    c0: int
    c1: int
    rows: int
    owner: int

    @property
    def numel(self) -> int:
        return segment_numel(self.rows, self.c1 - self.c0)


class _Plan:
    """Which learner owns which column block, and where each block sits in the wire buffers.
    The send buffer and the gathered buffer share one layout: the owners' stripes in rank order,
    each the owner's blocks in matrix order."""

    def __init__(self, shapes: Sequence[tuple[int, int]], n: int, rank: int):
        self.shapes, self.n, self.rank = list(shapes), n, rank
        self.blocks_of_slot: list[list[_Block]] = []
        self.owned: list[list[_Block]] = [[] for _ in range(n)]
        dealt = 0  # blocks are dealt round-robin: a matrix's n blocks go to n different owners
        for k, (rows, cols) in enumerate(self.shapes):
            edges = [cols * b // n for b in range(n + 1)]
            blocks = []
            for c0, c1 in zip(edges, edges[1:]):
                if c1 > c0:
                    blocks.append(_Block(k, c0, c1, rows, dealt % n))
                    dealt += 1
            self.blocks_of_slot.append(blocks)
            for block in blocks:
                self.owned[block.owner].append(block)
        self.offset: dict[_Block, int] = {}
        self.stripe_numel = []
        for blocks in self.owned:
            filled = 0
            for block in blocks:
                self.offset[block] = filled
                filled += block.numel
            self.stripe_numel.append(filled)
        self.stripe_start = [sum(self.stripe_numel[:s]) for s in range(n)]
        self.total_numel = sum(self.stripe_numel)

    def slot_segments(self, buffer: torch.Tensor, k: int):
        """(bounds, words views, recon views) of matrix k in a send/gathered-layout buffer."""
        blocks = self.blocks_of_slot[k]
        bounds = [b.c0 for b in blocks] + [blocks[-1].c1]
        views = [self.view(buffer, b, self.stripe_start[b.owner]) for b in blocks]
        return bounds, [w for w, _ in views], [r for _, r in views]

    def view(self, buffer: torch.Tensor, block: _Block, base: int):
        start = base + self.offset[block]
        return split_segment(buffer[start:start + block.numel], block.rows, block.c1 - block.c0)


PIPELINE_CHUNKS = 2
"""Chunks per exchange; an internal constant, since only speed depends on it. Each chunk costs
two collectives' latency, the CPU phases slow down when slices get narrow (a row-major matrix
read in column slices) and when they share the cores with the network stack, while a pipeline
of K chunks leaves about 1/K of the shorter of CPU and wire time exposed. Measured with
`asrdist bench comm --chunks K` (swbd shapes, 4 learners on 2 cores, 1 Gbit/s): K = 1, 2, 4, 8
gave speedups of about 11, 13, 12.5, 11.3."""


@dataclass(frozen=True)
class _Piece:
    """Columns [c0, c1) of a block that travel in one chunk: one wire segment."""
    block: _Block
    c0: int
    c1: int

    @property
    def numel(self) -> int:
        return segment_numel(self.block.rows, self.c1 - self.c0)


class _Chunks:
    """The plan's blocks cut into pipeline chunks of about equal numbers of values. Chunk c
    takes the columns whose values fall in [c, c+1) * total / K, matrix after matrix, so a chunk
    holds whole matrices (each spread over all owners) plus parts of at most two. Wire layout:
    chunk after chunk; within a chunk, the owners' pieces in rank order, each owner's in matrix
    order. With one chunk this is exactly the plan's layout."""

    def __init__(self, plan: _Plan, k: int):
        total = sum(rows * cols for rows, cols in plan.shapes)
        slices: list[list[tuple[int, int, int]]] = [[] for _ in range(k)]  # (slot, c0, c1)
        before = 0  # values in the matrices before this one
        for j, (rows, cols) in enumerate(plan.shapes):
            a, seen = 0, before
            while a < cols:
                c = min(k - 1, seen * k // total)
                end = -(-total * (c + 1) // k)  # the first value of chunk c + 1
                e = cols if c == k - 1 else min(cols, a + max(1, round((end - seen) / rows)))
                if slices[c] and slices[c][-1][0] == j:  # rounded short: the slice grows
                    a = slices[c].pop()[1]
                slices[c].append((j, a, e))
                seen, a = before + rows * e, e
            before += rows * cols
        self.slices = [sl for sl in slices if sl]
        n, rank = plan.n, plan.rank
        self.pieces: list[list[_Piece]] = []
        self.owner_numel: list[list[int]] = []
        self.start: list[int] = []  # of each chunk in the send / gathered buffers
        self.recv_start: list[int] = []  # of each chunk in this rank's recv buffer
        self.offset: dict[_Piece, int] = {}  # from the start of the piece's owner region
        filled = received = 0
        for sl in self.slices:
            pieces = [_Piece(b, max(a, b.c0), min(e, b.c1)) for j, a, e in sl
                      for b in plan.blocks_of_slot[j] if max(a, b.c0) < min(e, b.c1)]
            numel = [0] * n
            for piece in sorted(pieces, key=lambda p: p.block.owner):  # stable: matrix order kept
                self.offset[piece] = numel[piece.block.owner]
                numel[piece.block.owner] += piece.numel
            self.pieces.append(pieces)
            self.owner_numel.append(numel)
            self.start.append(filled)
            self.recv_start.append(received)
            filled += sum(numel)
            received += n * numel[rank]
        self.total_numel, self.recv_numel = filled, received
        self.plan = plan

    def where(self, c: int, piece: _Piece) -> int:
        """Offset of a piece of chunk c in the send / gathered buffers."""
        return self.start[c] + sum(self.owner_numel[c][:piece.block.owner]) + self.offset[piece]

    def view(self, buffer: torch.Tensor, start: int, piece: _Piece):
        return split_segment(buffer[start:start + piece.numel], piece.block.rows, piece.c1 - piece.c0)

    def slot_segments(self, buffer: torch.Tensor, c: int) -> list[tuple[int, list[int], list, list]]:
        """Per matrix slice of chunk c: (slot, bounds, words views, recon views) in `buffer`."""
        out = []
        for j, a, e in self.slices[c]:
            pieces = [p for p in self.pieces[c] if p.block.slot == j and a <= p.c0 < e]
            views = [self.view(buffer, self.where(c, p), p) for p in pieces]
            out.append((j, [p.c0 for p in pieces] + [e], [w for w, _ in views], [r for _, r in views]))
        return out

    def to_block_layout(self, chunked: torch.Tensor, blocks: torch.Tensor, back: bool = False) -> None:
        """Copy a gathered-layout buffer into the plan's (one-chunk) layout, or `back`."""
        plan = self.plan
        for c, pieces in enumerate(self.pieces):
            for p in pieces:
                b = p.block
                nw, width = packed_words(b.rows), b.c1 - b.c0
                bw, br = plan.view(blocks, b, plan.stripe_start[b.owner])
                pw, pr = self.view(chunked, self.where(c, p), p)
                pairs = ((bw.view(nw, width)[:, p.c0 - b.c0:p.c1 - b.c0], pw.view(nw, -1)),
                         (br.view(2, width)[:, p.c0 - b.c0:p.c1 - b.c0], pr.view(2, -1)))
                for block_view, piece_view in pairs:
                    (piece_view if back else block_view).copy_(block_view if back else piece_view)


@functools.lru_cache(maxsize=8)
def shared_owner_numel(shapes2d: tuple[tuple[int, int], ...], n: int, chunks: int) -> list[list[int]]:
    """Per pipeline chunk, the values each owner holds: the same for every rank (rank 0's plan),
    so a simulation of n learners builds it once, not n times."""
    return _Chunks(_Plan(shapes2d, n, 0), chunks).owner_numel


def chunk_transfers(shapes2d: Sequence[tuple[int, int]], n: int, rank: int, chunks: int) -> list[comm.Transfer]:
    """Steps 2 and 4 per pipeline chunk (the exchange's two all-to-alls), from the plan the run
    builds: int32 words, so 4 bytes each."""
    if n < 2 or not shapes2d:
        return []
    out = []
    for numel in shared_owner_numel(tuple(shapes2d), n, chunks):
        values = sum(numel)  # int32 words of the chunk (bits and reconstruction values)
        out.append(comm.Transfer("all_to_all", "rail", n, comm.all_to_all_bytes([4 * k for k in numel], rank), values))
        out.append(comm.Transfer("all_to_all", "rail", n, comm.all_to_all_bytes([4 * numel[rank]] * n, rank), values))
    return out


def exchange_traffic(shapes: Sequence[Sequence[int]], world_size: int, group_size: int, rank: int,
                     hierarchical: bool | str = "auto", chunks: int = PIPELINE_CHUNKS) -> list[comm.Transfer]:
    """One step's 1-bit exchange as learner `rank` sends it (float32 gradients of `shapes`, as
    `model.parameters()`): the two all-to-alls per chunk, or, hierarchical, the fp32 column
    reduce-scatter and all-gather inside the node around them (`hierarchical`: the strategy's
    setting). Built from the same plan, chunks and column shards the run uses (on the meta
    device: no memory); group "rail" is the world when there is one node per learner."""
    full = [tuple(as_columns(torch.empty(tuple(s), device="meta")).shape) for s in shapes]
    full = [s for s in full if s[0] * s[1] > 0]
    if world_size < 2:
        return []
    if not hierarchical_in_use(hierarchical, world_size, group_size):
        return [comm.Transfer(t.kind, "world", t.size, t.bytes_sent, t.values)
                for t in chunk_transfers(full, world_size, rank, chunks)]
    nodes, local = world_size // group_size, rank % group_size
    hierarchy = Hierarchy(node=None, rail=None, local_size=group_size, local_rank=local, num_nodes=nodes,
                          node_index=rank // group_size)
    shards = ColumnShards(full, hierarchy, torch.device("meta"))
    values = sum(r * c for r, c in full)
    inside = [] if group_size == 1 or not shards.part_numel else [
        comm.Transfer(kind, "node", group_size, comm.reduce_scatter_bytes(4 * shards.flat.numel(), group_size), values)
        for kind in ("reduce_scatter", "all_gather")]
    across = chunk_transfers(shards.shard_shapes, nodes, rank // group_size, chunks)
    return inside[:1] + across + inside[1:]
