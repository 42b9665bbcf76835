"""`asrdist.calibrate.stepcost`: a timed step is what the learner's loop does per minibatch, drawing
the minibatch from the sampler included (a real learner assembles it in its loop, not elsewhere)."""
from __future__ import annotations

import time
import types

import pytest
import torch

from asrdist.calibrate.stepcost import StepTimer
from asrdist.errors import DataError

FETCH_SECONDS = 0.004


def _slow_batches():
    while True:
        start = time.perf_counter()
        while time.perf_counter() - start < FETCH_SECONDS:  # work, as assembling features is
            pass
        yield "batch"


class _InstantTrainer:
    def __init__(self):
        self.state = types.SimpleNamespace(step=0)

    def train_step(self, batch):
        assert batch == "batch"
        return 0.0, 100  # (loss, frames)


def test_a_window_counts_drawing_the_minibatch():
    timer = StepTimer.__new__(StepTimer)
    timer.threads, timer.corpus = torch.get_num_threads(), "corpus"
    timer.device = torch.device("cpu")
    timer.trainer, timer.batches = _InstantTrainer(), _slow_batches()
    per_frame = timer.window(steps=5, seconds=0.0)
    # at least the drawing's own time per frame: 100 frames a minibatch
    assert per_frame >= FETCH_SECONDS / 100
    assert timer.trainer.state.step == 5


def test_a_sampler_with_no_minibatch_is_named():
    timer = StepTimer.__new__(StepTimer)
    timer.threads, timer.corpus = 1, "corpus/x"
    timer.device = torch.device("cpu")
    timer.trainer, timer.batches = _InstantTrainer(), iter(())
    with pytest.raises(DataError, match="corpus/x"):
        timer.window(steps=1, seconds=0.0)
