"""The simulator's uncertainty in a comparison: each run's prediction carries the error the
simulator made on its nearest validated case (`asrdist.sim.uncertainty`: the runs of `asrdist
bench simulator` on a CPU machine, predicted from microbenchmarks)."""
from __future__ import annotations

from asrdist.errors import AsrdistError


def nearest_validated(record: dict) -> dict | None:
    """A run record's nearest validated case, or None (no prediction, or no record of cases)."""
    from asrdist.sim.uncertainty import describe, nearest

    if record.get("predicted_frames_per_second") is None or not record.get("learners"):
        return None
    try:
        return describe(nearest(record["strategy"], record["learners"], "cpu"))
    except AsrdistError:
        return None


def uncertainty_line(summary: dict) -> str:
    """One sentence for the report: each simulated figure's error on its nearest validated case."""
    parts = [f"{r['run']} {100 * r['prediction_nearest_validated']['relative_error']:+.0f}% "
             f"({r['prediction_nearest_validated']['case']})"
             for r in summary["runs"] if r.get("prediction_nearest_validated")]
    if not parts:
        return ""
    return (" The simulator's error on the nearest case `asrdist bench simulator` validated (predicted vs "
            "measured): " + "; ".join(parts) + ".")
