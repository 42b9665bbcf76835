"""`onebit` strategy: stripes, identical learners, equality with a one-process simulation of the
algorithm, determinism, the error-feedback ablation, double buffering, exact resume."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F

from asrdist.errors import ConfigError
from asrdist.optim.adagrad import CntkAdaGrad
from asrdist.optim.max_change import clip_change
from asrdist.parallel import build_strategy, comm
from asrdist.parallel.base import LearnerContext
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.onebit_kernel import (SWBD_SHAPES, ReferenceQuantizer, Residual, as_columns, packed_words,
                                            quantize_dequantize)
from asrdist.parallel.onebit_plan import _Plan
from asrdist.parallel.standin import StandIn
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

STEPS, BATCH = 5, 12


def _model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))


def _data():
    gen = torch.Generator().manual_seed(1)
    return torch.randn(STEPS, BATCH, 6, generator=gen), torch.randint(0, 3, (STEPS, BATCH), generator=gen)


def _optimizer(name: str, params):
    if name == "sgd":
        return torch.optim.SGD(params, lr=0.2, momentum=0.9)
    return CntkAdaGrad(params, lr=0.05)


def _local_batches(steps, rank: int, n: int):
    """Learner `rank`'s slice of the global batch of every step in `steps`."""
    x, y = _data()
    mine = slice(rank * (BATCH // n), (rank + 1) * (BATCH // n))
    return [(x[t, mine], y[t, mine]) for t in steps]


def _local_loss(model, t: int, rank: int, n: int):
    (x, y), = _local_batches([t], rank, n)
    return F.cross_entropy(model(x), y)


def _train_steps(model, opt, strategy, steps, rank: int, n: int):
    """The trainer's own step on this learner's slices; the parameters after every step."""
    trajectory = []
    train_steps(make_trainer(model, opt, strategy), _local_batches(steps, rank, n),
                after_each=lambda: trajectory.append([p.detach().clone() for p in model.parameters()]))
    return trajectory


def _train(rank, n, config, opt_name="sgd", steps=STEPS, start=0, state=None, model_seed=None):
    """Set up and train; returns the parameters after every step, the strategy and its parts."""
    model = _model(rank if model_seed is None else model_seed)  # setup must broadcast rank 0's
    opt = _optimizer(opt_name, model.parameters())
    strategy = OneBitStrategy(config)
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=n))
    if state is not None:
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        strategy.load_state_dict(state["strategy"])
    trajectory = _train_steps(model, opt, strategy, range(start, start + steps), rank, n)
    return trajectory, strategy, model, opt


def _finish(strategy, model):
    strategy.finalize()
    return [p.detach().clone() for p in model.parameters()]


def _qd(quantizer, m, residual):
    rows, cols = m.shape
    words, recon = [torch.empty(packed_words(rows) * cols, dtype=torch.int32)], [torch.empty(2 * cols)]
    quantizer.quantize(m.contiguous(), residual, [0, cols], words, recon)
    out = torch.empty(rows, cols)
    quantizer.dequantize(words, recon, rows, [0, cols], out)
    return out


