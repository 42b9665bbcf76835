"""The one trainer end to end on a tiny tone corpus: learning, outputs, exact resume, errors."""
from __future__ import annotations

import json

import pytest
import torch

from asrdist.cli import main
from asrdist.train.checkpoint import latest_step_dir
from asrdist.train.metrics import read_metrics
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow  # end to end: `asrdist train` on a tone corpus

FAST = ["train.log_every=5", "data.batch_size=128", "model.hidden_dim=64", "model.hidden_layers=2",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus")
    assert main(["features", str(path)]) == 0
    return path


def _train(corpus, out, *extra, epochs=3):
    return main(["train", "configs/default.yaml", *FAST, *extra, "--data", str(corpus),
                 "--epochs", str(epochs), "--out", str(out), "--no-progress"])


@pytest.fixture(scope="module")
def full_run(corpus, tmp_path_factory):
    """Three epochs, checkpointed every 7 steps: the run whose outputs are checked, and the
    uninterrupted reference of the resume test (trained once for both)."""
    run = tmp_path_factory.mktemp("full") / "run"
    assert _train(corpus, run, "train.checkpoint_every=7") == 0
    return run


def test_dnn_learns_and_writes_run_outputs(corpus, full_run):
    run = full_run
    summary = json.loads((run / "summary.json").read_text())
    for key in ("strategy", "learners", "model", "parameters", "epochs", "train_frames",
                "frames_per_second", "wall_seconds", "final", "comm"):
        assert key in summary
    final = summary["final"]
    assert set(final) >= {"train_loss", "valid_loss", "frame_accuracy", "per"}
    assert summary["comm"]["bytes_sent"] == 0 and summary["learners"] == 1
    # 9 classes of tones: chance is far below these
    assert final["frame_accuracy"] > 0.8, final
    assert final["per"] < 0.35, final
    assert summary["history"][-1]["train_loss"] < summary["history"][0]["train_loss"]
    for name in ("report.png", "metrics.jsonl", "config.yaml", "env.json", "model.pt", "targets.pt"):
        assert (run / name).is_file(), name
    # eval on held-out speakers writes eval.json with the contract keys
    assert main(["eval", str(run), "--data", str(corpus)]) == 0
    ev = json.loads((run / "eval.json").read_text())
    assert {"frame_accuracy", "per", "utterances"} <= set(ev) and ev["utterances"] == 12


def test_resume_reproduces_uninterrupted_run(corpus, full_run, tmp_path):
    assert _train(corpus, tmp_path / "cut", "train.checkpoint_every=7", "train.max_steps=17") == 0
    assert latest_step_dir(tmp_path / "cut").name == "step-00000017"
    before = torch.load(latest_step_dir(tmp_path / "cut") / "rank-0.pt", weights_only=False)["loop"]
    assert main(["train", "configs/default.yaml", "--resume", str(tmp_path / "cut"),
                 "train.max_steps=0", "--no-progress"]) == 0
    # every validation's wall time counts from the job's training start, over both starts
    history = json.loads((tmp_path / "cut" / "summary.json").read_text())["history"]
    walls = [h["wall_seconds"] for h in history]
    assert len(walls) == 3 and walls == sorted(walls) and len(set(walls)) == 3
    assert walls[:len(before["history"])] == [h["wall_seconds"] for h in before["history"]]
    assert all(w > before["wall_seconds"] for w in walls[len(before["history"]):])
    epochs = [r for r in read_metrics(tmp_path / "cut") if r["kind"] == "epoch"]
    assert [r["wall_seconds"] for r in epochs] == walls and all(r["per"] is not None for r in epochs)
    full = torch.load(full_run / "model.pt", weights_only=False)["model"]
    resumed = torch.load(tmp_path / "cut" / "model.pt", weights_only=False)["model"]
    for k in full:
        assert torch.equal(full[k], resumed[k]), k


def test_same_seed_same_parameters(corpus, tmp_path):
    assert _train(corpus, tmp_path / "a", epochs=1) == 0
    assert _train(corpus, tmp_path / "b", epochs=1) == 0
    a = torch.load(tmp_path / "a" / "model.pt", weights_only=False)["model"]
    b = torch.load(tmp_path / "b" / "model.pt", weights_only=False)["model"]
    assert all(torch.equal(a[k], b[k]) for k in a)


def test_nan_loss_is_a_clear_error(corpus, tmp_path, capsys):
    rc = _train(corpus, tmp_path / "nan", "optim.lr=1e30", "optim.nesterov=false", "optim.max_change=false", epochs=1)
    assert rc != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("asrdist: error:") and "loss is" in err[-1]


@pytest.mark.parametrize("override,needle", [
    ("model.widht=3", "model.widht: unknown config key"),
    ("optim.lr=fast", "optim.lr"),
    ("bogus.x=1", "bogus: unknown config section"),
    ("strategy.error_feedback=false", "strategy.error_feedback"),
])
def test_bad_config_names_the_key(corpus, tmp_path, capsys, override, needle):
    assert _train(corpus, tmp_path / "bad", override) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and needle in err[0], err
    assert not (tmp_path / "bad").exists()


@pytest.mark.parametrize("recipe,overrides,metric", [
    ("configs/lstm.yaml", ["data.batch_size=16", "model.hidden_dim=32", "model.hidden_layers=1"], "per"),
    ("configs/ctc.yaml", ["data.batch_size=1500", "model.hidden_dim=48", "model.hidden_layers=1",
                          "eval.beam=2"], "per"),
])
def test_lstm_and_ctc_train(corpus, tmp_path, recipe, overrides, metric):
    rc = main(["train", recipe, *overrides, "train.log_every=5", "optim.warmup_steps=0",
               "--data", str(corpus), "--epochs", "3", "--out", str(tmp_path / "run"), "--no-progress"])
    assert rc == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    history = summary["history"]
    assert history[-1]["train_loss"] < 0.8 * history[0]["train_loss"], history
    assert metric in summary["final"]
    assert 0.0 <= summary["final"][metric] < 1.5


def test_malformed_recipe_is_a_one_line_error(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("model: [\n")
    assert main(["train", str(recipe), "--out", str(tmp_path / "run")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "invalid YAML" in err[0], err
    assert not (tmp_path / "run").exists()


def test_a_yaml_syntax_error_names_its_line_and_where_the_construct_began(tmp_path, capsys):
    recipe = tmp_path / "bad.yaml"
    recipe.write_text("data:\n  batch_size: [256\ntrain:\n  epochs: 2\n")
    assert main(["train", str(recipe), "--out", str(tmp_path / "run")]) == 2
    assert capsys.readouterr().err.splitlines() == [
        f"asrdist: error: {recipe}:3: invalid YAML: expected ',' or ']', but got ':' "
        "(while parsing a flow sequence that starts at line 2)"]


def test_features_follow_the_recipe(tmp_path, capsys):
    """A recipe asking for per-speaker CMVN must not train on global-CMVN features: they are
    re-extracted with its settings, and the user is told; features that fit are left alone."""
    from asrdist.config import load_config
    from asrdist.features.store import FeatureStore
    from asrdist.run.prepare import ensure_features
    root = ROOT
    corpus = make_tone_corpus(tmp_path / "corpus")
    ensure_features(corpus, load_config(root / "configs/default.yaml", [f"data.corpus={corpus}"]), progress=False)
    assert "it has none" in capsys.readouterr().out
    ensure_features(corpus, load_config(root / "configs/default.yaml", [f"data.corpus={corpus}"]), progress=False)
    assert capsys.readouterr().out == ""
    other = load_config(root / "configs/default.yaml", [f"data.corpus={corpus}", "data.cmvn=speaker"])
    ensure_features(corpus, other, progress=False)
    assert "cmvn=speaker (train: its features have num_mel_bins=40, cmvn=global" in capsys.readouterr().out
    assert {FeatureStore(corpus / s).meta["cmvn"] for s in ("train", "valid", "test")} == {"speaker"}
