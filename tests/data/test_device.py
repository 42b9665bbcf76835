"""The device plumbing: a learner computes on its context's device (its own GPU under NCCL, the
CPU under gloo) and every minibatch follows the model there. The CUDA test runs where CUDA is."""
from __future__ import annotations

import json

import pytest
import torch

from asrdist.cli import main
from asrdist.cluster.process_group import JobEnv, device_for_backend, start_learner
from asrdist.data.batch import Batch
from tests.support.corpus_fixture import make_tone_corpus

TINY = ["model.hidden_dim=32", "model.hidden_layers=1", "data.batch_size=64", "train.log_every=10"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus", utterances_per_speaker=10, speakers=4)
    assert main(["features", str(path)]) == 0
    return path


def test_the_backend_picks_the_device():
    assert device_for_backend("gloo", 3) == torch.device("cpu")
    one = start_learner(JobEnv(0, 1, 0, 1), seed=0, timeout=__import__("datetime").timedelta(seconds=5))
    assert one.device == (torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu"))


def test_every_minibatch_goes_to_the_models_device(corpus, tmp_path, monkeypatch):
    moved = []
    original = Batch.to

    def recording_to(self, device, non_blocking=False):
        moved.append(torch.device(device))
        return original(self, device, non_blocking)

    monkeypatch.setattr(Batch, "to", recording_to)
    out = tmp_path / "run"
    assert main(["train", "configs/default.yaml", *TINY, "--data", str(corpus), "--epochs", "1",
                 "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    device = summary["comm"]["per_learner"][0]["device"]
    assert moved and all(str(d) == device for d in moved)
    assert len(moved) == summary["steps"]


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_learner_trains_on_the_gpu(corpus, tmp_path):
    out = tmp_path / "run"
    assert main(["train", "configs/default.yaml", *TINY, "--data", str(corpus), "--epochs", "1",
                 "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["comm"]["per_learner"][0]["device"] == "cuda:0"
    assert summary["final"]["frame_accuracy"] > 0.3
