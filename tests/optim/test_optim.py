"""CNTK AdaGrad against a numpy reference; optimizer configs; learning-rate schedules."""
from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from asrdist.errors import ConfigError
from asrdist.optim.adagrad import CntkAdaGrad
from asrdist.optim.build import OptimConfig, build_optimizer
from asrdist.optim.light import SGD
from asrdist.optim.schedules import LRSchedule

torch.set_num_threads(1)


def _numpy_adagrad(params, grads_per_step, lr, momentum=0.0, nesterov=False, weight_decay=0.0, skip_unseen=False):
    """Straight transcription of DESIGN.md §5.2 in float64, one matrix at a time; with
    `skip_unseen` the multipliers' mean runs over elements whose running sum is non-zero."""
    params = [p.astype(np.float64).copy() for p in params]
    acc = [np.zeros_like(p) for p in params]
    buf = [np.zeros_like(p) for p in params]
    for grads in grads_per_step:
        for i, g in enumerate(grads):
            g = g.astype(np.float64) + weight_decay * params[i]
            acc[i] += g * g
            normalized = g / np.sqrt(acc[i] + 1e-16)
            multipliers = 1.0 / np.sqrt(acc[i] + 1e-16)
            lr_eff = lr / np.mean(multipliers[acc[i] > 0] if skip_unseen else multipliers)
            if momentum:
                buf[i] = momentum * buf[i] + normalized * lr_eff / lr
                step = normalized * lr_eff / lr + momentum * buf[i] if nesterov else buf[i]
                params[i] -= lr * step
            else:
                params[i] -= lr_eff * normalized
    return params


def _run_torch(params0, grads_per_step, **kw):
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in params0]
    opt = CntkAdaGrad(params, **kw)
    for grads in grads_per_step:
        for p, g in zip(params, grads):
            p.grad = torch.from_numpy(g.copy())
        opt.step()
    return [p.detach().numpy() for p in params], opt


def _problem(seed=0, steps=6):
    rng = np.random.default_rng(seed)
    params0 = [rng.normal(size=(5, 4)).astype(np.float32), rng.normal(size=(5,)).astype(np.float32)]
    grads = []
    for step in range(steps):
        g_w = rng.normal(size=(5, 4)).astype(np.float32)
        if step < 2:
            g_w[0, 0] = 0.0  # no gradient yet: multiplier 1e8 (CNTK's mean lets it shrink the matrix's lr)
        grads.append([g_w, rng.normal(size=(5,)).astype(np.float32) * 10])
    return params0, grads


@pytest.mark.parametrize("kw", [
    {},
    {"momentum": 0.9},
    {"momentum": 0.9, "nesterov": True},
    {"weight_decay": 0.01},
    {"skip_unseen": True},
    {"skip_unseen": True, "momentum": 0.9},
])
def test_adagrad_matches_numpy_reference(kw):
    params0, grads = _problem()
    got, _ = _run_torch(params0, grads, lr=0.05, **kw)
    want = _numpy_adagrad(params0, grads, lr=0.05, **kw)
    for g, w in zip(got, want):
        np.testing.assert_allclose(g, w, rtol=1e-5, atol=1e-6)
    assert np.abs(got[0] - params0[0]).max() > 1e-3


def test_adagrad_ignores_never_updated_elements_in_the_mean():
    """A dead unit's always-zero gradient must not shrink the rest of its matrix's step: the update
    equals that of the same matrix without the dead element; CNTK's literal mean shrinks it ~1e7x."""
    rng = np.random.default_rng(3)
    grads = [rng.normal(size=(4, 3)).astype(np.float32) for _ in range(3)]
    for g in grads:
        g[:, 0] = 0.0  # column 0 never sees a gradient
    live = [[g[:, 1:].copy()] for g in grads]
    zeros = np.zeros((4, 3), dtype=np.float32)
    got, _ = _run_torch([zeros], [[g] for g in grads], lr=0.1, skip_unseen=True)
    want, _ = _run_torch([zeros[:, 1:].copy()], live, lr=0.1, skip_unseen=True)
    np.testing.assert_allclose(got[0][:, 1:], want[0], rtol=1e-6)
    assert np.all(got[0][:, 0] == 0)
    literal, _ = _run_torch([zeros], [[g] for g in grads], lr=0.1)  # CNTK's mean, the default
    assert np.abs(literal[0]).max() < 1e-5 * np.abs(got[0]).max()


