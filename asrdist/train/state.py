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
    when it cannot be read (then the run's files speak for it, see `describe`)."""
    try:
        record = json.loads((Path(run_dir) / STATE_NAME).read_text())
    except (OSError, ValueError):
        return None
    return record if isinstance(record, dict) and record.get("state") in STATES else None


def write_state(run_dir: Path, state: str, **fields) -> None:
    """Rewrite the run's state record (atomically); `starts` is carried over from the last one."""
    if state not in STATES:
        raise ValueError(f"unknown run state {state!r}")
    before = read_state(run_dir) or {}
    starts = before.get("starts", 0) + (state == "started")
    record = {"state": state, "starts": starts, "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"), **fields}
    if state not in ("started", "prepared") and "checkpoint" not in record and before.get("checkpoint"):
        record["checkpoint"] = before["checkpoint"]  # a failure or the end keeps naming the last one
        for key in ("epoch", "epochs"):
            if key in before:
                record.setdefault(key, before[key])
    write_json_atomic(Path(run_dir) / STATE_NAME, record)
