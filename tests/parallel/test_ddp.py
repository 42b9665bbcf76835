"""`ddp`: torch's DistributedDataParallel as a strategy, bit for bit sync's arithmetic on 2 gloo
learners; its comm hooks (fp16 within fp16 rounding of sync, PowerSGD), a dropped step, DDP's
no_sync, PowerSGD's memory across a restore, its traffic model and its config."""
from __future__ import annotations

import copy
import json
import math

import pytest
import torch
import torch.nn.functional as F

from asrdist.cli import main
from asrdist.config import load_config
from asrdist.errors import ConfigError, DataError
from asrdist.io.torch_data import load_data
from asrdist.parallel import STRATEGIES, build_strategy, comm
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.ddp import DdpConfig, bucket_traffic, exchange_traffic, powersgd_values
from asrdist.parallel.sync import SyncConfig
from asrdist.parallel.sync import exchange_traffic as sync_traffic
from tests.support.dist_utils import run_distributed
from tests.support.paths import ROOT
from tests.support.strategy_harness import make_trainer, train_steps

STEPS, BATCH, FEATURES, HIDDEN, CLASSES = 6, 16, 12, 24, 5
FP16_GRADIENT_RTOL = 2.0 ** -9
"""An fp16-compressed mean against sync's, relative to the tensor's largest value: each learner's
value and the sum are rounded to fp16's 11 bits (2 x 2^-11 = 9.8e-4); measured 4.6e-4 (2 learners,
this model, the first step, torch 2.13)."""
FP16_PARAMETER_ATOL = 1e-4
"""The fp16 run's parameters after 6 steps (SGD 0.1, momentum 0.9) against sync's; measured 3.0e-5."""


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(FEATURES, HIDDEN), torch.nn.Tanh(), torch.nn.Linear(HIDDEN, HIDDEN),
                               torch.nn.Tanh(), torch.nn.Linear(HIDDEN, CLASSES))


def _batches(rank: int, world_size: int, nan_at: int | None = None) -> list:
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS, BATCH, FEATURES, generator=gen), torch.randint(0, CLASSES, (STEPS, BATCH), generator=gen)
    if nan_at is not None:
        x[nan_at, -1] = math.nan  # the last learner's share: its loss is NaN, the others' finite
    per = BATCH // world_size
    mine = slice(rank * per, (rank + 1) * per)
    return [(x[t, mine], y[t, mine]) for t in range(STEPS)]


def _setup(name: str, config, rank: int, world_size: int):
    model = _model(seed=rank)  # learners start different: setup must broadcast rank 0's
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy = build_strategy(name, config)
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=world_size))
    return model, opt, strategy


def _train(name: str, config, rank: int, world_size: int, nan_at: int | None = None, **loop) -> dict:
    """Every step through `Trainer.train_step`; the gradients each step's exchange handed over."""
    model, opt, strategy = _setup(name, config, rank, world_size)
    grads = []
    exchange = strategy.after_backward

    def exchange_and_record():
        exchange()
        grads.append([p.grad.clone() for p in model.parameters()])

    strategy.after_backward = exchange_and_record
    losses = train_steps(make_trainer(model, opt, strategy, **loop), _batches(rank, world_size, nan_at))
    strategy.finalize()
    return {"params": [p.detach().clone() for p in model.parameters()], "grads": grads, "losses": losses,
            "counters": strategy.counters.as_dict(), "strategy": strategy}


def _accumulated(name: str, rank: int, world_size: int) -> list[torch.Tensor]:
    """One step of two micro-batches, the first inside `no_sync()`, as `train.accumulate` drives it."""
    model, opt, strategy = _setup(name, None, rank, world_size)
    (x0, y0), (x1, y1) = _batches(rank, world_size)[:2]
    with strategy.no_sync():
        F.cross_entropy(strategy.forward_module(model)(x0), y0).backward()
    inside = strategy.counters.exchanges
    F.cross_entropy(strategy.forward_module(model)(x1), y1).backward()
    strategy.after_backward()
    assert inside == 0 and strategy.counters.exchanges == 1
    return [p.grad.clone() for p in model.parameters()]


