"""Online natural gradient: the preconditioner against dense references, its long-run stability,
the natural-gradient layers, max-change, and NG-SGD vs SGD on a small DNN."""
from __future__ import annotations

import copy

import pytest
import torch
import torch.nn.functional as F
from torch.testing import assert_close

from asrdist.errors import ConfigError, DataError
from asrdist.models.dnn import SplicedDNN
from asrdist.optim.max_change import MaxChangeConfig, clip_change
from asrdist.optim.ng_layers import (AffineLSTM, NaturalGradientLinear, apply_natural_gradient,
                                     load_natural_gradient_state, natural_gradient_state)
from asrdist.optim.ngsgd import NUM_INITIAL_UPDATES, OnlineNaturalGradient

F64 = torch.float64


def _correlated(n: int, dim: int, seed: int, decay: float = -1.5) -> torch.Tensor:
    """Rows with a full-rank but unequal covariance (eigenvalues spread over 10^(2·decay))."""
    gen = torch.Generator().manual_seed(seed)
    mix = torch.randn(dim, dim, generator=gen, dtype=F64) * torch.logspace(0, decay, dim, dtype=F64)
    return torch.randn(n, dim, generator=gen, dtype=F64) @ mix


def _warm(dim=12, rank=4, n=40, steps=5, **kw) -> OnlineNaturalGradient:
    p = OnlineNaturalGradient(dim, rank, num_samples_history=200, **kw)
    for s in range(steps):
        p.precondition(_correlated(n, dim, seed=s))
    return p


def _dense_update(R, d, rho, x, eta):
    """DESIGN.md §5.3 steps 2–3 with dense dim×dim matrices: the new Fisher estimate."""
    dim, rank = R.shape[1], R.shape[0]
    F_old = R.T @ torch.diag(d) @ R + rho * torch.eye(dim, dtype=F64)
    T = eta * x.T @ x / x.shape[0] + (1 - eta) * F_old
    Y = R @ T
    c, U = torch.linalg.eigh(Y @ Y.T)
    c, U = c.flip(0), U.flip(1)
    R_new = torch.diag(c.rsqrt()) @ U.T @ Y
    rho_new = (eta * torch.trace(x.T @ x) / x.shape[0] + (1 - eta) * (dim * rho + d.sum()) - c.sqrt().sum()) / (dim - rank)
    d_new = c.sqrt() - rho_new
    return R_new.T @ torch.diag(d_new) @ R_new + rho_new * torch.eye(dim, dtype=F64)


def test_statistics_update_matches_dense_reference():
    p = _warm()
    x = _correlated(40, 12, seed=99)
    R, d, rho = p.R, p.d, p.rho
    updates, floored, reorth = p.num_updates, p.num_floored, p.num_reorthogonalizations
    p.precondition(x)
    assert p.num_updates == updates + 1
    assert (p.num_floored, p.num_reorthogonalizations) == (floored, reorth)  # the plain formulas apply
    assert_close(p.fisher(), _dense_update(R, d, rho, x, p.eta(40)), rtol=1e-9, atol=1e-11)


def test_rows_orthonormal_and_fisher_is_low_rank_plus_identity():
    p = _warm()
    R = p.R
    assert_close(R @ R.T, torch.eye(4, dtype=F64), rtol=0, atol=1e-10)
    assert torch.all(p.d > 0) and p.rho > 0
    assert torch.all(p.d[:-1] >= p.d[1:])  # descending
    eig = torch.linalg.eigvalsh(p.fisher()).flip(0)
    assert_close(eig[:4], p.d + p.rho)  # rank directions: d_i + rho; the rest: rho
    assert_close(eig[4:], torch.full((8,), p.rho, dtype=F64))


def test_output_is_smoothed_inverse_with_preserved_norm():
    p = _warm()
    x = _correlated(40, 12, seed=7)
    G = p.smoothed_fisher()
    F_ = p.fisher()
    assert_close(G, F_ + 4.0 / 12 * torch.trace(F_) * torch.eye(12, dtype=F64))
    beta = p.rho * (1 + 4.0) + 4.0 / 12 * float(p.d.sum())
    x_hat, gamma = p.precondition_unscaled(x, update=False)
    assert_close(x_hat, beta * x @ torch.linalg.inv(G))  # identity smoothing: X̂ = β X G⁻¹
    y = p.precondition(x)  # uses the pre-update estimate, then updates
    assert_close(y.norm(), x.norm())
    assert_close(y, x_hat * gamma)
    assert gamma == pytest.approx(float(x.norm() / x_hat.norm()))


