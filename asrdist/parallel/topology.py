"""Gossip patterns of ADPSGD and their mixing-matrix / spectral-gap analysis (DESIGN.md §5.5, §5.7;
Lian et al. 2018, ICML; IBM's randomized ring, Zhang et al., ICASSP 2020).

Learners sit on a ring of n positions: the *actives* (even positions with an odd successor,
n // 2 of them) start exchanges, the *passives* only answer. One round: every active i averages
with one passive partner j, x_i, x_j <- (x_i + x_j)/2:
  - ``fixed``: i pairs with (i+1) mod n in even rounds, (i-1) mod n in odd rounds;
  - ``random``: a permutation of the passives from ``numpy.random.default_rng([seed, round])``
    gives active number k the passive perm[k]; nothing is sent.
The spectral gap 1 - max(|λ2|, |λn|) of E[WᵀW] sets the convergence rate: O(1/n²) for the fixed
ring, roughly constant for random. How `random` relates to the ICASSP 2020 scheme, odd n:
docs/strategies.md#gossip-patterns-paralleltopologypy."""
from __future__ import annotations

import functools
import operator
from typing import TYPE_CHECKING

import numpy as np

from asrdist.errors import ConfigError

if TYPE_CHECKING:
    import scipy.sparse as sp

PATTERNS = ("fixed", "random")
FIXED_PERIOD = 2  # the fixed pattern repeats every two rounds (right neighbour, then left)
MAX_LEARNERS = 4096  # the CLI's limit: the fixed ring's O(n²) eigenvalues take ~1 s at 4096


def _check_int(value, name: str, minimum: int, maximum: int | None = None) -> int:
    if isinstance(value, bool):
        raise ConfigError(f"{name}: expected an integer, got {value!r}")
    try:
        value = operator.index(value)
    except TypeError:
        raise ConfigError(f"{name}: expected an integer, got {value!r}") from None
    if value < minimum or (maximum is not None and value > maximum):
        bound = f"at least {minimum}" if maximum is None else f"in [{minimum}, {maximum}]"
        raise ConfigError(f"{name}: {value} must be {bound}")
    return value


def _check_pattern(pattern: str) -> str:
    if pattern not in PATTERNS:
        raise ConfigError(f"pattern: unknown gossip pattern {pattern!r} (known: {', '.join(PATTERNS)})")
    return pattern


def is_active(rank: int, n: int) -> bool:
    """True if `rank` starts exchanges: an even position with an odd successor on the ring."""
    n = _check_int(n, "learners", 2)
    rank = _check_int(rank, "rank", 0, n - 1)
    return rank % 2 == 0 and rank + 1 < n


def active_ranks(n: int) -> list[int]:
    """The n // 2 active positions, ascending: 0, 2, ..., with n-1 passive when n is odd."""
    n = _check_int(n, "learners", 2)
    return list(range(0, n - 1, 2))


def passive_ranks(n: int) -> list[int]:
    """The n - n // 2 passive positions, ascending: the odd ones, plus n-1 when n is odd."""
    n = _check_int(n, "learners", 2)
    return list(range(1, n, 2)) + ([n - 1] if n % 2 else [])


@functools.lru_cache(maxsize=256)
def _passive_permutation(n: int, seed: int, round: int) -> tuple[int, ...]:
    # O(n) once per (n, seed, round); cached so n simulated ranks in one process draw it once.
    rng = np.random.default_rng([seed, round])
    return tuple(int(r) for r in rng.permutation(passive_ranks(n)))


