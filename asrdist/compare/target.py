"""Time to accuracy: how long each run of a comparison took to reach a target error rate.

A run's points are its validations (summary.json's `history`: the consensus model's error rate
and `wall_seconds`, the job's seconds since training started, every --resume summed) and its
final evaluation, at the run's `wall_seconds` (the model it evaluates exists when training ends).
Its time to the target is the wall time of its first point at or below the target; a run with
no such point never reached it. The target (`--target`, `parse_target`) is by default the
baseline's final error rate (single's when it runs, else sync's), so that every strategy that
does as well as the baseline gets a time; or a number; or `best+N%` (the best final figure among
the strategies plus N% of it). With repeats, a strategy's final figure is the median of its runs'.
"""
from __future__ import annotations

import argparse
import re
from dataclasses import dataclass
from statistics import median, median_high

from asrdist.errors import ConfigError
from asrdist.run.summary import EpochRecord

DEFAULT_MARGIN = 0.05
"""`best+5%`: within this fraction (relative) of the best final figure among the strategies."""
TIE_SECONDS = 1e-3
"""Times closer than this are a tie (wall seconds are recorded to the millisecond)."""
BASELINES = ("single", "sync")
"""The default target's baseline: the first of these the comparison trains."""


@dataclass(frozen=True)
class Target:
    metric: str
    """The error rate the target is on (per, cer or wer)."""
    value: float
    """A run reaches the target at its first point with error rate <= value."""
    how: str
    """Where the value came from, in words."""


@dataclass(frozen=True)
class TargetSpec:
    """What `--target` asked for: `baseline` (the default), a `number`, or `best` plus `margin`."""

    kind: str = "baseline"
    value: float | None = None
    """The error rate (kind `number`) or the relative margin (kind `best`)."""

    def __post_init__(self):
        if self.kind not in ("baseline", "number", "best"):
            raise ConfigError(f"--target: unknown kind {self.kind!r}")
        if self.kind != "baseline" and (self.value is None or not self.value >= 0):
            raise ConfigError(f"--target: expected a number >= 0, got {self.value!r}")


_BEST = re.compile(r"best(?:\+(\d+(?:\.\d*)?|\.\d+)%)?")


def parse_target(text: str | float | None) -> TargetSpec:
    """`--target`'s text: `baseline`, an error rate (`0.05`) or `best+N%` (`best` alone: +0%).
    Raises ConfigError in one line naming what is accepted."""
    if text is None:
        return TargetSpec()
    if isinstance(text, (int, float)) and not isinstance(text, bool):
        return TargetSpec("number", float(text))
    word = str(text).strip().lower()
    if word == "baseline":
        return TargetSpec()
    best = _BEST.fullmatch(word)
    if best:
        return TargetSpec("best", float(best.group(1) or 0.0) / 100.0)
    try:
        number = float(word)
    except ValueError:
        number = None
    if number is None or not number >= 0 or number == float("inf"):
        raise ConfigError(f"--target: expected an error rate >= 0, 'baseline' or 'best+N%' (e.g. best+5%), "
                          f"got {text!r}")
    return TargetSpec("number", number)


def cli_target(text: str) -> TargetSpec:
    """argparse's `type=` for --target: its message is argparse's usage error."""
    try:
        return parse_target(text)
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc).removeprefix("--target: ")) from None


def default_target(finals: dict[str, float | None], metric: str, margin: float = DEFAULT_MARGIN) -> Target | None:
    """Within `margin` (relative) of the best final error rate among the runs (run -> final figure,
    None for a run that has none); None when no run has one."""
    known = {run: value for run, value in finals.items() if value is not None}
    if not known:
        return None
    best_run = min(known, key=known.get)
    best = known[best_run]
    return Target(metric, best * (1.0 + margin),
                  f"best+{margin * 100:g}%: within {margin * 100:g}% relative of the best final {metric.upper()} "
                  f"({best:.4f}, {best_run})")


def baseline_target(finals: dict[str, list[float]], metric: str) -> Target | None:
    """The baseline's final error rate: single's when it ran, else sync's (strategy -> the final
    figures of its runs; with repeats the upper median, so that at least half the baseline's own
    runs reach it); None without a baseline with a final figure."""
    for name in BASELINES:
        values = [v for v in finals.get(name) or [] if v is not None]
        if values:
            value = median_high(values)
            runs = f"the upper median of its {len(values)} runs' final figures" if len(values) > 1 else "its final figure"
            return Target(metric, float(value), f"baseline: {name}'s final {metric.upper()} ({value:.4f}, {runs}); "
                                                f"every run that does as well reaches it")
    return None


def choose_target(spec: TargetSpec, finals: dict[str, list[float]], metric: str) -> Target | None:
    """The target `spec` asks for, from each strategy's final figures (strategy -> its runs'; a
    failed run has none). The default, `baseline`, falls back to best+5% where neither single
    nor sync has a final figure, and says so."""
    if spec.kind == "number":
        return Target(metric, float(spec.value), f"given (--target {spec.value:g})")
    medians = {name: median(v) for name, values in finals.items() if (v := [x for x in values if x is not None])}
    if spec.kind == "best":
        return default_target(medians, metric, spec.value)
    goal = baseline_target(finals, metric)
    if goal is not None or not medians:
        return goal
    fallback = default_target(medians, metric)
    return Target(metric, fallback.value, f"no baseline (single or sync) has a final figure: {fallback.how}")


