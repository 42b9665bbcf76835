"""Gossip patterns of ADPSGD and the spectral-gap analysis (asrdist/parallel/topology.py)."""
from __future__ import annotations

import json
import math

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.errors import ConfigError
from asrdist.parallel import topology as topo

SMALL = range(2, 10)


@pytest.mark.parametrize("n", SMALL)
def test_bipartite_split_covers_ring(n):
    actives, passives = topo.active_ranks(n), topo.passive_ranks(n)
    assert sorted(actives + passives) == list(range(n))
    assert len(actives) == n // 2 and len(passives) == n - n // 2
    assert [r for r in range(n) if topo.is_active(r, n)] == actives
    assert all(a % 2 == 0 for a in actives)
    if n % 2:
        assert not topo.is_active(n - 1, n)  # the odd ring's last position would face active 0


def test_bipartite_split_examples():
    assert (topo.active_ranks(2), topo.passive_ranks(2)) == ([0], [1])
    assert (topo.active_ranks(3), topo.passive_ranks(3)) == ([0], [1, 2])
    assert (topo.active_ranks(5), topo.passive_ranks(5)) == ([0, 2], [1, 3, 4])


@pytest.mark.parametrize("n", SMALL)
def test_fixed_partners_alternate_ring_neighbours(n):
    for rank in range(n):
        for t in range(4):
            got = topo.partner(rank, n, t, "fixed")
            if not topo.is_active(rank, n):
                assert got is None
                continue
            assert got == ((rank + 1) % n if t % 2 == 0 else (rank - 1) % n)
            assert not topo.is_active(got, n)
    for t in range(4):
        pairs = topo.partners_of_round(n, t, "fixed")
        assert [a for a, _ in pairs] == topo.active_ranks(n)
        assert len({p for _, p in pairs}) == len(pairs)  # a matching: no passive asked twice


def test_fixed_two_learners_share_both_neighbours():
    assert [topo.partner(0, 2, t, "fixed") for t in range(3)] == [1, 1, 1]
    assert topo.partner(1, 2, 0, "fixed") is None


@pytest.mark.parametrize("n", SMALL)
def test_random_partners_are_a_shared_matching(n):
    seen = set()
    for t in range(60):
        pairs = topo.partners_of_round(n, t, "random", seed=3)
        passives = [p for _, p in pairs]
        assert len(set(passives)) == len(passives) and set(passives) <= set(topo.passive_ranks(n))
        seen.update(passives)
        assert all(topo.partner(r, n, t, "random", 3) is None for r in topo.passive_ranks(n))
    assert seen == set(topo.passive_ranks(n))  # every passive is chosen over rounds, odd n too


@pytest.mark.parametrize("n", [4, 5, 8])
def test_random_pattern_is_a_uniform_matching_round_by_round(n):
    """The property the docstring claims against the ICASSP 2020 scheme: every round a matching
    (no passive twice, only actives with passives), each active meeting each passive with
    probability 1/p: the frequencies over many rounds, and E[W] of the exact expectation."""
    actives, passives = topo.active_ranks(n), topo.passive_ranks(n)
    rounds = 3000
    met = np.zeros((n, n))
    for t in range(rounds):
        pairs = topo.partners_of_round(n, t, "random", seed=11)
        assert len({b for _, b in pairs}) == len(pairs) == len(actives)
        assert all(a in actives and b in passives for a, b in pairs)
        for a, b in pairs:
            met[a, b] += 1
    frequency = met[np.ix_(actives, passives)] / rounds
    # binomial standard error sqrt(p(1-p)/rounds) <= 0.0092: 5 of it is a failure, not noise
    np.testing.assert_allclose(frequency, 1 / len(passives), atol=0.046)
    # E[W] = E[WᵀW] (each round's W is a symmetric projection): the off-diagonal 1/(2p) per pair
    expected = topo.expected_wtw(n, "random")
    np.testing.assert_allclose(expected[np.ix_(actives, passives)], 1 / (2 * len(passives)))


def test_random_rounds_are_each_actives_own():
    """Actives a round apart draw from different matchings: they can ask the same passive at once."""
    n = 6
    assert any(topo.partner(0, n, t, "random", 2) == topo.partner(2, n, t + 1, "random", 2) for t in range(20))


def test_random_partner_is_pure_and_cheap():
    first = [topo.partner(a, 16, 7, "random", 5) for a in topo.active_ranks(16)]
    topo._passive_permutation.cache_clear()
    assert [topo.partner(a, 16, 7, "random", 5) for a in topo.active_ranks(16)] == first
    rounds = [topo.partners_of_round(16, t, "random", 5) for t in range(8)]
    assert any(r != rounds[0] for r in rounds[1:])
    assert topo.partners_of_round(16, 7, "random", 6) != topo.partners_of_round(16, 7, "random", 5)
    before = topo._passive_permutation.cache_info().misses
    for rank in range(1024):
        topo.partner(rank, 1024, 99, "random", 0)
    assert topo._passive_permutation.cache_info().misses == before + 1  # one draw per round


@pytest.mark.parametrize("bad", [dict(rank=4, n=4), dict(rank=0, n=1), dict(rank=0, n=4, pattern="ring"),
                                 dict(rank=0, n=4, seed=-1), dict(rank=0, n=4, round=-1)])
def test_partner_rejects_bad_arguments(bad):
    args = dict(round=0, pattern="fixed", seed=0) | bad
    with pytest.raises(ConfigError):
        topo.partner(args["rank"], args["n"], args["round"], args["pattern"], args["seed"])


