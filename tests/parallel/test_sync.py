"""`sync` strategy: n learners x local batch B/n == 1 learner x batch B; comm helpers."""
from __future__ import annotations

import time
from datetime import timedelta
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import build_strategy, comm
from asrdist.parallel.base import LearnerContext
from asrdist.parallel.standin import StandIn
from asrdist.parallel.sync import SyncConfig, SyncStrategy, bucket_layout
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

STEPS, BATCH = 4, 8


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _data():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 6, generator=gen), torch.randint(0, 3, (STEPS, BATCH), generator=gen)


def _optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.1, momentum=0.9)
    return torch.optim.Adagrad(params, lr=0.1)


def _train(opt_name: str, rank: int, world_size: int, config: SyncConfig | None, record: dict | None = None):
    """The trainer's own step on this rank's slice of every global batch."""
    model = _model(seed=rank)  # learners start different: setup must broadcast rank 0's
    opt = _optimizer(opt_name, model.parameters())
    strategy = SyncStrategy(config) if config else SyncStrategy()
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=world_size))
    if record is not None:  # buckets already launched when backward returns (before after_backward)
        exchange = strategy.after_backward

        def count_launched_then_exchange():
            record.setdefault("launched_in_backward", []).append(
                sum(b.pending is not None for b in strategy._buckets))
            exchange()

        strategy.after_backward = count_launched_then_exchange
    x, y = _data()
    per = BATCH // world_size
    mine = slice(rank * per, (rank + 1) * per)
    train_steps(make_trainer(model, opt, strategy), [(x[t, mine], y[t, mine]) for t in range(STEPS)])
    strategy.finalize()
    return [p.detach().clone() for p in model.parameters()], strategy.counters


def _learner(rank: int, world_size: int):
    out = {}
    tiny = SyncConfig(bucket_cap_mb=1e-4)  # one bucket per parameter: several launches per backward
    for opt_name in ("sgd", "adagrad"):
        record = {}
        out[opt_name], counters = _train(opt_name, rank, world_size, tiny, record)
        out[f"{opt_name}_launched"] = record["launched_in_backward"]
        out[f"{opt_name}_bytes"] = counters.bytes_sent
    out["sgd_default"], _ = _train("sgd", rank, world_size, SyncConfig())
    out["sgd_no_overlap"], _ = _train("sgd", rank, world_size, SyncConfig(overlap=False))

    shapes = [(3, 2), (5,)]
    stand_in = StandIn(SyncStrategy(SyncConfig(bucket_cap_mb=1e-4)), shapes,
                       LearnerContext(rank=rank, world_size=world_size))
    stand_in.set_gradients([torch.full(s, float(rank + 1)) for s in shapes])
    out["exchange"] = [g.clone() for g in stand_in.after_backward()]
    return out


def _reference(opt_name: str):
    model = _model(seed=0)
    opt = _optimizer(opt_name, model.parameters())
    x, y = _data()
    for t in range(STEPS):
        F.cross_entropy(model(x[t]), y[t]).backward()
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.slow
@pytest.mark.parametrize("world_size", [2, 4])
def test_n_learners_match_one_learner_with_the_global_batch(tmp_path, world_size):
    results = run_distributed(_learner, world_size, tmp_path)
    for opt_name in ("sgd", "adagrad"):
        expected = _reference(opt_name)
        for rank, res in enumerate(results):
            for got, want in zip(res[opt_name], expected):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
            # learners hold the same parameters, bit for bit
            for got, first in zip(res[opt_name], results[0][opt_name]):
                assert torch.equal(got, first)
            # overlap: some buckets were launched during backward, before after_backward
            assert all(n > 0 for n in res[f"{opt_name}_launched"])
    for rank, res in enumerate(results):
        for key in ("sgd_default", "sgd_no_overlap"):
            for got, want in zip(res[key], _reference("sgd")):
                torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-6)
        mean = sum(range(1, world_size + 1)) / world_size
        assert [g.tolist() for g in res["exchange"]] == [torch.full((3, 2), mean).tolist(), torch.full((5,), mean).tolist()]

    # bytes: ring allreduce of every bucket each step, plus rank 0's setup broadcast
    sizes = [p.numel() * 4 for p in _model(0).parameters()]
    per_step = sum(comm.ring_allreduce_bytes(s, world_size) for s in sizes)
    assert results[1]["sgd_bytes"] == STEPS * per_step
    assert results[0]["sgd_bytes"] == STEPS * per_step + sum(sizes) * (world_size - 1)


