"""train.average_last end to end: `asrdist train` (one learner, in-process) on the tone corpus writes
model.pt as the mean of the last epochs' models, summary.json says which and keeps the unaveraged
figures, averaging changes nothing else, and an interrupted run resumed gives the same model.pt."""
from __future__ import annotations

import json

import pytest
import torch

from asrdist.cli import main
from asrdist.train import checkpoint as ckpt
from asrdist.train.metrics import read_metrics
from tests.support.tone_runs import FAST, train_on_tones

pytestmark = pytest.mark.slow  # three trainings end to end


def _train(corpus, out, *extra) -> int:
    return train_on_tones(corpus, out, *extra, epochs=3)


def _model(path):
    return torch.load(path, map_location="cpu", weights_only=False)["model"]


@pytest.fixture(scope="module")
def averaged(tone_corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("averaged") / "run"
    assert _train(tone_corpus, run, "train.average_last=2") == 0
    return run


@pytest.fixture(scope="module")
def plain(tone_corpus, tmp_path_factory):
    run = tmp_path_factory.mktemp("plain") / "run"
    assert _train(tone_corpus, run) == 0
    return run


def test_model_pt_is_the_mean_of_the_last_two_epochs_models(averaged):
    summary = json.loads((averaged / "summary.json").read_text())
    final = summary["final"]
    assert final["averaged_epochs"] == [2, 3]
    # the checkpoints kept (KEEP_LAST = 2, none inside an epoch) are the ends of epochs 2 and 3
    ends = ckpt.complete_checkpoints(averaged)
    loops = [torch.load(d / "rank-0.pt", weights_only=False)["loop"] for d in ends]
    assert [loop["epoch"] for loop in loops] == [2, 3]
    first, last = (_model(d / "rank-0.pt") for d in ends)
    saved = _model(averaged / "model.pt")
    assert set(saved) == set(last)
    for key, value in last.items():
        expected = ((first[key].double() + value.double()) / 2).to(value.dtype) if value.is_floating_point() else value
        assert torch.equal(saved[key], expected), key
    assert any(not torch.equal(saved[k], last[k]) for k in last if last[k].is_floating_point())
    # beside the average's figures, the last epoch's model alone: its validation at the last epoch
    unaveraged, history = final["unaveraged"], summary["history"][-1]
    assert set(unaveraged) >= {"valid_loss", "per", "frame_accuracy"}
    assert unaveraged["valid_loss"] == pytest.approx(history["valid_loss"], rel=1e-6)
    assert unaveraged["per"] == pytest.approx(history["per"], rel=1e-6)
    assert final["valid_loss"] != unaveraged["valid_loss"]


def test_without_averaging_the_same_training_ends_in_the_last_epochs_model(averaged, plain):
    # the default (1): the training is the averaged run's, and model.pt its last epoch's model bit for bit
    last = _model(ckpt.latest_step_dir(averaged) / "rank-0.pt")
    plain_final = json.loads((plain / "summary.json").read_text())["final"]
    assert "averaged_epochs" not in plain_final and "unaveraged" not in plain_final
    plain_model = _model(plain / "model.pt")
    plain_last = _model(ckpt.latest_step_dir(plain) / "rank-0.pt")
    for key, value in last.items():
        assert torch.equal(plain_model[key], value) and torch.equal(plain_last[key], value), key
    unaveraged = json.loads((averaged / "summary.json").read_text())["final"]["unaveraged"]
    assert plain_final["valid_loss"] == pytest.approx(unaveraged["valid_loss"], rel=1e-6)


@pytest.mark.timeout(900)  # two trainings one after another on a loaded machine (a hang still ends the test)
def test_a_run_cut_inside_the_window_and_resumed_writes_the_same_model(tone_corpus, averaged, plain, tmp_path):
    cut = tmp_path / "cut"
    epoch_steps = [r["step"] for r in read_metrics(plain) if r["kind"] == "epoch"]
    assert _train(tone_corpus, cut, "train.average_last=2", f"train.max_steps={epoch_steps[1] + 2}") == 0
    assert json.loads((cut / "summary.json").read_text())["final"]["averaged_epochs"] == [2, 3]
    assert main(["train", "configs/default.yaml", "--resume", str(cut), "train.max_steps=0", "--no-progress"]) == 0
    resumed = json.loads((cut / "summary.json").read_text())
    assert resumed["final"]["averaged_epochs"] == [2, 3] and resumed["starts"] == 2
    resumed_model, saved = _model(cut / "model.pt"), _model(averaged / "model.pt")
    for key, value in saved.items():
        assert torch.equal(resumed_model[key], value), key


def test_two_asynchronous_learners_average_their_consensus_models(tone_corpus, tmp_path):
    # adpsgd: the learners' models differ, so each kept model is their consensus, a collective; epoch
    # 0 does not validate (every 2 epochs), so its epoch end takes the consensus for the average alone
    run = tmp_path / "run"
    assert main(["train", "configs/default.yaml", *FAST, "train.average_last=2", "train.validate_every_epochs=2",
                 "--strategy", "adpsgd", "--learners", "2", "--data", str(tone_corpus), "--epochs", "2",
                 "--out", str(run), "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["final"]["averaged_epochs"] == [1, 2] and "per" in summary["final"]["unaveraged"]
    assert [("per" in h) for h in summary["history"]] == [False, True]
    kept = [torch.load(run / "checkpoints" / "epoch-0002" / f"rank-{r}.pt", weights_only=False)["epoch_average"]["kept"]
            for r in (0, 1)]
    assert [k["epoch"] for k in kept[0]] == [k["epoch"] for k in kept[1]] == [0]
    own = [torch.load(run / "checkpoints" / "epoch-0001" / f"rank-{r}.pt", weights_only=False)["model"] for r in (0, 1)]
    assert any(not torch.equal(own[0][k], own[1][k]) for k in own[0])  # the learners' models differed
    for key, value in kept[0][0]["model"].items():
        assert torch.equal(kept[1][0]["model"][key], value), key  # every learner kept the same consensus
