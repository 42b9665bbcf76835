"""`onebit` pipelining: the chunk layout covers every column once, chunked exchanges are
bit-identical to the unchunked one (results, residuals, counters), checkpoints do not depend on
the chunking, and the fused owner's reduce matches the reference."""
from __future__ import annotations

import copy

import pytest
import torch

from asrdist.errors import ConfigError
from asrdist.parallel.base import LearnerContext
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.onebit_plan import _Chunks, _Plan
from asrdist.parallel.onebit_kernel import ReferenceQuantizer, Residual, get_quantizer, packed_words
from asrdist.parallel.standin import StandIn
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

SHAPES = [(40, 6), (40,), (3, 40), (3,), (70, 33), (70,)]


def _grads(step: int, rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(s, generator=gen) for s in SHAPES]


@pytest.mark.parametrize("k", [1, 2, 3, 4, 7, 50])
@pytest.mark.parametrize("n", [1, 3, 4])
def test_chunks_cover_every_column_once_in_balanced_pieces(n, k):
    shapes = [(40, 6), (40, 1), (3, 40), (3, 1), (70, 33), (70, 1)]
    plan = _Plan(shapes, n, rank=n - 1)
    chunks = _Chunks(plan, k)
    assert 1 <= len(chunks.slices) <= k
    covered = {j: [] for j in range(len(shapes))}
    for c, pieces in enumerate(chunks.pieces):
        for p in pieces:
            assert p.block.c0 <= p.c0 < p.c1 <= p.block.c1
            covered[p.block.slot] += range(p.c0, p.c1)
        values = sum(p.block.rows * (p.c1 - p.c0) for p in pieces)
        total = sum(r * c for r, c in shapes)
        assert abs(values - total / len(chunks.slices)) <= 70 * 2 or len(chunks.slices) < k
    assert all(sorted(cols) == list(range(shapes[j][1])) for j, cols in covered.items())
    assert chunks.total_numel == plan.total_numel
    assert chunks.recv_numel == n * plan.stripe_numel[plan.rank]
    # the wire regions of the pieces tile the buffer
    spans = sorted((chunks.where(c, p), p.numel) for c, ps in enumerate(chunks.pieces) for p in ps)
    assert [s for s, _ in spans] == [0] + [s + m for s, m in spans[:-1]]
    if k == 1:  # one chunk: exactly the plan's layout
        for p in chunks.pieces[0]:
            assert chunks.where(0, p) == plan.stripe_start[p.block.owner] + plan.offset[p.block]


def test_chunks_must_be_a_positive_integer():
    for bad in (0, -1, 2.0, True):
        with pytest.raises(ConfigError):
            OneBitStrategy(chunks=bad)


def _exchanges(rank: int, n: int, chunks: int, steps: int = 3) -> dict:
    strategy = OneBitStrategy(OneBitConfig(kernel="auto"), chunks=chunks)
    stand_in = StandIn(strategy, SHAPES, LearnerContext(rank=rank, world_size=n))
    setup_bytes = strategy.counters.bytes_sent  # rank 0's parameters, broadcast by setup
    outputs = []
    for t in range(steps):
        stand_in.set_gradients(_grads(t, rank))
        outputs.append([o.clone() for o in stand_in.after_backward()])
    counters = strategy.counters.as_dict()
    counters["bytes_sent"] -= setup_bytes
    return {"outputs": outputs, "counters": counters, "phases": dict(strategy.phase_seconds),
            "state": strategy.state_dict()}


def _learner(rank: int, n: int) -> dict:
    return {k: _exchanges(rank, n, k) for k in (1, 3, 5)}


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


@pytest.mark.slow
def test_chunked_exchanges_are_bit_identical_on_three_learners(tmp_path):
    n = 3
    results = run_distributed(_learner, n, tmp_path)
    quantized = sum((packed_words(s[0]) + 2) * (s[1] if len(s) > 1 else 1) for s in SHAPES)
    for res in results:
        base = res[1]
        assert base["counters"]["bytes_sent"] > 0
        for k in (3, 5):
            for a, b in zip(base["outputs"], res[k]["outputs"]):
                assert _equal(a, b), k
            assert res[k]["counters"]["bytes_sent"] == base["counters"]["bytes_sent"]
            assert res[k]["counters"]["exchanges"] == 3
            for key in ("residuals", "second_residuals"):
                assert _equal(base["state"][key], res[k]["state"][key]), key
            assert set(res[k]["phases"]) == {"quantize", "scatter_wait", "reduce", "gather_wait", "dequantize"}
    for t in range(3):  # every learner got the same gradient
        assert all(_equal(results[0][5]["outputs"][t], res[5]["outputs"][t]) for res in results)
    # all learners together send 2(n-1) x the quantized gradient per exchange
    assert sum(res[5]["counters"]["bytes_sent"] for res in results) == 3 * 2 * (n - 1) * quantized * 4


