"""`averaging` strategy: n gloo learners against a single-process simulation of the same learners."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from asrdist.config import config_from_tree
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import build_strategy
from asrdist.parallel.averaging import AveragingConfig, AveragingStrategy
from asrdist.parallel.base import LearnerContext
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import default_loss, make_trainer, train_steps
from tests.support.tiny_classifier import BATCH, tiny_batch, tiny_model

STEPS = 7


def _reported_loss(rank: int, loss, bad_rank: int | None):
    """The bad learner's objective is 10 worse (a loss tensor or its value; the gradient is unchanged)."""
    return 10.0 + loss if rank == bad_rank else loss


def _learner(rank: int, world_size: int, config: AveragingConfig, bad_rank: int | None):
    """The trainer's own step on this learner's minibatches."""
    model = tiny_model(seed=rank)  # learners start different: setup must broadcast rank 0's
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.5)
    strategy = AveragingStrategy(config)
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=world_size))
    included = []

    def reported_loss(model, batch):
        loss, frames = default_loss(model, batch)
        return _reported_loss(rank, loss, bad_rank), frames

    def record_average():
        if strategy.num_averages > len(included):  # this step averaged
            included.append(strategy.last_included)

    trainer = make_trainer(model, opt, strategy, loss_fn=reported_loss)
    train_steps(trainer, [tiny_batch(rank, step) for step in range(STEPS)], after_each=record_average)
    strategy.finalize()
    included.append(strategy.last_included)
    return {"params": [p.detach().clone() for p in model.parameters()],
            "momentum": [opt.state[p]["momentum_buffer"].clone() for p in model.parameters()],
            "counters": strategy.counters.as_dict(), "lr_scale": strategy.lr_scale(),
            "included": included, "payload": strategy.payload_bytes()}


def _reference(world_size: int, config: AveragingConfig, bad_rank: int | None):
    """The same learners simulated in one process, averaging by hand."""
    models = [tiny_model(seed=0) for _ in range(world_size)]
    opts = [torch.optim.SGD(m.parameters(), lr=0.1, momentum=0.5) for m in models]
    losses = [[] for _ in range(world_size)]
    samples = 0
    included_log = []

    def average():
        included = [True] * world_size
        if config.exclude_threshold is not None:
            means = [sum(v) / len(v) for v in losses]
            included = [m - min(means) <= config.exclude_threshold for m in means]
        for params in zip(*(m.parameters() for m in models)):
            tensors = [p.data for p in params]
            if config.average_momentum:
                tensors = [tensors, [opt.state[p]["momentum_buffer"] for opt, p in zip(opts, params)]]
            else:
                tensors = [tensors]
            for same in tensors:
                mean = sum(t for t, keep in zip(same, included) if keep) / sum(included)
                for t in same:
                    t.copy_(mean)
        included_log.append(included)
        for v in losses:
            v.clear()

    for step in range(STEPS):
        for rank, (model, opt) in enumerate(zip(models, opts)):
            x, y = tiny_batch(rank, step)
            loss = F.cross_entropy(model(x), y)
            loss.backward()
            opt.step()
            opt.zero_grad()
            losses[rank].append(_reported_loss(rank, loss.item(), bad_rank))
        samples += BATCH
        if samples >= config.average_every:
            average()
            samples = 0
    average()
    return models, opts, included_log


@pytest.mark.slow
@pytest.mark.parametrize("world_size, exclude", [(3, True), (2, False)])
def test_averaging_matches_single_process_reference(tmp_path, world_size, exclude):
    # with exclusion, momentum stays local; without, it is averaged too
    config = AveragingConfig(average_every=3 * BATCH, exclude_threshold=1.0 if exclude else None,
                             average_momentum=not exclude)
    bad_rank = 2 if exclude else None
    results = run_distributed(_learner, world_size, tmp_path, config, bad_rank)
    models, opts, included_log = _reference(world_size, config, bad_rank)

    assert included_log == results[0]["included"]  # averages after steps 3 and 6, then finalize
    assert len(included_log) == 3
    if exclude:
        assert included_log[0] == [True, True, False]
    for r in results:  # every learner ends identical, equal to the simulated average
        for got, p0, want in zip(r["params"], results[0]["params"], models[0].parameters()):
            assert torch.equal(got, p0)
            assert_close(got, want.detach())
    for rank, r in enumerate(results):
        for got, p in zip(r["momentum"], models[rank].parameters()):
            assert_close(got, opts[rank].state[p]["momentum_buffer"])
        if not exclude:
            assert all(torch.equal(a, b) for a, b in zip(r["momentum"], results[0]["momentum"]))
    params_bytes = 4 * sum(p.numel() for p in models[0].parameters())
    payload = results[0]["payload"]
    assert payload == params_bytes * (1 if exclude else 2)
    ring = 2 * payload * (world_size - 1) // world_size
    objectives = 2 * (3 * 2 * 8) * (world_size - 1) // world_size if exclude else 0
    for rank, r in enumerate(results):
        broadcast = params_bytes * (world_size - 1) if rank == 0 else 0  # setup: rank 0's parameters
        assert r["counters"]["bytes_sent"] == broadcast + 3 * (ring + objectives)
        assert r["counters"]["exchanges"] == 3 and r["counters"]["comm_seconds"] > 0
        assert r["lr_scale"] == 1.0  # default: the mean over B/n frames already carries the factor n


def test_single_learner_counting_and_state():
    model = tiny_model(0)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = build_strategy("averaging", AveragingConfig(average_every=20, samples_per_step=8))
    strategy.setup(model, opt, LearnerContext())
    assert strategy.lr_scale() == 1.0
    for _ in range(7):
        strategy.after_step()
    assert strategy.num_averages == 2 and strategy.samples_since_average == 8  # after steps 3 and 6
    twin = AveragingStrategy(AveragingConfig(average_every=20, samples_per_step=8))
    twin.load_state_dict(strategy.state_dict())
    assert (twin.num_averages, twin.samples_since_average, twin.steps) == (2, 8, 7)

    four = LearnerContext(rank=0, world_size=4)
    scaled, unscaled = AveragingStrategy(AveragingConfig(scale_lr=True)), AveragingStrategy()
    scaled.ctx = unscaled.ctx = four  # lr_scale needs only the context, not a process group
    assert (scaled.lr_scale(), unscaled.lr_scale()) == (4.0, 1.0)

    silent = AveragingStrategy()
    silent.setup(tiny_model(0), opt, LearnerContext())
    silent.after_step()
    with pytest.raises(TrainingError, match="note_samples"):
        silent.after_step()


def test_config_checks_and_recipe_keys():
    cfg = config_from_tree({"strategy": {"name": "averaging", "average_every": 5000, "exclude_threshold": 1}})
    assert cfg.strategy == AveragingConfig(average_every=5000, exclude_threshold=1.0)
    with pytest.raises(ConfigError, match="strategy.average_every"):
        AveragingConfig(average_every=0)
    with pytest.raises(ConfigError, match="strategy.exclude_threshold"):
        AveragingConfig(exclude_threshold=-1.0)
    with pytest.raises(ConfigError, match="averag"):
        config_from_tree({"strategy": {"name": "averaging", "every": 5}})
    assert math.isclose(AveragingStrategy().config.average_every, 20000)