def test_adagrad_first_step_is_mean_normalized():
    """Step 1: |G|/sqrt(G^2) = sign(G), multipliers 1/|G|: the update is lr * G / mean(1/|G|) / |G|."""
    g = np.array([[1.0, -4.0], [2.0, 0.5]], dtype=np.float32)
    got, _ = _run_torch([np.zeros_like(g)], [[g]], lr=1.0)
    mean_multiplier = np.mean(1 / np.abs(g))
    np.testing.assert_allclose(got[0], -np.sign(g) / mean_multiplier, rtol=1e-6)


def test_adagrad_state_dict_resume_is_exact():
    params0, grads = _problem(seed=1, steps=6)
    full, _ = _run_torch(params0, grads, lr=0.05, momentum=0.5)
    half, opt = _run_torch(params0, grads[:3], lr=0.05, momentum=0.5)
    state = opt.state_dict()
    assert {"sum_sq", "momentum_buffer"} <= set(state["state"][0])
    params = [torch.nn.Parameter(torch.from_numpy(p.copy())) for p in half]
    resumed = CntkAdaGrad(params, lr=0.05, momentum=0.5)
    resumed.load_state_dict(state)
    for grads_t in grads[3:]:
        for p, g in zip(params, grads_t):
            p.grad = torch.from_numpy(g.copy())
        resumed.step()
    for a, b in zip(full, params):
        np.testing.assert_array_equal(a, b.detach().numpy())


def test_adagrad_rejects_bad_hyperparameters():
    p = [torch.nn.Parameter(torch.zeros(2))]
    with pytest.raises(ValueError):
        CntkAdaGrad(p, lr=0)
    with pytest.raises(ValueError):
        CntkAdaGrad(p, nesterov=True)


# -- configs and construction -------------------------------------------------------------
@pytest.mark.parametrize("kwargs, field", [
    ({"name": "adam"}, "optim.name"),
    ({"lr": 0.0}, "optim.lr"),
    ({"lr": float("nan")}, "optim.lr"),
    ({"momentum": 1.0}, "optim.momentum"),
    ({"nesterov": True}, "optim.nesterov"),
    ({"weight_decay": -1.0}, "optim.weight_decay"),
    ({"warmup_steps": -1}, "optim.warmup_steps"),
    ({"lr_scaling": "cubic"}, "optim.lr_scaling"),
    ({"reference_batch": 0}, "optim.reference_batch"),
    ({"anneal_after_epoch": -1}, "optim.anneal_after_epoch"),
    ({"anneal_factor": 1.5}, "optim.anneal_factor"),
    ({"decay": "cosine"}, "optim.decay"),
    ({"decay": "geometric"}, "optim.final_lr"),
    ({"final_lr": 0.01}, "optim.final_lr"),
])
def test_bad_optim_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        OptimConfig(**kwargs)


def test_build_optimizer():
    params = [torch.nn.Parameter(torch.zeros(3))]
    sgd = build_optimizer(OptimConfig(lr=0.2, momentum=0.9, nesterov=True, weight_decay=1e-4), params)
    assert isinstance(sgd, SGD)  # torch.optim.SGD's updates without its compiler hooks (test_light.py)
    group = sgd.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.2, 0.9, True, 1e-4)
    ada = build_optimizer(OptimConfig(name="adagrad", lr=0.3), params)
    assert isinstance(ada, CntkAdaGrad) and ada.param_groups[0]["lr"] == 0.3
    assert ada.param_groups[0]["momentum"] == 0.0