def simulate(n: int, config: OneBitConfig, opt_name="sgd"):
    """The algorithm of DESIGN.md §5.2 for n learners in one process, whole matrices at a time
    (stripes do not change per-column arithmetic); trajectory and final parameters."""
    model = _model(0)
    opt = _optimizer(opt_name, model.parameters())
    params = list(model.parameters())
    # Momentum correction: each learner keeps its own heavy-ball buffer u and quantizes u, not g;
    # the optimizer then takes plain steps.
    correct = config.momentum_correction and opt_name == "sgd"
    mu = opt.param_groups[0]["momentum"]
    if correct:
        opt.param_groups[0]["momentum"] = 0.0
    velocity = [[None] * len(params) for _ in range(n)]
    q = ReferenceQuantizer()
    ef = config.error_feedback
    shapes = [as_columns(p).shape for p in params]
    residuals = [[Residual(*s) if ef else None for s in shapes] for _ in range(n)]
    second = [Residual(*s) if ef else None for s in shapes]
    pending, trajectory = None, []

    def apply(grads):
        for p, g in zip(params, grads or [None] * len(params)):
            p.grad = g
        opt.step()
        opt.zero_grad()

    for t in range(STEPS):
        local = []
        for i in range(n):
            _local_loss(model, t, i, n).backward()
            grads = [p.grad.clone() for p in params]
            if correct:
                for k, g in enumerate(grads):
                    u = velocity[i][k]
                    velocity[i][k] = g.clone() if u is None else mu * u + g
                grads = [u.clone() for u in velocity[i]]
            local.append(grads)
            opt.zero_grad()
        agg = []
        for k, p in enumerate(params):
            if t * BATCH < config.warm_start_frames:  # warm start: the fp32 mean, nothing quantized
                agg.append(sum(local[i][k] for i in range(n)) / n)
                continue
            total = None
            for i in range(n):
                d = _qd(q, as_columns(local[i][k]), residuals[i][k])
                total = d if total is None else total + d
            agg.append(_qd(q, total / n, second[k]).reshape(p.shape))
        if config.double_buffering:
            agg, pending = pending, agg
        apply(agg)
        trajectory.append([p.detach().clone() for p in params])
    if pending is not None:
        apply(pending)
    return trajectory, [p.detach().clone() for p in params]


RUNS = {
    "ef": (OneBitConfig(), "sgd"),
    "ef_again": (OneBitConfig(), "sgd"),
    "no_ef": (OneBitConfig(error_feedback=False), "sgd"),
    "no_momentum_correction": (OneBitConfig(momentum_correction=False), "sgd"),
    "double_buffering": (OneBitConfig(double_buffering=True), "sgd"),
    "adagrad": (OneBitConfig(), "adagrad"),
    "warm_start": (OneBitConfig(warm_start_frames=2 * BATCH), "sgd"),  # steps 0, 1 in fp32
}
INEXACT = {"warm_start"}
"""Runs whose fp32 allreduce sums in gloo's order, not the simulation's: compared to 1e-6."""


def _learner(rank: int, n: int):
    out = {}
    for name, (config, opt_name) in RUNS.items():
        trajectory, strategy, model, _ = _train(rank, n, config, opt_name)
        out[name] = (trajectory, _finish(strategy, model))
        out[f"{name}_counters"] = strategy.counters
    # exact resume, double buffering + error feedback: state after 2 steps, then 2 more steps
    config = OneBitConfig(double_buffering=True)
    _, strategy, model, opt = _train(rank, n, config, steps=2)
    state = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                           "strategy": strategy.state_dict()})
    straight = _train_steps(model, opt, strategy, (2, 3), rank, n)
    strategy.finalize()  # let its communication thread finish before the next strategy starts
    resumed, *_ = _train(rank, n, config, steps=2, start=2, state=state, model_seed=7)
    out["resume"] = (straight, resumed)
    if rank == 0:
        out["simulated"] = {name: simulate(n, config, opt_name) for name, (config, opt_name) in RUNS.items()}
    return out


def _equal(a, b) -> bool:
    return all(torch.equal(x, y) for x, y in zip(a, b))


def _close(a, b) -> bool:
    return all(torch.allclose(x, y, rtol=1e-5, atol=1e-6) for x, y in zip(a, b))


