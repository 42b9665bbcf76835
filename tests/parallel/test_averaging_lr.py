"""The averaging strategy's learning-rate semantics ("Learning rate" in asrdist/parallel/averaging.py).

The trainer splits a global batch B over n learners, each minimizing the mean loss over its B/n
samples. Averaging after every step with the default lr_scale() = 1 must then reproduce SGD with
Nesterov momentum on the whole batch at the same lr (the momentum buffers stay local: their mean
follows the single-process buffer), and scale_lr=true (Kaldi's rule) reproduces it at n x lr.
"""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from asrdist.parallel.averaging import AveragingConfig, AveragingStrategy
from asrdist.parallel.base import LearnerContext
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

pytestmark = pytest.mark.slow  # multi-process: every test runs gloo learners

BATCH, STEPS, LR, WORLD = 12, 6, 0.05, 2


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 3))


def _optimizer(model: torch.nn.Module, lr: float) -> torch.optim.Optimizer:
    return torch.optim.SGD(model.parameters(), lr=lr, momentum=0.9, nesterov=True)


def _global_batch(step: int):
    gen = torch.Generator().manual_seed(step)
    return torch.randn(BATCH, 5, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen)


def _learner(rank: int, world_size: int, scale_lr: bool):
    """The trainer's own step (lr times strategy.lr_scale()), each learner on its slice of every
    global batch; the default loss is the mean over the local B/n."""
    model = _model()
    opt = _optimizer(model, LR)
    strategy = AveragingStrategy(AveragingConfig(average_every=1, scale_lr=scale_lr))
    strategy.setup(model, opt, LearnerContext(rank=rank, world_size=world_size))
    local = BATCH // world_size
    mine = slice(rank * local, (rank + 1) * local)
    batches = [tuple(t[mine] for t in _global_batch(step)) for step in range(STEPS)]
    train_steps(make_trainer(model, opt, strategy, lr=LR), batches)
    strategy.finalize()
    return [p.detach().clone() for p in model.parameters()]


def _whole_batch_sgd(lr: float) -> list[torch.Tensor]:
    model = _model()
    opt = _optimizer(model, lr)
    for step in range(STEPS):
        x, y = _global_batch(step)
        F.cross_entropy(model(x), y).backward()  # mean over the whole B
        opt.step()
        opt.zero_grad()
    return [p.detach() for p in model.parameters()]


@pytest.mark.parametrize("scale_lr", [False, True])
def test_every_step_averaging_is_whole_batch_sgd(tmp_path, scale_lr):
    results = run_distributed(_learner, WORLD, tmp_path, scale_lr)
    same_lr, n_times_lr = _whole_batch_sgd(LR), _whole_batch_sgd(WORLD * LR)
    want, other = (n_times_lr, same_lr) if scale_lr else (same_lr, n_times_lr)
    for got in results:
        for a, b in zip(got, want):
            assert_close(a, b)
    assert max(float((a - b).abs().max()) for a, b in zip(results[0], other)) > 1e-3