def partner(rank: int, n: int, round: int, pattern: str, seed: int = 0) -> int | None:
    """The passive learner that active `rank` averages with in `round`; None for a passive rank.

    A pure function of its arguments, so all learners agree on it without communicating.
    """
    n = _check_int(n, "learners", 2)
    rank = _check_int(rank, "rank", 0, n - 1)
    round = _check_int(round, "round", 0)
    seed = _check_int(seed, "seed", 0)
    _check_pattern(pattern)
    if not (rank % 2 == 0 and rank + 1 < n):
        return None
    if pattern == "fixed":
        return (rank + 1) % n if round % 2 == 0 else (rank - 1) % n
    perm = _passive_permutation(n, seed, round)
    return perm[(rank // 2) % len(perm)]  # rank // 2 = index among the actives


def partners_of_round(n: int, round: int, pattern: str, seed: int = 0) -> list[tuple[int, int]]:
    """All (active, passive) pairs of `round`, in ascending active rank (the order they apply in)."""
    return [(a, partner(a, n, round, pattern, seed)) for a in active_ranks(n)]


def _round_rows(n: int, pairs: list[tuple[int, int]]) -> list[dict[int, float]]:
    """Row k of W as {column: weight}, x_new = W x after the pairwise averages of `pairs` in order."""
    rows: list[dict[int, float]] = [{i: 1.0} for i in range(n)]
    for a, b in pairs:
        merged = dict(rows[a])
        for col, w in rows[b].items():
            merged[col] = merged.get(col, 0.0) + w
        merged = {col: w / 2 for col, w in merged.items()}
        rows[a], rows[b] = merged, dict(merged)
    return rows


def _round_matrix(n: int, pairs: list[tuple[int, int]]) -> sp.csr_array:
    import scipy.sparse as sp  # here, not at the top: learners pair up without scipy (0.4 s of start-up each); the analysis needs it
    rows = _round_rows(n, pairs)
    indptr = np.cumsum([0] + [len(row) for row in rows])
    indices = [col for row in rows for col in row]
    data = [w for row in rows for w in row.values()]
    return sp.csr_array((data, indices, indptr), shape=(n, n))


def mixing_matrix(n: int, round: int, pattern: str, seed: int = 0) -> np.ndarray:
    """The n x n doubly stochastic W of one round (x <- W x); symmetric when the pairs are disjoint."""
    return _round_matrix(n, partners_of_round(n, round, pattern, seed)).toarray()


def _random_matching_expectation(n: int) -> np.ndarray:
    """Exact E[WᵀW] of the random pattern.

    Each round is a matching, so W is a symmetric projection and WᵀW = W. Active k takes perm[k]
    of a uniform permutation of the p passives, so it meets each passive with probability 1/p:
    E[W] = I - L/(2p), L the Laplacian of the complete bipartite graph actives x passives.
    """
    actives, passives = active_ranks(n), passive_ranks(n)
    m, p = len(actives), len(passives)
    expected = np.zeros((n, n))
    expected[actives, actives] = 1.0 - p / (2 * p)
    expected[passives, passives] = 1.0 - m / (2 * p)
    expected[np.ix_(actives, passives)] = 1.0 / (2 * p)
    expected[np.ix_(passives, actives)] = 1.0 / (2 * p)
    return expected


def random_expectation_eigenvalues(n: int) -> np.ndarray:
    """Eigenvalues of the exact random-pattern E[WᵀW], descending, in closed form.

    The complete bipartite Laplacian (m actives, p passives) has eigenvalues 0, p (m-1 times),
    m (p-1 times) and m+p, so E = I - L/(2p) needs no O(n³) eigensolver even at n = 1024.
    """
    m, p = len(active_ranks(n)), len(passive_ranks(n))
    eig = [1.0] + [0.5] * (m - 1) + [1.0 - m / (2 * p)] * (p - 1) + [1.0 - (m + p) / (2 * p)]
    return np.sort(np.array(eig))[::-1]


def _mean_wtw(n: int, rounds: list[list[tuple[int, int]]]) -> sp.csr_array:
    """The mean of WᵀW over `rounds`, each the pairs averaged in it, in order."""
    import scipy.sparse as sp  # here, not at the top: see _round_matrix
    # (WᵀW)_ij = sum_k W_ki W_kj: triplets straight from W's short rows, summed once by scipy,
    # which is far cheaper than thousands of small sparse products.
    data, rows, cols = [], [], []
    for pairs in rounds:
        for row in _round_rows(n, pairs):
            for i, wi in row.items():
                for j, wj in row.items():
                    data.append(wi * wj)
                    rows.append(i)
                    cols.append(j)
    return sp.csr_array((np.array(data) / len(rounds), (rows, cols)), shape=(n, n))


def _sampled_wtw(n: int, pattern: str, seed: int, rounds: int) -> sp.csr_array:
    return _mean_wtw(n, [partners_of_round(n, t, pattern, seed) for t in range(rounds)])


def measured_gap(n: int, exchanges: list[tuple[int, int]]) -> float | None:
    """The spectral gap of the mixing that happened: `exchanges` (active, passive) in the order
    they started, cut into windows of n // 2 (a lock-step round's worth), each window's W the
    product of its pairwise averages; the gap of the mean WᵀW (None: not one whole window).
    In lock step a window is a round and this is the pattern's sampled gap; when learners run at
    different speeds the fast pairs take more of each window and the slow ones mix less."""
    n = _check_int(n, "learners", 2)
    window = n // 2
    windows = [list(exchanges[k:k + window]) for k in range(0, len(exchanges) - window + 1, window)]
    if not windows:
        return None
    return spectral_gap(_mean_wtw(n, windows))


def expected_wtw(n: int, pattern: str, seed: int = 0, rounds: int | None = None) -> np.ndarray:
    """E[WᵀW] over rounds, the matrix whose spectral gap sets the convergence rate.

    fixed: the average of WᵀW over rounds 0..rounds-1 (default: one period of 2 rounds, exact).
    random: with rounds=None the exact expectation (`_random_matching_expectation`), independent
    of the seed; with rounds=R the sample mean over rounds 0..R-1 under `seed` (a check of it).
    """
    n = _check_int(n, "learners", 2)
    _check_pattern(pattern)
    if pattern == "random" and rounds is None:
        return _random_matching_expectation(n)
    rounds = FIXED_PERIOD if rounds is None else _check_int(rounds, "rounds", 1)
    return _sampled_wtw(n, pattern, seed, rounds).toarray()


def _symmetric_eigenvalues(matrix) -> np.ndarray:
    """Eigenvalues, descending. A sparse matrix of a ring-like graph is reordered to a narrow band
    (reverse Cuthill-McKee) and solved banded: O(n²) instead of dense O(n³)."""
    import scipy.sparse as sp  # here, not at the top: see _round_matrix
    from scipy.linalg import eigvals_banded
    from scipy.sparse.csgraph import reverse_cuthill_mckee
    if sp.issparse(matrix):
        coo = sp.coo_matrix(matrix)
        order = reverse_cuthill_mckee(sp.csr_matrix(coo), symmetric_mode=True)
        position = np.empty_like(order)
        position[order] = np.arange(len(order))
        rows, cols = position[coo.row], position[coo.col]
        width = int(np.max(np.abs(rows - cols), initial=0))
        if width <= 16:
            band = np.zeros((width + 1, matrix.shape[0]))
            lower = rows >= cols
            np.add.at(band, (rows[lower] - cols[lower], cols[lower]), coo.data[lower])
            return eigvals_banded(band, lower=True)[::-1]
        matrix = matrix.toarray()
    return np.linalg.eigvalsh((matrix + matrix.T) / 2)[::-1]


def spectral_gap(matrix) -> float:
    """1 - max(|λ2|, |λn|) of a symmetric matrix (dense or scipy sparse) whose top eigenvalue λ1 is
    1, eigenvalues sorted descending; 0: some information never mixes, 1: one round averages all."""
    import scipy.sparse as sp  # here, not at the top: see _round_matrix

    if not sp.issparse(matrix):
        matrix = np.asarray(matrix, dtype=np.float64)
    if matrix.ndim != 2 or matrix.shape[0] != matrix.shape[1] or matrix.shape[0] < 2:
        raise ValueError(f"spectral_gap: need a square matrix of size >= 2, got shape {matrix.shape}")
    return _gap_of(_symmetric_eigenvalues(matrix))


def _gap_of(eigenvalues_descending: np.ndarray) -> float:
    return float(1.0 - max(abs(eigenvalues_descending[1]), abs(eigenvalues_descending[-1])))


def pattern_gap(n: int, pattern: str, seed: int = 0) -> float:
    """Spectral gap of the exact E[WᵀW] for `n` learners under `pattern`."""
    n = _check_int(n, "learners", 2)
    if _check_pattern(pattern) == "random":
        return _gap_of(random_expectation_eigenvalues(n))
    return spectral_gap(_sampled_wtw(n, pattern, seed, FIXED_PERIOD))


def curve_grid(max_n: int = 1024, points: int = 24) -> list[int]:
    """Learner counts 2..max_n, log-spaced, always including every power of two."""
    max_n = _check_int(max_n, "max_n", 2)
    grid = {int(x) for x in np.rint(np.geomspace(2, max_n, points))}
    grid |= {2 ** k for k in range(1, max_n.bit_length()) if 2 ** k <= max_n}
    return sorted(grid | {max_n})


def gap_curve(learners: list[int] | None = None, seed: int = 0) -> list[dict]:
    """[{"learners": n, "fixed": gap, "random": gap}, ...] over `learners` (default `curve_grid()`)."""
    return [{"learners": n, **{p: pattern_gap(n, p, seed) for p in PATTERNS}}
            for n in (learners or curve_grid())]
