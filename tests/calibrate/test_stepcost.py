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


def test_the_lone_learner_of_a_job_of_nodes_with_a_straggler_is_built(tone_corpus):
    # a bench seeds S11 (2 hosts x 4 learners: train.group_size=4) or S7 run (a straggler's rank)
    # is predicted from one learner of its recipe alone, which has neither nodes nor that rank
    from contextlib import ExitStack

    from asrdist.config import load_config
    from asrdist.run.prepare import build_targets

    cfg = load_config("configs/default.yaml", ["model.hidden_dim=16", "model.hidden_layers=1", "train.learners=8",
                                               "train.group_size=4", "train.straggler.ranks=[3]", "strategy.name=sync",
                                               f"data.corpus={tone_corpus}"])
    with ExitStack() as stack:
        timer = StepTimer(stack, cfg, build_targets(tone_corpus, cfg, cfg.model.kind), learners=8, threads=1)
        assert timer.trainer.state.step == 0 and timer.task.samples_per_step > 0
        assert timer.window(steps=2, seconds=0.0) > 0
