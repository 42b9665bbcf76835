"""The compiled natural-gradient preconditioner (asrdist/native/ngsgd_kernel.cpp) against the Python
one, which is its specification, through initialization, skipped and updating minibatches, floors,
re-orthogonalization and a stretch of all-zero inputs: bit for bit on ATen's path (float64), to
float32 rounding on the float32 CPU fast path (BLAS directly, norms as loops); and the kernel
choice (config, fallback without a compiler)."""
from __future__ import annotations

import copy

import pytest
import torch
from tests.support.native_fixture import run_without_compiler
from torch.testing import assert_close

from asrdist.errors import ConfigError
from asrdist.optim.build import OptimConfig
from asrdist.optim.ng_layers import NaturalGradientLinear, apply_natural_gradient
from asrdist.optim.ngsgd import OnlineNaturalGradient


def _run(kernel: str, dim: int, rank: int, ones: bool, dtype: torch.dtype, scale: float, steps: int = 60):
    """Outputs and final state of a preconditioner fed correlated minibatches (every 7th one without
    an update, five all-zero ones mid-way)."""
    p = OnlineNaturalGradient(dim, rank, num_samples_history=300, kernel=kernel)
    gen = torch.Generator().manual_seed(1)
    mix = torch.randn(dim, dim, generator=gen) * torch.logspace(0, -3, dim)
    outputs = []
    for t in range(steps):
        x = (torch.randn(37, dim, generator=gen) @ mix).to(dtype)
        if 20 <= t < 25:
            x = x * 0
        update = t % 7 != 3
        if ones:
            outputs.append(p.precondition_with_ones(x[:, :-1].contiguous(), update))
        else:
            outputs.append((*p.precondition_unscaled(x, update, scale),))
    return p, outputs


@pytest.mark.parametrize("dim, rank, ones, scale", [(12, 4, True, 1.0), (50, 20, True, 1.0), (40, 12, False, 37.0)])
def test_native_kernel_matches_python_bit_for_bit_in_float64(dim, rank, ones, scale):
    python, expected = _run("python", dim, rank, ones, torch.float64, scale)
    native, got = _run("native", dim, rank, ones, torch.float64, scale)
    assert native._native and not python._native
    for e, g in zip(expected, got):
        assert all(torch.equal(a, b) if isinstance(a, torch.Tensor) else a == b for a, b in zip(e, g))
    a, b = python.state_dict(), native.state_dict()
    assert torch.equal(a["W"], b["W"]) and torch.equal(a["d"], b["d"]) and a["rho"] == b["rho"]
    assert {k: a[k] for k in ("num_updates", "skipped", "num_floored", "num_reorthogonalizations")} == \
           {k: b[k] for k in ("num_updates", "skipped", "num_floored", "num_reorthogonalizations")}
    assert b["num_floored"] >= 1  # the zero stretch floors the statistics in every case


@pytest.mark.parametrize("dim, rank, ones, scale", [
    (12, 4, True, 1.0),
    (12, 4, False, 37.0),
    (513, 20, True, 1.0),  # a 512-wide layer's inputs
    (90, 80, False, 256.0),  # rank close to dim: floors hit, R re-orthogonalized
])
def test_native_fast_path_matches_python_to_float32_rounding(dim, rank, ones, scale):
    python, expected = _run("python", dim, rank, ones, torch.float32, scale)
    native, got = _run("native", dim, rank, ones, torch.float32, scale)
    for e, g in zip(expected, got):
        assert_close(g[0], e[0], rtol=1e-4, atol=1e-5 * float(e[0].abs().max()))
        if ones:
            assert_close(g[1], e[1], rtol=1e-4, atol=1e-5)
        assert g[-1] == pytest.approx(e[-1], rel=1e-5)
    # the statistics: the same Fisher estimate (R itself may turn within a floored, degenerate subspace)
    assert_close(native.fisher(), python.fisher(), rtol=1e-4, atol=1e-4 * float(python.fisher().abs().max()))
    assert native.num_updates == python.num_updates and native.num_floored >= 1
    if rank == 80:
        assert native.num_reorthogonalizations >= 1


