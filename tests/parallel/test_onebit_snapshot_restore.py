"""`onebit` with double buffering: loading a snapshot while a trial's exchange is still on the
communication thread (the batch-size search restores between trials) must leave exactly the
snapshot's state; the exchange in flight is dropped, never applied later."""
from __future__ import annotations

import copy

import pytest
import torch

from asrdist.parallel.base import LearnerContext
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from tests.support.dist_utils import TIMEOUT, run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

BATCH, TRIAL_STEPS, STEPS_AFTER = 8, 3, 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 40), torch.nn.Tanh(), torch.nn.Linear(40, 3))


def _batches(steps, rank: int) -> list[tuple[torch.Tensor, torch.Tensor]]:
    def batch(t: int):
        gen = torch.Generator().manual_seed(1000 * t + rank)
        return torch.randn(BATCH, 6, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen)

    return [batch(t) for t in steps]


def _run(rank: int, n: int, snapshot_at: int, trial_steps: int) -> dict:
    """`snapshot_at` steps, a snapshot, `trial_steps` trial steps on other minibatches and the
    snapshot loaded again (none: the reference), then the same STEPS_AFTER steps."""
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=0.2, momentum=0.9)
    strategy = OneBitStrategy(OneBitConfig(double_buffering=True))
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=n, timeout=TIMEOUT))
    trainer = make_trainer(model, opt, strategy)
    train_steps(trainer, _batches(range(snapshot_at), rank))
    snapshot = copy.deepcopy({"model": model.state_dict(), "optimizer": opt.state_dict(),
                              "strategy": strategy.state_dict()})
    if trial_steps:
        train_steps(trainer, _batches(range(100, 100 + trial_steps), rank))
        # restored at once, the last trial exchange still in flight (as between search trials)
        state = copy.deepcopy(snapshot)
        model.load_state_dict(state["model"])
        opt.load_state_dict(state["optimizer"])
        strategy.load_state_dict(state["strategy"])
    trajectory = []
    train_steps(trainer, _batches(range(snapshot_at, snapshot_at + STEPS_AFTER), rank),
                after_each=lambda: trajectory.append([p.detach().clone() for p in model.parameters()]))
    state = strategy.state_dict()
    strategy.finalize()
    return {"trajectory": trajectory, "final": [p.detach().clone() for p in model.parameters()],
            "residuals": state["residuals"], "second_residuals": state["second_residuals"],
            "pending_gradient": state["pending_gradient"],
            "exchanges": state["counters"]["exchanges"], "bytes_sent": state["counters"]["bytes_sent"]}


def _learner(rank: int, n: int) -> dict:
    # snapshot at 0: nothing pending, the first step after the load applies nothing;
    # snapshot at 2: a pending gradient and non-zero residuals to restore
    return {(at, trials): _run(rank, n, at, trials) for at in (0, 2) for trials in (0, TRIAL_STEPS)}


def _equal(a, b) -> bool:
    if a is None or b is None:
        return a is None and b is None
    if torch.is_tensor(a):
        return torch.equal(a, b)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(_equal(x, y) for x, y in zip(a, b))
    return a == b


@pytest.mark.slow
def test_loading_a_snapshot_drops_the_exchange_in_flight(tmp_path):
    results = run_distributed(_learner, 2, tmp_path)
    for rank, res in enumerate(results):
        for at in (0, 2):
            reference, restored = res[(at, 0)], res[(at, TRIAL_STEPS)]
            for key, value in reference.items():
                assert _equal(restored[key], value), (rank, at, key)
