"""An epoch's progress as the user watches it: a tqdm bar on a terminal, plain lines elsewhere.

Each shows the minibatches done of the epoch's total, the training loss so far, frames per second
and the time left. The bar goes to stderr, or stdout when only stdout is a terminal (a learner under
the launcher); anywhere else a plain `[asrdist] epoch ...` line goes to stderr at every tenth of the
epoch and at least every `PLAIN_INTERVAL_S` seconds.
Which loss and which rate: docs/training.md#an-epochs-progress-trainprogresspy."""
from __future__ import annotations

import sys
import time
from typing import TextIO

from tqdm import tqdm

PLAIN_INTERVAL_S = 60.0
"""Longest quiet spell between two plain progress lines (an epoch of hours still says it lives)."""
PLAIN_STEPS = 10
"""Plain lines per epoch at least: one at each tenth of it."""


def terminal_stream() -> TextIO | None:
    """Where a bar can be drawn: stderr or stdout when it is a terminal, else None."""
    for stream in (sys.stderr, sys.stdout):
        try:
            if stream is not None and stream.isatty():
                return stream
        except (AttributeError, ValueError):  # a closed or replaced stream
            continue
    return None


def format_seconds(seconds: float) -> str:
    seconds = max(0, int(round(seconds)))
    hours, rest = divmod(seconds, 3600)
    return f"{hours}:{rest // 60:02d}:{rest % 60:02d}" if hours else f"{rest // 60}:{rest % 60:02d}"


class EpochProgress:
    """One epoch's display; `update` after every minibatch, `close` at the epoch's end.

    `enabled` False shows nothing (other learners than the job's first, `--no-progress`).
    `terminal` is the stream to draw a bar on (default: `terminal_stream()`); None prints plain
    lines to `plain` (default: stderr)."""

    def __init__(self, epoch: int, epochs: int, total: int, start: int = 0, enabled: bool = True,
                 terminal: TextIO | None | str = "auto", plain: TextIO | None = None):
        self.label = f"epoch {epoch + 1}/{epochs}"
        self.total, self.start, self.done = total, start, start
        self.enabled = enabled and total > 0
        self.terminal = terminal_stream() if terminal == "auto" else terminal
        self.plain = plain
        self.t0 = self._last_line = time.perf_counter()
        self.frames, self.job_fps = 0, None
        self._next_fraction = (start * PLAIN_STEPS // total + 1) if total else PLAIN_STEPS
        self.bar = None
        if self.enabled and self.terminal is not None:
            self.bar = tqdm(total=total, initial=start, desc=self.label, unit="minibatch", file=self.terminal,
                            dynamic_ncols=True, leave=False)

    def window_rate(self, job_fps: float) -> None:
        """The job's frames/s over the logging window that just closed."""
        self.job_fps = job_fps

    def fps(self) -> float:
        if self.job_fps is not None:
            return self.job_fps
        return self.frames / max(time.perf_counter() - self.t0, 1e-9)

    def update(self, done: int, frames: int, loss: float | None) -> None:
        """`done`: minibatches of the epoch done so far (the job's, for a shared epoch); `frames`:
        this learner's frames in the minibatch just trained; `loss`: the epoch's loss so far."""
        self.frames += frames
        done = min(max(done, self.done), self.total)
        if not self.enabled:
            self.done = done
            return
        shown_loss = f"{loss:.4f}" if loss is not None else "-"
        if self.bar is not None:
            self.bar.update(done - self.done)
            self.done = done
            self.bar.set_postfix_str(f"loss={shown_loss}, {self.fps():,.0f} frames/s", refresh=False)
            return
        self.done = done
        now = time.perf_counter()
        reached = done * PLAIN_STEPS >= self._next_fraction * self.total
        if not reached and now - self._last_line < PLAIN_INTERVAL_S:
            return
        while self._next_fraction * self.total <= done * PLAIN_STEPS:
            self._next_fraction += 1
        self._last_line = now
        ran = done - self.start
        left = (self.total - done) * (now - self.t0) / ran if ran > 0 else None
        eta = format_seconds(left) if left is not None else "-"
        print(f"[asrdist] {self.label}: {done}/{self.total} minibatches ({100 * done // self.total}%), "
              f"loss {shown_loss}, {self.fps():,.0f} frames/s, {format_seconds(now - self.t0)} elapsed, "
              f"ETA {eta}", file=self.plain or sys.stderr, flush=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()
            self.bar = None