def test_single_learner_leaves_gradients_alone():
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy("sync")
    strategy.setup(model, opt, LearnerContext())
    x, y = _data()
    F.cross_entropy(model(x[0]), y[0]).backward()
    before = [p.grad.clone() for p in model.parameters()]
    strategy.after_backward()
    assert all(torch.equal(p.grad, b) for p, b in zip(model.parameters(), before))
    assert strategy.counters.bytes_sent == 0


@pytest.mark.parametrize("kwargs", [{"bucket_cap_mb": 0}, {"bucket_cap_mb": -1.0}, {"bucket_cap_mb": "25"},
                                    {"overlap": "yes"}])
def test_config_is_validated(kwargs):
    with pytest.raises(ConfigError):
        SyncConfig(**kwargs)


def test_bucket_layout_is_ddps_small_first_bucket_then_the_cap():
    half_mib = [torch.zeros(2**20 // 8) for _ in range(6)]  # float32: 0.5 MiB each
    # a bucket closes once it reaches its limit: the first at first_bucket_mb, the rest at the cap
    assert bucket_layout(half_mib, SyncConfig(bucket_cap_mb=2, first_bucket_mb=1)) == [[0, 1], [2, 3, 4, 5]]
    assert bucket_layout(half_mib, SyncConfig(bucket_cap_mb=1.5, first_bucket_mb=0.5)) == [[0], [1, 2, 3], [4, 5]]
    assert bucket_layout(half_mib, SyncConfig(bucket_cap_mb=0.25)) == [[i] for i in range(6)]  # the cap bounds the first too
    mixed = [torch.zeros(10), torch.zeros(10, dtype=torch.float64), torch.zeros(10)]
    assert bucket_layout(mixed, SyncConfig()) == [[0, 2], [1]]  # one kind per flat buffer
    assert bucket_layout([], SyncConfig()) == []


def test_flatten_roundtrip_and_byte_formulas():
    tensors = [torch.randn(2, 3), torch.randn(4), torch.randn(1, 1, 2)]
    flat = comm.flatten(tensors)
    assert flat.shape == (12,)
    copies = [torch.zeros_like(t) for t in tensors]
    comm.unflatten_into(flat, copies)
    assert all(torch.equal(a, b) for a, b in zip(tensors, copies))
    with pytest.raises(ValueError):
        comm.flatten(tensors, out=torch.empty(5))
    assert comm.ring_allreduce_bytes(1000, 4) == 1500
    assert comm.ring_allreduce_bytes(1000, 1) == 0
    assert comm.all_to_all_bytes([10, 20, 30], rank=1) == 40


HANG_S = 120  # generous: only catches a hang, never paces the test


def _absent_peer(rank: int, world_size: int, done_flag: str):
    if rank == 1:
        # Alive but never joins the collective: stay until rank 0 has seen its timeout (a peer
        # that left early would make rank 0's collective fail differently, by a closed connection).
        deadline = time.monotonic() + HANG_S
        while not Path(done_flag).exists():
            assert time.monotonic() < deadline, "rank 0 never finished its collective"
            time.sleep(0.01)
        return None
    counters = comm.CommCounters()
    try:
        comm.allreduce(torch.ones(4), counters, timeout=timedelta(seconds=1))
    except TrainingError as e:
        return str(e), counters.comm_seconds
    finally:
        Path(done_flag).touch()
    return "no error"


@pytest.mark.slow
def test_a_collective_without_its_peer_fails_within_its_timeout(tmp_path):
    message, seconds = run_distributed(_absent_peer, 2, tmp_path, str(tmp_path / "rank0-done"))[0]
    # the timeout fired (the peer was still alive, sleeping), as one line naming the rank
    assert message.startswith("rank 0: allreduce (timeout 1 s) failed") and "\n" not in message
    assert "timed out" in message.lower() and seconds > 0
