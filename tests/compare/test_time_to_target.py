"""Time to accuracy (`asrdist.compare.target`) on synthetic histories: reached at a later validation,
at the first, never, only by the final evaluation, ties between runs, and the default target."""
from __future__ import annotations

import pytest

from asrdist.compare.repeats import recommendation
from asrdist.compare.target import Target, default_target, first_to_target, run_points, time_to_target
from asrdist.run.summary import EpochRecord


def _history(*points):
    return [EpochRecord.from_json({"epoch": e, "wall_seconds": t, "per": v, "valid_loss": 1.0})
            for e, (t, v) in enumerate(points)]


def test_the_first_validation_at_or_below_the_target_counts():
    points = run_points(_history((10.0, 0.40), (20.0, 0.25), (30.0, 0.18), (40.0, 0.21)), "per", 0.19, 45.0)
    assert time_to_target(points, 0.25) == 20.0  # at the target counts as reached
    assert time_to_target(points, 0.20) == 30.0  # not the later 0.21, nor the final 0.19
    assert time_to_target(points, 0.249) == 30.0


def test_reached_at_the_first_validation():
    assert time_to_target(run_points(_history((5.5, 0.1), (9.0, 0.05)), "per", 0.05, 10.0), 0.3) == 5.5


def test_never_reached_is_none():
    points = run_points(_history((10.0, 0.40), (20.0, 0.30)), "per", 0.29, 25.0)
    assert time_to_target(points, 0.2) is None
    assert time_to_target([], 0.2) is None


def test_the_final_evaluation_is_the_last_point():
    """A run whose consensus model only gets there after its final average reaches it at its end."""
    points = run_points(_history((10.0, 0.30), (20.0, 0.22)), "per", 0.20, 21.5)
    assert points[-1] == (21.5, 0.20)
    assert time_to_target(points, 0.21) == 21.5


def test_points_without_a_wall_time_or_the_metric_are_left_out():
    history = [EpochRecord.from_json(r) for r in ({"epoch": 0, "per": 0.1}, {"epoch": 1, "wall_seconds": 8.0, "cer": 0.1},
                                                  {"epoch": 2, "wall_seconds": 12.0, "per": 0.15})]
    assert run_points(history, "per", None, None) == [(12.0, 0.15)]


def test_the_default_target_is_within_five_percent_of_the_best_final_figure():
    target = default_target({"sync": 0.30, "adpsgd": 0.20, "failed": None}, "per")
    assert target.value == pytest.approx(0.21)
    assert target.metric == "per" and "adpsgd" in target.how and target.how.startswith("best+5%: within 5%")
    assert default_target({"a": None}, "per") is None
    assert default_target({"a": 0.0}, "per").value == 0.0  # a perfect run: the others must be perfect too


def test_first_to_target_with_ties_and_without_anyone():
    assert first_to_target({"sync": 12.0, "adpsgd": 8.0, "onebit": None}) == ["adpsgd"]
    assert first_to_target({"sync": 8.0, "adpsgd": 8.0, "onebit": 9.0}) == ["sync", "adpsgd"]
    assert first_to_target({"sync": None, "adpsgd": None}) == []


def _entries(times: dict, repeats: int = 1, ranges: dict | None = None) -> list[dict]:
    return [{"run": run, "strategy": run, "time_to_target_seconds": "never" if t is None else t, "failed": None,
             "repeats": repeats, "interval": {"time_to_target_seconds": (ranges or {}).get(run)}}
            for run, t in times.items()]


def test_the_recommendation_of_one_run_each_names_the_first_ties_and_never_but_no_winner():
    target = Target("per", 0.21, "given")
    setup = "4 learner(s) x 1 thread(s) sharing 2 CPU core(s)"
    line = recommendation(target, _entries({"sync": 12.0, "adpsgd": 8.0, "onebit": None}), setup)
    assert line.startswith("Recommendation: not separated (one run each, no interval; --repeats 2 or more gives "
                           "one): adpsgd reached PER <= 0.2100 first on this machine, in 8.0 s")
    assert "sync 12.0 s (1.50x)" in line and "never: onebit" in line and setup in line
    tied = recommendation(target, _entries({"sync": 8.0, "adpsgd": 8.0}), setup)
    assert tied.startswith("Recommendation: not separated: sync and adpsgd reached PER <= 0.2100 in the same median")
    assert recommendation(target, _entries({"sync": None}), setup).startswith(
        "No recommendation: no run reached PER <= 0.2100")
    assert recommendation(None, _entries({"sync": None}), setup).startswith("No recommendation")


