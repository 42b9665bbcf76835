"""Automatic minibatch-size search (CNTK's): trial sizes, the selection rule, and a real search on
the tone corpus that restores the epoch-start state between trials."""
from __future__ import annotations

import math

import pytest
import torch

from asrdist.config import load_config
from asrdist.errors import ConfigError, TrainingError
from asrdist.optim.batch_search import (EpochStartTrials, round_to_multiple, search_batch_size,
                                        trial_sizes)
from asrdist.parallel.onebit import OneBitConfig


class FakeTraining:
    """A callback with a fixed loss per size that records the sizes it was asked for."""

    def __init__(self, losses: dict[int, float]):
        self.losses, self.calls = losses, []

    def __call__(self, size: int) -> float:
        self.calls.append(size)
        return self.losses[size]


def _reference_choice(log: list[tuple[int, float]], tolerance: float = 1.01) -> int:
    base = log[0][1]
    chosen = log[0][0]
    for size, loss in log[1:]:
        if not loss <= tolerance * base:
            break
        chosen = size
    return chosen


def test_rounding_is_to_the_nearest_multiple_of_64():
    assert [round_to_multiple(v) for v in (256 * math.sqrt(2), 512 * math.sqrt(2), 1024 * math.sqrt(2),
                                          2048 * math.sqrt(2), 95.9, 96, 10)] == [384, 704, 1472, 2880, 64, 128, 64]


def test_trial_sizes_grow_by_sqrt2_up_to_twice_the_previous_size():
    assert trial_sizes(256) == [256, 384, 512]
    assert trial_sizes(256, 1024) == [512, 704, 1024, 1472, 2048]  # from half the previous size (CNTK)
    assert trial_sizes(256, 768) == [384, 512, 768, 1088, 1536]
    assert trial_sizes(256, 384) == [256, 384, 512, 704]  # half of 384 is below the base
    assert trial_sizes(64) == [64, 128]  # 64 * sqrt(2) rounds back to 64: skipped
    assert trial_sizes(1024, 256) == [1024]  # the first size is always tried
    assert trial_sizes(128, 120) == [128, 192]  # 256 would exceed 2 x 120


@pytest.mark.parametrize("base, previous", [(100, None), (0, None), (256, 0), (True, None)])
def test_bad_sizes_are_config_errors(base, previous):
    with pytest.raises(ConfigError, match="batch-size search"):
        trial_sizes(base, previous)


def test_all_trials_within_tolerance_picks_the_largest():
    fake = FakeTraining({256: 2.0, 384: 1.9, 512: 2.02})  # 2.02 == 1.01 x 2.0: still accepted
    assert search_batch_size(fake, 256) == 512
    assert fake.calls == [256, 384, 512]


def test_first_loss_above_tolerance_stops_the_search():
    fake = FakeTraining({256: 1.0, 384: 1.005, 512: 1.0101, 704: 0.5, 1024: 0.5})
    log: list = []
    assert search_batch_size(fake, 256, 512, log=log) == 384
    assert fake.calls == [256, 384, 512]  # later sizes are never tried, as in CNTK
    assert log == [(256, 1.0), (384, 1.005), (512, 1.0101)]


def test_non_finite_trial_loss_stops_and_non_finite_base_is_an_error():
    assert search_batch_size(FakeTraining({256: 1.0, 384: float("nan"), 512: 1.0}), 256) == 256
    assert search_batch_size(FakeTraining({256: 1.0, 384: float("inf"), 512: 1.0}), 256) == 256
    with pytest.raises(TrainingError, match="base size 256"):
        search_batch_size(FakeTraining({256: float("nan")}), 256)


def test_tolerance_is_configurable():
    losses = {256: 1.0, 384: 1.04, 512: 1.06}
    assert search_batch_size(FakeTraining(losses), 256) == 256
    assert search_batch_size(FakeTraining(losses), 256, tolerance=1.05) == 384
    with pytest.raises(ConfigError):
        search_batch_size(FakeTraining(losses), 256, tolerance=0.9)


def test_epoch_start_trials_restore_first_and_weight_by_frames():
    state = {"w": 0.0}
    batches = [(10, 1.0), (30, 3.0), (10, 5.0)]  # (frames, loss increment)

    def train_step(batch):
        frames, inc = batch
        state["w"] += inc
        return state["w"], frames

    agreed = []
    # 512 frames a trial: 2 minibatches at size 256, 1 at 512
    trials = EpochStartTrials(train_step, lambda size: iter(batches), lambda: dict(state),
                              lambda saved: state.update(saved), frames=512,
                              agree=lambda loss: agreed.append(loss) or 2 * loss)
    state["w"] = 100.0  # what a previous trial left behind
    assert trials(256) == 2 * (10 * 1.0 + 30 * 4.0) / 40  # two minibatches, from w = 0
    assert trials(512) == 2 * 1.0 and agreed == [(10 * 1.0 + 30 * 4.0) / 40, 1.0]
    trials.restore()
    assert state == {"w": 0.0}
    with pytest.raises(TrainingError, match="no minibatch of size 0"):
        EpochStartTrials(train_step, lambda size: [], dict, print, frames=64)(0)
    with pytest.raises(ConfigError):
        EpochStartTrials(train_step, lambda size: [], dict, print, frames=0)


