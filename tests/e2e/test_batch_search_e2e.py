"""Onebit's automatic minibatch-size search wired into `asrdist train`: two learners search at the
start of every epoch after the first, train the epoch at the chosen size, and a resumed run
rebuilds its sampler at the searched size."""
from __future__ import annotations

import json
import math
from pathlib import Path

import pytest

from asrdist.cli import main
from asrdist.config import load_config
from asrdist.errors import ConfigError
from asrdist.optim.batch_search import round_to_multiple, trial_sizes
from asrdist.optim.build import OptimConfig
from asrdist.optim.schedules import LRSchedule
from asrdist.parallel.base import LearnerContext
from asrdist.run.learner import batch_search_hooks
from asrdist.train.metrics import read_metrics
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow  # end to end: two learners through `asrdist train`

ARGS = ["strategy.auto_batch_size=true", "strategy.batch_search_minibatches=3", "data.batch_size=128",
        "model.hidden_dim=32", "model.hidden_layers=1", "optim.warmup_steps=0", "train.threads=1"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus")
    assert main(["features", str(path)]) == 0
    return path


def _check_searches(run: Path, epochs: int) -> list[dict]:
    records = read_metrics(run)
    searches = [r for r in records if r["kind"] == "batch_search"]
    assert [r["epoch"] for r in searches] == list(range(2, epochs + 1))  # each epoch after the first
    previous = 128
    for r in searches:
        sizes = [size for size, _ in r["trials"]]
        assert r["previous"] == previous
        assert sizes == trial_sizes(128, previous)[:len(sizes)]
        assert sizes[0] == max(128, round_to_multiple(previous / 2))  # from half the last choice (CNTK)
        # the rule of batch_search: the largest size before the first loss above 1.01 x the first
        base = r["trials"][0][1]
        expected = sizes[0]
        for size, loss in r["trials"][1:]:
            if not (math.isfinite(loss) and loss <= 1.01 * base):
                break
            expected = size
        assert r["chosen"] == expected
        assert r["chosen"] % 64 == 0 and 128 <= r["chosen"] <= 2 * previous
        previous = r["chosen"]
    return searches


def test_two_learners_search_the_batch_size_every_epoch_and_resume_at_the_searched_size(corpus, tmp_path):
    # plain SGD at lr 0.1. Each trial trains on the same frames (CNTK): on this corpus the epoch-1
    # search keeps 128 (it picked 256 while trials counted minibatches and the larger sizes saw more
    # data), so the resume below no longer has to rebuild its sampler at another size here
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/onebit.yaml"), *ARGS, "optim.lr=0.1", "optim.momentum=0", "optim.nesterov=false", "--learners", "2",
                 "--data", str(corpus), "--epochs", "2", "--out", str(run), "--no-progress"]) == 0
    _check_searches(run, 2)
    assert main(["train", str(ROOT / "configs/onebit.yaml"), "--resume", str(run), "--epochs", "3",
                 "--no-progress"]) == 0
    searches = _check_searches(run, 3)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["learners"] == 2 and summary["strategy"] == "onebit" and summary["epochs"] == 3
    # each epoch ran at its size: epoch 0 at 128, later ones at the size their search chose
    steps_at = [r["step"] for r in read_metrics(run) if r["kind"] == "epoch"]
    epoch_steps = [step - (steps_at[i - 1] if i else 0) for i, step in enumerate(steps_at)]
    assert len(epoch_steps) == 3 and sum(epoch_steps) == summary["steps"]
    sizes = [128] + [r["chosen"] for r in searches]
    assert summary["train_frames"] == sum(n * b for n, b in zip(epoch_steps, sizes))
    # the learning-rate clock counts minibatches at the configured size (128), so warmup and
    # decay follow the data seen, not the number of (larger) minibatches
    from asrdist.train.checkpoint import load_learner
    loop = load_learner(run, 0, 2)["loop"]
    assert loop["schedule_step"] == pytest.approx(sum(n * b / 128 for n, b in zip(epoch_steps, sizes)))
    # (with a searched size above 128 the clock runs ahead of the step count; this corpus keeps 128 now)
    # the search's traffic is not counted: one exchange per real step on every learner
    for p in summary["comm"]["per_learner"]:
        assert p["exchanges"] == summary["steps"] and p["frames"] == summary["train_frames"] // 2


def test_bad_sizes_for_the_search_are_config_errors():
    with pytest.raises(ConfigError, match="strategy.auto_batch_size") as err:  # refused when the config loads
        load_config(ROOT / "configs/onebit.yaml", ["data.batch_size=96", "strategy.auto_batch_size=true"])
    assert "\n" not in str(err.value)
    cfg = load_config(ROOT / "configs/onebit.yaml", ["data.batch_size=128", "strategy.auto_batch_size=true"])
    with pytest.raises(ConfigError, match="strategy.auto_batch_size") as err:  # and by the learners' own count
        batch_search_hooks(cfg, None, LearnerContext(world_size=3))
    assert "\n" not in str(err.value)


def test_schedule_anneals_by_the_given_epoch():
    cfg = OptimConfig(lr=1.0, anneal_after_epoch=1, anneal_factor=0.5)
    schedule = LRSchedule(cfg, steps_per_epoch=10, total_epochs=4, global_batch=cfg.reference_batch)
    assert [schedule.lr_at(s) for s in (0, 9, 10, 25)] == [1.0, 1.0, 0.5, 0.25]
    assert [schedule.lr_at(s, e) for s, e in ((0, 0), (25, 0), (3, 1), (3, 3))] == [1.0, 1.0, 0.5, 0.125]
