"""`ddp`: torch's DistributedDataParallel as a strategy (DESIGN.md §5.1; Li et al., VLDB 2020).

1. At setup every learner takes rank 0's parameters and buffers (broadcast, counted as sync's),
   then the model is wrapped in `DistributedDataParallel` on the strategy's process group (the
   job's: gloo on the CPU, NCCL on CUDA), gradients as views of its buckets.
2. The trainer runs the forward through the wrapper (`forward_module`), so DDP's reducer
   averages the gradients during backward, bucket by bucket: one bucket for its first step,
   then buckets of at most `bucket_cap_mb` in the order backward produced the gradients.
3. `hook` replaces a bucket's allreduce by torch's comm hook: fp16 or bf16 compression, or
   PowerSGD (Vogels et al., NeurIPS 2019) at rank `powersgd_rank` after `powersgd_start_iter`
   steps of plain allreduce, with torch's defaults otherwise (error feedback, warm start).
4. `after_backward` only counts the exchange (bytes as a ring allreduce, compressed bytes with a
   hook); its time is not in `comm_seconds`: the reducer's collectives cannot be timed from outside.
`no_sync()` is DDP's. What it counts, keeps on resume and does on gloo:
docs/strategies.md#ddp-torchs-distributeddataparallel-parallelddppy."""
from __future__ import annotations

import inspect
import math
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, ContextManager, Iterator, Sequence

import numpy as np
import torch
import torch.distributed as dist
from torch.distributed.algorithms.ddp_comm_hooks import default_hooks, powerSGD_hook
from torch.nn.parallel import DistributedDataParallel

from asrdist.checks import check_field
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import comm
from asrdist.parallel.base import CommCounters, LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.descriptor import LockStep, SimJob, StrategyDescriptor
from asrdist.parallel.sync import SyncConfig, bucket_layout

HOOKS = ("none", "fp16", "bf16", "powersgd")
DDP_BUCKET_CAP_MB = 25.0
"""DDP's own default cap: at it, DDP's first bucket holds at most 1 MiB (`dist._DEFAULT_FIRST_BUCKET_BYTES`)."""
POWERSGD_MIN_COMPRESSION_RATE = 2
"""torch's default `min_compression_rate`, passed explicitly (the count relies on it): a matrix is
compressed when its factors are under half its size."""


@dataclass
class DdpConfig:
    hook: str = "none"
    """none | fp16 | bf16 | powersgd: torch's DDP communication hook for every bucket (none: DDP's
    own allreduce)."""
    powersgd_rank: int = 1
    """PowerSGD's matrix approximation rank (torch's `matrix_approximation_rank`)."""
    powersgd_start_iter: int = 1000
    """Steps of plain allreduce before PowerSGD compresses (torch's `start_powerSGD_iter`, its
    default 1000; at least 2: DDP rebuilds its buckets after its first step)."""
    bucket_cap_mb: float = DDP_BUCKET_CAP_MB
    """Largest bucket, in MiB (DDP's `bucket_cap_mb`). At DDP's default, 25, the first bucket holds
    at most 1 MiB; DDP gives any other cap to its first bucket too."""

    def __post_init__(self):
        if self.hook not in HOOKS:
            raise ConfigError(f"strategy.hook: expected one of {', '.join(HOOKS)}, got {self.hook!r}")
        check_field("strategy.powersgd_rank", self.powersgd_rank, at_least=1)
        check_field("strategy.powersgd_start_iter", self.powersgd_start_iter, at_least=2)
        check_field("strategy.bucket_cap_mb", self.bucket_cap_mb, float, above=0)


# ------------------------------------------------------------------------------ traffic

def powersgd_values(shapes: Sequence[Sequence[int]], rank: int,
                    min_compression_rate: float = POWERSGD_MIN_COMPRESSION_RATE) -> tuple[int, int, int]:
    """(uncompressed, P, Q) values torch's `powerSGD_hook` allreduces for one bucket of gradients
    of `shapes`: each tensor as a matrix (shape[0], rest); one worth compressing at rank r sends
    its P (rows x r) and Q (columns x r), vectors and the others go whole."""
    plain = p_values = q_values = 0
    for shape in shapes:
        numel = math.prod(shape)
        rows = shape[0] if len(shape) else 1
        cols = numel // rows if rows else 0
        r = min(rows, cols, rank)
        if (rows + cols) * r * min_compression_rate < numel:
            p_values, q_values = p_values + rows * r, q_values + cols * r
        else:
            plain += numel
    return plain, p_values, q_values


