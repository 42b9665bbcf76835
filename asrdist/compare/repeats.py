"""Repeats: a comparison trains each strategy K times in interleaved rounds (round 1 every
strategy once, then round 2, ...; round r's runs with seed + r - 1), so that a spell of a busy
machine falls on every strategy alike, and reports each strategy's median with an interval.

1. Per strategy, the median over its runs of time to target (a run that never reached it counts
   as infinitely slow), frames/s and final error rate; the interval is the range over the runs
   (K runs give no finer interval), and the error rate's also a bootstrap interval over the eval
   split's utterances (`compare.scores`).
2. The winner is the strategy of the lowest median time to target; the recommendation names it
   only when its slowest run was faster than the runner-up's fastest (the two ranges do not
   overlap), and says "not separated" otherwise (always with one run each: there is no interval).
3. Speed-up over single: single's median time to target / the strategy's, and the strategy's
   median frames/s / single's.
"""
from __future__ import annotations

import math
from statistics import median

from asrdist.compare.target import Target, first_to_target

NEVER = "never"
INF = math.inf


def run_name(strategy: str, round_: int) -> str:
    """A run's directory under OUT: round 1 is OUT/<strategy> (as a comparison without repeats
    names it, so that such a comparison resumes with --repeats), round r OUT/<strategy>-r<r>."""
    return strategy if round_ == 1 else f"{strategy}-r{round_}"


def seconds(value) -> float:
    """A time to target as a number: never (or a failed run's None) is infinitely slow."""
    return INF if value is None or value == NEVER else float(value)


def middle(values: list[float]) -> float | None:
    """The median of the figures a strategy's runs have (None without any)."""
    known = [v for v in values if v is not None]
    return median(known) if known else None


def span(values: list[float]) -> list[float] | None:
    """[lowest, highest] of the figures a strategy's runs have (None without any)."""
    known = [v for v in values if v is not None]
    return [min(known), max(known)] if known else None


def time_median(times: list) -> float | str | None:
    """The median time to target of a strategy's runs: a number, NEVER when the median run never
    reached it, None when no run finished."""
    known = [seconds(t) for t in times if t is not None]
    if not known:
        return None
    m = median(known)
    return NEVER if m == INF else m


def time_span(times: list) -> list | None:
    """[fastest, slowest] time to target of a strategy's runs (NEVER for an end no run reached)."""
    known = [seconds(t) for t in times if t is not None]
    if not known:
        return None
    return [NEVER if v == INF else v for v in (min(known), max(known))]


def speedups(entries: list[dict]) -> None:
    """Each strategy's `speedup_vs_single`: {time_to_target, frames_per_second} over single's
    medians (None where either is missing, or without a single run)."""
    single = next((e for e in entries if e["strategy"] == "single" and not e.get("failed")), None)
    for e in entries:
        if single is None or e.get("failed"):
            e["speedup_vs_single"] = None
            continue
        base_t, t = single.get("time_to_target_seconds"), e.get("time_to_target_seconds")
        by_time = base_t / t if isinstance(base_t, float | int) and isinstance(t, float | int) and t > 0 else None
        base_f, f = single.get("frames_per_second"), e.get("frames_per_second")
        e["speedup_vs_single"] = {"time_to_target": by_time,
                                  "frames_per_second": f / base_f if f and base_f else None}


def recommendation(target: Target | None, entries: list[dict], setup: str) -> str:
    """The line that names the strategy that reached the target first, on this machine, where its
    runs' range of times is separated from the runner-up's; "not separated" otherwise."""
    if target is None:
        return "No recommendation: no run has a final error rate to set a target from."
    goal = f"{target.metric.upper()} <= {target.value:.4f}"
    done = [e for e in entries if not e.get("failed")]
    times = {e["run"]: (None if e["time_to_target_seconds"] == NEVER else e["time_to_target_seconds"]) for e in done}
    winners = first_to_target(times)
    if not winners:
        return f"No recommendation: no run reached {goal} ({setup})."
    first = times[winners[0]]
    others = sorted((t, run) for run, t in times.items() if t is not None and run not in winners)
    behind = "; ".join(f"{run} {t:.1f} s ({t / first:.2f}x)" if first > 0 else f"{run} {t:.1f} s"
                       for t, run in others)
    never = [run for run, t in times.items() if t is None]
    tail = (f"; then {behind}" if behind else "") + (f"; never: {', '.join(never)}" if never else "")
    repeats = min(e.get("repeats") or 1 for e in done)
    if len(winners) > 1:
        return (f"Recommendation: not separated: {' and '.join(winners)} reached {goal} in the same median time, "
                f"{first:.1f} s{tail} ({setup}).")
    winner = next(e for e in done if e["run"] == winners[0])
    if repeats < 2:
        return (f"Recommendation: not separated (one run each, no interval; --repeats 2 or more gives one): "
                f"{winner['run']} reached {goal} first on this machine, in {first:.1f} s{tail} ({setup}).")
    runner = min((e for e in done if e is not winner), key=lambda e: seconds(e["time_to_target_seconds"]),
                 default=None)
    if runner is None:
        return f"Recommendation: {winner['run']} reached {goal} in {first:.1f} s (median of {repeats}), alone ({setup})."
    mine, theirs = _range(winner), _range(runner)
    ranges = f"{winner['run']} {_text(mine)}, {runner['run']} {_text(theirs)} over {repeats} runs each"
    if seconds(mine[1]) < seconds(theirs[0]):
        return (f"Recommendation: {winner['run']} reached {goal} first on this machine, in {first:.1f} s (median), "
                f"separated from the runner-up ({ranges}){tail} ({setup}).")
    return (f"Recommendation: not separated: {winner['run']} reached {goal} first by median time, {first:.1f} s, "
            f"but its runs' times overlap the runner-up's ({ranges}){tail} ({setup}).")