@pytest.mark.parametrize("pattern", topo.PATTERNS)
@pytest.mark.parametrize("n", SMALL)
def test_mixing_matrix_doubly_stochastic_and_preserves_mean(n, pattern):
    x = np.random.default_rng(n).normal(size=(n, 3))
    for t in range(4):
        w = topo.mixing_matrix(n, t, pattern, seed=1)
        assert w.shape == (n, n) and (w >= 0).all()
        np.testing.assert_allclose(w.sum(axis=0), 1.0)
        np.testing.assert_allclose(w.sum(axis=1), 1.0)
        np.testing.assert_allclose((w @ x).mean(axis=0), x.mean(axis=0))
        np.testing.assert_allclose(w, w.T)  # disjoint pairs


def test_passive_asked_twice_averages_in_arrival_order():
    def pairwise(a, b):
        p = np.eye(3)
        p[[a, a, b, b], [a, b, a, b]] = 0.5
        return p

    w = topo._round_matrix(3, [(0, 1), (2, 1)]).toarray()
    np.testing.assert_allclose(w, pairwise(2, 1) @ pairwise(0, 1))
    np.testing.assert_allclose(w.sum(axis=0), 1.0)
    np.testing.assert_allclose(w.sum(axis=1), 1.0)


@pytest.mark.parametrize("n", [3, 4, 5, 8])
def test_random_expectation_exact_matches_sampled(n):
    exact = topo.expected_wtw(n, "random")
    sampled = topo.expected_wtw(n, "random", seed=11, rounds=2000)
    np.testing.assert_allclose(sampled, exact, atol=0.03)
    np.testing.assert_allclose(exact.sum(axis=1), 1.0)
    np.testing.assert_allclose(np.linalg.eigvalsh(exact)[::-1], topo.random_expectation_eigenvalues(n),
                               atol=1e-12)


@pytest.mark.parametrize("n", [2, 3, 4, 7, 16, 33, 64])
def test_pattern_gap_equals_dense_eigenvalues(n):
    for pattern in topo.PATTERNS:
        dense = topo.spectral_gap(topo.expected_wtw(n, pattern))
        assert topo.pattern_gap(n, pattern) == pytest.approx(dense, abs=1e-12)


def test_spectral_gap_scaling():
    for n in (8, 32, 128):  # even fixed ring: E[WᵀW] = I - L_ring/4, gap sin²(π/n)
        assert topo.pattern_gap(n, "fixed") == pytest.approx(math.sin(math.pi / n) ** 2, rel=1e-9)
    fixed = {n: topo.pattern_gap(n, "fixed") for n in (32, 64, 512, 1024)}
    assert fixed[64] / fixed[32] == pytest.approx(0.25, abs=0.01)  # O(1/n²)
    assert fixed[1024] / fixed[512] == pytest.approx(0.25, abs=0.01)
    random = {n: topo.pattern_gap(n, "random") for n in (8, 256, 1024)}
    assert random[256] > 0.9 * random[8] and random[1024] > 0.9 * random[8]
    assert random[1024] > 1e4 * fixed[1024]
    assert topo.pattern_gap(2, "fixed") == pytest.approx(1.0)  # one exchange averages both


def test_curve_grid_log_spaced_with_powers_of_two():
    grid = topo.curve_grid()
    assert grid[0] == 2 and grid[-1] == 1024 and grid == sorted(set(grid))
    assert {2 ** k for k in range(1, 11)} <= set(grid)
    assert 15 <= len(grid) <= 40


def test_cli_writes_json_and_plot(tmp_path, capsys):
    out, png = tmp_path / "topo.json", tmp_path / "plots" / "topo.png"
    rc = main(["topology", "--learners", "16", "--pattern", "random", "--seed", "2",
               "--json", str(out), "--plot", str(png)])
    assert rc == 0
    printed = capsys.readouterr().out
    assert "spectral gap" in printed and "mixing matrix" in printed
    result = json.loads(out.read_text())
    assert {"learners", "pattern", "spectral_gap", "curve", "mixing_matrix"} <= set(result)
    assert (result["learners"], result["pattern"]) == (16, "random")
    assert result["spectral_gap"] == pytest.approx(topo.pattern_gap(16, "random"))
    assert [row["learners"] for row in result["curve"]] == topo.curve_grid()
    assert all(set(row) == {"learners", "fixed", "random"} for row in result["curve"])
    np.testing.assert_allclose(result["mixing_matrix"], topo.mixing_matrix(16, 0, "random", 2))
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not [p for p in tmp_path.rglob(".*.tmp")]


def test_cli_large_n_leaves_matrix_out(tmp_path):
    out = tmp_path / "topo.json"
    assert main(["topology", "--learners", "100", "--pattern", "fixed", "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert "mixing_matrix" not in result
    assert result["spectral_gap"] == pytest.approx(math.sin(math.pi / 100) ** 2, rel=1e-9)


@pytest.mark.parametrize("argv", [["--learners", "1", "--pattern", "fixed"],
                                  ["--learners", "8", "--pattern", "ring"],
                                  ["--learners", "8", "--pattern", "fixed", "--json", "{file}/out.json"]])
def test_cli_bad_input_is_one_line_error(tmp_path, capsys, argv):
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    rc = main(["topology"] + [a.replace("{file}", str(blocker)) for a in argv])
    err = capsys.readouterr().err.strip()
    assert rc != 0
    assert err.startswith("asrdist: error: ") and "\n" not in err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["file"]