def _restores(rank: int, world_size: int, checkpoint: str) -> dict:
    """PowerSGD's memory in a snapshot: restored on the same DDP, the next steps repeat bit for bit;
    loaded from a checkpoint file (as data) by a new strategy (a resumed run), it is kept once DDP
    has rebuilt its buckets."""
    config = DdpConfig(hook="powersgd", powersgd_start_iter=2)
    model, opt, strategy = _setup("ddp", config, rank, world_size)
    trainer = make_trainer(model, opt, strategy)
    batches = _batches(rank, world_size)
    train_steps(trainer, batches[:4])
    saved = copy.deepcopy({"model": model.state_dict(), "opt": opt.state_dict(), "strategy": strategy.state_dict()})
    train_steps(trainer, batches[4:])
    first = [p.detach().clone() for p in model.parameters()]
    model.load_state_dict(saved["model"])
    opt.load_state_dict(saved["opt"])
    strategy.load_state_dict(copy.deepcopy(saved["strategy"]))
    train_steps(trainer, batches[4:])
    again = [p.detach().clone() for p in model.parameters()]

    torch.save(saved, f"{checkpoint}-{rank}.pt")
    saved = load_data(f"{checkpoint}-{rank}.pt", DataError)
    model2, opt2, resumed = _setup("ddp", config, rank, world_size)
    model2.load_state_dict(saved["model"])
    opt2.load_state_dict(saved["opt"])
    resumed.load_state_dict(saved["strategy"])
    train_steps(make_trainer(model2, opt2, resumed), batches[4:])
    return {"first": first, "again": again, "resumed": [p.detach().clone() for p in model2.parameters()],
            "iters": (strategy.powersgd.iter, resumed.powersgd.iter),
            "memory": (sorted(strategy.powersgd.error_dict), sorted(resumed.powersgd.error_dict)),
            "left": dict(resumed._restored_layout)}


def _learner(rank: int, world_size: int, checkpoint: str) -> dict:
    out = {"sync": _train("sync", None, rank, world_size), "ddp": _train("ddp", None, rank, world_size),
           "fp16": _train("ddp", DdpConfig(hook="fp16"), rank, world_size),
           "bf16": _train("ddp", DdpConfig(hook="bf16"), rank, world_size),
           "powersgd": _train("ddp", DdpConfig(hook="powersgd", powersgd_start_iter=2), rank, world_size),
           "powersgd_buckets": _train("ddp", DdpConfig(hook="powersgd", powersgd_start_iter=2,
                                                       bucket_cap_mb=1e-3), rank, world_size),
           "sync_skip": _train("sync", None, rank, world_size, nan_at=2, nonfinite="skip"),
           "ddp_skip": _train("ddp", None, rank, world_size, nan_at=2, nonfinite="skip"),
           "accumulated": {name: _accumulated(name, rank, world_size) for name in ("sync", "ddp")},
           "restores": _restores(rank, world_size, checkpoint)}
    for run in out.values():
        run.pop("strategy", None)
    return out


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    where = tmp_path_factory.mktemp("ddp")
    return run_distributed(_learner, 2, where, str(where / "checkpoint"))


