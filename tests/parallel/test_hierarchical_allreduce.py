"""Hierarchical allreduce (reduce-scatter in the node, allreduce across nodes, all-gather in the node):
equal to the flat allreduce, honest byte counts, one rail group per local rank, `sync` and
`onebit` with `strategy.hierarchical`. Multi-process parts run once, on 4 gloo learners as 2 nodes x 2."""
from __future__ import annotations

from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
import torch.distributed as dist

from asrdist.config import from_dict
from asrdist.errors import ConfigError
from asrdist.parallel import comm
from asrdist.parallel.base import CommCounters, LearnerContext
from asrdist.parallel.groups import build_groups, rail_ranks
from asrdist.parallel.hierarchical_allreduce import (
    ColumnShards, Hierarchy, build_hierarchy, chunk_bounds, deal_columns, finish_all, hierarchical_allreduce, padded_numel,
    use_hierarchical,
)
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.onebit_kernel import ReferenceQuantizer, Residual, as_columns, packed_words
from asrdist.parallel.standin import StandIn
from asrdist.parallel.sync import SyncConfig, SyncStrategy
from tests.support.dist_utils import TIMEOUT, learner_context, run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

WORLD, NODE = 4, 2
LENGTHS = (1, 7, 64, 1001)  # 1, 7 and 1001 are padded to a multiple of the node size
STEPS, BATCH = 3, 8
ONEBIT_SHAPES = [(10, 6), (10,), (3, 10), (3,)]


# ----------------------------------------------------------------------------- one process

def test_rails_are_one_group_per_local_rank():
    rails = rail_ranks(8, 4)
    assert rails == [[0, 4], [1, 5], [2, 6], [3, 7]]
    assert sorted(r for rail in rails for r in rail) == list(range(8))
    assert len(rail_ranks(12, 3)) == 3  # group_size groups, not one per pair of learners


def test_columns_are_dealt_once_and_biases_spread():
    shapes = [(4, 5), (4, 1), (2, 4), (2, 1)]
    dealt = deal_columns(shapes, 2)
    for j, (_, cols) in enumerate(shapes):
        covered = sorted(c for part in dealt for slot, c0, c1 in part if slot == j for c in range(c0, c1))
        assert covered == list(range(cols))
    assert all(any(slot == 1 or slot == 3 for slot, _, _ in part) for part in dealt)  # one bias each


def test_column_shards_on_one_node_of_one_learner_are_the_identity():
    shapes = [(3, 4), (3, 1)]
    shards = ColumnShards(shapes, Hierarchy(None, None, 1, 0, 1, 0), torch.device("cpu"))
    sources = [torch.randn(s) for s in shapes]
    shard = shards.reduce_scatter(sources, CommCounters())
    for view, result in zip(shard, shards.result_matrices):
        result.copy_(view)
    targets = [torch.empty(s) for s in shapes]
    shards.all_gather(targets, CommCounters())
    assert all(torch.equal(a, b) for a, b in zip(sources, targets))


def test_length_must_be_a_multiple_of_the_node_size():
    with pytest.raises(ValueError, match="multiple of 2"):
        hierarchical_allreduce(torch.zeros(5), CommCounters(), Hierarchy(None, None, 2, 0, 2, 0))
    assert padded_numel(5, Hierarchy(None, None, 2, 0, 2, 0)) == 6 and padded_numel(5, None) == 5


@pytest.mark.parametrize("cls", [SyncConfig, OneBitConfig])
def test_config_is_validated(cls):
    with pytest.raises(ConfigError, match="strategy.hierarchical"):
        cls(hierarchical="sometimes")
    with pytest.raises(ConfigError, match="strategy.hierarchical"):
        cls(hierarchical=1)
    assert cls().hierarchical == "auto"
    assert from_dict(cls, {"hierarchical": True}, "strategy").hierarchical == "true"  # YAML's true
    assert from_dict(cls, {"hierarchical": "false"}, "strategy").hierarchical == "false"


def test_auto_is_hierarchical_only_across_nodes_on_the_whole_job():
    def ctx(group_size, world=4, job_world=4):
        return LearnerContext(rank=1, world_size=world, job_world_size=job_world,
                              groups=SimpleNamespace(group_size=group_size))

    assert use_hierarchical("auto", ctx(2))
    assert not use_hierarchical("auto", ctx(4))  # one node
    assert not use_hierarchical("auto", ctx(1))  # one learner per node: flat, no copies
    assert not use_hierarchical("auto", ctx(2, world=2))  # a strategy inside a node
    assert not use_hierarchical("false", ctx(2))
    assert use_hierarchical("true", ctx(4))
    assert not use_hierarchical("auto", LearnerContext(rank=1, world_size=4))  # no groups: flat
    with pytest.raises(ConfigError, match="strategy.hierarchical"):
        use_hierarchical("true", LearnerContext(rank=1, world_size=4))


