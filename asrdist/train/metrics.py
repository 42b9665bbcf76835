"""Metrics out: JSON lines (the record) and TensorBoard (the view). Rank 0 only."""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from asrdist.io.atomic import finite_or_null, output_errors

TENSORBOARD_FLUSH_SECONDS = 5
"""How often TensorBoard's writer thread wakes to write (its default: 120 s). A stop signal is raised
in the main thread wherever it is (`asrdist.io.atomic.signals_raise`, as Ctrl-C is); raised inside the
writer queue's notify it can leave a stale waiter that swallows the next wake-up, and closing the
writer then waited for the thread's next timed wake-up: a stopped single-learner run took 2 minutes
to exit, about 1 stop in 25 under load (2026-11-26, py-spy: the main thread in the writer's join, the
writer in its queue's timed wait). With 5 s a stop costs at most that, and TensorBoard shows a
running job's figures within 5 s."""


class MetricsLog:
    def __init__(self, run_dir: Path, enabled: bool = True, resume_step: int | None = None):
        self.enabled = enabled
        self.path = run_dir / "metrics.jsonl"
        self._tb = None
        self._started = time.monotonic()
        self._seconds_before = 0.0
        """Every record's `seconds`: training time since the run started, summed over its (re)starts."""
        if not enabled:
            return
        if resume_step is not None and self.path.is_file():
            # Drop records written after the checkpoint we resume from: they will be redone.
            kept = [line for line in self.path.read_text().splitlines()
                    if line and json.loads(line).get("step", 0) <= resume_step]
            self.path.write_text("".join(k + "\n" for k in kept))
            self._seconds_before = max((json.loads(k).get("seconds", 0.0) for k in kept), default=0.0)
        elif self.path.exists():
            self.path.unlink()
        try:
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"), flush_secs=TENSORBOARD_FLUSH_SECONDS)
        except Exception:  # tensorboard missing or broken: JSONL stays the record
            self._tb = None

    def log(self, kind: str, step: int, **values: Any) -> None:
        if not self.enabled:
            return
        seconds = self._seconds_before + time.monotonic() - self._started
        record = {"kind": kind, "step": step, "seconds": round(seconds, 3), **values}
        with output_errors(self.path), open(self.path, "a", encoding="utf-8") as f:
            f.write(json.dumps(finite_or_null(record), allow_nan=False) + "\n")
        if self._tb is not None:
            for k, v in values.items():
                if isinstance(v, (int, float)) and not isinstance(v, bool):
                    self._tb.add_scalar(f"{kind}/{k}", v, step)

    def close(self) -> None:
        if self._tb is not None:
            self._tb.close()


def read_metrics(run_dir: Path) -> list[dict]:
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