def test_natural_gradient_layers_train_alike_with_either_kernel():
    """A small DNN trained 30 steps with natural gradient: the same weights with either kernel, to
    float32 rounding."""
    torch.manual_seed(0)
    base = torch.nn.Sequential(torch.nn.Linear(24, 32), torch.nn.ReLU(), torch.nn.Linear(32, 32), torch.nn.ReLU(),
                               torch.nn.Linear(32, 6))
    models = {k: apply_natural_gradient(copy.deepcopy(base), kernel=k) for k in ("python", "native")}
    gen = torch.Generator().manual_seed(2)
    batches = [(torch.randn(64, 24, generator=gen), torch.randint(0, 6, (64,), generator=gen)) for _ in range(30)]
    for model in models.values():
        optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
        for x, y in batches:
            optimizer.zero_grad()
            torch.nn.functional.cross_entropy(model(x), y).backward()
            optimizer.step()
    for a, b in zip(models["python"].parameters(), models["native"].parameters()):
        assert_close(b, a, rtol=1e-4, atol=1e-5)
    assert not torch.equal(models["native"][0].weight, base[0].weight)  # it trained
    layer = next(m for m in models["native"].modules() if isinstance(m, NaturalGradientLinear))
    assert layer.preconditioner_in.kernel == "native" and layer.preconditioner_in._native


def test_kernel_choice_is_validated():
    with pytest.raises(ConfigError, match="natural_gradient_kernel"):
        OptimConfig(natural_gradient=True, natural_gradient_kernel="gpu")
    with pytest.raises(ConfigError, match="kernel"):
        OnlineNaturalGradient(8, 2, kernel="fast")


def test_without_a_compiler_auto_falls_back_to_python_with_a_one_line_warning(tmp_path):
    """A machine without a C++ compiler (and no cached build): `auto` warns once, in one line, and
    the Python preconditioner runs; `native` is a one-line ConfigError."""
    script = (
        "import warnings, torch\n"
        "from asrdist.errors import ConfigError\n"
        "from asrdist.optim.ngsgd import OnlineNaturalGradient\n"
        "p = OnlineNaturalGradient(6, 2)\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    y = p.precondition(torch.randn(5, 6))\n"
        "print(p._native, tuple(y.shape))\n"
        "print(len(caught), str(caught[0].message))\n"
        "try:\n"
        "    OnlineNaturalGradient(6, 2, kernel='native').precondition(torch.randn(5, 6))\n"
        "except ConfigError as e:\n"
        "    print('ConfigError', e)\n")
    missing, (native, warning, error) = run_without_compiler(tmp_path, script)
    assert native == "False (5, 6)"
    assert warning.startswith("1 ") and str(missing) in warning and "Python preconditioner" in warning
    assert error.startswith("ConfigError optim.natural_gradient_kernel:") and str(missing) in error


def test_a_multi_learner_run_builds_the_kernel_once_before_its_learners_start(monkeypatch):
    """`asrdist train` with NG-SGD and several learners resolves (builds) the kernel in the launching
    process before it starts them; plain SGD and `natural_gradient_kernel=python` never build it."""
    from types import SimpleNamespace

    import asrdist.optim.ngsgd as ngsgd
    import asrdist.run.launch as launch
    from asrdist.config import RunConfig, TrainConfig

    events = []
    monkeypatch.setattr(ngsgd, "resolve_kernel", lambda kind: events.append(("resolve", kind)) or True)
    monkeypatch.setattr(launch, "run_workers", lambda *a, **k: events.append(("workers",)) or {})
    args = SimpleNamespace(no_progress=True, resume=None)
    for optim, expected in ((OptimConfig(natural_gradient=True), [("resolve", "auto"), ("workers",)]),
                            (OptimConfig(natural_gradient=True, natural_gradient_kernel="native"),
                             [("resolve", "native"), ("workers",)]),
                            (OptimConfig(natural_gradient=True, natural_gradient_kernel="python"), [("workers",)]),
                            (OptimConfig(), [("workers",)])):
        events.clear()
        cfg = RunConfig(optim=optim, train=TrainConfig(learners=2), strategy_name="sync")
        launch._start_learners(cfg, None, args, nodes=1, network="1gbit", resume=False)
        assert events == expected