def _cubic_loss(holder, batch):
    """(W * C_t).sum() + (b ** 3).sum(), C_t the inputs."""
    return (holder.w * batch.inputs).sum() + (holder.b ** 3).sum(), batch.num_frames


def _linear_run(chunks: int, steps: int, state=None, start: int = 0):
    """Double-buffered training on `_cubic_loss`; returns the weights after every step."""
    torch.manual_seed(0)
    holder = torch.nn.Module()
    holder.w = torch.nn.Parameter(torch.randn(70, 9))
    holder.b = torch.nn.Parameter(torch.randn(70))
    opt = torch.optim.SGD(holder.parameters(), lr=0.5, momentum=0.9)
    strategy = OneBitStrategy(OneBitConfig(double_buffering=True), chunks=chunks)
    strategy.setup(holder, opt, LearnerContext())
    if state is not None:
        holder.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        strategy.load_state_dict(state["strategy"])
    coefficients = [(torch.randn(70, 9, generator=torch.Generator().manual_seed(t)), torch.empty(0))
                    for t in range(start, start + steps)]
    trajectory = []
    train_steps(make_trainer(holder, opt, strategy, loss_fn=_cubic_loss), coefficients,
                after_each=lambda: trajectory.append([p.detach().clone() for p in holder.parameters()]))
    saved = copy.deepcopy({"model": holder.state_dict(), "optimizer": opt.state_dict(),
                           "strategy": strategy.state_dict()})
    strategy.finalize()
    return trajectory, saved


def test_checkpoints_do_not_depend_on_the_chunking():
    straight, _ = _linear_run(chunks=1, steps=5)
    _, state = _linear_run(chunks=4, steps=2)
    assert state["strategy"]["pending_gradient"] is not None
    resumed, _ = _linear_run(chunks=1, steps=3, state=state, start=2)  # 4 chunks saved, 1 loads
    assert all(_equal(a, b) for a, b in zip(straight[2:], resumed))
    _, state1 = _linear_run(chunks=1, steps=2)
    for key in ("pending_gradient",):
        assert torch.equal(state["strategy"][key], state1["strategy"][key])
    resumed4, _ = _linear_run(chunks=3, steps=3, state=state1, start=2)  # and back
    assert all(_equal(a, b) for a, b in zip(straight[2:], resumed4))


@pytest.mark.parametrize("rows,width,n", [(1, 4, 2), (37, 5, 3), (64, 3, 2), (70, 13, 4)])
@pytest.mark.parametrize("with_residual", [True, False])
def test_fused_reduce_quantize_matches_dequantize_mean_then_quantize(rows, width, n, with_residual):
    fused = get_quantizer("fused")
    gen = torch.Generator().manual_seed(rows * width + n)
    nw = packed_words(rows) * width
    words = [torch.randint(-2**31, 2**31 - 1, (nw,), dtype=torch.int32, generator=gen) for _ in range(n)]
    recon = [torch.randn(2 * width, generator=gen) for _ in range(n)]
    last, means = torch.randn(rows, width, generator=gen), torch.randn(2, width, generator=gen)
    results = []
    for quantizer, fused_path in ((fused, True), (ReferenceQuantizer(), True), (ReferenceQuantizer(), False)):
        residual = None
        if with_residual:
            residual = Residual(rows, width)
            residual.last.copy_(last)
            residual.means.copy_(means)
        out_words, out_recon = torch.zeros(nw, dtype=torch.int32), torch.zeros(2 * width)
        if fused_path:
            quantizer.reduce_quantize(words, recon, rows, width, residual, out_words, out_recon)
        else:  # the two steps, spelled out
            mean = torch.zeros(rows, width)
            for w, r in zip(words, recon):
                quantizer.dequantize([w], [r], rows, [0, width], mean, accumulate=True)
            quantizer.quantize(mean / n, residual, [0, width], [out_words], [out_recon])
        results.append([out_words, out_recon] + ([residual.last, residual.means] if residual else []))
    for other in results[1:]:
        assert _equal(results[0], other)
