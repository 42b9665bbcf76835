"""The simulator's uncertainty: every prediction carries the relative error measured on its nearest
validated case.

The validated cases are recorded in `validated_cases.json` beside this module: the held-out rows of
`asrdist simulate --validate` (the papers' GPU clusters, each predicted with the presets fitted on
the other papers) and the rows of `asrdist bench simulator` (real `asrdist train` runs on a CPU
machine, predicted from microbenchmarks). `scripts/record_validated_cases.py` rewrites it from a
bench JSON and a fresh `--validate`; a test checks that its paper rows are what `--validate` gives.

Nearest: the same kind of learner first (GPU presets or measured CPU compute), then the same
placement of several learners (all on one host, talking over its loopback, or each on a host of its
own: learners that share one host's cores and kernel wait on each other in ways the simulator does
not model, and its errors there are of another size), then the same strategy (or one of its family:
the asynchronous ADPSGD variants), then the closest learner count (in powers of two).
"""
from __future__ import annotations

import json
import math
from dataclasses import asdict, dataclass
from pathlib import Path

from asrdist.errors import DataError
from asrdist.io.atomic import write_json_atomic
from asrdist.parallel import STRATEGIES

RECORD = Path(__file__).with_name("validated_cases.json")


@dataclass(frozen=True)
class ValidatedCase:
    source: str
    """`simulate --validate` (held out) or `bench simulator`."""
    case: str
    strategy: str
    learners: int
    device: str
    """gpu (the device presets) or cpu (measured compute per frame)."""
    relative_error: float
    """(predicted - measured) / measured."""
    placement: str = "hosts"
    """Where several learners ran: `loopback` (one host) or `hosts` (a host per learner or node:
    the papers' clusters, emulated hosts). A lone learner's case matches either."""


PLACEMENTS = ("loopback", "hosts")


def placement_of(learners: int, nodes: int | None, network: str | None) -> str:
    """`loopback` when several learners share one host (one node, or the loopback network), else `hosts`."""
    return "loopback" if learners > 1 and ((nodes or 1) <= 1 or network in (None, "loopback")) else "hosts"


def load_cases(path: Path = RECORD) -> list[ValidatedCase]:
    try:
        rows = json.loads(Path(path).read_text())["cases"]
        return [ValidatedCase(**row) for row in rows]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not a record of validated cases ({exc})") from None


def _distance(case: ValidatedCase, strategy: str, learners: int, device: str, placement: str) -> float:
    if case.strategy == strategy:
        apart = 0.0
    else:
        apart = 5.0 if STRATEGIES[case.strategy].asynchronous and STRATEGIES[strategy].asynchronous else 10.0
    placed = 50.0 if case.placement != placement and case.learners > 1 and learners > 1 else 0.0
    return ((100.0 if case.device != device else 0.0) + placed + apart
            + abs(math.log2(case.learners) - math.log2(learners)))


def nearest(strategy: str, learners: int, device: str, cases: list[ValidatedCase] | None = None,
            placement: str = "hosts") -> ValidatedCase | None:
    """The validated case nearest a prediction (see the module docstring); None without cases."""
    if placement not in PLACEMENTS:
        raise ValueError(f"placement {placement!r}: one of {', '.join(PLACEMENTS)}")
    cases = load_cases() if cases is None else cases
    strategy = "sync" if strategy == "single" else strategy  # a lone learner is validated as any other
    return min(cases, key=lambda c: _distance(c, strategy, max(learners, 1), device, placement), default=None)


def describe(case: ValidatedCase | None) -> dict | None:
    """A prediction's `nearest_validated` entry."""
    return None if case is None else asdict(case)


def time_band(seconds: float, relative_error: float | None) -> tuple[float, float]:
    """Where a predicted time may land, measured, if the prediction errs by as much as its nearest
    validated case did, either way: seconds x (1 -/+ |error|). (Frames/s predicted e too high,
    (predicted - measured) / measured, puts the measured time at seconds x (1 + e).) A prediction
    without a case gets no bounds."""
    if relative_error is None:
        return 0.0, math.inf
    return seconds * max(0.0, 1.0 - abs(relative_error)), seconds * (1.0 + abs(relative_error))


def apart(a: tuple[float, float | None], b: tuple[float, float | None]) -> bool:
    """Whether two predicted times, each (seconds, its nearest case's error), are ranked beyond
    the simulator's error: their `time_band`s do not overlap."""
    (a_lo, a_hi), (b_lo, b_hi) = time_band(*a), time_band(*b)
    return a_hi < b_lo or b_hi < a_lo


def cases_from_validate(result: dict) -> list[ValidatedCase]:
    """The held-out rows of `asrdist.sim.validate.validate()`."""
    return [ValidatedCase("simulate --validate (held out)", f"{r['paper']}: {r['case']}", r["strategy"],
                          r["learners"], "gpu", r["relative_error"]) for r in result["held_out_rows"]]


def cases_from_bench(result: dict) -> list[ValidatedCase]:
    """The rows of an `asrdist bench simulator` JSON."""
    placement = "loopback" if result["network"] == "loopback" else "hosts"
    return [ValidatedCase("bench simulator", f"{name} on {n} learner(s), {result['network']}, {result['cores']} "
                                             f"cores, load {result['load_average']['before'][0]:.1f}",
                          name, int(n), "cpu", row["relative_error"], placement)
            for name, by_n in result["predictions"].items() for n, row in by_n.items()]


def record(cases: list[ValidatedCase], path: Path = RECORD, note: str = "") -> None:
    write_json_atomic(path, {"note": note, "cases": [asdict(c) for c in cases]})
