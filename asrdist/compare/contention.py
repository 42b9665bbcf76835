"""Runs of a comparison that trained beside another job: their learners received less than
`CONTENDED_SHARE` of the CPU they were entitled to (summary.json's `contended`, `cpu_share`,
`load`: `asrdist.utils.contention`). The table marks their CPU share and simulator error, and a
note under it names each, with its figures."""
from __future__ import annotations

from asrdist.utils.contention import CONTENDED_SHARE

MARK = " (contended)"
MARKED = ("cpu_share", "prediction_error")
"""The table's columns whose cell a contended run's row marks."""


def flagged(record: dict) -> bool:
    return bool(record.get("contended")) and not record.get("failed")


def mark(record: dict, key: str) -> str:
    """What a run's cell in column `key` carries after its figure: MARK, or nothing."""
    return MARK if key in MARKED and flagged(record) else ""


def load_text(load: dict | float | None) -> str:
    if isinstance(load, int | float):
        return f"load average {load:.1f}"
    if not load or load.get("start") is None:
        return "load average not read"
    return (f"load average {load['start']:.1f} at its start, {load.get('end') or 0:.1f} at its end, on "
            f"{load.get('cores')} cores")


def contended_lines(runs: list[dict]) -> list[str]:
    """A note for each contended run: its share, the load, what it means for its figures."""
    return [f"{r['run']}: contended: its learners received {r['cpu_share']:.0%} of the CPU they were entitled to "
            f"(under {CONTENDED_SHARE:.0%} is flagged; {load_text(r.get('load'))}): another job took cores it would "
            f"have had, so its times, the speed-ups against it and its simulator error are partly that job's; train "
            f"it again on a quiet machine" for r in runs if flagged(r)]
