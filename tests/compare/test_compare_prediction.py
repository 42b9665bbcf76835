"""compare's prediction checks (asrdist/compare/prediction.py): the simulator's ranking by time to
a target error beside the measured one."""
from __future__ import annotations

import json

import pytest

from asrdist.compare.prediction import ranking_line, time_to_target_check


def _run(tmp_path, name: str, curve: list[tuple[float, float]], predicted_fps: float | None, frames: int = 1000):
    path = tmp_path / name
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({
        "strategy": name, "learners": 2, "frames_per_second": 1.0, "wall_seconds": 1.0, "final": {},
        "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0}, "train_frames": frames * len(curve)}))
    return {"run": name, "path": str(path), "strategy": name, "learners": 2, "metric": "per",
            "error_rate": curve[-1][1], "epochs": len(curve), "predicted_frames_per_second": predicted_fps,
            "failed": None, "curve": [{"epoch": i + 1, "seconds": s, "per": e} for i, (s, e) in enumerate(curve)]}


def test_the_ranking_by_time_to_target_is_predicted_from_epochs_needed_and_simulated_speed(tmp_path):
    runs = [_run(tmp_path, "sync", [(10, 0.5), (20, 0.2), (30, 0.1)], predicted_fps=100.0),
            _run(tmp_path, "adpsgd", [(5, 0.3), (10, 0.104)], predicted_fps=400.0),
            _run(tmp_path, "onebit", [(4, 0.6), (8, 0.5)], predicted_fps=1000.0),  # never within 5% of 0.1
            _run(tmp_path, "averaging", [(6, 0.09)], predicted_fps=None)]  # not simulated
    # the default target, within 5% of the best final PER (0.09): only averaging reaches it, and it
    # was not simulated: nothing to rank
    assert time_to_target_check(runs) is None
    check = time_to_target_check(runs, target=0.105)
    by_run = {r["run"]: r for r in check["rows"]}
    assert by_run["sync"]["epochs"] == 3 and by_run["sync"]["measured_seconds"] == 30
    assert by_run["sync"]["predicted_seconds"] == pytest.approx(3 * 1000 / 100.0)
    assert by_run["adpsgd"]["predicted_seconds"] == pytest.approx(2 * 1000 / 400.0)
    assert check["measured_ranking"] == check["predicted_ranking"] == ["adpsgd", "sync"]
    assert check["rankings_match"] and set(check["not_ranked"]) == {"onebit", "averaging"}
    line = ranking_line({"time_to_target_prediction": check})
    assert "adpsgd 10 s measured, 5 s predicted" in line and "the same ranking" in line
    # a simulator that had adpsgd slow would rank otherwise, and say so
    runs[1]["predicted_frames_per_second"] = 10.0
    other = time_to_target_check(runs, target=0.105)
    assert not other["rankings_match"] and "another ranking" in ranking_line({"time_to_target_prediction": other})


def test_runs_predicted_within_the_simulators_error_are_not_ranked_apart_and_a_swap_beyond_it_is_named(tmp_path):
    from asrdist.sim.uncertainty import apart, time_band

    assert time_band(100.0, -0.2) == pytest.approx((80.0, 120.0))  # an error on frames/s is one on the time
    assert time_band(100.0, 1.5) == pytest.approx((0.0, 250.0)) and time_band(100.0, None) == (0.0, float("inf"))
    assert apart((100.0, 0.1), (130.0, 0.1)) and not apart((100.0, 0.1), (120.0, 0.1))
    assert not apart((100.0, None), (1000.0, 0.0))  # a prediction with no validated case is never ranked apart

    def case(error: float) -> dict:
        return {"source": "bench simulator", "case": "c", "strategy": "sync", "learners": 2, "device": "cpu",
                "relative_error": error, "placement": "loopback"}

    # predicted: a 10 s, b 10.5 s, c 30 s; measured: b before a (a near tie), c last
    runs = [_run(tmp_path, "a", [(12, 0.1)], predicted_fps=100.0),
            _run(tmp_path, "b", [(11, 0.1)], predicted_fps=1000 / 10.5),
            _run(tmp_path, "c", [(35, 0.1)], predicted_fps=1000 / 30)]
    for r, error in zip(runs, (0.1, -0.1, 0.2)):
        r["prediction_nearest_validated"] = case(error)
    check = time_to_target_check(runs, target=0.1)
    assert not check["rankings_match"] and check["within_error"] == [["a", "b"]]
    assert check["contradictions"] == [] and check["rankings_agree_beyond_error"]
    assert [r["nearest_validated_error"] for r in check["rows"]] == [0.1, -0.1, 0.2]
    line = ranking_line({"time_to_target_prediction": check})
    assert "not ranked apart): a / b" in line and "Every pair it put apart beyond its error ran in that order" in line
    # c measured first although predicted three times slower: a contradiction, with each of a and b
    runs[2]["curve"][0]["seconds"] = 5
    check = time_to_target_check(runs, target=0.1)
    assert check["contradictions"] == [["a", "c"], ["b", "c"]] and not check["rankings_agree_beyond_error"]
    assert "yet ran in the other order: a / c, b / c" in ranking_line({"time_to_target_prediction": check})
    # with no validated cases nothing is ranked apart, and nothing contradicts
    for r in runs:
        r["prediction_nearest_validated"] = None
    check = time_to_target_check(runs, target=0.1)
    assert len(check["within_error"]) == 3 and check["contradictions"] == []
