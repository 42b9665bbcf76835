"""Online natural-gradient preconditioner (Povey, Zhang & Khudanpur 2015; Kaldi nnet3's
`OnlineNaturalGradient`).

It keeps a low-rank-plus-identity estimate F = Rᵀ D R + ρ I of the scatter (Fisher) matrix of the
rows it is given and multiplies each minibatch X by the inverse of F smoothed with the identity:
1. η = 1 − exp(−N / num_samples_history), at most 0.9;
2. T = η XᵀX/N + (1−η) F;  Z = (R T)(R T)ᵀ = U C Uᵀ;
3. R ← C^{-½} Uᵀ R T;  D ← C^{½} − ρ' I (floors on C, ρ and D; re-orthogonalize R if needed);
4. W = E^{½} R with the identity smoothing E;  5. X̂ = X − (X Wᵀ) W, rescaled to X's norm;
6. steps 2–3 run on the first 10 minibatches, then every `update_period`.
`kernel` picks the compiled asrdist/native/ngsgd_kernel.cpp or this Python (the specification).
The formulas, floors, initialization and costs: docs/optimizers.md#online-natural-gradient-optimngsgdpy."""
from __future__ import annotations

import math
import warnings
from typing import Any

import numpy as np
import torch

from asrdist.errors import ConfigError, DataError
from asrdist.native import NativeBuildError, load

EPSILON = 1.0e-10
"""Absolute floor on ρ and D (keeps all-zero inputs from collapsing F)."""
DELTA = 5.0e-4
"""Floor on ρ and D relative to the largest √c (controls round-off)."""
MAX_ETA = 0.9
CONDITION_THRESHOLD = 1.0e6
NUM_INITIAL_UPDATES = 10
NUM_INIT_ITERS = 3
KERNEL_KINDS = ("auto", "native", "python")

_kernel_module = None  # kept here too: asrdist.native.load takes a lock, and this is every layer's hot path


def native_kernel():
    """The compiled preconditioner (asrdist/native/ngsgd_kernel.cpp), built on first use; raises
    asrdist.native.NativeBuildError with a one-line reason where it cannot be built."""
    global _kernel_module
    if _kernel_module is None:
        _kernel_module = load("ngsgd_kernel")
    return _kernel_module


def resolve_kernel(kind: str) -> bool:
    """Whether preconditioners of `kind` run compiled: "native" (a ConfigError where it cannot be
    built), "python", or "auto" (compiled where it builds, else one warning and Python)."""
    if kind not in KERNEL_KINDS:
        raise ConfigError(f"optim.natural_gradient_kernel: unknown kernel '{kind}' (known: {', '.join(KERNEL_KINDS)})")
    if kind == "python":
        return False

    try:
        native_kernel()
        return True
    except NativeBuildError as e:
        if kind == "native":
            raise ConfigError(f"optim.natural_gradient_kernel: the compiled kernel is unavailable ({e})") from None
        warnings.warn(f"natural-gradient kernel unavailable ({e}); using the Python preconditioner",
                      RuntimeWarning, stacklevel=2)
        return False


def _small(t: torch.Tensor) -> np.ndarray:
    """A rank×rank tensor as float64 numpy: the small algebra is float64 (Z is a fourth power of the
    data) and elementwise numpy is cheaper per call than torch. Factorizations stay in torch:
    numpy's own LAPACK can spin up a competing thread pool."""
    return t.detach().to("cpu", torch.float64).numpy()