def _range(entry: dict) -> list:
    interval = (entry.get("interval") or {}).get("time_to_target_seconds")
    t = entry.get("time_to_target_seconds")
    return interval or [t, t]


def _text(pair: list) -> str:
    return "[" + "-".join(NEVER if v == NEVER or v is None else f"{v:.1f}" for v in pair) + " s]"


MEDIAN_KEYS = ("error_rate", "test_error_rate", "frame_accuracy", "frames_per_second", "mb_sent", "mb_wire", "comm_seconds",
               "wait_seconds", "wall_seconds", "compute_seconds_per_frame", "step_seconds_per_frame")
"""A strategy's figures that are the median of its runs'."""
ROUND_KEYS = ("run", "path", "round", "seed", "time_to_target_seconds", "error_rate", "error_rate_utterances",
              "test_error_rate", "frames_per_second", "wall_seconds", "steal_share", "failed")
"""What summary.json keeps of each run of a strategy (`rounds`)."""
CONTENTION_KEYS = ("contended", "load", "cpu_share")
"""Each run's contention figures, where its record has them (the runs' summaries since issue 58
item 3): kept per round; the strategy's `contended` is true when any run's was, its `cpu_share`
the lowest and its `load` that run's."""


def _busiest(records: list[dict]) -> dict:
    """The run that received the least of its CPU (the first where none says)."""
    shares = [r for r in records if isinstance(r.get("cpu_share"), int | float)]
    return min(shares, key=lambda r: r["cpu_share"]) if shares else records[0]


def aggregate(strategy: str, records: list[dict], pooled_intervals: dict | None = None) -> dict:
    """A strategy's entry in summary.json's `runs` from the records of its runs (in round order):
    the first finished run's record (its path, curves, points, cores) with the medians of
    MEDIAN_KEYS and of time to target, `repeats` (how many runs), `rounds` (each run's figures)
    and `interval` (the range over the runs of each median's figure; `pooled_intervals`: the
    bootstrap intervals over the eval and test splits' utterances, pooled over the runs)."""
    done = [r for r in records if not r.get("failed")]
    entry = dict(done[0] if done else records[0])
    entry["run"], entry["repeats"] = strategy, len(records)
    entry["rounds"] = [{k: r.get(k) for k in ROUND_KEYS + CONTENTION_KEYS if k in r or k in ROUND_KEYS}
                       for r in records]
    if not done:
        entry["failed"] = records[0].get("failed")
        entry["interval"] = None
        return entry
    entry["failed"] = None
    for key in MEDIAN_KEYS:
        entry[key] = middle([r.get(key) for r in done])
    entry["steal_share"] = max((r["steal_share"] for r in done if r.get("steal_share") is not None), default=None)
    times = [r.get("time_to_target_seconds") for r in done]
    entry["time_to_target_seconds"] = time_median(times)
    reached = [r.get("reached_target") for r in done]
    entry["reached_target"] = None if None in reached else entry["time_to_target_seconds"] != NEVER
    if any(k in r for r in done for k in CONTENTION_KEYS):  # the runs' own figures: see CONTENTION_KEYS
        entry["contended"] = any(bool(r.get("contended")) for r in done)
        entry["load"] = _busiest(done).get("load")
        entry["cpu_share"] = min((r["cpu_share"] for r in done if isinstance(r.get("cpu_share"), int | float)),
                                 default=None)
    pooled_intervals = pooled_intervals or {}
    entry["interval"] = {
        "time_to_target_seconds": time_span(times),
        "frames_per_second": span([r.get("frames_per_second") for r in done]),
        "error_rate": span([r.get("error_rate") for r in done]),
        "test_error_rate": span([r.get("test_error_rate") for r in done]),
        "error_rate_utterances": pooled_intervals.get("valid"),
        "test_error_rate_utterances": pooled_intervals.get("test"),
        "how": (f"range over the strategy's {len(done)} finished run(s) (seeds "
                f"{', '.join(str(r.get('seed')) for r in done)}); the error rates' `_utterances`: 95% bootstrap "
                f"interval over the split's utterances, pooled over the runs"),
    }
    return entry