def test_update_schedule_and_eval_mode():
    p = OnlineNaturalGradient(10, 3, update_period=4)
    x = _correlated(16, 10, seed=1).float()
    for _ in range(NUM_INITIAL_UPDATES):
        p.precondition(x)
    assert p.num_updates == NUM_INITIAL_UPDATES
    counts = []
    for _ in range(12):
        p.precondition(x)
        counts.append(p.num_updates)
    assert counts == [10, 10, 10, 11, 11, 11, 11, 12, 12, 12, 12, 13]
    state = p.state_dict()
    y1 = p.precondition(x, update=False)
    y2 = p.precondition(x, update=False)
    assert_close(y1, y2)
    assert p.state_dict()["num_updates"] == state["num_updates"] and torch.equal(p.state_dict()["W"], state["W"])


def test_deterministic_initialization_and_state_round_trip():
    xs = [_correlated(20, 9, seed=s).float() for s in range(14)]
    a, b = OnlineNaturalGradient(9, 3, seed=3), OnlineNaturalGradient(9, 3, seed=3)
    for x in xs[:7]:
        assert torch.equal(a.precondition(x), b.precondition(x))
    c = OnlineNaturalGradient(9, 3, seed=3)
    c.load_state_dict(a.state_dict())
    for x in xs[7:]:
        assert torch.equal(a.precondition(x), c.precondition(x))
    fresh = OnlineNaturalGradient(9, 3)
    assert torch.equal(fresh.precondition(xs[0], update=False), xs[0])  # identity until initialized


def test_implicit_ones_column_matches_materialized_rows():
    """precondition_with_ones(x) is precondition_unscaled([x, 1]) — through initialization, plain
    steps and statistics updates — without building the ones column."""
    implicit, explicit = OnlineNaturalGradient(10, 4, num_samples_history=200), OnlineNaturalGradient(10, 4, num_samples_history=200)
    for s in range(NUM_INITIAL_UPDATES + 6):
        x = _correlated(24, 9, seed=s)
        main, ones_column, gamma = implicit.precondition_with_ones(x)
        reference, reference_gamma = explicit.precondition_unscaled(torch.cat([x, torch.ones(24, 1, dtype=F64)], 1))
        assert_close(main, reference[:, :9], rtol=1e-10, atol=1e-12)
        assert_close(ones_column, reference[:, 9], rtol=1e-10, atol=1e-12)
        assert gamma == pytest.approx(reference_gamma, rel=1e-10)
    assert implicit.num_updates == explicit.num_updates
    assert_close(implicit.fisher(), explicit.fisher(), rtol=1e-9, atol=1e-12)
    with pytest.raises(DataError, match=r"\(N, 9\) \(plus its ones column\)"):
        implicit.precondition_with_ones(torch.zeros(3, 10))
    fresh = OnlineNaturalGradient(10, 4)
    main, ones_column, _ = fresh.precondition_with_ones(torch.ones(2, 9), update=False)  # identity before any update
    assert torch.equal(main, torch.ones(2, 9)) and torch.equal(ones_column, torch.ones(2))


def test_degenerate_inputs_and_bad_arguments():
    assert torch.equal(OnlineNaturalGradient(1, 0).precondition(torch.ones(3, 1)), torch.ones(3, 1))
    p = OnlineNaturalGradient(6, 2)
    assert p.precondition(torch.zeros(0, 6)).shape == (0, 6)
    z = p.precondition(torch.zeros(5, 6))  # all-zero minibatch: floors keep F positive
    assert torch.all(z == 0) and p.rho > 0 and torch.all(p.d > 0)
    with pytest.raises(DataError, match=r"\(N, 6\)"):
        p.precondition(torch.zeros(5, 7))
    with pytest.raises(ConfigError, match="rank"):
        OnlineNaturalGradient(4, 4)
    with pytest.raises(ConfigError, match="update_period"):
        OnlineNaturalGradient(4, 2, update_period=0)