def symmetric_eigh(z: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(c, U) of a symmetric float64 matrix z = U diag(c) Uᵀ, c descending."""
    c, U = torch.linalg.eigh(torch.from_numpy(z))  # ascending
    return c.numpy()[::-1], U.numpy()[:, ::-1]


class _Rows:
    """The minibatch X a preconditioner sees: the rows of `x`, with a column of ones appended when
    `ones` (a layer's inputs and its bias). The ones column is never materialized: it enters each
    product analytically, which spares a copy of x and keeps every product contiguous."""

    __slots__ = ("x", "ones")

    def __init__(self, x: torch.Tensor, ones: bool):
        self.x, self.ones = x, ones

    def times_transposed(self, W: torch.Tensor) -> torch.Tensor:
        """H = X Wᵀ."""
        if self.ones:
            return torch.addmm(W[:, -1], self.x, W[:, :-1].T)
        return self.x @ W.T

    def residual(self, H: torch.Tensor, W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None]:
        """X − H W as (its columns from x, its ones column or None)."""
        if self.ones:
            return torch.addmm(self.x, H, W[:, :-1], alpha=-1.0), torch.mv(H, W[:, -1]).neg_().add_(1.0)
        return torch.addmm(self.x, H, W, alpha=-1.0), None

    def transposed_times(self, H: torch.Tensor) -> torch.Tensor:
        """J = Hᵀ X."""
        J = H.T @ self.x
        return torch.cat([J, H.sum(0)[:, None]], dim=1) if self.ones else J


class OnlineNaturalGradient:
    """Preconditioner for minibatches of `dim`-dimensional row vectors; see the module docstring."""

    __slots__ = ("dim", "rank", "num_samples_history", "alpha", "update_period", "seed", "kernel", "_native",
                 "num_updates", "num_reorthogonalizations", "num_floored", "_skipped",
                 "_W", "_d", "_rho", "_e_diag", "_two_minus_e")

    def __init__(self, dim: int, rank: int, num_samples_history: float = 2000.0, alpha: float = 4.0,
                 update_period: int = 4, seed: int = 0, kernel: str = "auto"):
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise ConfigError(f"OnlineNaturalGradient: dim must be a positive integer, got {dim!r}")
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < dim:
            raise ConfigError(f"OnlineNaturalGradient: rank must be in [0, dim) = [0, {dim}), got {rank!r}")
        if not 0 < num_samples_history <= 1e6:
            raise ConfigError(f"OnlineNaturalGradient: num_samples_history must be in (0, 1e6], "
                              f"got {num_samples_history!r}")
        if not alpha >= 0:
            raise ConfigError(f"OnlineNaturalGradient: alpha must be >= 0, got {alpha!r}")
        if isinstance(update_period, bool) or not isinstance(update_period, int) or update_period < 1:
            raise ConfigError(f"OnlineNaturalGradient: update_period must be an integer >= 1, got {update_period!r}")
        self.dim, self.rank = dim, rank
        self.num_samples_history, self.alpha = float(num_samples_history), float(alpha)
        self.update_period, self.seed = update_period, seed
        if kernel not in KERNEL_KINDS:
            raise ConfigError(f"OnlineNaturalGradient: kernel must be one of {', '.join(KERNEL_KINDS)}, got {kernel!r}")
        self.kernel = kernel
        self._native: bool | None = None  # resolved at the first minibatch: building is not free
        self.num_updates = 0
        """Statistics updates done since initialization (Kaldi's t)."""
        self.num_reorthogonalizations = 0
        self.num_floored = 0
        """Updates in which some floor (on C, ρ or D) was applied."""
        self._skipped = 0
        self._W: torch.Tensor | None = None  # E^{1/2} R, rank x dim
        self._d = np.zeros(0)  # diagonal of D (float64, descending)
        self._rho = 0.0
        self._e_diag = np.zeros(0)  # diagonal of E for (D, ρ)
        self._two_minus_e = torch.zeros(0)  # 2 − diag(E), for tr(XXᵀ) in _project

    # -- public API ------------------------------------------------------------------------------
    @property
    def initialized(self) -> bool:
        return self._W is not None

    def eta(self, num_rows: int) -> float:
        return min(MAX_ETA, 1.0 - math.exp(-num_rows / self.num_samples_history))

    def precondition(self, x: torch.Tensor, update: bool = True) -> torch.Tensor:
        """X̂·γ for x of shape (N, dim): preconditioned, with the same Frobenius norm as x.

        With `update=False` (evaluation) the statistics are left untouched; before the first
        updating call the preconditioner is the identity."""
        x_hat, gamma = self.precondition_unscaled(x, update)
        return x_hat.mul_(gamma) if gamma != 1.0 else x_hat

    def precondition_unscaled(self, x: torch.Tensor, update: bool = True,
                              scale: float = 1.0) -> tuple[torch.Tensor, float]:
        """(P, g) with P·g = `precondition(scale·x)`, for callers that fold g into a later product
        (the natural-gradient layers do); `scale` spares them a pass over x."""
        x_hat, _, gamma = self._precondition(x, False, update, scale)
        return x_hat, gamma

    def precondition_with_ones(self, x: torch.Tensor, update: bool = True) -> tuple[torch.Tensor, torch.Tensor, float]:
        """`precondition_unscaled` of the rows [x, 1] (x: N × (dim−1)) without building them:
        (P[:, :-1], P[:, -1], g)."""
        return self._precondition(x, True, update, 1.0)

    def _precondition(self, x: torch.Tensor, ones: bool, update: bool,
                      scale: float) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        # every layer's hot path, twice a step: the common case (initialized, no update due, the
        # state's dtype and device) is one kernel call after a few attribute reads
        if x.dim() != 2 or x.shape[1] + ones != self.dim:
            shape = f"(N, {self.dim - 1}) (plus its ones column)" if ones else f"(N, {self.dim})"
            raise DataError(f"OnlineNaturalGradient: expected input of shape {shape}, got {tuple(x.shape)}")
        W = self._W
        if (W is None and not update) or self.rank == 0 or x.shape[0] == 0:
            return x.clone(), (x.new_ones(x.shape[0]) if ones else None), scale
        native = self._native
        if native is None:  # resolved at the first minibatch (building is not free), or after a load
            native = self._native = resolve_kernel(self.kernel)
        if W is None:
            self._initialize(_Rows(x, ones), scale * scale)
            W = self._W
        two_minus_e = self._two_minus_e
        if W.dtype != x.dtype or W.device != x.device:
            W = W.to(dtype=x.dtype, device=x.device)
            two_minus_e = two_minus_e.to(dtype=x.dtype, device=x.device)
        if update and (self.num_updates < NUM_INITIAL_UPDATES or self._skipped >= self.update_period - 1):
            x_hat, last, gamma = self._update(_Rows(x, ones), W, scale * scale)
        else:
            if update:
                self._skipped += 1
            if native:
                x_hat, last, gamma = native_kernel().precondition(x, W, two_minus_e, ones)
            else:
                rows = _Rows(x, ones)
                x_hat, last, gamma, _ = self._project(rows, rows.times_transposed(W), W)
        return x_hat, last, gamma * scale

    @property
    def native(self) -> bool:
        """Whether this preconditioner runs compiled (resolved at its first minibatch)."""
        return bool(self._native)

    @property
    def rho(self) -> float:
        return self._rho

    @property
    def d(self) -> torch.Tensor:
        """Diagonal of D (float64, descending)."""
        return torch.from_numpy(self._d.copy())

    @property
    def R(self) -> torch.Tensor:
        """The rank×dim matrix with orthonormal rows (float64), recovered as E^{-½} W."""
        self._check_initialized()
        return self._W.to("cpu", torch.float64) / torch.from_numpy(np.sqrt(self._e(self._d, self._rho)))[:, None]

    def fisher(self) -> torch.Tensor:
        """Dense F = Rᵀ D R + ρ I (dim×dim, float64). For tests and small dims only."""
        R = self.R
        return R.T @ (self.d[:, None] * R) + self._rho * torch.eye(self.dim, dtype=torch.float64)

    def smoothed_fisher(self) -> torch.Tensor:
        """Dense G = F + (α/dim) tr(F) I, whose inverse `precondition` applies (up to scale)."""
        F = self.fisher()
        return F + (self.alpha / self.dim) * torch.trace(F) * torch.eye(self.dim, dtype=torch.float64)

    def state_dict(self) -> dict[str, Any]:
        return {"W": None if self._W is None else self._W.detach().cpu().clone(),
                "d": torch.from_numpy(self._d.copy()), "rho": self._rho, "num_updates": self.num_updates,
                "skipped": self._skipped, "num_reorthogonalizations": self.num_reorthogonalizations,
                "num_floored": self.num_floored}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        W = state["W"]
        if W is not None and tuple(W.shape) != (self.rank, self.dim):
            raise ConfigError(f"OnlineNaturalGradient: state has W of shape {tuple(W.shape)}, "
                              f"expected ({self.rank}, {self.dim})")
        device = self._W.device if self._W is not None else torch.device("cpu")
        d = torch.as_tensor(state["d"], dtype=torch.float64).numpy().copy()
        if W is None:
            self._W, self._d, self._rho = None, d, float(state["rho"])
        else:
            self._set_state(W.clone().to(device), d, state["rho"])
        self.num_updates, self._skipped = int(state["num_updates"]), int(state["skipped"])
        self.num_reorthogonalizations = int(state.get("num_reorthogonalizations", 0))
        self.num_floored = int(state.get("num_floored", 0))

    def __repr__(self) -> str:
        return (f"OnlineNaturalGradient(dim={self.dim}, rank={self.rank}, num_samples_history="
                f"{self.num_samples_history:g}, alpha={self.alpha:g}, update_period={self.update_period})")

    # -- internals -------------------------------------------------------------------------------
    def _check_initialized(self) -> None:
        if self._W is None:
            raise DataError("OnlineNaturalGradient: not initialized yet (no minibatch seen)")

    def _e(self, d: np.ndarray, rho: float) -> np.ndarray:
        """Diagonal of E: e_ii = 1/(β/d_ii + 1), β = ρ(1+α) + (α/dim) tr D (identity smoothing)."""
        beta = rho * (1.0 + self.alpha) + self.alpha * d.sum() / self.dim
        return 1.0 / (beta / d + 1.0)

    def _project(self, rows: _Rows, H: torch.Tensor,
                 W: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor | None, float, float]:
        """(X̂ = X − H W as (columns from x, ones column or None), γ, tr(XXᵀ)). As in Kaldi,
        tr(XXᵀ) comes from the fresh X̂ and H, since W Wᵀ = E: tr(XXᵀ) = tr(X̂X̂ᵀ) + Σ_i (2 − e_i)·|H_:i|²,
        sparing a pass over X."""
        x_hat, last = rows.residual(H, W)
        flat = x_hat.reshape(-1)
        terms = [torch.dot(flat, flat), torch.dot(H.square().sum(0), self._two_minus_e_for(H))]
        if last is not None:
            terms.append(torch.dot(last, last))
        values = torch.stack(terms).tolist()
        tr_hat = values[0] + (values[2] if last is not None else 0.0)
        tr_x = tr_hat + values[1]
        return x_hat, last, (math.sqrt(tr_x / tr_hat) if tr_hat > 0.0 else 1.0), tr_x

    def _two_minus_e_for(self, like: torch.Tensor) -> torch.Tensor:
        two_minus_e = self._two_minus_e
        if two_minus_e.dtype != like.dtype or two_minus_e.device != like.device:
            two_minus_e = two_minus_e.to(dtype=like.dtype, device=like.device)
        return two_minus_e

    def _set_state(self, W: torch.Tensor, d: np.ndarray, rho: float, e: np.ndarray | None = None,
                   two_minus_e: torch.Tensor | None = None) -> None:
        self._W, self._d, self._rho = W, d, float(rho)
        self._e_diag = self._e(d, rho) if e is None else e
        if two_minus_e is None or two_minus_e.dtype != W.dtype or two_minus_e.device != W.device:
            two_minus_e = torch.from_numpy(2.0 - self._e_diag).to(dtype=W.dtype, device=W.device)
        self._two_minus_e = two_minus_e

    def _initial_rows(self) -> torch.Tensor:
        gen = torch.Generator().manual_seed(self.seed)
        q, _ = torch.linalg.qr(torch.randn(self.dim, self.rank, generator=gen, dtype=torch.float64))
        return q.T.contiguous()

    def _initialize(self, rows: _Rows, scale_sq: float) -> None:
        x = rows.x
        d = np.full(self.rank, EPSILON)
        sqrt_e = torch.from_numpy(np.sqrt(self._e(d, EPSILON)))
        self._set_state((sqrt_e[:, None] * self._initial_rows()).to(dtype=x.dtype, device=x.device), d, EPSILON)
        for _ in range(NUM_INIT_ITERS):
            self._update(rows, self._W, scale_sq)
        self.num_updates, self._skipped = 0, 0

    def _update(self, rows: _Rows, W: torch.Tensor, scale_sq: float = 1.0) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """Precondition the rows with the current F, then move F towards the scatter of
        X = scale·rows (steps 1–5)."""
        n, dim, rank = rows.x.shape[0], self.dim, self.rank
        eta = self.eta(n)
        a, b = eta / n, 1.0 - eta
        d, rho = self._d, self._rho
        if self._native:
            (x_hat, last, gamma, W_new, d_new, rho_new, e_new, two_minus_e, floored,
             reorthogonalize) = native_kernel().update(rows.x, W, self._two_minus_e_for(W), rows.ones,
                                                       torch.from_numpy(d), rho, torch.from_numpy(self._e_diag),
                                                       self.alpha, a, b, scale_sq)
            d_new, e_new = d_new.numpy(), e_new.numpy()
            return self._updated(x_hat, last, gamma, W_new, d_new, rho_new, e_new, floored, reorthogonalize,
                                 two_minus_e)
        H = rows.times_transposed(W)
        J = rows.transposed_times(H)  # W XᵀX / scale_sq, rank x dim: scale_sq is folded into the small factors below
        K, L = _small(J @ J.T) * (scale_sq * scale_sq), _small(H.T @ H) * scale_sq

        inv_sqrt_e = 1.0 / np.sqrt(self._e_diag)
        d_rho = d + rho
        # Z = Y Yᵀ with Y = a E^{-½} J + b (D + ρ) R, written with rank×rank quantities only.
        scale = np.outer(inv_sqrt_e, inv_sqrt_e)
        RSR = (L + L.T) * (0.5 * scale)  # R XᵀX Rᵀ
        Z = ((a * a * 0.5) * scale) * (K + K.T) + (a * b) * RSR * (d_rho[:, None] + d_rho[None, :]) \
            + np.diag((b * d_rho) ** 2)
        c, U = symmetric_eigh(Z)
        reorthogonalize = not c[0] <= CONDITION_THRESHOLD * c[-1]
        c_floor = (rho * b) ** 2
        floored = bool(c[-1] < c_floor)
        if floored:  # R' = C^{-½}UᵀY loses orthonormality only through C
            reorthogonalize = True
            c = np.maximum(c, c_floor)

        x_hat, last, gamma, tr_x = self._project(rows, H, W)
        tr_x *= scale_sq

        sqrt_c = np.sqrt(c)
        rho_new = (a * tr_x + b * (dim * rho + d.sum()) - sqrt_c.sum()) / (dim - rank)
        d_new = sqrt_c - rho_new
        floor = max(EPSILON, DELTA * sqrt_c[0])
        if not rho_new >= floor:
            rho_new, floored = floor, True
        if d_new[-1] < floor:
            d_new, floored = np.maximum(d_new, floor), True
        e_new = self._e(d_new, rho_new)
        sqrt_e_new = np.sqrt(e_new)

        # W' = E'^{½} R' = A B with A = a E'^{½} C^{-½} Uᵀ E^{-½}, B = scale_sq·J + (b/a)(D + ρ) W
        # (here J lacks scale_sq: it goes into A and the coefficient of W).
        A = (a * scale_sq * sqrt_e_new / sqrt_c)[:, None] * U.T * inv_sqrt_e[None, :]
        B = J.addcmul_(W, torch.from_numpy((b / (a * scale_sq)) * d_rho).to(W)[:, None])
        W_new = torch.from_numpy(A).to(W) @ B
        return self._updated(x_hat, last, gamma, W_new, d_new, rho_new, e_new, floored, reorthogonalize)

    def _updated(self, x_hat, last, gamma, W_new, d_new, rho_new, e_new, floored, reorthogonalize,
                 two_minus_e=None) -> tuple[torch.Tensor, torch.Tensor | None, float]:
        """Step 3's bookkeeping, shared by both kernels: re-orthogonalize if asked, keep the new state."""
        if reorthogonalize:
            W_new = self._reorthogonalized(W_new, np.sqrt(e_new))
            self.num_reorthogonalizations += 1
            two_minus_e = None
        self.num_floored += int(floored)
        self._set_state(W_new.to(self._W.dtype), d_new, rho_new, e_new, two_minus_e)
        self.num_updates += 1
        self._skipped = 0
        return x_hat, last, gamma

    def _reorthogonalized(self, W: torch.Tensor, sqrt_e: np.ndarray) -> torch.Tensor:
        """W = E^{½} R with R Rᵀ = O = Lc Lcᵀ (Cholesky) -> E^{½} Lc⁻¹ R, whose rows are orthonormal.
        Lc is lower-triangular, so the leading (largest-eigenvalue) rows move least."""
        inv_sqrt_e = 1.0 / sqrt_e
        O = _small(W @ W.T) * np.outer(inv_sqrt_e, inv_sqrt_e)
        Lc, info = torch.linalg.cholesky_ex(torch.from_numpy(0.5 * (O + O.T)))
        if int(info) != 0 or not bool(torch.isfinite(Lc).all()):
            # R lost rank: restart from fresh orthonormal rows, keeping D and ρ
            return (torch.from_numpy(sqrt_e)[:, None] * self._initial_rows()).to(W)
        Lc_inv = torch.linalg.solve_triangular(Lc, torch.eye(self.rank, dtype=torch.float64), upper=False).numpy()
        return torch.from_numpy(sqrt_e[:, None] * Lc_inv * inv_sqrt_e[None, :]).to(W) @ W
