"""`sync`: synchronous allreduce SGD, the baseline (DESIGN.md §5.1).

1. At setup every learner takes rank 0's parameters and buffers (broadcast).
2. Parameters are grouped into flat buckets in reverse registration order by torch's own bucket
   assignment, the one DistributedDataParallel uses: a first bucket of at most `first_bucket_mb`,
   the others at most `bucket_cap_mb`; one kind (device, dtype) per bucket.
3. During backward a post-accumulate-grad hook copies each gradient into its bucket; a full bucket's
   allreduce is launched asynchronously, buckets strictly in index order on every learner.
4. `after_backward` launches what is left, waits, divides by n and makes every p.grad a view of
   the mean in its bucket; the optimizer then takes the same step everywhere.
With `hierarchical` (auto: more than one node) each bucket goes through `hierarchical_allreduce`.
Why hooks beside DDP (the ddp strategy): docs/strategies.md#sync-bucketed-allreduce-parallelsyncpy."""
from __future__ import annotations

from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Iterator, Sequence

import torch
import torch.distributed as dist

from asrdist.checks import check_field
from asrdist.errors import TrainingError
from asrdist.parallel import comm
from asrdist.parallel.base import CommCounters, LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.descriptor import LockStep, SimJob, StrategyDescriptor
from asrdist.parallel.hierarchical_allreduce import (
    Hierarchy,
    build_hierarchy,
    check_hierarchical,
    finish_all,
    hierarchical_allreduce,
    padded_numel,
    use_hierarchical,
)


@dataclass
class SyncConfig:
    bucket_cap_mb: float = 25.0
    """Largest flat bucket, in MB (2**20 bytes); one allreduce per bucket."""
    first_bucket_mb: float = dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20
    """Largest first bucket (the gradients backward produces first), as DDP's (1 MiB); at most
    `bucket_cap_mb`."""
    overlap: bool = True
    """Launch each bucket's allreduce during backward as soon as its gradients are ready;
    False: everything in after_backward."""
    hierarchical: Any = "auto"
    """auto | true | false: reduce-scatter inside the node, allreduce across nodes, all-gather
    inside the node (`asrdist.parallel.hierarchical_allreduce`); auto = when there are several nodes."""

    def __post_init__(self):
        self.hierarchical = check_hierarchical(self.hierarchical)
        check_field("strategy.bucket_cap_mb", self.bucket_cap_mb, float, above=0)
        check_field("strategy.first_bucket_mb", self.first_bucket_mb, float, above=0)
        check_field("strategy.overlap", self.overlap, bool)


class _Bucket:
    """One flat buffer of gradients (zero-padded to a multiple of the node size when the
    allreduce is hierarchical) and the allreduce in flight on it."""

    __slots__ = ("tensors", "flat", "values", "views", "ready", "pending")

    def __init__(self, tensors: list[torch.Tensor], hierarchy: Hierarchy | None):
        self.tensors = tensors
        numel = sum(t.numel() for t in tensors)
        self.flat = torch.zeros(padded_numel(numel, hierarchy), dtype=tensors[0].dtype, device=tensors[0].device)
        self.values = self.flat[:numel]
        self.views = comm.flat_views(self.flat, [t.shape for t in tensors])
        self.ready = [False] * len(tensors)
        self.pending = None


def bucket_layout(tensors: Sequence[torch.Tensor], config: SyncConfig) -> list[list[int]]:
    """Which tensors (in launch order) share a bucket, in launch order: the layout the strategy
    builds and `exchange_traffic` counts, by torch's own assignment (DDP's)."""
    if not tensors:
        return []
    cap = int(config.bucket_cap_mb * 2**20)
    limits = [min(int(config.first_bucket_mb * 2**20), cap), cap]
    buckets, _ = dist._compute_bucket_assignment_by_size(list(tensors), limits, [False] * len(tensors))
    return [list(b) for b in buckets]


def _build_buckets(tensors: Sequence[torch.Tensor], config: SyncConfig, hierarchy: Hierarchy | None) -> list[_Bucket]:
    return [_Bucket([tensors[i] for i in idx], hierarchy) for idx in bucket_layout(tensors, config)]


def hierarchical_in_use(setting: str, world_size: int, group_size: int) -> bool:
    """`use_hierarchical` for a strategy on the whole job of `world_size` learners in nodes of
    `group_size`, without a process group (the simulator's view)."""
    if setting == "false" or world_size < 2:
        return False
    return setting == "true" or world_size // group_size > 1