@pytest.mark.parametrize("base, minibatches", [(256, 10), (128, 3), (64, 4)])
def test_every_trial_size_trains_on_the_same_frames(base, minibatches):
    """CNTK tries every size on the same number of samples: a trial at a larger size takes fewer
    minibatches, never more data (the bias a fixed count of minibatches had toward large sizes)."""
    seen: dict[int, int] = {}

    def batches_at(size):
        return iter([size] * 1000)  # minibatches of exactly `size` frames

    def train_step(frames):
        seen[current] = seen.get(current, 0) + frames
        return 1.0, frames

    trials = EpochStartTrials(train_step, batches_at, dict, lambda s: None, frames=minibatches * base)
    for current in trial_sizes(base, 2 * base):  # base, base x sqrt(2)^k ... up to 4 x base
        trials(current)
    budget = minibatches * base
    assert seen[base] == budget
    for size, frames in seen.items():
        # round(budget / size) minibatches: within half a minibatch of the budget, at least one
        assert abs(frames - budget) <= size / 2 and frames >= size
    assert trials.minibatches_at(2 * base) == max(1, round(minibatches / 2))


def test_onebit_config_switch_is_validated():
    cfg = load_config(None, ["strategy.name=onebit", "strategy.auto_batch_size=true",
                             "strategy.batch_search_minibatches=4"])
    assert cfg.strategy.auto_batch_size is True and cfg.strategy.batch_search_minibatches == 4
    assert OneBitConfig().auto_batch_size is False
    for bad in ({"auto_batch_size": "yes"}, {"batch_search_minibatches": 0},
                {"batch_search_minibatches": 2.5}):
        with pytest.raises(ConfigError, match=rf"^strategy\.{next(iter(bad))}: expected"):  # the key as written
            OneBitConfig(**bad)


# ------------------------------------------------------------------- real model, real sampler

@pytest.fixture(scope="module")
def tone_corpus(tmp_path_factory):
    from asrdist.cli import main
    from tests.support.corpus_fixture import make_tone_corpus

    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus")
    assert main(["features", str(path)]) == 0
    return path


def _learner(corpus, tmp_path):
    """Model, optimizer (momentum: optimizer state matters), onebit strategy (residuals matter)
    and the Trainer, as one learner of a run."""
    from asrdist.data.samplers import FrameSampler
    from asrdist.optim.build import build_optimizer
    from asrdist.parallel.base import LearnerContext
    from asrdist.parallel.onebit import OneBitStrategy
    from asrdist.train import checkpoint as ckpt
    from asrdist.run.prepare import build_targets, frame_labels
    from asrdist.run.task import SpeechTask
    from asrdist.train.loop import LoopConfig
    from asrdist.train.trainer import Trainer, TrainerHooks

    torch.set_num_threads(1)
    cfg = load_config("configs/default.yaml", [f"data.corpus={corpus}", "model.hidden_dim=32",
                                               "model.hidden_layers=1", "optim.warmup_steps=0",
                                               "optim.lr=0.05", "data.batch_size=128"])
    torch.manual_seed(0)
    targets = build_targets(corpus, cfg, "frame")
    task = SpeechTask(cfg, targets, 0, 1)
    labels = frame_labels(task.train_dir, targets)

    def sampler_at(size: int, epoch: int):
        s = FrameSampler(task.store, labels, batch_size=size, context=cfg.model.context, seed=cfg.seed)
        s.set_epoch(epoch)
        return s

    model = task.model
    optimizer = build_optimizer(cfg.optim, model.parameters())
    strategy = OneBitStrategy(OneBitConfig())
    ctx = LearnerContext()
    strategy.setup(model, optimizer, ctx)
    trainer = Trainer(model, optimizer, strategy, sampler_at(128, 0), TrainerHooks(loss_fn=task.loss,
                      lr_at=lambda step, epoch: cfg.optim.lr), ctx, tmp_path, LoopConfig(epochs=1, progress=False))

    def save_state():
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(),
                "strategy": strategy.state_dict(), "rng": ckpt.rng_state()}

    def load_state(state):
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        strategy.load_state_dict(state["strategy"])
        ckpt.set_rng_state(state["rng"])

    return trainer, sampler_at, save_state, load_state


def test_search_on_the_tone_corpus_restores_the_epoch_start_between_trials(tone_corpus, tmp_path):
    trainer, sampler_at, save_state, load_state = _learner(tone_corpus, tmp_path)
    for batch in trainer.sampler:  # epoch 0 at the configured size
        trainer.train_step(batch)
    start = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    residuals = [r.clone() for r in trainer.strategy.state_dict()["residuals"]]
    trials = EpochStartTrials(trainer.train_step, lambda size: sampler_at(size, 1), save_state, load_state,
                              frames=3 * 128)  # 3 minibatches at the base size
    log: list = []
    chosen = search_batch_size(trials, 128, 128, log=log)
    sizes = [s for s, _ in log]
    assert sizes == trial_sizes(128, 128)[:len(sizes)] and sizes[0] == 128
    assert chosen == _reference_choice(log)
    assert len({loss for _, loss in log}) == len(log)  # the sizes really trained differently
    # a trial repeated after others gives the identical loss: everything was restored
    for size, loss in log:
        assert trials(size) == loss
    trials.restore()
    for k, v in trainer.model.state_dict().items():
        assert torch.equal(v, start[k]), k
    for before, after in zip(residuals, trainer.strategy.state_dict()["residuals"]):
        assert torch.equal(before, after)
    # from the restored state the base trial repeats; run again without a restore, it does not
    for expected_same in (True, False):
        losses = [trainer.train_step(b)[0] for _, b in zip(range(3), sampler_at(128, 1))]
        assert (sum(loss * 128 for loss in losses) / 384 == log[0][1]) is expected_same