def test_four_thousand_updates_on_ill_conditioned_inputs():
    """Every minibatch updates the statistics (65 forgetting time constants), through a stretch of
    all-zero minibatches and one of huge ones."""
    dim, rank, n = 16, 6, 8
    gen = torch.Generator().manual_seed(0)
    basis, _ = torch.linalg.qr(torch.randn(dim, dim, generator=gen, dtype=F64))
    scales = torch.logspace(2, -4, dim, dtype=F64)  # covariance condition number 1e12
    mix = (scales[:, None] * basis.T).float()
    p = OnlineNaturalGradient(dim, rank, num_samples_history=500, update_period=1)
    noise = torch.randn(4_000, n, dim, generator=gen)
    for t in range(4_000):
        x = noise[t] @ mix
        if 1200 <= t < 1400:
            x = x * 0  # a stretch of all-zero minibatches must not break it
        elif 2400 <= t < 2600:
            x = x * 1e3
        y = p.precondition(x)
        if t % 997 == 0:
            assert torch.isfinite(y).all()
            assert float(y.norm()) == pytest.approx(float(x.norm()), rel=1e-3, abs=1e-6)
    assert p.num_updates == 4_000
    R = p.R
    assert torch.isfinite(R).all() and torch.isfinite(p.d).all() and p.rho > 0
    assert_close(R @ R.T, torch.eye(rank, dtype=F64), rtol=0, atol=1e-4)
    # no collapse: the estimate tracks the true covariance's top directions and total variance
    top = basis[:, :3]
    captured = torch.linalg.norm(R.double() @ top, dim=0)
    assert torch.all(captured > 0.99), captured
    true_trace = float((scales ** 2).sum())
    assert 0.5 < float(torch.trace(p.fisher())) / true_trace < 2.0


# ------------------------------------------------------------------------------- layers

def _pair(in_f=7, out_f=5, bias=True):
    torch.manual_seed(0)
    plain = torch.nn.Linear(in_f, out_f, bias=bias)
    return plain, NaturalGradientLinear.from_linear(copy.deepcopy(plain))


@pytest.mark.parametrize("bias", [True, False])
def test_ng_linear_is_a_drop_in_linear(bias):
    plain, ng = _pair(bias=bias)
    assert ng.state_dict().keys() == plain.state_dict().keys()
    assert ng.preconditioner_in.rank == 4 and ng.preconditioner_out.rank == 3  # min(20, 8//2), min(80, 6//2)
    x = torch.randn(3, 11, 7, requires_grad=True)
    x2 = x.detach().clone().requires_grad_(True)
    y_plain, y_ng = plain(x), ng(x2)
    assert torch.equal(y_plain, y_ng)
    g = torch.randn_like(y_plain)
    y_plain.backward(g)
    y_ng.backward(g)
    assert_close(x2.grad, x.grad)  # the input gradient is the plain one
    reloaded = torch.nn.Linear(7, 5, bias=bias)
    reloaded.load_state_dict(ng.state_dict())
    assert torch.equal(reloaded(x.detach()), y_ng.detach())


def test_ng_linear_weight_gradient_is_preconditioned_outer_product():
    plain, ng = _pair()
    for _ in range(3):  # get past initialization
        ng(torch.randn(16, 7)).sum().backward()
    ref_in, ref_out = copy.deepcopy(ng.preconditioner_in), copy.deepcopy(ng.preconditioner_out)
    ng.zero_grad()
    x, g = torch.randn(16, 7), torch.randn(16, 5)
    ng(x).backward(g)
    x_in = torch.cat([x, torch.ones(16, 1)], dim=1)
    # derivatives are preconditioned as those of the summed objective (×rows), then scaled back
    full = ref_out.precondition(g * 16).T @ ref_in.precondition(x_in) / 16
    assert_close(ng.weight.grad, full[:, :7])
    assert_close(ng.bias.grad, full[:, 7])


def test_preconditioners_update_only_in_training_mode():
    _, ng = _pair()
    x = torch.randn(16, 7)
    ng(x).sum().backward()
    updates = ng.preconditioner_in.num_updates, ng.preconditioner_out.num_updates
    ng.eval()
    ng(x).sum().backward()
    assert (ng.preconditioner_in.num_updates, ng.preconditioner_out.num_updates) == updates
    ng.train()
    ng(x).sum().backward()
    assert ng.preconditioner_in.num_updates == updates[0] + 1


def test_apply_natural_gradient_keeps_parameters_and_state():
    model = SplicedDNN(4, 6, hidden_layers=2, hidden_dim=16, context=1)
    params = list(model.parameters())
    opt = torch.optim.SGD(params, lr=0.1)
    apply_natural_gradient(model, update_period=2)
    layers = [m for m in model.modules() if isinstance(m, torch.nn.Linear)]
    assert len(layers) == 3 and all(isinstance(m, NaturalGradientLinear) for m in layers)
    assert all(a is b for a, b in zip(model.parameters(), params))
    assert layers[0].preconditioner_in.update_period == 2
    x, y = torch.randn(32, 12), torch.randint(0, 6, (32,))
    for _ in range(3):
        F.cross_entropy(model(x), y).backward()
        opt.step()
        opt.zero_grad()
    twin = apply_natural_gradient(copy.deepcopy(model))
    load_natural_gradient_state(twin, natural_gradient_state(model))
    for m in (model, twin):
        F.cross_entropy(m(x), y).backward()
    assert all(torch.equal(a.grad, b.grad) for a, b in zip(model.parameters(), twin.parameters()))


