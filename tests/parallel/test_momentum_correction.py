"""Momentum correction: moving SGD's momentum into the strategy changes nothing without compression."""
from __future__ import annotations

import copy

import pytest
import torch

from asrdist.optim.adagrad import CntkAdaGrad
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.momentum import MomentumCorrection
from tests.support.strategy_harness import make_trainer, train_steps


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _batches(n: int, learners: int = 1):
    gen = torch.Generator().manual_seed(1)
    return [[(torch.randn(8, 6, generator=gen), torch.randint(0, 3, (8,), generator=gen)) for _ in range(learners)]
            for _ in range(n)]


def _grads(model, batch):
    model.zero_grad()
    x, y = batch
    torch.nn.functional.cross_entropy(model(x), y).backward()
    return [p.grad.clone() for p in model.parameters()]


class CorrectedExactExchange(Strategy):
    """Onebit's momentum handling with an exact exchange: only the correction in after_backward."""

    def setup(self, model, optimizer, ctx):
        super().setup(model, optimizer, ctx)
        self.params = list(model.parameters())
        self.correction = MomentumCorrection.take_over(optimizer, self.params)

    def after_backward(self):
        self.correction.apply(self.params)


@pytest.mark.parametrize("nesterov,weight_decay", [(False, 0.0), (True, 0.0), (True, 1e-2), (False, 1e-2)])
def test_corrected_plain_steps_equal_torch_sgd_with_momentum(nesterov, weight_decay):
    reference, corrected = _model(), _model()
    opt_ref = torch.optim.SGD(reference.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov,
                              weight_decay=weight_decay)
    opt = torch.optim.SGD(corrected.parameters(), lr=0.1, momentum=0.9, nesterov=nesterov,
                          weight_decay=weight_decay)
    strategy = CorrectedExactExchange()
    strategy.setup(corrected, opt, LearnerContext())
    assert strategy.correction is not None
    assert all(g["momentum"] == 0 and not g["nesterov"] and g["weight_decay"] == 0 for g in opt.param_groups)
    for (batch,) in _batches(6):
        _grads(reference, batch)
        opt_ref.step()
    train_steps(make_trainer(corrected, opt, strategy), [batch for (batch,) in _batches(6)])
    for a, b in zip(reference.parameters(), corrected.parameters()):
        torch.testing.assert_close(a, b, rtol=1e-6, atol=1e-7)


def test_mean_of_local_directions_is_the_global_direction():
    """Linearity: n learners' corrected gradients average to the single-buffer direction of the
    mean gradient, which is why sync-with-momentum and corrected onebit agree without quantization."""
    learners, model = 3, _model()
    params = list(model.parameters())
    local = [MomentumCorrection([(0.9, True, 0.0)] * len(params)) for _ in range(learners)]
    single = MomentumCorrection([(0.9, True, 0.0)] * len(params))
    for step in _batches(5, learners):
        per_learner = []
        for i, batch in enumerate(step):
            grads = _grads(model, batch)
            for p, g in zip(params, grads):
                p.grad = g
            local[i].apply(params)
            per_learner.append([p.grad.clone() for p in params])
        mean = [sum(gs) / learners for gs in zip(*[[g for g in _grads(model, b)] for b in step])]
        for p, g in zip(params, mean):
            p.grad = g
        single.apply(params)
        for k, p in enumerate(params):
            torch.testing.assert_close(sum(d[k] for d in per_learner) / learners, p.grad, rtol=1e-5, atol=1e-6)


def test_nothing_to_take_over_and_state_round_trip():
    model = _model()
    params = list(model.parameters())
    assert MomentumCorrection.take_over(torch.optim.SGD(params, lr=0.1), params) is None  # no momentum
    assert MomentumCorrection.take_over(CntkAdaGrad(params, lr=0.1, momentum=0.9), params) is None
    opt = torch.optim.SGD(params, lr=0.1, momentum=0.5)
    mc = MomentumCorrection.take_over(opt, params)
    (batch,) = _batches(1)[0]
    _grads(model, batch)
    mc.apply(params)
    restored = MomentumCorrection(mc.settings)
    restored.load_state_dict(copy.deepcopy(mc.state_dict()))
    for a, b in zip(mc.buffers, restored.buffers):
        assert torch.equal(a, b)
    with pytest.raises(ValueError, match="buffers"):
        MomentumCorrection(mc.settings[:1]).load_state_dict(mc.state_dict())
