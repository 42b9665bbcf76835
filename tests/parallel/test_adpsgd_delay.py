"""adpsgd's delay-by-one as the IBM papers write it, x_{k+1} = W_k x_k − η g(x_{k−1}): two gloo
learners (an active that trains through `Trainer.train_step`, a passive that only answers) against
the recurrence computed in one process. The passive does not step, so what it answers at every
exchange is fixed by the exchanges before it: the run is deterministic and the reference exact."""
from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from asrdist.parallel.adpsgd import AdpsgdConfig, AdpsgdStrategy
from asrdist.train.loop import LoopConfig
from asrdist.train.trainer import Trainer, TrainerHooks
from tests.support.dist_utils import learner_context, run_distributed
from tests.support.engine_fixture import ListOrder, mse_loss

pytestmark = pytest.mark.slow

LR = 0.05


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _start(flat: torch.Tensor, rank: int) -> None:
    with torch.no_grad():  # the two learners start apart, so that every exchange moves them
        flat.add_(torch.randn(flat.shape, generator=torch.Generator().manual_seed(10 + rank)))


def _learner(rank, world_size, run_dir, steps, delay_by_one):
    ctx = learner_context()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR)
    strategy = AdpsgdStrategy(AdpsgdConfig(delay_by_one=delay_by_one))
    strategy.setup(model, opt, ctx)
    _start(strategy.flat, rank)
    start = strategy.flat.clone()
    dist.barrier(group=ctx.group)  # both starting points set before the first exchange
    if strategy.active:
        sampler = ListOrder(steps)
        trainer = Trainer(model, opt, strategy, sampler, TrainerHooks(loss_fn=mse_loss, lr_at=lambda s, e: LR), ctx,
                          Path(run_dir), LoopConfig(epochs=1, progress=False))
        for batch in sampler.batches:
            trainer.train_step(batch)
    strategy.end_exchanges()  # the last exchange lands; the passive hears the goodbye
    strategy.await_goodbyes([0, 1])
    return {"start": start, "end": strategy.flat.clone(), "active": strategy.active}


def _flat_grad(model: torch.nn.Module, x: torch.Tensor, batch) -> torch.Tensor:
    """g(x) on `batch`, with the parameters set to the flat vector x."""
    model = copy.deepcopy(model)
    torch.nn.utils.vector_to_parameters(x, model.parameters())
    loss, _ = mse_loss(model, batch)
    grads = torch.autograd.grad(loss, list(model.parameters()))
    return torch.cat([g.reshape(-1) for g in grads])


def _reference(x_active, x_passive, batches, delay_by_one):
    """The recurrence in one process. Step k: the exchange of x_k (submitted at the end of step
    k−1; none at step 0) mixes x_k with the passive's value, both move halfway; then the SGD step
    with g(x_{k−1}) (delay-by-one; none at step 0) or g(x_k) (plain, where the exchange of step k
    follows the update, on the active's thread)."""
    model = _model()
    xa, xp, held = x_active.clone(), x_passive.clone(), None
    for k, batch in enumerate(batches):
        g = _flat_grad(model, xa, batch)  # g(x_k), computed while x_k is exchanged
        if delay_by_one:
            if k > 0:  # W_k x_k
                delta_a, delta_p = (xp - xa).mul_(0.5), (xa - xp).mul_(0.5)
                xa, xp = xa + delta_a, xp + delta_p
            if held is not None:
                xa = xa - LR * held  # - lr g(x_{k-1})
            held = g
        else:
            xa = xa - LR * g  # then the exchange of the updated x
            delta_a, delta_p = (xp - xa).mul_(0.5), (xa - xp).mul_(0.5)
            xa, xp = xa + delta_a, xp + delta_p
    if delay_by_one:  # the exchange of x_K, in flight at the end, lands
        delta_a, delta_p = (xp - xa).mul_(0.5), (xa - xp).mul_(0.5)
        xa, xp = xa + delta_a, xp + delta_p
    return xa, xp


@pytest.mark.parametrize("delay_by_one", [True, False])
def test_delay_by_one_is_the_recurrence_of_the_papers(tmp_path, delay_by_one):
    steps = 6
    active, passive = run_distributed(_learner, 2, tmp_path, str(tmp_path), steps, delay_by_one)
    assert active["active"] and not passive["active"]
    xa, xp = _reference(active["start"], passive["start"], ListOrder(steps).batches, delay_by_one)
    torch.testing.assert_close(active["end"], xa, rtol=0, atol=1e-6)
    torch.testing.assert_close(passive["end"], xp, rtol=0, atol=1e-6)
    # and the two differ: delay-by-one is not plain ADPSGD with another name
    other_a, _ = _reference(active["start"], passive["start"], ListOrder(steps).batches, not delay_by_one)
    assert (other_a - xa).abs().max() > 1e-4