def _allreduce(values: int, world_size: int, element_size: int) -> comm.Transfer:
    return comm.Transfer("allreduce", "world", world_size, comm.ring_allreduce_bytes(values * element_size, world_size),
                         values)


def bucket_traffic(shapes: Sequence[Sequence[int]], world_size: int, config: DdpConfig,
                   compressing: bool = True, element_size: int = 4) -> list[comm.Transfer]:
    """What one learner sends for one DDP bucket of gradients of `shapes` under `config.hook`:
    one allreduce (fp16 / bf16: 2 bytes a value), or PowerSGD's three when it compresses
    (`compressing`: past `powersgd_start_iter`). The strategy counts exactly these."""
    if world_size < 2:
        return []
    if config.hook == "powersgd" and compressing:
        return [_allreduce(v, world_size, element_size)
                for v in powersgd_values(shapes, config.powersgd_rank) if v]
    numel = sum(math.prod(s) for s in shapes)
    return [_allreduce(numel, world_size, 2 if config.hook in ("fp16", "bf16") else element_size)] if numel else []


def _limits_mb(config: DdpConfig) -> tuple[float, float]:
    """(first bucket, other buckets) in MiB, as DDP sets them from `bucket_cap_mb`."""
    if config.bucket_cap_mb == DDP_BUCKET_CAP_MB:
        return dist._DEFAULT_FIRST_BUCKET_BYTES / 2**20, config.bucket_cap_mb
    return config.bucket_cap_mb, config.bucket_cap_mb


def exchange_traffic(shapes: Sequence[Sequence[int]], world_size: int,
                     config: DdpConfig | None = None) -> list[list[comm.Transfer]]:
    """One step's exchange once DDP has rebuilt its buckets (backward's order taken as the reverse
    of registration, as sync's) and PowerSGD compresses: per bucket, in launch order, its transfers."""
    config = config or DdpConfig()
    launch_order = list(reversed([tuple(s) for s in shapes]))
    first, cap = _limits_mb(config)
    tensors = [torch.empty(s, device="meta") for s in launch_order]
    layout = bucket_layout(tensors, SyncConfig(bucket_cap_mb=cap, first_bucket_mb=first))
    buckets = [bucket_traffic([launch_order[i] for i in idx], world_size, config) for idx in layout]
    return [b for b in buckets if b]


# ----------------------------------------------------------------------------- strategy

def _construction_options() -> dict[str, bool]:
    """No broadcast while DDP is built (setup's own is counted) nor before every forward (buffers
    as sync: rank 0's at finalize); torch 2.13 renamed broadcast_buffers to forward_sync_buffers."""
    names = inspect.signature(DistributedDataParallel.__init__).parameters
    options = {"init_sync": False} if "init_sync" in names else {}
    options["forward_sync_buffers" if "forward_sync_buffers" in names else "broadcast_buffers"] = False
    return options


def _tensors(output: Any) -> Iterator[torch.Tensor]:
    """The tensors of a forward's output (a tensor, or tuples, lists and dicts of them)."""
    if isinstance(output, torch.Tensor):
        yield output
    elif isinstance(output, (tuple, list)):
        for item in output:
            yield from _tensors(item)
    elif isinstance(output, dict):
        for item in output.values():
            yield from _tensors(item)


