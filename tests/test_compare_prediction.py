"""compare's prediction checks (asrdist/compare/prediction.py): the simulator's ranking by time to
a target error beside the measured one."""
from __future__ import annotations

import json

import pytest

from asrdist.compare.prediction import ranking_line, time_to_target_check


def _run(tmp_path, name: str, curve: list[tuple[float, float]], predicted_fps: float | None, frames: int = 1000):
    path = tmp_path / name
    path.mkdir()
    (path / "summary.json").write_text(json.dumps({"train_frames": frames * len(curve)}))
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
