"""`averaging` with minibatches of different frame counts per learner (CTC utterances, LSTM
chunks): every learner must average at the same steps, as often as `average_every` asks, and a
reported frame count is never added on top of `samples_per_step`."""
from __future__ import annotations

import random

import pytest
import torch

from asrdist.errors import TrainingError
from asrdist.parallel.averaging import AveragingConfig, AveragingStrategy
from asrdist.parallel.base import LearnerContext
from tests.support.dist_utils import TIMEOUT, run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

STEPS, NOMINAL, EVERY = 23, 100, 500  # an average due every 5 minibatches: after 5, 10, 15, 20


def _frames(rank: int, step: int) -> int:
    return NOMINAL if rank == 0 else random.Random(step).randint(37, 163)


def _batch(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    frames = _frames(rank, step)
    gen = torch.Generator().manual_seed(100 * rank + step)
    return torch.randn(frames, 4, generator=gen), torch.randint(0, 3, (frames,), generator=gen)


def _learner(rank: int, world_size: int) -> dict:
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 3)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    strategy = AveragingStrategy(AveragingConfig(average_every=EVERY, samples_per_step=NOMINAL))
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=world_size, timeout=TIMEOUT))
    trainer = make_trainer(model, opt, strategy)
    averaged_at, params_at = [], []

    def record_average():
        if strategy.num_averages > len(averaged_at):  # this step averaged
            averaged_at.append(trainer.state.step)
            params_at.append([p.detach().clone() for p in model.parameters()])

    train_steps(trainer, [_batch(rank, step) for step in range(1, STEPS + 1)], after_each=record_average)
    strategy.finalize()
    return {"averaged_at": averaged_at, "params_at": params_at,
            "final": [p.detach().clone() for p in model.parameters()]}


@pytest.mark.slow
def test_learners_with_different_frame_counts_average_at_the_same_steps(tmp_path):
    r0, r1 = run_distributed(_learner, 2, tmp_path)
    assert r0["averaged_at"] == r1["averaged_at"] == [5, 10, 15, 20]
    for a, b in zip(r0["params_at"] + [r0["final"]], r1["params_at"] + [r1["final"]]):
        assert all(torch.equal(x, y) for x, y in zip(a, b))


def test_reported_samples_are_not_added_to_samples_per_step():
    strategy = AveragingStrategy(AveragingConfig(average_every=20, samples_per_step=8))
    strategy.setup(torch.nn.Linear(2, 2), None, LearnerContext())
    for _ in range(7):
        strategy.note_samples(8)
        strategy.after_step()
    assert strategy.num_averages == 2 and strategy.samples_since_average == 8  # after steps 3 and 6
    assert strategy.samples_noted == 56


def test_varying_reports_without_samples_per_step_stop_with_an_error():
    strategy = AveragingStrategy(AveragingConfig(average_every=20))
    strategy.setup(torch.nn.Linear(2, 2), None, LearnerContext())
    strategy.note_samples(8)
    strategy.after_step()
    twin = AveragingStrategy(AveragingConfig(average_every=20))
    twin.load_state_dict(strategy.state_dict())  # a resumed learner keeps the first minibatch's size
    for learner in (strategy, twin):
        with pytest.raises(TrainingError, match="samples_per_step"):
            learner.note_samples(9)
