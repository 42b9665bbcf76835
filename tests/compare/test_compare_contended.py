"""A comparison's contended run (its summary's `contended`): its CPU share and simulator error
are marked in the table and the page, a note names it with its figures, and its record and the
time-to-target check say so (issue 58, item 3). Made-up runs, no training."""
from __future__ import annotations

import json

from asrdist.calibrate import microbench
from asrdist.compare.report import build_summary, format_table, note_lines, render_html
from asrdist.compare.runs import run_config
from asrdist.sim.calibration import Microbenchmarks
from tests.support.compare_fixture import TINY, fabricate_runs, make_corpus

MICRO = Microbenchmarks(2, {"1x2": 1e-3, "2x1": 2.5e-3}, {"1x2": 0.05, "2x1": 0.05}, 20_000.0, 2e-9, 1e-9,
                        0.5e-9, 1e-9, "loopback", 1e9, 0.8, 2e-10, 50e-6)


def _contend(run, share: float) -> None:
    summary = json.loads((run / "summary.json").read_text())
    summary.update(load={"start": 6.5, "end": 7.0, "cores": 2}, cpu_share=share, contended=share < 0.8)
    (run / "summary.json").write_text(json.dumps(summary))


def test_a_contended_run_is_marked_in_the_table_the_notes_and_its_simulator_error(tmp_path):
    runs = fabricate_runs(tmp_path / "runs", make_corpus(tmp_path / "corpus"), ["single", "sync"])
    _contend(runs["single"], 0.42)
    _contend(runs["sync"], 0.97)
    calibrations = {name: microbench.RunCalibration(MICRO, {"feature_dim": 40, "num_classes": 9}, "before it trained",
                                                    "", run_config(run).to_dict()) for name, run in runs.items()}
    summary = build_summary(runs, {"config": "c.yaml", "learners": 2, "overrides": TINY, "same_recipe": True},
                            calibrations=calibrations, target=1.0)  # both runs reach it: both rows timed
    single, sync = summary["runs"]
    assert (single["contended"], single["cpu_share"], single["load"]["start"]) == (True, 0.42, 6.5)
    assert single["prediction_error_contended"] is True and sync["prediction_error_contended"] is False
    table = format_table(summary).splitlines()
    assert "CPU share" in table[0]
    single_row, sync_row = (next(line for line in table if line.startswith(name)) for name in ("single", "sync"))
    assert single_row.count("(contended)") == 3 and "42% (contended)" in single_row  # strategy, CPU share, simulator error
    assert "(contended)" not in sync_row and "97%" in sync_row
    (note,) = [line for line in note_lines(summary) if "contended" in line]
    assert note.startswith("single: contended: its learners received 42% of the CPU they were entitled to")
    assert "load average 6.5 at its start" in note
    page = render_html(summary)
    assert "42% (contended)" in page and "single: contended" in page
    check = summary["time_to_target_prediction"]
    assert {r["run"]: r["contended"] for r in check["rows"]} == {"single": True, "sync": False}
    assert "s measured (contended)" in page
