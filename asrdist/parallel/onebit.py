"""`onebit`: 1-bit SGD with error feedback, as in CNTK (Seide et al., Interspeech 2014; DESIGN.md §5.2).

Per minibatch, on every learner (n learners, this one is `rank`):
1. Quantize each gradient column (a column of W[out, in] is W[:, j]; a bias is one column):
   v = g + r, bit = (v >= 0), reconstruction values = mean of the negative / non-negative
   entries (0 if a side is empty), new residual r = v - dequant (error feedback).
2. Columns are split into n stripes: each matrix's columns into n contiguous blocks, the blocks
   dealt to the learners round-robin in matrix order, so one-column biases spread over them.
   One all-to-all sends every learner's quantized stripe s (bits packed 32 per int32, plus two
   floats per column) to learner s.
3. The owner dequantizes and sums the n contributions, divides by n (the mean), adds its second
   residual, and quantizes again (second error feedback).
4. The re-quantized stripes are all-gathered (an all-to-all of the stripe repeated n times: gloo's
   all-gather wants equal sizes), and every learner dequantizes the same bits into p.grad, so all
   learners apply the identical gradient and training stays deterministic.

`error_feedback: false` drops both residuals (the ablation). `double_buffering: true` runs steps
2-4 of minibatch t on a communication thread while minibatch t+1 is computed; the gradient of t is
applied at step t+1, so the first step applies nothing (every p.grad is set to None, which torch
optimizers skip) and `finalize()` applies the last pending gradient with one more optimizer step.
Off, the update is exact 1-bit SGD. `auto_batch_size: true` asks the trainer for CNTK's
minibatch-size search at epoch starts (`asrdist.optim.batch_search`); the strategy itself only
carries the switch, since the search restarts from the epoch-start state of everything.
"""
from __future__ import annotations

import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Sequence

import torch
import torch.distributed as dist

from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import comm
from asrdist.parallel.base import LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.onebit_kernel import (
    KERNEL_KINDS, Residual, as_columns, get_quantizer, packed_words, segment_numel, split_segment,
)
from asrdist.parallel.momentum import MomentumCorrection


@dataclass
class OneBitConfig:
    error_feedback: bool = True
    """Carry each learner's quantization error (and each stripe owner's) into the next
    minibatch. False is the ablation: plain 1-bit quantization, which must train worse."""
    double_buffering: bool = False
    """Exchange minibatch t's gradient while t+1 is computed and apply it one step late."""
    kernel: str = "auto"
    """Quantizer: 'fused' (compiled C, CPU), 'reference' (pure torch) or 'auto' (fused when it
    builds and the device is the CPU)."""
    auto_batch_size: bool = False
    """CNTK's automatic minibatch-size search (`asrdist.optim.batch_search`) at every epoch start
    after the first: from the epoch-start state, trial global sizes data.batch_size x sqrt(2)^k
    (multiples of 64, up to 2x the previous epoch's size) each train `batch_search_minibatches`;
    the largest whose loss stays <= 1.01 x the base size's trains the epoch."""
    batch_search_minibatches: int = 10
    """Minibatches trained per trial size by the search."""
    momentum_correction: bool = True
    """With SGD momentum (or weight decay), each learner folds them into its own gradient before
    quantizing, and the optimizer applies the exchanged result as a plain step (see
    `MomentumCorrection`). False quantizes raw gradients and leaves momentum to the optimizer,
    which amplifies the quantization error by 1/(1 - momentum) (the ablation)."""

    def __post_init__(self):
        for key in ("error_feedback", "double_buffering", "auto_batch_size", "momentum_correction"):
            if not isinstance(getattr(self, key), bool):
                raise ConfigError(f"strategy.onebit.{key}: expected true or false, got {getattr(self, key)!r}")
        if self.kernel not in KERNEL_KINDS:
            raise ConfigError(f"strategy.onebit.kernel: unknown kernel {self.kernel!r} (known: {', '.join(KERNEL_KINDS)})")
        m = self.batch_search_minibatches
        if isinstance(m, bool) or not isinstance(m, int) or m < 1:
            raise ConfigError(f"strategy.onebit.batch_search_minibatches: expected an integer >= 1, got {m!r}")


