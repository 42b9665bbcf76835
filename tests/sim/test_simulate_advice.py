"""`asrdist simulate`'s advisor gives one advice: the ranking where the simulator's error band puts
the winner apart, or that the leaders cannot be told apart, never both (issue 58, item 6)."""
from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from asrdist.cli import main
from asrdist.sim import uncertainty
from asrdist.sim.cli import advice
from asrdist.sim.uncertainty import ValidatedCase

TOLD_APART = ", then "
TIED = "cannot be told apart by the simulator here"


def _ranked(*times: float):
    return [SimpleNamespace(name=n, epoch_seconds=t) for n, t in zip("abcd", times)]


def _errors(*errors):
    return [None if e is None else SimpleNamespace(relative_error=e) for e in errors]


def test_the_advice_is_a_ranking_where_the_winner_is_apart_and_a_tie_where_not():
    said, tiers = advice(_ranked(10.0, 20.0, 21.0, 40.0), _errors(0.1, 0.05, 0.05, 0.1))
    assert said.startswith("a, then b or c, then d (fastest epoch first") and "±10%" in said
    assert tiers == [["a"], ["b", "c"], ["d"]] and TIED not in said
    said, tiers = advice(_ranked(10.0, 11.0, 30.0), _errors(0.1, 0.2, 0.1))
    assert said == f"a and b {TIED} (error ±20%); slower than a beyond that error: c"
    assert tiers == [["a", "b"], ["c"]] and TOLD_APART not in said
    said, _ = advice(_ranked(10.0, 30.0), _errors(None, 0.1))  # no case bounds the winner's time
    assert said.startswith(f"a and b {TIED} (error unbounded")


@pytest.mark.parametrize("error, told_apart", [(0.0, True), (5.0, False)])
def test_simulate_prints_one_advice(tmp_path, monkeypatch, capsys, error, told_apart):
    """The advisor's ranking, with every validated case erring by `error`: none (each strategy's
    band a point, the ranking stands) or 500% (every band overlaps the winner's)."""
    monkeypatch.setattr(uncertainty, "load_cases",
                        lambda path=None: [ValidatedCase("test", "every", "sync", 4, "gpu", error)])
    out = tmp_path / "advice.json"
    assert main(["simulate", "--cluster", "2x2", "--network", "1gbit", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    lines = [line for line in printed.splitlines() if line.startswith("advice: ")]
    result = json.loads(out.read_text())
    assert len(lines) == 1 and lines[0] == f"advice: {result['advice']}"
    winner = result["ranking"][0]["name"]
    assert (TOLD_APART in lines[0]) is told_apart and (TIED in lines[0]) is not told_apart
    assert "not ranked apart" not in printed
    if told_apart:
        assert result["why"].startswith(f"{winner} wins") and result["within_error_of_winner"] == []
    else:  # no winner said, no runner-up said to be slower
        assert " wins" not in result["why"] and "runner-up" not in result["why"]
        assert result["advice_tiers"][0] == [p["name"] for p in result["ranking"]]
        assert result["within_error_of_winner"] == result["advice_tiers"][0][1:]