def allreduce_traffic(numel: int, world_size: int, group_size: int, hierarchical: bool,
                      element_size: int = 4, group: str = "world") -> list[comm.Transfer]:
    """What one learner sends to sum `numel` values over `world_size` learners: one ring allreduce,
    or the three steps of `hierarchical_allreduce` (the length padded to the node size)."""
    if world_size < 2 or numel == 0:
        return []
    if not hierarchical:
        return [comm.Transfer("allreduce", group, world_size, comm.ring_allreduce_bytes(numel * element_size, world_size),
                              numel)]
    size, nodes = group_size, world_size // group_size
    padded = -(-numel // size) * size
    out = []
    if size > 1:
        out.append(comm.Transfer("reduce_scatter", "node", size, comm.reduce_scatter_bytes(padded * element_size, size),
                                 numel))
    if nodes > 1:
        out.append(comm.Transfer("allreduce", "rail", nodes,
                                 comm.ring_allreduce_bytes(padded // size * element_size, nodes), numel // size))
    if size > 1:
        out.append(comm.Transfer("all_gather", "node", size, comm.reduce_scatter_bytes(padded * element_size, size),
                                 numel))
    return out


def exchange_traffic(shapes: Sequence[Sequence[int]], world_size: int, group_size: int,
                     config: SyncConfig | None = None, group: str = "world") -> list[list[comm.Transfer]]:
    """One step's gradient exchange as one learner sends it: per bucket, in launch order, its
    transfers (float32 gradients of `shapes`, in registration order, as `model.parameters()`)."""
    config = config or SyncConfig()
    tensors = [torch.empty(s, device="meta") for s in reversed(list(shapes))]  # shapes only, no memory
    hierarchical = group == "world" and hierarchical_in_use(config.hierarchical, world_size, group_size)
    buckets = [allreduce_traffic(sum(tensors[i].numel() for i in idx), world_size, group_size, hierarchical,
                                 group=group) for idx in bucket_layout(tensors, config)]
    return [b for b in buckets if b]


class SyncStrategy(Strategy):
    """Gradient mean by bucketed allreduce, overlapped with backward."""

    name = "sync"
    config_class = SyncConfig

    def __init__(self, config: SyncConfig | None = None, *, counters: CommCounters | None = None):
        super().__init__(config, counters=counters)
        self._buckets: list[_Bucket] = []
        self._where: dict[int, tuple[int, int]] = {}  # id(param) -> (bucket, slot)
        self._next_launch = 0
        self._hooks: list = []
        self._hierarchy: Hierarchy | None = None
        self._accumulating = False  # inside no_sync(): the hooks leave gradients where they are

    # ---------------------------------------------------------------- trainer interface

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        if not ctx.distributed:
            return
        comm.broadcast_module(model, self.counters, src=0, group=ctx.group, timeout=ctx.timeout)
        self._hierarchy = build_hierarchy(ctx) if use_hierarchical(self.config.hierarchical, ctx) else None
        params = list(reversed(parameters_with_grad(model)))
        self._buckets = _build_buckets(params, self.config, self._hierarchy)
        self._where = {id(t): (b, k) for b, bucket in enumerate(self._buckets) for k, t in enumerate(bucket.tensors)}
        if self.config.overlap:
            self._hooks = [p.register_post_accumulate_grad_hook(self._on_grad_ready) for p in params]

    def after_backward(self) -> None:
        if not self.ctx.distributed:
            return
        for bucket in self._buckets:
            for k, p in enumerate(bucket.tensors):
                if not bucket.ready[k]:
                    self._fill(bucket, k, p)
        self._launch_ready()
        if self._hierarchy is not None:
            finish_all(bucket.pending for bucket in self._buckets)
        n = self.ctx.world_size
        for bucket in self._buckets:
            bucket.pending.wait()
            bucket.flat.div_(n)
            for k, (p, view) in enumerate(zip(bucket.tensors, bucket.views)):
                # the mean is handed over as a view of the bucket, not copied (DDP's
                # gradient_as_bucket_view): the trainer's zero_grad(set_to_none) lets go of it before
                # the next backward fills the bucket again
                p.grad = view
                bucket.ready[k] = False
            bucket.pending = None
        self._next_launch = 0
        self.counters.add(exchanges=1)

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """The micro-batches of a step but its last add into p.grad; the last one's backward
        (outside) fires the hooks with the sums, which then go into the buckets."""
        self._accumulating = True
        try:
            yield
        finally:
            self._accumulating = False

    def finalize(self) -> None:
        """Parameters are identical already; buffers (e.g. batch-norm statistics) are not, so
        rank 0's are taken."""
        for handle in self._hooks:
            handle.remove()
        self._hooks = []
        if self.ctx.distributed and self.model is not None:
            comm.broadcast_module(self.model, self.counters, src=0, group=self.ctx.group, timeout=self.ctx.timeout,
                                  parameters=False)

    # --------------------------------------------------------------------------- helpers

    def _fill(self, bucket: _Bucket, k: int, p: torch.Tensor) -> None:
        view = bucket.views[k]
        if p.grad is None:
            view.zero_()
        else:
            view.copy_(p.grad)
        bucket.ready[k] = True

    def _on_grad_ready(self, p: torch.Tensor) -> None:
        if self._accumulating:
            return
        b, k = self._where[id(p)]
        bucket = self._buckets[b]
        if bucket.ready[k] or bucket.pending is not None:
            raise TrainingError("sync: a gradient became ready twice before after_backward "
                                "(accumulate over several backward calls inside strategy.no_sync())")
        self._fill(bucket, k, p)
        self._launch_ready()

    def _launch_ready(self) -> None:
        """Launch complete buckets in index order: every learner issues the same sequence."""
        while self._next_launch < len(self._buckets) and all(self._buckets[self._next_launch].ready):
            bucket = self._buckets[self._next_launch]
            bucket.pending = self._allreduce(bucket.flat)
            self._next_launch += 1

    def _allreduce(self, flat: torch.Tensor):
        """Launch one bucket's sum over the learners: flat, or hierarchical across nodes."""
        if self._hierarchy is None:
            return comm.allreduce(flat, self.counters, group=self.ctx.group, async_op=True, timeout=self.ctx.timeout)
        return hierarchical_allreduce(flat, self.counters, self._hierarchy, timeout=self.ctx.timeout, async_op=True)


def _simulated(config: SyncConfig, job: SimJob) -> LockStep:
    return LockStep(exchange_traffic(job.shapes, job.learners, job.per_node, config), overlap=config.overlap)


SYNC = StrategyDescriptor(SyncStrategy, LockStep, _simulated,
                          advised={"sync": {}, "sync_flat": {"hierarchical": "false"}})
