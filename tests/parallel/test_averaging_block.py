"""`averaging` with block momentum (BMUF): n gloo learners against the same learners simulated in
one process, a resumed run against an uninterrupted one, and the config's keys and ranges."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from asrdist.config import config_from_tree
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel.averaging import AVERAGING, AveragingConfig, AveragingStrategy, block_momentum_for
from asrdist.parallel.base import LearnerContext
from asrdist.parallel.descriptor import SimJob
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import make_trainer, train_steps
from tests.support.tiny_classifier import BATCH, tiny_batch, tiny_model



def _optimizer(model: torch.nn.Module) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)


def _start(rank: int, world_size: int, config: AveragingConfig, seed: int):
    model = tiny_model(seed)  # learners start different: setup must broadcast rank 0's
    opt = _optimizer(model)
    strategy = AveragingStrategy(config)
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=world_size))
    return model, opt, strategy


def _learner(rank: int, world_size: int, config: AveragingConfig, steps: int, resume_at: int):
    """The trainer's own steps; with `resume_at`, the learner is rebuilt there from its checkpoint
    state (a fresh model, setup's broadcast, then the saved model, optimizer and strategy)."""
    model, opt, strategy = _start(rank, world_size, config, seed=rank)
    batches = [tiny_batch(rank, step) for step in range(steps)]
    if resume_at:
        train_steps(make_trainer(model, opt, strategy), batches[:resume_at])
        saved = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                               "strategy": strategy.state_dict()})
        model, opt, strategy = _start(rank, world_size, config, seed=100 + rank)
        model.load_state_dict(saved["model"])
        opt.load_state_dict(saved["optimizer"])
        strategy.load_state_dict(saved["strategy"])
        batches = batches[resume_at:]
    train_steps(make_trainer(model, opt, strategy), batches)
    strategy.finalize()
    return {"params": [p.detach().clone() for p in model.parameters()],
            "counters": strategy.counters.as_dict(), "averages": strategy.num_averages}


def _reference(world_size: int, config: AveragingConfig, steps: int):
    """The same learners in one process: average by hand, then BMUF's arithmetic on the mean."""
    eta = 1 - 1 / world_size if config.block_momentum == "auto" else config.block_momentum
    zeta, look = config.block_lr, (eta if config.block_nesterov else 0.0)
    models = [tiny_model(seed=0) for _ in range(world_size)]
    opts = [_optimizer(m) for m in models]
    base = [p.detach().clone() for p in models[0].parameters()]
    delta = [torch.zeros_like(b) for b in base]

    def average(final: bool, pending: bool):
        for i, params in enumerate(zip(*(m.parameters() for m in models))):
            mean = sum(p.data for p in params) / world_size
            if pending:
                delta[i] = eta * delta[i] + zeta * (mean - base[i])
                x_global = base[i] + delta[i]
            else:
                x_global = base[i] - look * delta[i]
            base[i] = x_global if final else x_global + look * delta[i]
            for p in params:
                p.data.copy_(base[i])
            if config.average_momentum:
                buffers = [opt.state[p]["momentum_buffer"] for opt, p in zip(opts, params)]
                buffer_mean = sum(buffers) / world_size
                for b in buffers:
                    b.copy_(buffer_mean)

    samples = 0
    for step in range(steps):
        for rank, (model, opt) in enumerate(zip(models, opts)):
            x, y = tiny_batch(rank, step)
            F.cross_entropy(model(x), y).backward()
            opt.step()
            opt.zero_grad()
        samples += BATCH
        if samples >= config.average_every:
            average(final=False, pending=True)
            samples = 0
    average(final=True, pending=samples > 0)
    return [p.detach() for p in models[0].parameters()]


CASES = {  # name: (learners, config, steps, resume_at)
    "auto-nesterov": (3, AveragingConfig(average_every=3 * BATCH, block_momentum="auto"), 7, 0),
    "plain-momentum-zeta": (2, AveragingConfig(average_every=2 * BATCH, block_momentum=0.5, block_lr=0.8,
                                               block_nesterov=False, average_momentum=False), 6, 0),
    "resumed-mid-block": (2, AveragingConfig(average_every=3 * BATCH, block_momentum=0.6, block_lr=1.2), 9, 4),
}