# -- schedules ----------------------------------------------------------------------------
def test_constant_schedule_and_batch_scaling():
    assert LRSchedule(OptimConfig(lr=0.1), 10, 3, 256).lr_at(17) == pytest.approx(0.1)
    lin = LRSchedule(OptimConfig(lr=0.1, lr_scaling="linear", reference_batch=256), 10, 3, 1024)
    assert lin.lr_at(0) == pytest.approx(0.4)
    sqrt = LRSchedule(OptimConfig(lr=0.1, lr_scaling="sqrt", reference_batch=256), 10, 3, 1024)
    assert sqrt.lr_at(5) == pytest.approx(0.2)
    assert LRSchedule(OptimConfig(lr=0.1), 10, 3, 256, scale=4).lr_at(0) == pytest.approx(0.4)


def test_linear_warmup():
    sched = LRSchedule(OptimConfig(lr=1.0, warmup_steps=4), 100, 1, 256)
    assert [sched.lr_at(s) for s in range(6)] == pytest.approx([0.25, 0.5, 0.75, 1.0, 1.0, 1.0])


def test_anneal_after_epoch():
    sched = LRSchedule(OptimConfig(lr=1.0, anneal_after_epoch=2), 10, 5, 256)
    per_epoch = [sched.lr_at(e * 10 + 3) for e in range(5)]
    r = 1 / math.sqrt(2)
    assert per_epoch == pytest.approx([1.0, 1.0, r, r * r, r ** 3])
    assert sched.lr_at(19) == pytest.approx(1.0) and sched.lr_at(20) == pytest.approx(r)


def test_geometric_decay_from_initial_to_final():
    sched = LRSchedule(OptimConfig(lr=0.1, decay="geometric", final_lr=0.001), 5, 2, 256)
    lrs = [sched.lr_at(s) for s in range(10)]
    assert lrs[0] == pytest.approx(0.1) and lrs[-1] == pytest.approx(0.001)
    ratios = np.array(lrs[1:]) / np.array(lrs[:-1])
    np.testing.assert_allclose(ratios, ratios[0])  # a constant factor per step
    assert sched.lr_at(50) == pytest.approx(0.001)


def test_schedule_is_a_pure_function_of_step_and_apply_sets_groups():
    cfg = OptimConfig(lr=0.1, warmup_steps=3, lr_scaling="linear", reference_batch=128, anneal_after_epoch=1,
                      decay="geometric", final_lr=0.01)
    sched = LRSchedule(cfg, 4, 3, 256, scale=2.0)
    forward = [sched.lr_at(s) for s in range(12)]
    backward = [LRSchedule(cfg, 4, 3, 256, scale=2.0).lr_at(s) for s in reversed(range(12))][::-1]
    assert forward == backward
    # Composition: 0.1 x 2 (scale) x 2 (batch) x warmup x anneal x decay.
    step = 5
    expected = 0.4 * 1.0 * (1 / math.sqrt(2)) * (0.1 ** (step / 11))
    assert sched.lr_at(step) == pytest.approx(expected)
    a, b = torch.nn.Parameter(torch.zeros(1)), torch.nn.Parameter(torch.zeros(1))
    opt = torch.optim.SGD([{"params": [a]}, {"params": [b], "lr_multiplier": 0.5}], lr=1.0)
    lr = sched.apply(opt, step)
    assert lr == pytest.approx(expected)
    assert opt.param_groups[0]["lr"] == pytest.approx(expected)
    assert opt.param_groups[1]["lr"] == pytest.approx(expected / 2)


def test_schedule_rejects_bad_arguments():
    with pytest.raises(ValueError):
        LRSchedule(OptimConfig(), 0, 1, 256)
    with pytest.raises(ValueError):
        LRSchedule(OptimConfig(), 1, 1, 256).lr_at(-1)
