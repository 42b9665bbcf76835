"""`onebit`: 1-bit SGD with error feedback, as in CNTK (Seide et al., Interspeech 2014; DESIGN.md §5.2).

Per minibatch, on every learner (n learners):
1. quantize each gradient column: v = g + r, bit = (v >= 0), reconstruction values the means of
   the negative / non-negative entries, new residual r = v − dequant (error feedback);
2. split the columns into n stripes (each matrix's columns into n blocks, dealt round-robin) and
   send every learner its stripe by one all-to-all (bits packed 32 per int32, two floats a column);
3. the owner dequantizes and averages the n contributions, adds its second residual, re-quantizes;
4. the stripes are all-gathered and every learner dequantizes the same bits into p.grad.
`warm_start_frames` exchanges the job's first frames in fp32 (CNTK's warm start);
`error_feedback: false` is the ablation; `double_buffering` runs steps 2-4 of step t behind the
compute of t+1; steps 1-4 are pipelined in chunks (bit-identical); `hierarchical` runs them across
nodes only. Details: docs/strategies.md#onebit-1-bit-sgd-with-error-feedback-parallelonebitpy."""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Callable, Sequence

import torch

from asrdist.checks import check_field
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import comm
from asrdist.parallel.base import LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.descriptor import Pipelined, SimJob, StrategyDescriptor
from asrdist.parallel.groups import copy_group
from asrdist.parallel.hierarchical_allreduce import (
    ColumnShards,
    build_hierarchy,
    check_hierarchical,
    use_hierarchical,
)
from asrdist.parallel.momentum import MomentumCorrection
from asrdist.parallel.onebit_kernel import (
    KERNEL_KINDS,
    Residual,
    as_columns,
    get_quantizer,
)
from asrdist.parallel.onebit_plan import PIPELINE_CHUNKS, _Chunks, _Piece, _Plan, exchange_traffic
from asrdist.parallel.sync import hierarchical_in_use


@dataclass
class OneBitConfig:
    error_feedback: bool = True
    """Carry each learner's quantization error (and each stripe owner's) into the next
    minibatch. False is the ablation: plain 1-bit quantization, which must train worse."""
    double_buffering: bool = False
    """Exchange minibatch t's gradient while t+1 is computed and apply it one step late."""
    kernel: str = "auto"
    """Quantizer: 'fused' (compiled C, CPU), 'triton' (CUDA), 'reference' (pure torch) or 'auto'
    (fused on the CPU when it builds, triton on CUDA when Triton is there, else the reference)."""
    auto_batch_size: bool = False
    """CNTK's automatic minibatch-size search (`asrdist.optim.batch_search`) at every epoch start
    after the first: from the epoch-start state, trial global sizes data.batch_size x sqrt(2)^k
    (multiples of 64, up to 2x the previous epoch's size) each train on the same frames (those of
    `batch_search_minibatches` at data.batch_size, as CNTK);
    the largest whose loss stays <= 1.01 x the base size's trains the epoch."""
    batch_search_minibatches: int = 10
    """The search's budget per trial: this many minibatches of data.batch_size, in frames; every
    trial size trains on those frames (fewer, larger minibatches at a larger size)."""
    momentum_correction: bool = True
    """With SGD momentum (or weight decay), each learner folds them into its own gradient before
    quantizing, and the optimizer applies the exchanged result as a plain step (see
    `MomentumCorrection`). False quantizes raw gradients and leaves momentum to the optimizer,
    which amplifies the quantization error by 1/(1 - momentum) (the ablation)."""
    hierarchical: Any = "auto"
    """auto | true | false: fp32 reduce-scatter inside the node, the 1-bit exchange across nodes on
    this learner's columns, all-gather inside the node; auto = when there are several nodes."""
    warm_start_frames: int = 0
    """CNTK's warm start (`distributed_after`, in samples): the job's first this-many frames are
    exchanged in full precision (one fp32 allreduce of the gradients, sync's arithmetic), then
    1-bit quantization starts with zero residuals. 0 = quantize from the first minibatch."""

    def __post_init__(self):
        self.hierarchical = check_hierarchical(self.hierarchical)
        for key in ("error_feedback", "double_buffering", "auto_batch_size", "momentum_correction"):
            check_field(f"strategy.{key}", getattr(self, key), bool)
        if self.kernel not in KERNEL_KINDS:
            raise ConfigError(f"strategy.kernel: unknown kernel {self.kernel!r} (known: {', '.join(KERNEL_KINDS)})")
        check_field("strategy.batch_search_minibatches", self.batch_search_minibatches, at_least=1)
        check_field("strategy.warm_start_frames", self.warm_start_frames, at_least=0)