@pytest.mark.slow
def test_three_learners(tmp_path):
    n = 3
    results = run_distributed(_learner, n, tmp_path)
    simulated = results[0]["simulated"]
    for name in RUNS:
        trajectory, final = results[0][name]
        for res in results[1:]:  # every learner bit-identical after every step
            assert all(_equal(a, b) for a, b in zip(trajectory, res[name][0])), name
            assert _equal(final, res[name][1]), name
        sim_trajectory, sim_final = simulated[name]
        same = _close if name in INEXACT else _equal
        assert all(same(a, b) for a, b in zip(trajectory, sim_trajectory)), name
        assert same(final, sim_final), name
    ef, ef_again, no_ef = (results[0][k][1] for k in ("ef", "ef_again", "no_ef"))
    assert _equal(ef, ef_again)  # one seed, two runs: identical
    assert not _equal(ef, no_ef)  # the ablation changes the updates
    straight, resumed = results[1]["resume"]
    assert all(_equal(a, b) for a, b in zip(straight, resumed))

    # bytes on the wire, from the buffers: all learners together send 2(n-1) x the quantized model
    quantized_int32 = sum((packed_words(as_columns(p).shape[0]) + 2) * as_columns(p).shape[1]
                          for p in _model(0).parameters())
    setup_bytes = sum(p.numel() * 4 for p in _model(0).parameters()) * (n - 1)  # rank 0's broadcast
    total = sum(res["ef_counters"].bytes_sent for res in results) - setup_bytes
    assert total == STEPS * 2 * (n - 1) * quantized_int32 * 4
    assert all(res["ef_counters"].exchanges == STEPS for res in results)

    # warm start: two fp32 steps (sync's arithmetic, not the quantized one), then 1-bit from zero residuals
    warm, ef_run = results[0]["warm_start"][0], results[0]["ef"][0]
    fp32 = simulate(n, OneBitConfig(warm_start_frames=STEPS * BATCH))[0]
    assert _close(warm[1], fp32[1]) and not _close(warm[1], ef_run[1])
    assert not _close(warm[2], fp32[2])  # quantized from step 2 on
    model_bytes = sum(p.numel() * 4 for p in _model(0).parameters())
    extra = sum(res["warm_start_counters"].bytes_sent - res["ef_counters"].bytes_sent for res in results)
    assert extra == 2 * (n * comm.ring_allreduce_bytes(model_bytes, n) - 2 * (n - 1) * quantized_int32 * 4)


def test_single_learner_applies_the_twice_quantized_gradient():
    model = _model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy("onebit", OneBitConfig())
    strategy.setup(model, opt, LearnerContext())
    _local_loss(model, 0, 0, 1).backward()
    raw = [p.grad.clone() for p in model.parameters()]
    strategy.after_backward()
    for p, g in zip(model.parameters(), raw):
        assert torch.equal(p.grad, quantize_dequantize(quantize_dequantize(g)))
    assert strategy.counters.bytes_sent == 0


def _linear_loss(holder, batch):
    """A loss whose gradient does not depend on the parameters: (W * C_t).sum(), C_t the inputs."""
    return (holder.w * batch.inputs).sum(), batch.num_frames


def _linear_run(config: OneBitConfig, steps: int, max_change: bool = False):
    torch.manual_seed(0)
    w = torch.nn.Parameter(torch.randn(33, 5))
    holder = torch.nn.Module()
    holder.w = w
    opt = torch.optim.SGD([w], lr=0.5)
    strategy = OneBitStrategy(config)
    strategy.setup(holder, opt, LearnerContext())
    gen = torch.Generator().manual_seed(2)
    coefficients = [(torch.randn(33, 5, generator=gen), torch.empty(0)) for _ in range(steps)]
    trajectory = [w.detach().clone()]
    trainer = make_trainer(holder, opt, strategy, loss_fn=_linear_loss)
    if max_change:  # lr x |g| is about 6 here: every step is capped at 0.75
        trainer.hooks.before_optimizer_step = lambda lr: clip_change(holder, lr)
    train_steps(trainer, coefficients, after_each=lambda: trajectory.append(w.detach().clone()))
    strategy.finalize()
    return trajectory, w.detach().clone()


@pytest.mark.parametrize("max_change", [False, True])
def test_double_buffering_applies_each_update_one_step_late(max_change):
    exact, exact_final = _linear_run(OneBitConfig(), steps=4, max_change=max_change)
    late, late_final = _linear_run(OneBitConfig(double_buffering=True), steps=4, max_change=max_change)
    assert torch.equal(late[1], late[0])  # the first step applies nothing
    for t in range(1, 5):
        assert torch.equal(late[t], exact[t - 1])
    # finalize applies the last pending gradient through apply_update: max-change included
    assert torch.equal(late_final, exact_final)


