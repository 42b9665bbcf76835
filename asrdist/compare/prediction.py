"""The simulator's uncertainty in a comparison: each run's prediction carries the error the
simulator made on its nearest validated case (`asrdist.sim.uncertainty`: the runs of `asrdist
bench simulator` on a CPU machine, predicted from microbenchmarks)."""
from __future__ import annotations

from pathlib import Path

from asrdist.compare.contention import MARK, flagged
from asrdist.errors import AsrdistError, DataError
from asrdist.run.summary import RunSummary
from asrdist.sim.uncertainty import apart, describe, nearest, placement_of


def nearest_validated(record: dict) -> dict | None:
    """A run record's nearest validated case, or None (no prediction, or no record of cases)."""
    if record.get("predicted_frames_per_second") is None or not record.get("learners"):
        return None
    try:
        return describe(nearest(record["strategy"], record["learners"], "cpu",
                                placement=placement_of(record["learners"], record.get("nodes"), record.get("network"))))
    except AsrdistError:
        return None


def mark_contended(record: dict) -> None:
    """A contended run's simulator error is the other job's as much as the simulator's: its record
    says so (`prediction_error_contended`), beside the figure."""
    record["prediction_error_contended"] = flagged(record) and record.get("prediction_error") is not None


def uncertainty_line(summary: dict) -> str:
    """One sentence for the report: each simulated figure's error on its nearest validated case."""
    parts = [f"{r['run']} {100 * r['prediction_nearest_validated']['relative_error']:+.0f}% "
             f"({r['prediction_nearest_validated']['case']})"
             for r in summary["runs"] if r.get("prediction_nearest_validated")]
    if not parts:
        return ""
    return (" The simulator's error on the nearest case `asrdist bench simulator` validated (predicted vs "
            "measured): " + "; ".join(parts) + ".")


TARGET_SLACK = 1.05
"""The default target: within 5% relative of the best final error among the runs (issue 34's)."""


def _epochs_to(curve: list[dict], metric: str, target: float) -> dict | None:
    """The first epoch record of a run's curve at or below `target`."""
    return next((point for point in curve if point.get(metric) is not None and point[metric] <= target), None)


def time_to_target_check(runs: list[dict], target: float | None = None) -> dict | None:
    """The simulator's ranking of the runs by time to a target error beside the measured one.

    Measured: the wall seconds of the run's first validation at or below the target (metrics.jsonl,
    from the run's start). Predicted: the epochs that run needed (its convergence per epoch, taken
    from its own measured curve: the simulator predicts time, not convergence) x the run's frames
    per epoch (a count, from summary.json) / the simulated frames/s. Runs that never reached the
    target, or were not simulated, are listed apart. None without two runs to rank."""
    done = [r for r in runs if not r.get("failed") and r.get("metric") and r.get("error_rate") is not None]
    if not done:
        return None
    metric = done[0]["metric"]
    target = TARGET_SLACK * min(r["error_rate"] for r in done) if target is None else target
    rows, left_out = [], {}
    for r in done:
        point = _epochs_to(r.get("curve") or [], metric, target)
        if point is None or point.get("seconds") is None:
            left_out[r["run"]] = f"did not reach {metric} {target:.4f}"
            continue
        if not r.get("predicted_frames_per_second"):
            left_out[r["run"]] = "not simulated"
            continue
        frames = _train_frames(r["path"])
        if not frames:
            left_out[r["run"]] = "no train_frames in its summary.json"
            continue
        frames_per_epoch = frames / max(r["epochs"] or 1, 1)
        case = r.get("prediction_nearest_validated")
        rows.append({"run": r["run"], "strategy": r["strategy"], "learners": r["learners"], "epochs": point["epoch"],
                     "measured_seconds": point["seconds"],
                     "predicted_seconds": point["epoch"] * frames_per_epoch / r["predicted_frames_per_second"],
                     "nearest_validated_error": case["relative_error"] if case else None,
                     "contended": flagged(r)})
    if len(rows) < 2:
        return None
    measured = [x["run"] for x in sorted(rows, key=lambda x: x["measured_seconds"])]
    by_prediction = sorted(rows, key=lambda x: x["predicted_seconds"])
    predicted = [x["run"] for x in by_prediction]
    ties, contradictions = [], []
    for i, faster in enumerate(by_prediction):
        for slower in by_prediction[i + 1:]:
            if not apart((faster["predicted_seconds"], faster["nearest_validated_error"]),
                         (slower["predicted_seconds"], slower["nearest_validated_error"])):
                ties.append([faster["run"], slower["run"]])
            elif faster["measured_seconds"] > slower["measured_seconds"]:
                contradictions.append([faster["run"], slower["run"]])
    return {"metric": metric, "target": target, "rows": rows, "measured_ranking": measured,
            "predicted_ranking": predicted, "rankings_match": measured == predicted,
            "within_error": ties, "contradictions": contradictions, "rankings_agree_beyond_error": not contradictions,
            "not_ranked": left_out,
            "convergence": "epochs to the target from each run's own measured curve; the simulator gives the "
                           "time per epoch (predicted time excludes start-up, measured time includes it)",
            "error_bands": "each predicted time x (1 -/+ |the error on its nearest validated case|); two runs whose "
                           "bands overlap are within the simulator's error of each other (`within_error`), and "
                           "a pair it put apart that ran in the other order is a contradiction"}


def _train_frames(run_dir: str) -> float | None:
    try:
        return RunSummary.read(Path(run_dir)).train_frames
    except (OSError, DataError):
        return None


def ranking_line(summary: dict) -> str:
    """One sentence for the report: the predicted ranking by time to target beside the measured."""
    check = summary.get("time_to_target_prediction")
    if not check:
        return ""
    times = "; ".join(f"{r['run']} {r['measured_seconds']:.0f} s measured{MARK if r.get('contended') else ''}, "
                      f"{r['predicted_seconds']:.0f} s predicted ({r['epochs']} epoch(s))" for r in check["rows"])
    line = (f" Time to {check['metric'].upper()} {check['target']:.4f}: {times}. Fastest first, measured: "
            f"{', '.join(check['measured_ranking'])}; the simulator: {', '.join(check['predicted_ranking'])} "
            f"({'the same ranking' if check['rankings_match'] else 'another ranking'}).")
    if "contradictions" not in check:  # a summary written before the error bands
        return line

    def pairs(found: list) -> str:
        return ", ".join(f"{a} / {b}" for a, b in found)

    if check["within_error"]:
        line += f" Within the simulator's error of each other (not ranked apart): {pairs(check['within_error'])}."
    if check["contradictions"]:
        line += f" Put apart beyond its error, yet ran in the other order: {pairs(check['contradictions'])}."
    else:
        line += " Every pair it put apart beyond its error ran in that order."
    return line