def run_points(history: list[EpochRecord], metric: str, final_value: float | None,
               final_seconds: float | None) -> list[tuple[float, float]]:
    """(wall seconds, error rate) of a run's validations in order, then its final evaluation."""
    points = [(float(r.wall_seconds), float(getattr(r, metric))) for r in history
              if r.wall_seconds is not None and getattr(r, metric) is not None]
    if final_value is not None and final_seconds is not None:
        points.append((float(final_seconds), float(final_value)))
    return points


def time_to_target(points: list[tuple[float, float]], target: float) -> float | None:
    """The wall seconds of the first point (in time order) at or below `target`; None: never reached."""
    return next((seconds for seconds, value in sorted(points, key=lambda p: p[0]) if value <= target), None)


def first_to_target(times: dict[str, float | None]) -> list[str]:
    """The runs that reached the target first (several when tied within TIE_SECONDS); [] if none did."""
    reached = {run: t for run, t in times.items() if t is not None}
    if not reached:
        return []
    first = min(reached.values())
    return [run for run, t in reached.items() if t - first < TIE_SECONDS]


SYNC_MARGIN = 0.10
"""DESIGN.md §7: every strategy, with its own recipe, within 10% relative of sync's error rate."""


STILL_FALLING = 0.05
"""A run whose error rate fell this much more (relative, over its last epoch) than sync's was still
learning when it stopped."""


def last_epoch_drop(curve: list[dict], metric: str) -> float | None:
    """How much (relative) a run's validation error rate fell over its last epoch, from its curve
    (`run_record`'s per-epoch points); None with fewer than two validations."""
    values = [p[metric] for p in curve if p.get(metric) is not None]
    if len(values) < 2 or not values[-2] > 0:
        return None
    return 1.0 - values[-1] / values[-2]


def behind_sync(runs: list[dict], metric: str, margin: float = SYNC_MARGIN) -> list[str]:
    """A line for each run whose final error rate is more than `margin` (relative) above the sync
    run's after the same epochs, so that a report never lets such a gap pass unsaid, with what its
    curve says of why: still falling faster than sync's over the last epoch (it stopped while still
    learning: more epochs of its recipe should narrow the gap) or not (the gap is the strategy's or
    its recipe's, not too few epochs). Runs of other epochs than sync's are not compared (their gap
    would say nothing about the strategy)."""
    sync = next((r for r in runs if r.get("strategy") == "sync" and not r.get("failed")
                 and r.get("error_rate") is not None), None)
    if sync is None or not sync["error_rate"] > 0:
        return []
    sync_drop = last_epoch_drop(sync.get("curve") or [], metric)
    lines = []
    for r in runs:
        if r is sync or r.get("failed") or r.get("error_rate") is None or r.get("epochs") != sync.get("epochs"):
            continue
        gap = r["error_rate"] / sync["error_rate"] - 1
        if gap <= margin:
            continue
        line = (f"{r['run']}: {metric.upper()} {r['error_rate']:.4f} is {gap:.0%} above sync's "
                f"{sync['error_rate']:.4f} after the same {sync['epochs']} epoch(s), beyond the "
                f"{margin:.0%} a strategy's own recipe aims for")
        drop = last_epoch_drop(r.get("curve") or [], metric)
        if drop is None or sync_drop is None:
            line += ": its recipe may need more epochs or other settings (docs/measurements.md)"
        elif drop > sync_drop + STILL_FALLING:
            line += (f"; it was still learning when it stopped: its validation {metric.upper()} fell "
                     f"{drop:.0%} over its last epoch, sync's {sync_drop:.0%}, so more epochs of its "
                     f"recipe should narrow the gap (docs/measurements.md)")
        else:
            line += (f"; more epochs alone are unlikely to close it: its validation {metric.upper()} fell "
                     f"{drop:.0%} over its last epoch, sync's {sync_drop:.0%} (its recipe or the strategy "
                     f"costs accuracy here; docs/measurements.md)")
        lines.append(line)
    return lines


STEAL_NOTE = 0.05
"""A run whose host took more than this share of the machine's CPU time while it trained is named:
this machine's own steal stayed under 4% in quiet spells and reached 44% in a busy one (2026-11-29)."""


def busy_host(runs: list[dict], share: float = STEAL_NOTE) -> list[str]:
    """A line for each run whose machine's host (the hypervisor) took more than `share` of the CPU
    time while it trained (its summary's `steal_share`): its times, and its simulator error, are
    partly that other work's, so a comparison it ranks may not hold on a quiet machine."""
    return [f"{r['run']}: this machine's host took {r['steal_share']:.0%} of its CPU time (steal) while it "
            f"trained: its times are slower than this machine is, and a ranking it takes part in may not "
            f"hold when the machine is quiet; train it again to check"
            for r in runs if not r.get("failed") and (r.get("steal_share") or 0.0) > share]