def test_a_strategy_more_than_ten_percent_behind_sync_is_named_and_others_are_not():
    from asrdist.compare.target import behind_sync

    runs = [{"run": "sync", "strategy": "sync", "error_rate": 0.05, "epochs": 2, "failed": None},
            {"run": "onebit", "strategy": "onebit", "error_rate": 0.0555, "epochs": 2, "failed": None},  # +11%
            {"run": "adpsgd", "strategy": "adpsgd", "error_rate": 0.0545, "epochs": 2, "failed": None},  # +9%
            {"run": "averaging", "strategy": "averaging", "error_rate": 0.09, "epochs": 4, "failed": None},
            {"run": "hybrid", "strategy": "hybrid", "error_rate": None, "epochs": 2, "failed": "boom"}]
    lines = behind_sync(runs, "per")
    assert len(lines) == 1 and lines[0].startswith("onebit: PER 0.0555 is 11% above sync's 0.0500 after the same 2")
    assert behind_sync([r for r in runs if r["run"] != "sync"], "per") == []  # nothing to compare with


def test_a_run_whose_host_took_much_of_the_cpu_is_named_and_quiet_ones_are_not():
    from asrdist.compare.target import STEAL_NOTE, busy_host
    from asrdist.run.finish import busiest_host
    from asrdist.run.summary import LearnerFigures

    runs = [{"run": "sync", "steal_share": 0.43, "failed": None},
            {"run": "onebit", "steal_share": STEAL_NOTE, "failed": None},  # at the line: not named
            {"run": "adpsgd", "steal_share": None, "failed": None},  # no /proc/stat: nothing to say
            {"run": "single", "failed": None},  # a summary from before the key
            {"run": "averaging", "steal_share": 0.9, "failed": "boom"}]  # its failure is said instead
    lines = busy_host(runs)
    assert len(lines) == 1 and lines[0].startswith("sync: this machine's host took 43% of its CPU time (steal)")
    assert busy_host(runs, share=0.5) == []
    # the run's figure: its busiest learner's; none where no learner could read it
    assert busiest_host([LearnerFigures(steal_share=s) for s in (0.01, 0.2, None)]) == 0.2
    assert busiest_host([LearnerFigures(rank=0), LearnerFigures(steal_share=None)]) is None


def test_the_line_for_a_strategy_behind_sync_says_from_its_curve_whether_it_was_still_learning():
    from asrdist.compare.target import behind_sync, last_epoch_drop

    def curve(*values):
        return [{"epoch": e + 1, "per": v} for e, v in enumerate(values)]

    assert last_epoch_drop(curve(0.10, 0.08), "per") == pytest.approx(0.2)
    assert last_epoch_drop(curve(0.10), "per") is None and last_epoch_drop([], "per") is None
    sync = {"run": "sync", "strategy": "sync", "error_rate": 0.05, "epochs": 2, "failed": None,
            "curve": curve(0.055, 0.05)}  # -9% over its last epoch
    learning = {"run": "onebit", "strategy": "onebit", "error_rate": 0.08, "epochs": 2, "failed": None,
                "curve": curve(0.12, 0.08)}  # -33%: still falling much faster than sync
    levelled = {"run": "averaging", "strategy": "averaging", "error_rate": 0.08, "epochs": 2, "failed": None,
                "curve": curve(0.082, 0.08)}  # -2%
    lines = behind_sync([sync, learning, levelled], "per")
    assert len(lines) == 2
    assert "still learning when it stopped" in lines[0] and "fell 33% over its last epoch, sync's 9%" in lines[0]
    assert "more epochs alone are unlikely to close it" in lines[1] and "fell 2% over its last epoch" in lines[1]
    # a run of one validation has no slope to read: the line says only what is known
    lone = behind_sync([sync, {**learning, "curve": curve(0.08)}], "per")
    assert len(lone) == 1 and "may need more epochs or other settings" in lone[0]