# ------------------------------------------------------------------------ four learners

def _values(numel: int, rank: int, salt: int = 0) -> torch.Tensor:
    return torch.randn(numel, generator=torch.Generator().manual_seed(1000 * salt + 10 * rank + numel))


def _onebit_grads(step: int, rank: int) -> list[torch.Tensor]:
    gen = torch.Generator().manual_seed(100 * step + rank)
    return [torch.randn(s, generator=gen) for s in ONEBIT_SHAPES]


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 7), torch.nn.Tanh(), torch.nn.Linear(7, 3))  # odd sizes


def _train(rank: int, ctx: LearnerContext, strategy) -> tuple[list[torch.Tensor], object]:
    model = _model(seed=rank)  # setup broadcasts rank 0's
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy.setup(model, opt, ctx)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS, BATCH, 6, generator=gen), torch.randint(0, 3, (STEPS, BATCH), generator=gen)
    mine = slice(rank * BATCH // WORLD, (rank + 1) * BATCH // WORLD)
    train_steps(make_trainer(model, opt, strategy), [(x[t, mine], y[t, mine]) for t in range(STEPS)])
    strategy.finalize()
    return [p.detach().clone() for p in model.parameters()], strategy


def _learner(rank: int, world_size: int) -> dict:
    ctx = replace(learner_context(), groups=build_groups(rank, world_size, NODE, TIMEOUT), group_size=NODE)
    out: dict = {}
    created, new_group = [], dist.new_group
    dist.new_group = lambda *a, **k: created.append(a) or new_group(*a, **k)
    try:
        hierarchy = build_hierarchy(ctx)
    finally:
        dist.new_group = new_group
    out["rails_created"] = len(created)
    out["rail"] = dist.get_process_group_ranks(hierarchy.rail)

    for numel in LENGTHS:
        padded = torch.zeros(padded_numel(numel, hierarchy))
        padded[:numel] = _values(numel, rank)
        counters = CommCounters()
        hierarchical_allreduce(padded, counters, hierarchy, timeout=TIMEOUT)
        flat = _values(numel, rank)
        comm.allreduce(flat, CommCounters(), timeout=TIMEOUT)
        out[numel] = (padded, flat, counters.bytes_sent)
    chunked = torch.zeros(padded_numel(LENGTHS[-1], hierarchy))  # a pipeline of 63 chunks of 16 values
    chunked[:LENGTHS[-1]] = _values(LENGTHS[-1], rank)
    counters = CommCounters()
    hierarchical_allreduce(chunked, counters, hierarchy, timeout=TIMEOUT, chunk_bytes=64)
    out["chunked"] = (chunked, counters.bytes_sent)
    buffers = [torch.zeros(padded_numel(numel, hierarchy)) for numel in LENGTHS]  # several in flight
    for numel, b in zip(LENGTHS, buffers):
        b[:numel] = _values(numel, rank, salt=1)
    finish_all([hierarchical_allreduce(b, CommCounters(), hierarchy, timeout=TIMEOUT, async_op=True)
                for b in buffers])
    out["async"] = buffers

    for setting in ("auto", "false"):
        out[f"sync_{setting}"], strategy = _train(rank, ctx, SyncStrategy(SyncConfig(bucket_cap_mb=1e-4,
                                                                                     hierarchical=setting)))
        out[f"sync_{setting}_hierarchical"] = strategy._hierarchy is not None

    stand_in = StandIn(OneBitStrategy(OneBitConfig(hierarchical="true")), ONEBIT_SHAPES, ctx)
    out["onebit"] = []
    for t in range(STEPS):
        stand_in.set_gradients(_onebit_grads(t, rank))
        out["onebit"].append([g.clone() for g in stand_in.after_backward()])
    out["onebit_double_buffering"], _ = _train(rank, ctx, OneBitStrategy(OneBitConfig(double_buffering=True)))
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    return run_distributed(_learner, WORLD, tmp_path_factory.mktemp("hierarchical"))


@pytest.mark.slow
def test_rails_are_built_once_per_local_rank(results):
    assert [r["rails_created"] for r in results] == [NODE] * WORLD
    assert [r["rail"] for r in results] == [[0, 2], [1, 3], [0, 2], [1, 3]]


@pytest.mark.slow
@pytest.mark.parametrize("numel", LENGTHS)
def test_equals_the_flat_allreduce(results, numel):
    hierarchical, flat, _ = results[0][numel]
    torch.testing.assert_close(hierarchical[:numel], flat)
    assert not hierarchical[numel:].any()  # the padding stays zero
    assert all(torch.equal(r[numel][0], hierarchical) for r in results)  # the same bits everywhere
    expected = sum(_values(numel, rank, salt=1) for rank in range(WORLD))
    for r in results:
        torch.testing.assert_close(r["async"][LENGTHS.index(numel)][:numel], expected)


@pytest.mark.slow
@pytest.mark.parametrize("numel", LENGTHS)
def test_bytes_are_node_reduce_scatter_rail_allreduce_node_all_gather(results, numel):
    nbytes = padded_numel(numel, Hierarchy(None, None, NODE, 0, 2, 0)) * 4
    inside = comm.reduce_scatter_bytes(nbytes, NODE)
    across = comm.ring_allreduce_bytes(nbytes // NODE, WORLD // NODE)
    assert all(r[numel][2] == 2 * inside + across for r in results)


@pytest.mark.slow
def test_a_pipeline_of_chunks_gives_the_same_sum_and_bytes(results):
    for r in results:
        chunked, sent = r["chunked"]
        whole, _, whole_sent = r[LENGTHS[-1]]
        torch.testing.assert_close(chunked, whole, rtol=0, atol=1e-5)
        assert sent == whole_sent


def test_chunks_cover_the_tensor_in_multiples_of_the_node_size():
    for numel, size, chunk_bytes in ((1002, 2, 64), (12, 3, 4), (4096, 4, 2**20), (0, 2, 64)):
        bounds = chunk_bounds(numel, size, 4, chunk_bytes)
        assert bounds[0][0] == 0 and bounds[-1][1] == numel
        assert all(b0 == a1 for (_, a1), (b0, _) in zip(bounds, bounds[1:]))
        assert all((b - a) % size == 0 for a, b in bounds)
        assert all((b - a) * 4 <= max(chunk_bytes, 4 * size) for a, b in bounds)
    assert len(chunk_bounds(1002, 2, 4, 64)) == 63


@pytest.mark.slow
def test_sync_hierarchical_trains_like_flat(results):
    assert all(r["sync_auto_hierarchical"] and not r["sync_false_hierarchical"] for r in results)
    for r in results:
        for a, b in zip(r["sync_auto"], results[0]["sync_false"]):
            torch.testing.assert_close(a, b)
        assert all(torch.equal(a, b) for a, b in zip(r["sync_auto"], results[0]["sync_auto"]))


def _qd(quantizer, m: torch.Tensor, residual: Residual) -> torch.Tensor:
    rows, cols = m.shape
    words, recon = [torch.empty(packed_words(rows) * cols, dtype=torch.int32)], [torch.empty(2 * cols)]
    quantizer.quantize(m.contiguous(), residual, [0, cols], words, recon)
    out = torch.empty(rows, cols)
    quantizer.dequantize(words, recon, rows, [0, cols], out)
    return out


@pytest.mark.slow
def test_onebit_hierarchical_is_the_flat_exchange_of_the_node_means(results):
    """1-bit SGD between 2 'learners' whose gradients are the node means: per column the same
    arithmetic, so bit for bit the same, on every learner."""
    q, nodes = ReferenceQuantizer(), WORLD // NODE
    shapes = [tuple(as_columns(torch.empty(s)).shape) for s in ONEBIT_SHAPES]
    residuals = [[Residual(*s) for s in shapes] for _ in range(nodes)]
    second = [Residual(*s) for s in shapes]
    for t in range(STEPS):
        grads = [_onebit_grads(t, rank) for rank in range(WORLD)]
        for k, shape in enumerate(ONEBIT_SHAPES):
            total = None
            for node in range(nodes):
                mean = (as_columns(grads[NODE * node][k]) + as_columns(grads[NODE * node + 1][k])) / NODE
                d = _qd(q, mean, residuals[node][k])
                total = d if total is None else total + d
            expected = _qd(q, total / nodes, second[k]).reshape(shape)
            for r in results:
                assert torch.equal(r["onebit"][t][k], expected), (t, k)


@pytest.mark.slow
def test_onebit_hierarchical_double_buffered_learners_stay_identical(results):
    final = results[0]["onebit_double_buffering"]
    assert all(torch.equal(a, b) for r in results for a, b in zip(r["onebit_double_buffering"], final))
