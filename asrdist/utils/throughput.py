"""The one definition of throughput, used by summary.json, `compare`, every bench and the simulator.

A job's throughput is its training frames (all learners together) over the job's wall seconds of
training: from the moment the learners enter the epoch loop to the moment the last one leaves it.
Epoch ends count (a lock-step learner waits inside its steps, an asynchronous one at an epoch's
end: both kinds of waiting are time the job spends), start-up and the final evaluation do not.
With learners started together, the job's training seconds are its longest learner's loop time.
A learner's own rate (its frames over its own loop time) is reported apart, never summed into the
job's figure: the sum of rates lets a learner that stops early count as if it went on.
"""
from __future__ import annotations

from typing import Iterable


def job_frames_per_second(learner_frames: Iterable[float], learner_loop_seconds: Iterable[float]) -> float:
    """The job's frames ÷ its training wall seconds (the longest learner loop); 0.0 when no time passed."""
    frames = sum(learner_frames)
    seconds = max(learner_loop_seconds, default=0.0)
    return frames / seconds if seconds > 0 else 0.0


def learner_frames_per_second(frames: float, loop_seconds: float) -> float:
    """One learner's own rate: its frames over its own loop time (an extra key, never the job's figure)."""
    return frames / loop_seconds if loop_seconds > 0 else 0.0
