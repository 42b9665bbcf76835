"""A learner's failure, through torch.distributed.elastic's own records.

A failing learner writes torch's error-file format (`ErrorHandler.record_exception`'s JSON) to
TORCHELASTIC_ERROR_FILE, its one line as the message, and `failed-rank-R.txt` (the line, then the
traceback) into the report directory: `record_failure`, the one writer of both. torch's agent
reads the error file into its `ChildFailedError.failures` (`ProcessFailure` by global rank);
`asrdist.cluster.agent` hands those to the supervisor as `LearnerExit` records (`write_exits`).
"""
from __future__ import annotations

import json
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path

from asrdist.errors import AsrdistError
from asrdist.io.atomic import write_json_atomic
from asrdist.utils import environ


def report_path(report_dir: Path, rank: int) -> Path:
    return Path(report_dir) / f"failed-rank-{rank}.txt"


def failure_line(rank: int, exc: BaseException) -> str:
    """`learner rank R: ...`: an asrdist error is its own first line, any other names its type
    (a bare KeyError says only the key)."""
    text = str(exc).strip()
    detail = (text.splitlines()[0] if text else "").removeprefix(f"rank {rank}: ")
    if not isinstance(exc, AsrdistError) or not detail:
        detail = f"{type(exc).__name__}: {detail}".rstrip(": ")
    return f"learner rank {rank}: {detail}"


def record_failure(report_dir: Path | None, rank: int, exc: BaseException) -> str:
    """Record the exception being handled as learner `rank`'s failure (see the module docstring);
    returns its line. Best-effort: on a full disk the line the learner prints still reaches the
    launcher's log."""
    message = failure_line(rank, exc)
    stack = traceback.format_exc()
    error_file = environ.elastic_error_file()
    try:
        if error_file:
            data = {"message": {"message": message, "extraInfo": {"py_callstack": stack,
                                                                    "timestamp": str(int(time.time()))}}}
            Path(error_file).write_text(json.dumps(data))
        if report_dir is not None:
            report_path(report_dir, rank).write_text(message + "\n" + stack)
    except OSError:
        pass
    return message


@dataclass(frozen=True)
class LearnerExit:
    """A failed learner as torch's agent saw it (`ProcessFailure`): its global rank, exit code
    (negative: the signal that ended it) and the message of its error file ('' without one)."""

    rank: int
    exitcode: int
    message: str = ""

    @classmethod
    def of(cls, rank: int, failure) -> "LearnerExit":
        """From torch's `ProcessFailure`: the message only where the learner wrote an error file."""
        data = failure.error_file_data.get("message") if isinstance(failure.error_file_data, dict) else None
        return cls(rank, failure.exitcode, data.get("message", "") if isinstance(data, dict) else "")


def write_exits(path: Path, failures: dict) -> None:
    """An agent's `ChildFailedError.failures` (global rank -> ProcessFailure) for the supervisor."""
    write_json_atomic(Path(path), [asdict(LearnerExit.of(rank, f)) for rank, f in failures.items()])


def read_exits(paths: list[Path]) -> list[LearnerExit]:
    """What the agents handed over (`write_exits`), in their order; an agent that wrote nothing
    (it succeeded, or died itself) adds nothing."""
    exits = []
    for path in paths:
        try:
            exits += [LearnerExit(**x) for x in json.loads(Path(path).read_text())]
        except (OSError, ValueError):
            continue
    return exits
