"""A run's state record, `state.json`: prepared, started, checkpointed, finished or failed; written
atomically by whoever changes the state (the launcher, the engine at each checkpoint, the learner at
the end), read by `--resume` and by the user."""
from __future__ import annotations

import json
import time
from pathlib import Path

from asrdist.io.atomic import write_json_atomic

STATE_NAME = "state.json"


STATES = ("prepared", "started", "checkpointed", "finished", "failed")


def read_state(run_dir: Path) -> dict | None:
    """The run's state record; None when it has none (a run of an older asrdist, or no run) or
    when it cannot be read (then the run's files speak for it, see `describe`; `damage` says why)."""
    try:
        record = json.loads((Path(run_dir) / STATE_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("state") in STATES else None


def damage(run_dir: Path) -> str | None:
    """What makes the run's state.json unreadable as a record, in a few words; None when it is
    sound or there is none."""
    try:
        text = (Path(run_dir) / STATE_NAME).read_text(errors="replace")
    except FileNotFoundError:
        return None
    except OSError as exc:
        return f"cannot be read ({exc.strerror or exc})"
    if not text.strip():
        return "empty"
    try:
        record = json.loads(text)
    except ValueError:
        return "not JSON"
    if not isinstance(record, dict):
        return f"a JSON {_json_kind(record)}, not a record"
    if record.get("state") not in STATES:
        return f"unknown state {record.get('state')!r} (known: {', '.join(STATES)})"
    if not _count(record.get("starts", 0)):
        return f"'starts' is not a count ({record.get('starts')!r})"
    return None


def _json_kind(value) -> str:
    return {list: "list", str: "string", bool: "boolean", type(None): "null"}.get(type(value), "number")


def _count(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 0


def write_state(run_dir: Path, state: str, starts: int | None = None, **fields) -> None:
    """Rewrite the run's state record (atomically); `starts` is carried over from the last one
    (counted one up by a start), unless given (a damaged record's, counted again)."""
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}")
    before = read_state(run_dir) or {}
    if starts is None:
        earlier = before.get("starts", 0)
        starts = (earlier if _count(earlier) else 0) + (state == "started")
    record = {"state": state, "starts": starts, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
    if state not in ("started", "prepared") and "checkpoint" not in record and before.get("checkpoint"):
        record["checkpoint"] = before["checkpoint"]  # a failure or the end keeps naming the last one
        for key in ("epoch", "epochs"):
            if key in before:
                record.setdefault(key, before[key])
    write_json_atomic(Path(run_dir) / STATE_NAME, record)
