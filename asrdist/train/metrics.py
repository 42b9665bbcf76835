"""Metrics out: JSON lines (the record) and TensorBoard (the view). Rank 0 only.

Also what the trainer's records hold: a logging window's `train` record (`TrainWindow`, whose job
rate comes from the job store's `frames` counter), and the epoch record's rising-loss warning.
"""
from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any


from asrdist.errors import Stopped
from asrdist.io.atomic import finite_or_null, output_errors
from asrdist.utils.throughput import job_frames_per_second, learner_frames_per_second

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
            # an older run's records, epochs numbered from 0, are renumbered as the new ones will be
            kept = numbered_from_one([json.loads(line) for line in self.path.read_text().splitlines() if line])
            kept = [r for r in kept if r.get("step", 0) <= resume_step]
            self.path.write_text("".join(json.dumps(r) + "\n" for r in kept))
            self._seconds_before = max((r.get("seconds", 0.0) for r in kept), default=0.0)
        elif self.path.exists():
            self.path.unlink()
        try:
            # rank 0 alone writes TensorBoard: the other learners do not pay its second of import time
            from torch.utils.tensorboard import SummaryWriter

            self._tb = SummaryWriter(str(run_dir / "tensorboard"), flush_secs=TENSORBOARD_FLUSH_SECONDS)
        except Stopped:  # a stop signal came meanwhile: the run stops (not a broken TensorBoard)
            raise
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


FRAMES_KEY = "frames"
"""The job store's counter of every learner's frames trained (each adds its own at its window ends)."""


class TrainWindow:
    """One logging window of `train.log_every` steps: its mean loss, and frames per second, this
    learner's and the job's (every learner adds its frames to one counter in the job store; rank
    0's rate is the counter's growth over its window: the job's frames over wall seconds,
    `asrdist.utils.throughput`)."""

    def __init__(self, store):
        self.store, self.frames, self.t0 = store, 0, time.perf_counter()
        self.losses: list[float] = []
        self.job0 = self._job_total(0)

    def _job_total(self, add: int) -> int | None:
        return int(self.store.add(FRAMES_KEY, add)) if self.store is not None else None

    def add(self, loss: float, frames: int) -> None:
        self.losses.append(loss)
        self.frames += frames

    def rates(self) -> tuple[float, float]:
        """(this learner's, the job's) frames per second since the window began; starts the next."""
        now = time.perf_counter()
        elapsed = max(now - self.t0, 1e-9)
        total = self._job_total(self.frames)
        learner = learner_frames_per_second(self.frames, elapsed)
        job = (job_frames_per_second([total - self.job0], [elapsed]) if total is not None and self.job0 is not None
               else learner)
        self.frames, self.t0, self.job0 = 0, now, total
        return learner, job

    def log(self, metrics: MetricsLog, step: int, epoch: int, lr: float) -> float:
        """Close the window into a `train` record at `step`; returns the job's frames per second."""
        learner_fps, job_fps = self.rates()
        mean_loss = sum(self.losses) / len(self.losses)
        metrics.log("train", step, epoch=epoch, loss=mean_loss, frames_per_second=job_fps,
                    learner_frames_per_second=learner_fps, lr=lr)
        self.losses = []
        return job_fps


def warn_if_loss_rose(record: dict, history: list[dict], strategy, rank: int) -> None:
    """A strategy with advice for it (onebit) warns when an epoch's training loss (`record`) is
    above the last one's (`history[-1]`); the record notes it, rank 0 says it."""
    advice = strategy.rising_loss_advice
    previous = history[-1]["train_loss"] if history else None
    if advice is None or previous is None or record["train_loss"] is None or not record["train_loss"] > previous:
        return
    record["loss_rose"] = True
    if rank == 0:
        print(f"[asrdist] warning: {strategy.name}: train loss rose from {previous:.4f} to "
              f"{record['train_loss']:.4f} in epoch {record['epoch']}; {advice}", flush=True)


def epoch_line(record: dict) -> str:
    """The epoch record as the leader prints it (the per-learner shares: metrics.jsonl only)."""
    shown = ", ".join(f"{k}={v:.4f}" if isinstance(v, float) else f"{k}={v}" for k, v in record.items()
                      if k != "minibatches_by_learner")
    return f"[asrdist] {shown}"


def numbered_from_one(records: list[dict]) -> list[dict]:
    """`records` (metrics.jsonl's, an epoch history) with their epochs numbered from 1, as runs
    number them since 2026-12 (the progress line, the log, metrics.jsonl, summary.json, the
    checkpoints' epoch-N): those of an older run, numbered from 0 (one of them says epoch 0: its
    first), come back shifted by one; newer ones as they are."""
    if not any(r.get("epoch") == 0 and not isinstance(r.get("epoch"), bool) for r in records):
        return records
    return [{**r, "epoch": r["epoch"] + 1} if isinstance(r.get("epoch"), int) else r for r in records]


def read_metrics(run_dir: Path) -> list[dict]:
    """metrics.jsonl's records, epochs numbered from 1 (an older run's too: `numbered_from_one`)."""
    path = Path(run_dir) / "metrics.jsonl"
    if not path.is_file():
        return []
    return numbered_from_one([json.loads(line) for line in path.read_text().splitlines() if line.strip()])