def _equal(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


@pytest.mark.slow
def test_ddp_trains_bit_for_bit_as_sync(results):
    for rank, res in enumerate(results):
        assert _equal(res["ddp"]["params"], res["sync"]["params"]), rank
        assert _equal(res["ddp"]["params"], results[0]["ddp"]["params"])
        assert res["ddp"]["losses"] == res["sync"]["losses"]
        # the same bytes: the setup's broadcast (rank 0) and one ring allreduce of the gradients a step
        assert res["ddp"]["counters"]["bytes_sent"] == res["sync"]["counters"]["bytes_sent"] > 0
        assert res["ddp"]["counters"]["exchanges"] == STEPS
    sizes = [p.numel() * 4 for p in _model(0).parameters()]
    assert results[1]["ddp"]["counters"]["bytes_sent"] == STEPS * comm.ring_allreduce_bytes(sum(sizes), 2)


@pytest.mark.slow
def test_fp16_differs_from_sync_by_fp16_rounding(results):
    for res in results:
        sync, fp16 = res["sync"], res["fp16"]
        for got, want in zip(fp16["grads"][0], sync["grads"][0]):  # the first step: the same parameters
            assert (got - want).abs().max() <= FP16_GRADIENT_RTOL * want.abs().max()
        assert not _equal(fp16["params"], sync["params"])
        for got, want in zip(fp16["params"], sync["params"]):
            torch.testing.assert_close(got, want, rtol=0, atol=FP16_PARAMETER_ATOL)
        assert _equal(fp16["params"], results[0]["fp16"]["params"])
        # bf16 (gloo sums bf16 on the CPU): 8 bits, 8 x fp16's step
        for got, want in zip(res["bf16"]["grads"][0], sync["grads"][0]):
            assert (got - want).abs().max() <= 8 * FP16_GRADIENT_RTOL * want.abs().max()
    # 2 bytes a value (rank 1: no setup broadcast)
    assert results[1]["fp16"]["counters"]["bytes_sent"] * 2 == results[1]["sync"]["counters"]["bytes_sent"]
    assert results[1]["bf16"]["counters"]["bytes_sent"] == results[1]["fp16"]["counters"]["bytes_sent"]


@pytest.mark.slow
def test_powersgd_compresses_after_its_start(results):
    sizes = [tuple(p.shape) for p in _model(0).parameters()]
    plain = comm.ring_allreduce_bytes(4 * sum(math.prod(s) for s in sizes), 2)
    compressed = sum(t.bytes_sent for t in bucket_traffic(sizes, 2, DdpConfig(hook="powersgd")))
    assert 0 < compressed < plain / 2
    for res in results:
        for key in ("powersgd", "powersgd_buckets"):  # one bucket; a bucket per tensor (gloo: in turn)
            run = res[key]
            assert _equal(run["params"], results[0][key]["params"])
            assert all(torch.isfinite(p).all() for p in run["params"])
            assert run["losses"][:2] == res["sync"]["losses"][:2]  # plain allreduce for 2 steps
            assert not _equal(run["params"], res["sync"]["params"])
    # counted: the two plain steps, then the compressed ones (rank 1 has no setup broadcast)
    assert results[1]["powersgd"]["counters"]["bytes_sent"] == 2 * plain + (STEPS - 2) * compressed
    assert results[1]["powersgd_buckets"]["counters"]["bytes_sent"] == 2 * plain + (STEPS - 2) * compressed


@pytest.mark.slow
def test_a_non_finite_loss_on_one_learner_drops_the_step_on_both_as_sync(results):
    for res in results:
        assert math.isnan(results[1]["ddp_skip"]["losses"][2]) and math.isfinite(results[0]["ddp_skip"]["losses"][2])
        assert _equal(res["ddp_skip"]["params"], res["sync_skip"]["params"])
        assert not _equal(res["ddp_skip"]["params"], res["ddp"]["params"])


@pytest.mark.slow
def test_no_sync_accumulates_as_sync(results):
    for res in results:
        assert _equal(res["accumulated"]["ddp"], res["accumulated"]["sync"])
        assert _equal(res["accumulated"]["ddp"], results[0]["accumulated"]["ddp"])


@pytest.mark.slow
def test_powersgd_memory_is_restored(results):
    for res in results:
        r = res["restores"]
        assert _equal(r["again"], r["first"])  # restored on the same DDP: the same steps again
        assert r["iters"][0] == r["iters"][1] == STEPS
        assert r["memory"][0] == r["memory"][1] != [] and r["left"] == {}  # kept after DDP's rebuild
        # a new DDP's first step runs in its initial bucket, a plain allreduce; then the memory resumes
        assert _equal(r["resumed"], results[0]["restores"]["resumed"]) and not _equal(r["resumed"], r["first"])


@pytest.mark.slow
def test_asrdist_train_runs_ddp_end_to_end(tone_corpus, tmp_path):
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/default.yaml"), "--data", str(tone_corpus), "--learners", "2",
                 "--strategy", "ddp", "train.epochs=1", "train.threads=1", "data.batch_size=128",
                 "model.hidden_dim=32", "model.hidden_layers=1", "--out", str(run), "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["strategy"] == "ddp" and summary["learners"] == 2 and summary["steps"] > 0
    for learner in summary["comm"]["per_learner"]:
        assert learner["exchanges"] == summary["steps"] and learner["bytes_sent"] > 0
    # the raw module's keys, not DDP's wrapper's (module.*): the model loads as any other run's
    model = torch.load(run / "model.pt", weights_only=False)["model"]
    assert model and not any(key.startswith("module.") for key in model)


# ---------------------------------------------------------------- in one process

def test_a_lone_learner_leaves_gradients_alone():
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy("ddp")
    strategy.setup(model, opt, LearnerContext())
    assert strategy.forward_module(model) is model
    (x, y), = _batches(0, 1)[:1]
    with strategy.no_sync():
        F.cross_entropy(model(x), y).backward()
    before = [p.grad.clone() for p in model.parameters()]
    strategy.after_backward()
    assert _equal([p.grad for p in model.parameters()], before) and strategy.counters.bytes_sent == 0


@pytest.mark.parametrize("override,message", [
    ("strategy.hook=zip", "strategy.hook: expected one of none, fp16, bf16, powersgd, got 'zip'"),
    ("strategy.powersgd_rank=0", "strategy.powersgd_rank: expected an integer >= 1, got 0"),
    ("strategy.powersgd_start_iter=1", "strategy.powersgd_start_iter: expected an integer >= 2, got 1"),
    ("strategy.bucket_cap_mb=0", "strategy.bucket_cap_mb: expected a number > 0, got 0"),
    ("strategy.bucket_cap_mb=abc", "strategy.bucket_cap_mb: expected a number, got 'abc'"),
    ("strategy.first_bucket_mb=1", "first_bucket_mb"),
])
def test_bad_config_values_fail_in_one_line_naming_the_key(override, message):
    with pytest.raises(ConfigError) as err:
        load_config(ROOT / "configs/default.yaml", ["strategy.name=ddp", "train.learners=2", override])
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_registry_holds_ddp_beside_sync():
    assert STRATEGIES["ddp"].config_class is DdpConfig and STRATEGIES["ddp"].name == "ddp"
    assert not STRATEGIES["ddp"].asynchronous and STRATEGIES["ddp"].advised == {}
    assert isinstance(build_strategy("ddp"), Strategy)


def test_traffic_without_a_hook_is_sync_flats_and_the_hooks_shrink_it():
    shapes = [(512, 440), (512,), (512, 512), (512,), (512, 512), (512,), (40, 512), (40,)]
    flat = sync_traffic(shapes, 4, 4, SyncConfig(hierarchical="false"))
    assert exchange_traffic(shapes, 4) == flat and len(flat) > 1  # DDP's 1 MiB first bucket, as sync's
    assert len(exchange_traffic(shapes, 4, DdpConfig(bucket_cap_mb=24))) == 1  # any other cap bounds the first too
    bytes_of = lambda config: sum(t.bytes_sent for b in exchange_traffic(shapes, 4, config) for t in b)  # noqa: E731
    assert bytes_of(DdpConfig(hook="fp16")) * 2 == bytes_of(DdpConfig(hook="bf16")) * 2 == bytes_of(DdpConfig())
    assert bytes_of(DdpConfig(hook="powersgd")) < bytes_of(DdpConfig()) / 50
    # rank r: P (rows x r) and Q (columns x r) per matrix; vectors, and matrices too small to gain, whole
    assert powersgd_values([(512, 440), (512,), (3, 2)], 1) == (512 + 6, 512, 440)
    assert powersgd_values([(512, 440)], 4) == (0, 2048, 1760)
    assert powersgd_values([(8, 2, 3, 3)], 2) == (0, 16, 36)  # a convolution: (out, in x kh x kw)
    assert bucket_traffic(shapes, 1, DdpConfig()) == []


@pytest.mark.parametrize("hook", ["none", "fp16", "powersgd"])
def test_the_simulator_runs_ddp(hook):
    from asrdist.sim.cluster import LINKS, Cluster
    from asrdist.sim.scenario import Job, run_job, strategy_config

    shapes = [(64, 32), (64,), (10, 64), (10,)]
    cluster = Cluster(1, 4, LINKS["1gbit"], LINKS["1gbit"])
    result = run_job(Job("ddp", strategy_config("ddp", {"hook": hook}), shapes, cluster, 256, 1e-5))
    assert result.frames_per_second > 0
    sent = sum(t.bytes_sent for b in exchange_traffic(shapes, 4, DdpConfig(hook=hook)) for t in b)
    assert result.bytes_per_step == pytest.approx(sent)  # one learner's