def test_affine_lstm_matches_torch_lstm_and_takes_natural_gradient():
    torch.manual_seed(0)
    lstm = torch.nn.LSTM(5, 6, num_layers=2, batch_first=True, bidirectional=True)
    affine = AffineLSTM.from_lstm(lstm)
    x = torch.randn(3, 7, 5)
    assert_close(affine(x)[0], lstm(x)[0], rtol=1e-5, atol=1e-6)
    model = torch.nn.Module()
    model.lstm = lstm
    apply_natural_gradient(model, convert_lstm=True)
    assert isinstance(model.lstm, AffineLSTM)
    assert all(isinstance(m, NaturalGradientLinear) for m in model.lstm.input_maps)
    model.lstm(x)[0].square().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


# ---------------------------------------------------------------------------- max-change

def test_clip_change_caps_layers_then_the_whole_model():
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.ReLU(), torch.nn.Linear(4, 4), torch.nn.Linear(4, 3))
    grads = {0: 10.0, 2: 0.1, 3: 10.0}  # layer index -> gradient scale
    for i, scale in grads.items():
        for p in model[i].parameters():
            p.grad = torch.full_like(p, scale)
    before = {i: torch.sqrt(sum(p.grad.square().sum() for p in model[i].parameters())) for i in grads}
    lr = 0.1
    stats = clip_change(model, lr, MaxChangeConfig(hidden=0.75, output=1.5, total=1.6))
    after = {i: lr * torch.sqrt(sum(p.grad.square().sum() for p in model[i].parameters())) for i in grads}
    expected = {0: 0.75, 2: lr * float(before[2]), 3: 1.5}  # hidden capped, untouched, output capped
    total = sum(v ** 2 for v in expected.values()) ** 0.5
    for i in grads:
        assert float(after[i]) == pytest.approx(expected[i] * 1.6 / total, rel=1e-5)
    assert stats.layers_capped == 2 and stats.total_norm == pytest.approx(total, rel=1e-5)
    assert stats.total_scale == pytest.approx(1.6 / total, rel=1e-5)
    small = clip_change(model, lr)  # already within every cap: nothing changes
    assert small.layers_capped == 0 and small.total_scale == 1.0
    with pytest.raises(ConfigError, match="max_change.total"):
        MaxChangeConfig(total=-1)


# ------------------------------------------------------------------- NG-SGD vs plain SGD

def _task(n=4096, seed=0):
    """An ill-conditioned synthetic classification task: a random teacher on rotated,
    unevenly scaled inputs."""
    gen = torch.Generator().manual_seed(seed)
    basis, _ = torch.linalg.qr(torch.randn(20, 20, generator=gen))
    scales = torch.logspace(-2, 0.5, 20)
    z = torch.randn(n, 20, generator=gen)
    x = (z * scales) @ basis.T + 0.5
    w1, w2 = torch.randn(20, 32, generator=gen), torch.randn(32, 8, generator=gen)
    return x, (torch.tanh(z @ w1) @ w2).argmax(1)


def _train(model, x, y, lr, steps=300, batch=64):
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    gen = torch.Generator().manual_seed(5)
    for _ in range(steps):
        idx = torch.randint(0, len(x), (batch,), generator=gen)
        opt.zero_grad()
        F.cross_entropy(model(x[idx]), y[idx]).backward()
        clip_change(model, lr)
        opt.step()
    with torch.no_grad():
        return float(F.cross_entropy(model(x), y))


def test_ng_sgd_trains_a_dnn_at_least_as_well_as_sgd():
    torch.set_num_threads(1)
    x, y = _task()

    def dnn():  # the default DNN's class, small: 5 frames x 4 features -> 2 x 64 ReLU -> 8
        torch.manual_seed(0)
        return SplicedDNN(4, 8, hidden_layers=2, hidden_dim=64, context=2)

    sgd = min(_train(dnn(), x, y, lr) for lr in (0.2, 0.4))
    ng = _train(apply_natural_gradient(dnn()), x, y, 0.2)
    assert ng <= sgd, (ng, sgd)