class OneBitStrategy(Strategy):
    """1-bit SGD with error feedback and stripe aggregation; see the module docstring.

    `chunks`: pipeline chunks per exchange (default `PIPELINE_CHUNKS`; 1 runs the phases one
    after another). `phase_seconds` accumulates the seconds spent in each phase of the exchange
    by the thread(s) running it: quantize, reduce (owners), dequantize, and scatter_wait /
    gather_wait, the time blocked on the two all-to-alls (wire time not hidden by other phases);
    hierarchical: node_scatter / node_gather, the reduce-scatter and all-gather inside the node."""

    name = "onebit"
    config_class = OneBitConfig
    rising_loss_advice = ("1-bit quantization error grows with the step size: lower optim.lr (e.g. half), "
                          "keep strategy.error_feedback and strategy.momentum_correction on, or compare with "
                          "--strategy sync")

    def __init__(self, config: OneBitConfig | None = None, chunks: int | None = None):
        super().__init__(config)
        chunks = PIPELINE_CHUNKS if chunks is None else chunks
        if isinstance(chunks, bool) or not isinstance(chunks, int) or chunks < 1:
            raise ConfigError(f"strategy onebit: chunks must be an integer >= 1, got {chunks!r}")
        self.chunks = chunks
        self.phase_seconds: dict[str, float] = {}
        self._params: list[torch.nn.Parameter] = []
        self._plan: _Plan | None = None
        self._shards: ColumnShards | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future | None = None
        self._result_ready = False  # the gathered buffer holds a gradient not yet applied
        self._stashed_state: dict[str, Any] | None = None
        self._momentum: MomentumCorrection | None = None
        self._residuals: list[Residual] = []
        self._second: dict[_Piece, Residual] = {}
        self._update: Callable[[], None] | None = None  # the trainer's last step_fn
        self._frames_done = 0  # job frames trained in the warm start so far
        self._frame_step = 0

    # ---------------------------------------------------------------- trainer interface

    @property
    def pipeline_chunks(self) -> int:
        """Chunks the exchange is pipelined over (at most `chunks`: fewer when there are fewer columns)."""
        return len(self._chunks.slices)

    def wants_batch_search(self) -> bool:
        return self.config.auto_batch_size

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        self._params = parameters_with_grad(model)
        for name, p in model.named_parameters():
            if p.requires_grad and p.dtype != torch.float32:
                raise ConfigError(f"strategy onebit: parameter {name} is {p.dtype}, float32 required")
        if ctx.distributed:
            comm.broadcast_module(model, self.counters, src=0, group=ctx.group, timeout=ctx.timeout)
        if self.config.momentum_correction:
            self._momentum = MomentumCorrection.take_over(optimizer, self._params)
        self._prepare([p.shape for p in self._params], ctx)

    def after_backward(self) -> None:
        if self._momentum is not None:
            self._momentum.apply(self._params)
        if self.warming_up:
            self._full_precision_step()
            return
        sources = self._sources([p.grad for p in self._params])
        if not self.config.double_buffering:
            # Chunk c's columns are read (quantized) before they are overwritten (dequantized).
            self._exchange_into(sources, self._grad_targets())
            return
        if self._shards is not None:  # inside the node now; across nodes on the thread
            sources = self._timed("node_scatter", self._shards.reduce_scatter, sources, self.counters)
        buffer = self._step % 2  # the other send buffer may still be on the wire
        for c in range(len(self._chunks.slices)):
            self._timed("quantize", self._quantize_chunk, sources, buffer, c)
        self._wait_inflight()
        if self._result_ready:
            self._dequantize_into_grads()
        else:
            for p in self._params:  # first step: nothing to apply yet
                p.grad = None
        self._inflight = self._executor.submit(self._exchange, None, buffer, None, False)
        self._step += 1

    @property
    def warming_up(self) -> bool:
        """Whether this minibatch is still inside the warm start (the same answer on every learner:
        it counts the job's nominal frames per lock-step minibatch)."""
        return self._frames_done < self.config.warm_start_frames

    def note_samples(self, n: int) -> None:
        if not self._frame_step:  # nominal frames of one job-wide minibatch, fixed at the first one
            self._frame_step = (self.ctx.samples_per_step or n) * max(1, self.ctx.job_world_size)

    def _full_precision_step(self) -> None:
        """One warm-start minibatch: the mean of the learners' gradients by a fp32 allreduce."""
        for p in self._params:
            if p.grad is None:
                p.grad = torch.zeros_like(p)
        if self.ctx.distributed:
            comm.allreduce_mean([p.grad for p in self._params], self.counters, group=self.ctx.group,
                                timeout=self.ctx.timeout)
            self.counters.add(exchanges=1)
        self._frames_done += self._frame_step

    def close(self, error: BaseException | None = None) -> None:
        """On failure the exchange thread is dropped at once (its collective fails by timeout)."""
        if error is not None and self._executor is not None:
            self._executor.shutdown(wait=False, cancel_futures=True)
            self._executor = None

    def apply_update(self, step_fn: Callable[[], None]) -> None:
        self._update = step_fn
        step_fn()

    def finalize(self) -> None:
        """With double buffering, apply the last minibatch's pending gradient through
        `apply_update` with the trainer's last update (max-change, optimizer step at the last
        learning rate, zero_grad), so every minibatch is applied exactly once, and alike."""
        if self.config.double_buffering and self._plan is not None:
            self._wait_inflight()
            if self._result_ready and self._update is not None:
                self._dequantize_into_grads()
                self.apply_update(self._update)
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def discard_step(self) -> None:
        """A dropped step's non-finite values must not live on in the error-feedback residuals:
        their non-finite entries are reset to zero (the finite ones keep their feedback)."""
        for residual in [*self._residuals, *self._second.values()]:
            value = residual.materialize()
            if not bool(torch.isfinite(value).all()):
                residual.load(torch.nan_to_num(value, nan=0.0, posinf=0.0, neginf=0.0))

    def state_dict(self) -> dict[str, Any]:
        """This learner's state: residuals differ per rank, so every rank's must be saved. The
        second residuals and the pending gradient are saved per block in the plan's layout,
        whatever the chunking. The exchange in flight is finished first and its result kept as
        the pending gradient, so counters, residuals and pending gradient are of the same step."""
        if self._plan is not None:
            self._wait_inflight()
        state = super().state_dict()
        if self._momentum is not None:
            state["momentum"] = self._momentum.state_dict()
        if self._plan is None:
            return state
        pending = None
        if self._result_ready:
            pending = torch.empty_like(self._gathered)
            self._chunks.to_block_layout(self._gathered, pending)
        state.update({
            "rank": self._plan.rank,
            "world_size": self._plan.n,
            "shapes": self._plan.shapes,
            "step": self._step,
            "warm_start_frames_done": self._frames_done,
            "residuals": [r.materialize().cpu() for r in self._residuals] if self._residuals else None,
            "second_residuals": [torch.cat([self._second[p].materialize() for p in pieces], dim=1).cpu()
                                 for pieces in self._owned_pieces] if self._second else None,
            "pending_gradient": pending.cpu() if pending is not None else None,
        })
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Replace this learner's state by `state`. The exchange in flight (double buffering) is
        finished and its result dropped: otherwise it would later overwrite the loaded second
        residuals and pending gradient, or be applied as the next step's update (a batch-size
        search restores its snapshot right after a trial's last step)."""
        if self._plan is not None:
            self._wait_inflight()
            self._result_ready = False
        super().load_state_dict(state)
        if self._plan is None:
            self._stashed_state = state  # applied at setup
            return
        if self._momentum is not None and state.get("momentum") is not None:
            self._momentum.load_state_dict(state["momentum"])
        p = self._plan
        if (state.get("rank"), state.get("world_size"), state.get("shapes")) != (p.rank, p.n, p.shapes):
            raise ConfigError(f"strategy onebit: checkpoint state is for rank {state.get('rank')} of "
                              f"{state.get('world_size')} learners, this is rank {p.rank} of {p.n}")
        if state.get("residuals") is not None and self._residuals:
            for residual, value in zip(self._residuals, state["residuals"]):
                residual.load(value.to(residual.last.device))
        if state.get("second_residuals") is not None and self._second:
            for pieces, value in zip(self._owned_pieces, state["second_residuals"]):
                for piece in pieces:
                    b = piece.block
                    self._second[piece].load(value[:, piece.c0 - b.c0:piece.c1 - b.c0].to(self.ctx.device))
        self._step = state.get("step", 0)
        self._frames_done = int(state.get("warm_start_frames_done", self.config.warm_start_frames))
        pending = state.get("pending_gradient")
        self._result_ready = pending is not None and self.config.double_buffering
        if self._result_ready:
            self._chunks.to_block_layout(self._gathered, pending.to(self._gathered.device), back=True)

    # --------------------------------------------------------------------------- helpers

    def _prepare(self, shapes: Sequence[torch.Size], ctx: LearnerContext) -> None:
        shapes = [torch.Size(s) for s in shapes]
        self._shapes = shapes
        self._live = [k for k, s in enumerate(shapes) if s.numel() > 0]
        self._full_shapes = [tuple(as_columns(torch.empty(shapes[k], device="meta")).shape) for k in self._live]
        dev = ctx.device
        if use_hierarchical(self.config.hierarchical, ctx):
            hierarchy = build_hierarchy(ctx)  # its rails are this strategy's private groups
            self._shards = ColumnShards(self._full_shapes, hierarchy, dev, ctx.timeout)
            shapes2d, n, rank = self._shards.shard_shapes, hierarchy.num_nodes, hierarchy.node_index
            self._group = hierarchy.rail
        else:
            self._shards = None
            shapes2d, n, rank = self._full_shapes, ctx.world_size, ctx.rank
            self._group = copy_group(ctx.group, ctx.timeout) if ctx.distributed else None
        self._plan = plan = _Plan(shapes2d, n, rank)
        self._chunks = chunks = _Chunks(plan, self.chunks) if shapes2d else _Chunks(plan, 1)
        self._quantizer = get_quantizer(self.config.kernel, ctx.device)

        def wire(numel: int) -> torch.Tensor:
            return torch.zeros(numel, dtype=torch.int32, device=dev)

        self._send = [wire(chunks.total_numel) for _ in range(2 if self.config.double_buffering else 1)]
        self._gathered = wire(chunks.total_numel)
        self._recv, self._mine_repeated = wire(chunks.recv_numel), wire(chunks.recv_numel)
        # Views into the wire buffers, built once: per chunk, (slot, bounds, words, recon) per
        # matrix slice ...
        k_range = range(len(chunks.slices))
        self._send_segments = [[chunks.slot_segments(buf, c) for c in k_range] for buf in self._send]
        self._gathered_segments = [chunks.slot_segments(self._gathered, c) for c in k_range]
        # ... and per owned piece its n incoming segments and its re-quantized segment.
        ef = self.config.error_feedback
        self._owner_work: list[list[tuple]] = []
        self._second: dict[_Piece, Residual] = {}
        for c in k_range:
            mine, base = chunks.owner_numel[c][rank], chunks.recv_start[c]
            work = []
            for p in (p for p in chunks.pieces[c] if p.block.owner == rank):
                incoming = [chunks.view(self._recv, base + s * mine + chunks.offset[p], p) for s in range(n)]
                width = p.c1 - p.c0
                if ef:
                    self._second[p] = Residual(p.block.rows, width, dev)
                work.append((p, [w for w, _ in incoming], [r for _, r in incoming], self._second.get(p),
                             chunks.view(self._mine_repeated, base + chunks.offset[p], p)))
            self._owner_work.append(work)
        self._owned_pieces = [sorted((p for p in self._second if p.block is b), key=lambda p: p.c0)
                              for b in plan.owned[rank]]
        self._residuals = [Residual(r, c, dev) for r, c in shapes2d] if ef else []
        self._zeros: dict[int, torch.Tensor] = {}
        self._step = 0
        self._inflight, self._result_ready = None, False
        if self.config.double_buffering and self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onebit-comm")
        if self._stashed_state is not None:
            state, self._stashed_state = self._stashed_state, None
            self.load_state_dict(state)

    def _sources(self, grads: Sequence[torch.Tensor | None]) -> list[torch.Tensor]:
        """The [R, C] contiguous float32 matrix quantized for each live slot (zeros for None)."""
        out = []
        for j, k in enumerate(self._live):
            g = grads[k]
            if g is None:
                out.append(self._zeros.setdefault(k, torch.zeros(self._full_shapes[j], device=self.ctx.device)))
                continue
            if g.dtype != torch.float32:
                raise TrainingError(f"onebit: gradient {k} is {g.dtype}, float32 required")
            out.append(as_columns(g).contiguous())
        return out

    def _grad_targets(self) -> list[torch.Tensor]:
        """The [R, C] views of p.grad the exchanged gradient is written to (allocated if needed)."""
        for p in self._params:
            if p.grad is None or not p.grad.is_contiguous():
                p.grad = torch.empty_like(p, memory_format=torch.contiguous_format)
        return [as_columns(self._params[k].grad) for k in self._live]

    def _timed(self, phase: str, fn, *args):
        t0 = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.phase_seconds[phase] = self.phase_seconds.get(phase, 0.0) + time.perf_counter() - t0

    def _exchange_into(self, sources: list[torch.Tensor], targets: list[torch.Tensor]) -> None:
        """One synchronous exchange of the full matrices `sources` into `targets`; hierarchical:
        inside the node around the exchange of this learner's columns across nodes."""
        if self._shards is None:
            self._exchange(sources, 0, targets, stalled=True)
            return
        shard = self._timed("node_scatter", self._shards.reduce_scatter, sources, self.counters)
        self._exchange(shard, 0, self._shards.result_matrices, stalled=True)
        self._timed("node_gather", self._shards.all_gather, targets, self.counters)

    def _exchange(self, sources: list[torch.Tensor] | None, buffer: int,
                  targets: list[torch.Tensor] | None, stalled: bool) -> None:
        """Steps 1-4 as a pipeline over the chunks: at stage t, quantize chunk t (if `sources`)
        and launch its all-to-all, reduce chunk t - 1 and launch its gather, dequantize chunk
        t - 2 (if `targets`). Every rank launches the collectives in the same order."""
        k = len(self._chunks.slices)
        scatters: list = [None] * k
        gathers: list = [None] * k
        for stage in range(k + 2):
            if stage < k:
                if sources is not None:
                    self._timed("quantize", self._quantize_chunk, sources, buffer, stage)
                scatters[stage] = self._scatter(buffer, stage, stalled)
            if 0 <= stage - 1 < k:
                self._timed("scatter_wait", self._finish, scatters[stage - 1], stalled)
                self._timed("reduce", self._reduce_chunk, stage - 1)
                gathers[stage - 1] = self._gather(stage - 1, stalled)
            if targets is not None and 0 <= stage - 2 < k:
                self._timed("gather_wait", self._finish, gathers[stage - 2], stalled)
                self._timed("dequantize", self._dequantize_chunk, stage - 2, targets)
        if targets is None:
            for pending in gathers:
                self._timed("gather_wait", self._finish, pending, stalled)
        self.counters.add(exchanges=1)

    def _quantize_chunk(self, sources: list[torch.Tensor], buffer: int, c: int) -> None:
        """Step 1 for chunk c: its columns of every matrix (plus residual) into the send buffer."""
        self._quantizer.quantize_bucket([(sources[j], self._residuals[j] if self._residuals else None,
                                          bounds, words, recon) for j, bounds, words, recon in
                                         self._send_segments[buffer][c]])

    def _scatter(self, buffer: int, c: int, stalled: bool):
        """Step 2 for chunk c: launch the all-to-all sending each owner its pieces."""
        ch, n, rank = self._chunks, self._plan.n, self._plan.rank
        size, mine = sum(ch.owner_numel[c]), ch.owner_numel[c][rank]
        send = self._send[buffer][ch.start[c]:ch.start[c] + size]
        recv = self._recv[ch.recv_start[c]:ch.recv_start[c] + n * mine]
        if n == 1:
            recv.copy_(send)
            return None
        return comm.all_to_all(recv, send, [mine] * n, ch.owner_numel[c], self.counters, group=self._group,
                               async_op=True, timeout=self.ctx.timeout, stalled=stalled)

    def _reduce_chunk(self, c: int) -> None:
        """Step 3 for chunk c: the owner's mean of the n contributions, re-quantized with the
        second residual, repeated n times for the gather."""
        for piece, in_words, in_recon, second, (words, recon) in self._owner_work[c]:
            self._quantizer.reduce_quantize(in_words, in_recon, piece.block.rows, piece.c1 - piece.c0,
                                            second, words, recon)
        mine, base = self._chunks.owner_numel[c][self._plan.rank], self._chunks.recv_start[c]
        for s in range(1, self._plan.n):
            self._mine_repeated[base + s * mine:base + (s + 1) * mine].copy_(self._mine_repeated[base:base + mine])

    def _gather(self, c: int, stalled: bool):
        """Step 4 for chunk c: launch the all-to-all that brings every owner's pieces to all."""
        ch, n, rank = self._chunks, self._plan.n, self._plan.rank
        size, mine = sum(ch.owner_numel[c]), ch.owner_numel[c][rank]
        gathered = self._gathered[ch.start[c]:ch.start[c] + size]
        repeated = self._mine_repeated[ch.recv_start[c]:ch.recv_start[c] + n * mine]
        if n == 1:
            gathered.copy_(repeated)
            return None
        return comm.all_to_all(gathered, repeated, ch.owner_numel[c], [mine] * n, self.counters,
                               group=self._group, async_op=True, timeout=self.ctx.timeout, stalled=stalled)

    @staticmethod
    def _finish(pending, stalled: bool) -> None:
        if pending is not None:
            pending.wait(stalled)

    def _dequantize_chunk(self, c: int, targets: list[torch.Tensor]) -> None:
        self._quantizer.dequantize_bucket([(words, recon, self._plan.shapes[j][0], bounds, targets[j])
                                           for j, bounds, words, recon in self._gathered_segments[c]])

    def _wait_inflight(self) -> None:
        if self._inflight is None:
            return
        t0 = time.perf_counter()
        try:
            self._inflight.result()
        finally:
            self.counters.add(wait_seconds=time.perf_counter() - t0)
            self._inflight = None
        self._result_ready = True

    def _dequantize_into_grads(self) -> None:
        """Step 4, last part: every learner writes the identical aggregated gradient."""
        targets = self._grad_targets()
        shard_targets = targets if self._shards is None else self._shards.result_matrices
        for c in range(len(self._chunks.slices)):
            self._timed("dequantize", self._dequantize_chunk, c, shard_targets)
        if self._shards is not None:
            self._timed("node_gather", self._shards.all_gather, targets, self.counters)
        for k, p in enumerate(self._params):
            if p.numel() == 0 and p.grad is None:
                p.grad = torch.zeros_like(p)
        self._result_ready = False


def _simulated(config: OneBitConfig, job: SimJob) -> Pipelined:
    n, per_node = job.learners, job.per_node
    span = per_node if hierarchical_in_use(config.hierarchical, n, per_node) else 0
    return Pipelined(lambda rank: exchange_traffic(job.shapes, n, per_node, rank, config.hierarchical),
                     config.double_buffering, PIPELINE_CHUNKS, node_span=span)


ONEBIT = StrategyDescriptor(OneBitStrategy, Pipelined, _simulated, codes_alone=True,
                            advised={"onebit": {}, "onebit_double_buffering": {"double_buffering": True}})