def test_plan_stripes_cover_every_column_once_and_spread_biases():
    shapes = [(40, 6), (40, 1), (3, 40), (3, 1), (5, 2)]
    for n in (1, 2, 3, 4, 7):
        plan = _Plan(shapes, n, rank=0)
        for k, (rows, cols) in enumerate(shapes):
            covered = [c for b in plan.blocks_of_slot[k] for c in range(b.c0, b.c1)]
            assert covered == list(range(cols))
        owners_of_biases = {plan.blocks_of_slot[k][0].owner for k in (1, 3)}
        assert len(owners_of_biases) == min(n, 2)
        assert sum(plan.stripe_numel) == plan.total_numel


def test_swbd_bytes_on_the_wire_are_under_one_25th_of_fp32_allreduce():
    shapes = [as_columns(torch.empty(s, device="meta")).shape for s in SWBD_SHAPES]
    numel = sum(r * c for r, c in shapes)
    for n in (2, 4, 8):
        fp32 = comm.ring_allreduce_bytes(numel * 4, n)
        plans = [_Plan(shapes, n, rank) for rank in range(n)]
        for rank, plan in enumerate(plans):
            mine = plan.stripe_numel[rank]
            onebit = (comm.all_to_all_bytes(plan.stripe_numel, rank) + (n - 1) * mine) * 4
            assert onebit <= fp32 / 25, (n, rank, onebit / fp32)


@pytest.mark.parametrize("kwargs", [{"error_feedback": "no"}, {"double_buffering": 1}, {"kernel": "gpu"},
                                    {"warm_start_frames": -1}, {"warm_start_frames": 0.5}])
def test_config_is_validated(kwargs):
    with pytest.raises(ConfigError):
        OneBitConfig(**kwargs)


def test_state_from_another_world_size_is_refused():
    model = _model(0)
    strategy = OneBitStrategy()
    strategy.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), LearnerContext())
    state = strategy.state_dict()
    state["world_size"] = 4
    with pytest.raises(ConfigError):
        strategy.load_state_dict(state)


def test_exchange_on_a_stand_in_model():
    shapes = [(40, 6), (40,)]
    stand_in = StandIn(OneBitStrategy(), shapes, LearnerContext())
    grads = [torch.randn(s) for s in shapes]
    stand_in.set_gradients(grads)
    out = stand_in.after_backward()
    for g, o in zip(grads, out):
        assert o.shape == g.shape
        assert torch.equal(o, quantize_dequantize(quantize_dequantize(g)))


def test_the_warm_start_trains_unquantized_and_its_count_survives_a_checkpoint():
    def learner(config):
        model = _model(0)
        opt = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy = OneBitStrategy(config)
        strategy.setup(model, opt, LearnerContext())
        return model, opt, strategy

    model, opt, strategy = learner(OneBitConfig(warm_start_frames=3 * BATCH))
    plain = _model(0)
    plain_opt = torch.optim.SGD(plain.parameters(), lr=0.1)
    _train_steps(model, opt, strategy, range(2), 0, 1)
    _train_steps(plain, plain_opt, build_strategy("single"), range(2), 0, 1)
    assert strategy.warming_up and _equal(list(model.parameters()), list(plain.parameters()))
    state = copy.deepcopy(strategy.state_dict())
    assert state["warm_start_frames_done"] == 2 * BATCH
    _, _, resumed = learner(OneBitConfig(warm_start_frames=3 * BATCH))
    resumed.load_state_dict(state)
    assert resumed.warming_up
    _train_steps(model, opt, strategy, range(2, 4), 0, 1)  # step 2 the last in fp32, step 3 quantized
    _train_steps(plain, plain_opt, build_strategy("single"), range(2, 4), 0, 1)
    assert not strategy.warming_up and not _equal(list(model.parameters()), list(plain.parameters()))