class DdpStrategy(Strategy):
    """torch's DistributedDataParallel behind the strategy interface (module docstring)."""

    name = "ddp"
    config_class = DdpConfig

    def __init__(self, config: DdpConfig | None = None, *, counters: CommCounters | None = None):
        super().__init__(config, counters=counters)
        self.ddp: DistributedDataParallel | None = None
        self.powersgd: powerSGD_hook.PowerSGDState | None = None
        self._param_index: dict[int, int] = {}  # id(parameter) -> its place in model.parameters()
        self._grad_hooks: list = []
        self._forwarded = False  # a forward ran through the wrapper since the last after_backward
        self._backward_ran = False  # a backward ran since the last forward
        self._output: Any = None  # the last forward's output, until after_backward
        self._rebuilt_bucket_bytes: list[int] | None = None
        self._reduced_steps = 0  # steps DDP's reducer exchanged in (its buckets are rebuilt after the first)
        self._serialize = False
        self._in_flight: torch.futures.Future | None = None  # powersgd on gloo: the previous bucket's exchange
        self._layout: dict[int, list[int]] = {}  # bucket index -> parameter indices, as the hook saw them
        self._restored_layout: dict[int, list[int]] = {}  # the layout a loaded PowerSGD memory belongs to

    # ---------------------------------------------------------------- trainer interface

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        if not ctx.distributed:
            return
        comm.broadcast_module(model, self.counters, src=0, group=ctx.group, timeout=ctx.timeout)
        self._param_index = {id(p): k for k, p in enumerate(model.parameters())}
        cap = None if self.config.bucket_cap_mb == DDP_BUCKET_CAP_MB else self.config.bucket_cap_mb
        self.ddp = DistributedDataParallel(model, process_group=ctx.group, bucket_cap_mb=cap,
                                           gradient_as_bucket_view=True, **_construction_options())
        self.ddp.register_forward_hook(self._keep_output)
        self._grad_hooks = [p.register_post_accumulate_grad_hook(self._on_grad) for p in parameters_with_grad(model)]
        self._register_comm_hook()

    def forward_module(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.ddp is None:
            return model
        if model is not self.model:
            raise TrainingError("ddp: forward_module was handed another model than the one set up")
        self._forwarded, self._backward_ran = True, False
        return self.ddp

    def no_sync(self) -> ContextManager[None]:
        return nullcontext() if self.ddp is None else self.ddp.no_sync()

    def after_backward(self) -> None:
        """DDP averaged the gradients in backward: count the exchange. A step whose loss was not
        finite had no backward (the trainer made its gradients NaN): a NaN backward through the
        wrapper then joins the others' exchange, so every learner drops the step together."""
        if self.ddp is None:
            return
        if not self._forwarded:
            raise TrainingError("ddp: no forward ran through DDP's wrapper this step, so DDP exchanged nothing: "
                                "train.emulate_compute_ms replaces the forward and backward DDP reduces gradients "
                                "in (emulate compute with strategy sync)")
        if not self._backward_ran:
            outputs = [t for t in _tensors(self._output) if t.requires_grad]
            if not outputs:
                raise TrainingError("ddp: the forward's output holds no tensor with a gradient to exchange")
            torch.autograd.backward(outputs, [torch.full_like(t, math.nan) for t in outputs])
        if self.config.hook == "none":
            n = self.ctx.world_size
            self.counters.add(bytes_sent=sum(comm.ring_allreduce_bytes(b, n) for b in self._bucket_bytes()))
        self.counters.add(exchanges=1)
        self._reduced_steps += 1
        self._forwarded = self._backward_ran = False
        self._output = self._in_flight = None

    def discard_step(self) -> None:
        """A dropped step's NaN reached PowerSGD's memory: those buckets restart their error
        feedback and warm start (every learner alike: the mean was NaN everywhere)."""
        if self.powersgd is None:
            return
        for memory in (self.powersgd.error_dict, self.powersgd.p_memory_dict, self.powersgd.q_memory_dict):
            for index in [k for k, t in memory.items() if not bool(torch.isfinite(t).all())]:
                del memory[index]

    def finalize(self) -> None:
        """Parameters are identical already; buffers (batch-norm statistics) are not: rank 0's."""
        for handle in self._grad_hooks:
            handle.remove()
        self._grad_hooks = []
        if self.ctx.distributed and self.model is not None:
            comm.broadcast_module(self.model, self.counters, src=0, group=self.ctx.group, timeout=self.ctx.timeout,
                                  parameters=False)

    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        if self.powersgd is not None:
            state["powersgd"] = self._powersgd_state()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        if self.powersgd is not None and state.get("powersgd") is not None:
            self._load_powersgd_state(state["powersgd"])

    # --------------------------------------------------------------------- the exchange

    def _keep_output(self, module: torch.nn.Module, args: Any, output: Any) -> None:
        self._output = output if torch.is_grad_enabled() else None

    def _on_grad(self, p: torch.Tensor) -> None:
        self._backward_ran = True

    def _bucket_bytes(self) -> list[int]:
        """Bytes of each of DDP's buckets this step (its first step's, then the rebuilt ones), from
        DDP's own record of them."""
        if self._rebuilt_bucket_bytes is not None:
            return self._rebuilt_bucket_bytes
        record = self.ddp._get_ddp_logging_data()
        rebuilt = bool(record.get("has_rebuilt_buckets"))
        sizes = [int(s) for s in str(record["rebuilt_bucket_sizes" if rebuilt else "bucket_sizes"]).split(",")]
        if rebuilt:
            self._rebuilt_bucket_bytes = sizes
        return sizes

    def _register_comm_hook(self) -> None:
        if self.config.hook == "none":
            return
        if self.config.hook == "powersgd":
            self.powersgd = powerSGD_hook.PowerSGDState(process_group=self.ctx.group,
                                                        matrix_approximation_rank=self.config.powersgd_rank,
                                                        start_powerSGD_iter=self.config.powersgd_start_iter,
                                                        min_compression_rate=POWERSGD_MIN_COMPRESSION_RATE)
            # gloo runs a hook's later collectives from its worker threads: two buckets in flight
            # would interleave them differently on each learner (measured: an abort, torch 2.13)
            self._serialize = dist.get_backend(self.ctx.group) == "gloo"
        self.ddp.register_comm_hook(self.powersgd, self._exchange_bucket)

    def _exchange_bucket(self, state, bucket):  # unannotated: DDP compares annotations with classes, these are strings
        """DDP's comm hook (state, dist.GradBucket) -> Future[Tensor]: torch's hook of
        `strategy.hook` on one bucket, counted."""
        n = self.ctx.world_size
        if self.config.hook != "powersgd":
            self._count(bucket_traffic([(bucket.buffer().numel(),)], n, self.config))
            if self.config.hook == "fp16":
                return default_hooks.fp16_compress_hook(self.ctx.group, bucket)
            return default_hooks.bf16_compress_hook(self.ctx.group, bucket)
        if self._in_flight is not None:
            self._in_flight.wait()
        index = bucket.index()
        self._layout[index] = [self._param_index[id(p)] for p in bucket.parameters()]
        compressing = state.iter >= state.start_powerSGD_iter
        shapes = [tuple(g.shape) for g in bucket.gradients()]
        if compressing and self._reduced_steps == 0:
            # DDP's first step runs in its initial buckets, not the ones PowerSGD's memory is kept
            # for (a resumed run): a plain allreduce, as torch's own first steps
            future = default_hooks.allreduce_hook(self.ctx.group, bucket)
            state.maybe_increase_iter(bucket)
            compressing = False
        else:
            if compressing:
                self._check_restored(index)
            future = powerSGD_hook.powerSGD_hook(state, bucket)
        self._count(bucket_traffic(shapes, n, self.config, compressing, bucket.buffer().element_size()))
        if self._serialize:
            self._in_flight = future
        return future

    def _count(self, transfers: list[comm.Transfer]) -> None:
        self.counters.add(bytes_sent=sum(t.bytes_sent for t in transfers))

    # ------------------------------------------------------------------ PowerSGD's memory

    def _check_restored(self, index: int) -> None:
        """A loaded PowerSGD memory of bucket `index` stays only where the bucket holds the same
        parameters as when it was saved."""
        saved = self._restored_layout.pop(index, None)
        if saved is not None and saved != self._layout[index]:
            for memory in (self.powersgd.error_dict, self.powersgd.p_memory_dict, self.powersgd.q_memory_dict):
                memory.pop(index, None)

    def _powersgd_state(self) -> dict[str, Any]:
        """Tensors and plain values only (a checkpoint loads as data): numpy's key as a tensor."""
        s = self.powersgd
        kind, key, position, has_gauss, gauss = s.rng.get_state(legacy=True)
        return {"iter": s.iter, "rng": (str(kind), torch.from_numpy(key.astype(np.int64)), int(position),
                                        int(has_gauss), float(gauss)),
                "error": dict(s.error_dict), "p": dict(s.p_memory_dict), "q": dict(s.q_memory_dict),
                "layout": {k: list(v) for k, v in self._layout.items()},
                "numel_before": s.total_numel_before_compression, "numel_after": s.total_numel_after_compression,
                "next_stats_report": s.next_stats_report}

    def _load_powersgd_state(self, saved: dict[str, Any]) -> None:
        s, device = self.powersgd, self.ctx.device
        s.iter = int(saved["iter"])
        kind, key, *rest = saved["rng"]
        s.rng.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
        s.error_dict, s.p_memory_dict, s.q_memory_dict = (
            {int(k): t.to(device) for k, t in saved[name].items()} for name in ("error", "p", "q"))
        s.total_numel_before_compression = saved["numel_before"]
        s.total_numel_after_compression = saved["numel_after"]
        s.next_stats_report = saved["next_stats_report"]
        self._restored_layout = {int(k): list(v) for k, v in saved["layout"].items()}


def _simulated(config: DdpConfig, job: SimJob) -> LockStep:
    return LockStep(exchange_traffic(job.shapes, job.learners, config), overlap=True)


DDP = StrategyDescriptor(DdpStrategy, LockStep, _simulated)
"""Not among the advisor's variants: without a hook its traffic is sync_flat's; the hooks' coding
costs are not modelled."""