@pytest.mark.slow
@pytest.mark.parametrize("case", sorted(CASES))
def test_block_momentum_matches_single_process_reference(tmp_path, case):
    world_size, config, steps, resume_at = CASES[case]
    results = run_distributed(_learner, world_size, tmp_path, config, steps, resume_at)
    want = _reference(world_size, config, steps)
    for r in results:  # every learner ends identical, at the simulated global model
        for got, p0, ref in zip(r["params"], results[0]["params"], want):
            assert torch.equal(got, p0)
            assert_close(got, ref)
    # block momentum sends nothing more than plain averaging: setup's broadcast and one allreduce
    # of parameters and (here, unless average_momentum is off) momentum buffers per average
    params_bytes = 4 * sum(p.numel() for p in want)
    payload = params_bytes * (2 if config.average_momentum else 1)
    ring = 2 * payload * (world_size - 1) // world_size
    averages = steps // (config.average_every // BATCH) + 1
    # (a resumed learner's counters are the checkpoint's: they go on from there)
    for rank, r in enumerate(results):
        broadcast = params_bytes * (world_size - 1) if rank == 0 else 0
        assert r["counters"]["bytes_sent"] == broadcast + averages * ring
        assert r["counters"]["exchanges"] == averages


def test_off_is_plain_averaging_and_auto_is_cntks_default():
    model = tiny_model(0)
    for config, learners, on in [(AveragingConfig(), 4, False), (AveragingConfig(block_momentum="auto"), 1, False),
                                 (AveragingConfig(block_momentum="auto"), 4, True),
                                 (AveragingConfig(block_lr=0.5), 1, True)]:
        strategy = AveragingStrategy(config)
        strategy.ctx = LearnerContext(rank=0, world_size=learners)
        strategy.block_momentum = block_momentum_for(config, learners)
        assert strategy.block_on is on
    assert block_momentum_for(AveragingConfig(block_momentum="auto"), 4) == 0.75  # CNTK: 1 − 1/n
    single = AveragingStrategy(AveragingConfig(average_every=8, samples_per_step=8))
    single.setup(model, _optimizer(model), LearnerContext())
    assert single.block_base is None and "block_base" not in single.state_dict()  # off: today's state


def test_block_state_round_trip_on_one_learner():
    """With ζ != 1 one learner is its own average: x_g = b + ηΔ + ζ(x − b), saved and resumed."""
    config = AveragingConfig(average_every=8, samples_per_step=8, block_momentum=0.5, block_lr=2.0)
    model = tiny_model(0)
    opt = _optimizer(model)
    strategy = AveragingStrategy(config)
    strategy.setup(model, opt, LearnerContext())
    start = [p.detach().clone() for p in model.parameters()]
    train_steps(make_trainer(model, opt, strategy), [tiny_batch(0, 0)])
    assert strategy.num_averages == 1
    state = copy.deepcopy(strategy.state_dict())
    for d, b, s in zip(state["block_delta"], state["block_base"], start):
        assert_close(b, s + 1.5 * d)  # Nesterov: restart at x_g + ηΔ, with x_g = start + Δ
    twin = AveragingStrategy(config)
    twin.setup(tiny_model(5), _optimizer(tiny_model(5)), LearnerContext())
    twin.load_state_dict(state)
    for a, b in zip(twin.block_base + twin.block_delta, strategy.block_base + strategy.block_delta):
        assert torch.equal(a, b)
    with pytest.raises(TrainingError, match="block momentum state"):
        _load_into_other_shape(config, state)


def _load_into_other_shape(config: AveragingConfig, state: dict) -> None:
    other = AveragingStrategy(config)
    other.setup(torch.nn.Linear(2, 2), None, LearnerContext())
    other.load_state_dict(state)


def test_config_keys_ranges_and_unchanged_traffic():
    cfg = config_from_tree({"strategy": {"name": "averaging", "block_momentum": "auto", "block_lr": 1.5,
                                         "block_nesterov": False}})
    assert cfg.strategy == AveragingConfig(block_momentum="auto", block_lr=1.5, block_nesterov=False)
    assert config_from_tree({"strategy": {"name": "averaging", "block_momentum": 0}}).strategy.block_momentum == 0.0
    for bad, key in [({"block_momentum": 1.0}, "block_momentum"), ({"block_momentum": -0.1}, "block_momentum"),
                     ({"block_momentum": "cntk"}, "block_momentum"), ({"block_momentum": True}, "block_momentum"),
                     ({"block_lr": 0}, "block_lr"), ({"block_nesterov": 1}, "block_nesterov")]:
        with pytest.raises(ConfigError, match=f"strategy.{key}"):
            config_from_tree({"strategy": {"name": "averaging", **bad}})
    job = SimJob(shapes=[(512, 440), (512,)], learners=4, per_node=4, local_batch=64, averaged_values=225792)
    plain = AVERAGING.simulated(AveragingConfig(average_every=10000), job)
    block = AVERAGING.simulated(AveragingConfig(average_every=10000, block_momentum="auto"), job)
    assert block == plain  # block momentum adds no communication
