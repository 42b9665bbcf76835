"""Model averaging end to end through `asrdist train` (issue 5, DESIGN.md §5.4), 2 learners.

On a tone corpus, with the recipes' own optimizers (configs/default.yaml for `sync`,
configs/averaging.yaml for averaging, shrunk to a tiny DNN): averaging + NG-SGD ends at most 3%
relative above `sync`, averaging + plain SGD (same recipe, natural_gradient and max_change off)
ends at least twice NG-SGD averaging's error, and an averaging + NG-SGD run resumed from a mid-run
checkpoint ends bitwise equal to the uninterrupted run. (Plain-SGD averaging against `sync` is a
toss-up on this easy task, so it is not asserted; on the built-in corpus it is clearly worse, see
scripts/experiment_averaging.sh.) Margins over run seeds 0-3 and a second corpus seed: NG-SGD
averaging 0.05-0.89 x sync's error, plain SGD 2.7-16 x NG-SGD's.

The metric is frame error on the valid speaker (3,248 frames), not PER: the ~240 valid phones
make one phone error 0.4% absolute (3% relative of a ~1% PER is a fraction of one phone), and the
31 phones the tone corpus never uses get floored priors (1e-8) that make the hybrid decoder insert
them, so PER there measures the floor, not the model. Four speakers put the valid speaker's pitch
(x1.03) next to the training speakers' (x1.06, x1.09): errors measure training, not extrapolation.
"""
from __future__ import annotations

import json
import shutil

import pytest
import torch

from asrdist.cli import main

pytestmark = pytest.mark.slow  # four 2-learner launches through torch.distributed.run

TINY = ["model.hidden_dim=64", "model.hidden_layers=2", "data.batch_size=128", "train.log_every=10"]
SYNC = ["configs/default.yaml", "--strategy", "sync", "optim.warmup_steps=0", "optim.anneal_after_epoch=null"]
# 53 steps per epoch per learner; an average every 20 local steps (1280 frames of 64)
AVERAGING = ["configs/averaging.yaml", "strategy.average_every=1280"]
PLAIN_SGD = ["optim.natural_gradient=false"]  # max-change on in both arms: only NG-SGD differs
CHECKPOINT_EVERY = 31  # the last two checkpoints kept: step 93 (mid epoch 2, mid interval) and 106


@pytest.fixture(scope="module")
def corpus(tone_corpus):
    return tone_corpus


def _train(corpus, out, recipe, *extra) -> dict:
    assert main(["train", *recipe, *TINY, *extra, "--data", str(corpus), "--learners", "2", "--epochs", "2",
                 "--out", str(out), "--no-progress"]) == 0
    return json.loads((out / "summary.json").read_text())


def _frame_error(summary: dict) -> float:
    return 1.0 - summary["final"]["frame_accuracy"]


@pytest.fixture(scope="module")
def ngsgd_run(corpus, tmp_path_factory):
    out = tmp_path_factory.mktemp("averaging") / "ngsgd"
    return out, _train(corpus, out, AVERAGING, f"train.checkpoint_every={CHECKPOINT_EVERY}")


@pytest.mark.timeout(900)  # three 2-learner trainings (and the module's fixture's): past 300 s on a loaded machine
def test_ngsgd_averaging_keeps_up_with_sync_plain_sgd_does_not(corpus, ngsgd_run, tmp_path):
    sync = _train(corpus, tmp_path / "sync", SYNC)
    plain = _train(corpus, tmp_path / "plain", AVERAGING, *PLAIN_SGD)
    ngsgd = ngsgd_run[1]
    assert ngsgd["strategy"] == plain["strategy"] == "averaging" and sync["strategy"] == "sync"
    errors = {name: _frame_error(s) for name, s in (("sync", sync), ("ngsgd", ngsgd), ("plain", plain))}
    assert errors["sync"] < 0.05, errors  # everything learned the task; the comparison means something
    assert errors["ngsgd"] <= 1.03 * errors["sync"], errors
    assert errors["plain"] >= 2.0 * errors["ngsgd"] and errors["plain"] - errors["ngsgd"] >= 0.003, errors
    # averaging sends one model per average (~5 per run), sync one gradient per step (106)
    assert 0 < ngsgd["comm"]["bytes_sent"] < sync["comm"]["bytes_sent"] / 10


def test_averaging_ngsgd_resumes_exactly(corpus, ngsgd_run, tmp_path):
    full_dir = ngsgd_run[0]
    resumed = tmp_path / "resumed"
    shutil.copytree(full_dir, resumed)
    checkpoints = sorted(p for p in (resumed / "checkpoints").glob("step-*"))
    middle, last = checkpoints[-2], checkpoints[-1]
    assert (middle.name, last.name) == ("step-00000093", "step-00000106")
    state = torch.load(middle / "rank-1.pt", weights_only=False)
    # a resume point inside an epoch, between two averages, with natural-gradient statistics
    assert state["sampler"]["position"] > 0 and state["strategy"]["samples_since_average"] > 0
    assert state["extra"]["natural_gradient"] and state["strategy"]["num_averages"] >= 4
    shutil.rmtree(last)  # as if the run had stopped right after step 93
    (resumed / "checkpoints" / "latest").write_text(middle.name + "\n")
    for name in ("model.pt", "summary.json"):
        (resumed / name).unlink()
    assert main(["train", "configs/averaging.yaml", "--resume", str(resumed), "--no-progress"]) == 0
    full = torch.load(full_dir / "model.pt", weights_only=False)["model"]
    again = torch.load(resumed / "model.pt", weights_only=False)["model"]
    assert full.keys() == again.keys()
    for key in full:
        assert torch.equal(full[key], again[key]), key