_default_quantizer = None


def quantize_dequantize(v: torch.Tensor) -> torch.Tensor:
    """The per-column 1-bit reconstruction of a 1-D (one column) or 2-D tensor W[out, in]
    (columns W[:, j]): each entry becomes the mean of its column's entries of the same sign
    (negative, or non-negative)."""
    global _default_quantizer
    if v.dim() not in (1, 2):
        raise ValueError(f"quantize_dequantize: expected a 1-D or 2-D tensor, got shape {tuple(v.shape)}")
    if v.numel() == 0:
        return v.clone()
    if v.device.type == "cpu":
        _default_quantizer = _default_quantizer or get_quantizer("auto")
        quantizer = _default_quantizer
    else:
        quantizer = get_quantizer("reference", v.device)
    m = as_columns(v).to(torch.float32).contiguous()
    rows, cols = m.shape
    words = torch.empty(packed_words(rows) * cols, dtype=torch.int32, device=v.device)
    recon = torch.empty(2 * cols, device=v.device)
    quantizer.quantize(m, None, [0, cols], [words], [recon])
    out = torch.empty_like(m)
    quantizer.dequantize([words], [recon], rows, [0, cols], out)
    return out.reshape(v.shape).to(v.dtype)


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


class OneBitStrategy(Strategy):
    """1-bit SGD with error feedback and stripe aggregation; see the module docstring."""

    name = "onebit"

    def __init__(self, config: OneBitConfig | None = None):
        config = OneBitConfig() if config is None else config
        if not isinstance(config, OneBitConfig):
            raise ConfigError(f"strategy onebit: expected a OneBitConfig, got {type(config).__name__}")
        super().__init__(config)
        self._params: list[torch.nn.Parameter] = []
        self._plan: _Plan | None = None
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future | None = None
        self._result_ready = False  # the gathered buffer holds a gradient not yet applied
        self._stashed_state: dict[str, Any] | None = None
        self._momentum: MomentumCorrection | None = None

    # ---------------------------------------------------------------- trainer interface

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        self._params = parameters_with_grad(model)
        for name, p in model.named_parameters():
            if p.requires_grad and p.dtype != torch.float32:
                raise ConfigError(f"strategy onebit: parameter {name} is {p.dtype}, float32 required")
        if ctx.distributed:
            comm.broadcast_module(model, self.counters, src=0, timeout=ctx.timeout)
        if self.config.momentum_correction:
            self._momentum = MomentumCorrection.take_over(optimizer, self._params)
        self._prepare([p.shape for p in self._params], ctx)

    def after_backward(self) -> None:
        if self._momentum is not None:
            self._momentum.apply(self._params)
        grads = [p.grad for p in self._params]
        if not self.config.double_buffering:
            self._quantize_local(grads, 0)
            self._exchange_stripes(self._send[0], stalled=True)
            self._dequantize_into_grads()
            return
        buffer = self._step % 2  # the other send buffer may still be on the wire
        self._quantize_local(grads, buffer)
        send = self._send[buffer]
        self._wait_inflight()
        if self._result_ready:
            self._dequantize_into_grads()
        else:
            for p in self._params:  # first step: nothing to apply yet
                p.grad = None
        self._inflight = self._executor.submit(self._exchange_stripes, send, False)
        self._step += 1

    def finalize(self) -> None:
        """With double buffering, apply the last minibatch's pending gradient (one more optimizer
        step), so every minibatch is applied exactly once."""
        if self.config.double_buffering and self._plan is not None:
            self._wait_inflight()
            if self._result_ready and self.optimizer is not None:
                self._dequantize_into_grads()
                self.optimizer.step()
                self.optimizer.zero_grad()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
            self._executor = None

    def state_dict(self) -> dict[str, Any]:
        """This learner's state: residuals differ per rank, so every rank's must be saved."""
        state = super().state_dict()
        if self._momentum is not None:
            state["momentum"] = self._momentum.state_dict()
        if self._plan is None:
            return state
        self._wait_inflight()
        state.update({
            "rank": self._plan.rank,
            "world_size": self._plan.n,
            "shapes": self._plan.shapes,
            "step": self._step,
            "residuals": [r.materialize().cpu() for r in self._residuals] if self._residuals else None,
            "second_residuals": [r.materialize().cpu() for r in self._second] if self._second else None,
            "pending_gradient": self._gathered.cpu().clone() if self._result_ready else None,
        })
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
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
        for key, mine in (("residuals", self._residuals), ("second_residuals", self._second)):
            saved = state.get(key)
            if saved is not None and mine:
                for residual, value in zip(mine, saved):
                    residual.load(value.to(residual.last.device))
        self._step = state.get("step", 0)
        pending = state.get("pending_gradient")
        self._result_ready = pending is not None and self.config.double_buffering
        if self._result_ready:
            self._gathered.copy_(pending)

    # ------------------------------------------------------------------------ model-free

    def setup_exchange(self, shapes: Sequence[torch.Size], ctx: LearnerContext) -> None:
        """Prepare `exchange` for float32 gradients of these shapes without a model (benchmarks)."""
        self.ctx = ctx
        self._prepare(shapes, ctx)
        self._outputs = [torch.empty(s, device=ctx.device) for s in shapes]

    def exchange(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        """One synchronous 1-bit exchange of `grads` (shaped as given to `setup_exchange`),
        quantization and error feedback included; returns the aggregated gradients every
        learner obtains (views of internal buffers, valid until the next call)."""
        if getattr(self, "_outputs", None) is None:
            raise TrainingError("onebit.exchange: call setup_exchange first")
        if len(grads) != len(self._outputs):
            raise ValueError(f"onebit.exchange: {len(grads)} gradients, {len(self._outputs)} expected")
        self._quantize_local(list(grads), 0)
        self._exchange_stripes(self._send[0], stalled=True)
        for j, k in enumerate(self._live):
            self._dequantize_slot(j, as_columns(self._outputs[k]))
        return list(self._outputs)

    # --------------------------------------------------------------------------- helpers

    def _prepare(self, shapes: Sequence[torch.Size], ctx: LearnerContext) -> None:
        shapes = [torch.Size(s) for s in shapes]
        self._shapes = shapes
        self._live = [k for k, s in enumerate(shapes) if s.numel() > 0]
        shapes2d = [tuple(as_columns(torch.empty(shapes[k], device="meta")).shape) for k in self._live]
        n, rank = ctx.world_size, ctx.rank
        self._plan = plan = _Plan(shapes2d, n, rank)
        self._quantizer = get_quantizer(self.config.kernel, ctx.device)
        self._group = dist.new_group(timeout=ctx.timeout) if ctx.distributed else None
        dev = ctx.device

        def wire(numel: int) -> torch.Tensor:
            return torch.zeros(numel, dtype=torch.int32, device=dev)

        self._send = [wire(plan.total_numel) for _ in range(2 if self.config.double_buffering else 1)]
        self._gathered = wire(plan.total_numel)
        mine = plan.stripe_numel[rank]
        self._recv, self._mine_repeated = wire(n * mine), wire(n * mine)
        owned = plan.owned[rank]
        self._sums = [torch.zeros(b.rows, b.c1 - b.c0, device=dev) for b in owned]
        # Views into the wire buffers, built once: (bounds, words, recon) per matrix ...
        slots = range(len(shapes2d))
        self._send_segments = [[plan.slot_segments(buf, j) for j in slots] for buf in self._send]
        self._gathered_segments = [plan.slot_segments(self._gathered, j) for j in slots]
        # ... and, per owned block, its n incoming segments and its re-quantized segment.
        self._owner_views = []
        for b in owned:
            incoming = [plan.view(self._recv, b, s * mine) for s in range(n)]
            self._owner_views.append((([w for w, _ in incoming], [r for _, r in incoming]),
                                      plan.view(self._mine_repeated, b, 0)))
        ef = self.config.error_feedback
        self._residuals = [Residual(r, c, dev) for r, c in shapes2d] if ef else []
        self._second = [Residual(b.rows, b.c1 - b.c0, dev) for b in owned] if ef else []
        self._zeros: dict[int, torch.Tensor] = {}
        self._step = 0
        self._inflight, self._result_ready = None, False
        if self.config.double_buffering and self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="onebit-comm")
        if self._stashed_state is not None:
            state, self._stashed_state = self._stashed_state, None
            self.load_state_dict(state)

    def _quantize_local(self, grads: Sequence[torch.Tensor | None], buffer: int) -> None:
        """Step 1: quantize every matrix (plus its residual) straight into send buffer `buffer`."""
        for j, k in enumerate(self._live):
            g = grads[k]
            if g is None:
                g2d = self._zeros.setdefault(k, torch.zeros(self._plan.shapes[j], device=self.ctx.device))
            else:
                if g.dtype != torch.float32:
                    raise TrainingError(f"onebit: gradient {k} is {g.dtype}, float32 required")
                g2d = as_columns(g).contiguous()
            bounds, words, recon = self._send_segments[buffer][j]
            self._quantizer.quantize(g2d, self._residuals[j] if self._residuals else None, bounds, words, recon)

    def _exchange_stripes(self, send: torch.Tensor, stalled: bool) -> None:
        """Steps 2-4 up to the gathered bits: all-to-all, owner's reduce + re-quantize, gather."""
        plan, n, rank = self._plan, self._plan.n, self._plan.rank
        mine = plan.stripe_numel[rank]
        timeout = self.ctx.timeout
        if n > 1:
            comm.all_to_all(self._recv, send, [mine] * n, plan.stripe_numel, self.counters,
                            group=self._group, timeout=timeout, stalled=stalled)
        else:
            self._recv.copy_(send)
        out = self._mine_repeated[:mine]
        for m, block in enumerate(plan.owned[rank]):
            width = block.c1 - block.c0
            (in_words, in_recon), (words, recon) = self._owner_views[m]
            self._quantizer.dequantize_mean(in_words, in_recon, block.rows, self._sums[m])
            self._quantizer.quantize(self._sums[m], self._second[m] if self._second else None,
                                     [0, width], [words], [recon])
        if n > 1:
            for s in range(1, n):
                self._mine_repeated[s * mine:(s + 1) * mine].copy_(out)
            comm.all_to_all(self._gathered, self._mine_repeated, plan.stripe_numel, [mine] * n,
                            self.counters, group=self._group, timeout=timeout, stalled=stalled)
        else:
            self._gathered.copy_(out)
        self.counters.exchanges += 1

    def _wait_inflight(self) -> None:
        if self._inflight is None:
            return
        t0 = time.perf_counter()
        try:
            self._inflight.result()
        finally:
            self.counters.wait_seconds += time.perf_counter() - t0
            self._inflight = None
        self._result_ready = True

    def _dequantize_slot(self, j: int, out2d: torch.Tensor) -> None:
        bounds, words, recon = self._gathered_segments[j]
        self._quantizer.dequantize(words, recon, self._plan.shapes[j][0], bounds, out2d)

    def _dequantize_into_grads(self) -> None:
        """Step 4, last part: every learner writes the identical aggregated gradient."""
        for j, k in enumerate(self._live):
            p = self._params[k]
            if p.grad is None or not p.grad.is_contiguous():
                p.grad = torch.empty_like(p, memory_format=torch.contiguous_format)
            self._dequantize_slot(j, as_columns(p.grad))
        for k, p in enumerate(self._params):
            if p.numel() == 0 and p.grad is None:
                p.grad = torch.zeros_like(p)
        self._result_ready = False
