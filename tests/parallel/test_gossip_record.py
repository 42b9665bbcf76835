"""The mixing a gossiping job really had (asrdist/run/gossip.py, topology.measured_gap): rebuilt
from the exchanges in the order they started, against the lock-step schedule and a dense
reference (the product of each window's pairwise averages, multiplied out with numpy)."""
from __future__ import annotations

import numpy as np
import pytest

from asrdist.parallel import topology as topo
from asrdist.run.gossip import GOSSIP_NAME, gossip_summary, write_gossip


def _dense_gap(n: int, pairs: list[tuple[int, int]]) -> float:
    window, total, count = n // 2, np.zeros((n, n)), 0
    for k in range(0, len(pairs) - window + 1, window):
        w = np.eye(n)
        for a, b in pairs[k:k + window]:
            step = np.eye(n)
            step[[a, a, b, b], [a, b, a, b]] = 0.5
            w = step @ w
        total += w.T @ w
        count += 1
    eig = np.sort(np.linalg.eigvalsh(total / count))[::-1]
    return 1 - max(abs(eig[1]), abs(eig[-1]))


@pytest.mark.parametrize("n", [4, 8, 16])
@pytest.mark.parametrize("pattern", topo.PATTERNS)
def test_a_lock_step_record_mixes_as_the_pattern_says(n, pattern):
    pairs = [p for r in range(40) for p in topo.partners_of_round(n, r, pattern, seed=3)]
    assert topo.measured_gap(n, pairs) == pytest.approx(_dense_gap(n, pairs), abs=1e-9)
    if pattern == "fixed":  # one period holds the whole expectation
        assert topo.measured_gap(n, pairs) == pytest.approx(topo.pattern_gap(n, pattern), abs=1e-9)


@pytest.mark.parametrize("pattern", topo.PATTERNS)
def test_a_slow_active_makes_the_measured_mixing_worse_than_lock_step(pattern):
    # 8 learners; the last active exchanges once for every three of the others' exchanges, each
    # active counting its own rounds (as AdpsgdStrategy does): the slow one is averaged a third as
    # often, and under the random pattern actives rounds apart draw from different matchings
    n = 8
    rng = np.random.default_rng(0)
    actives = topo.active_ranks(n)
    rounds = {a: 0 for a in actives}
    starts = []
    for tick in range(600):
        for a in actives:
            if a != actives[-1] or tick % 3 == 0:
                starts.append((tick + rng.uniform(0, 0.5), a, topo.partner(a, n, rounds[a], pattern)))
                rounds[a] += 1
    starts.sort()
    pairs = [(a, p) for _, a, p in starts]
    lockstep = [p for r in range(len(pairs) // (n // 2)) for p in topo.partners_of_round(n, r, pattern, 0)]
    measured = topo.measured_gap(n, pairs)
    assert measured == pytest.approx(_dense_gap(n, pairs), abs=1e-9)
    assert measured < topo.measured_gap(n, lockstep) * (0.99 if pattern == "fixed" else 0.7)


def test_the_learners_records_are_merged_in_time_order_and_written(tmp_path):
    n = 4  # actives 0 and 2 record their own exchanges; passives record none; a non-leader None
    records = [{"learners": n, "pattern": "fixed", "seed": 0, "exchanges": [(10.0, 0, 1), (12.0, 0, 3)]},
               {"learners": n, "pattern": "fixed", "seed": 0, "exchanges": []},
               {"learners": n, "pattern": "fixed", "seed": 0, "exchanges": [(11.0, 2, 3), (13.0, 2, 1)]},
               None]
    figures, exchanges = gossip_summary(records)
    assert exchanges == [(10.0, 0, 1), (11.0, 2, 3), (12.0, 0, 3), (13.0, 2, 1)]
    assert figures["exchanges"] == 4 and figures["rounds"] == 2
    assert figures["exchanges_per_active"] == {"min": 2, "max": 2}
    assert figures["spectral_gap"] == pytest.approx(figures["spectral_gap_lockstep"])  # this is lock step
    assert figures["spectral_gap_expected"] == pytest.approx(topo.pattern_gap(n, "fixed"))
    write_gossip(tmp_path, exchanges)
    lines = (tmp_path / GOSSIP_NAME).read_text().splitlines()
    assert lines[0].split("\t") == ["seconds", "active", "passive"]
    assert [line.split("\t") for line in lines[1:3]] == [["0.000000", "0", "1"], ["1.000000", "2", "3"]]
    assert gossip_summary([None, None]) is None
    assert topo.measured_gap(n, [(0, 1)]) is None  # not one whole round's worth
