"""`asrdist eval` loads a run's model strictly, in the architecture the learners trained.

A loose load (strict=False into a plain model) would score an NG-SGD LSTM run, whose nn.LSTM
became an AffineLSTM with other state_dict keys, with random LSTM weights: every key must match.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F

from asrdist.cli import main
from asrdist.config import config_from_tree
from asrdist.run.evaluate import load_run_model
from asrdist.optim.ng_layers import AffineLSTM, apply_natural_gradient
from asrdist.train.checkpoint import save_model
from asrdist.data.targets import Targets
from asrdist.run.prepare import save_targets
from asrdist.run.task import build_model_for
from tests.support.corpus_fixture import make_tone_corpus

INPUT_DIM, CLASSES, CHUNK = 6, 5, 7
TARGETS = Targets(kind="monophone", phones=[f"p{i}" for i in range(CLASSES)], silence_id=0, num_classes=CLASSES)


def _config(name: str, natural_gradient: bool):
    return config_from_tree({"model": {"name": name, "hidden_layers": 2, "hidden_dim": 8},
                             "optim": {"natural_gradient": natural_gradient}, "data": {"batch_size": 4}})


def _inputs(kind: str) -> tuple:
    gen = torch.Generator().manual_seed(3)
    if kind == "frame":
        return (torch.randn(8, INPUT_DIM * 11, generator=gen),)
    x = torch.randn(4, CHUNK, INPUT_DIM, generator=gen)
    return (x,) if kind == "chunk" else (x, torch.full((4,), CHUNK))


def _trained_run(run_dir: Path, name: str, natural_gradient: bool = True) -> torch.nn.Module:
    """A few NG-SGD steps on random data, then model.pt and targets.pt as the trainer writes them."""
    cfg = _config(name, natural_gradient)
    model = build_model_for(cfg, INPUT_DIM, TARGETS)
    if natural_gradient:
        apply_natural_gradient(model, convert_lstm=model.kind == "chunk", seed=cfg.seed)
    opt = torch.optim.SGD(model.parameters(), lr=0.5)
    inputs = _inputs(model.kind)
    for _ in range(3):
        out = model(*inputs)
        out = out[0] if isinstance(out, tuple) else out
        F.cross_entropy(out.reshape(-1, out.shape[-1]), torch.zeros(out.shape[:-1].numel(), dtype=torch.long)).backward()
        opt.step()
        opt.zero_grad()
    run_dir.mkdir(parents=True, exist_ok=True)
    save_targets(run_dir, TARGETS)
    save_model(run_dir / "model.pt", model, {"config": cfg.to_dict(), "input_dim": INPUT_DIM})
    return model.eval()


@pytest.mark.parametrize("name", ["lstm", "blstm", "dnn", "ctc"])
def test_eval_loads_exactly_the_trained_natural_gradient_weights(tmp_path, name):
    trained = _trained_run(tmp_path / "run", name)
    torch.manual_seed(1234)  # a fresh build's random weights differ from the trained ones
    loaded, cfg, _, input_dim = load_run_model(tmp_path / "run")
    assert cfg.optim.natural_gradient and input_dim == INPUT_DIM
    if name in ("lstm", "blstm"):
        assert isinstance(loaded.lstm, AffineLSTM)
    want, got = trained.state_dict(), loaded.state_dict()
    assert list(got) == list(want)
    for key in want:
        assert torch.equal(got[key], want[key]), key
    with torch.no_grad():
        a, b = trained(*_inputs(trained.kind)), loaded(*_inputs(loaded.kind))
    a, b = (a[0], b[0]) if isinstance(a, tuple) else (a, b)
    assert torch.equal(a, b)


def _one_error_line(capsys) -> str:
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("asrdist: error:"), err
    return err[0]


def test_model_from_another_architecture_is_a_one_line_error(tmp_path, capsys):
    """A plain-LSTM state under a config that says natural gradient: the first missing key is named."""
    run = tmp_path / "run"
    _trained_run(run, "lstm", natural_gradient=False)
    blob = torch.load(run / "model.pt", weights_only=False)
    blob["config"] = _config("lstm", natural_gradient=True).to_dict()
    torch.save(blob, run / "model.pt")
    assert main(["eval", str(run), "--data", str(tmp_path)]) != 0
    line = _one_error_line(capsys)
    assert str(run / "model.pt") in line and "missing key 'lstm.input_maps.0.weight'" in line, line
    assert not (run / "eval.json").exists()


def test_unexpected_and_misshaped_keys_are_named(tmp_path, capsys):
    run = tmp_path / "run"
    _trained_run(run, "dnn")
    blob = torch.load(run / "model.pt", weights_only=False)
    blob["model"]["extra.weight"] = torch.zeros(2)
    torch.save(blob, run / "model.pt")
    assert main(["eval", str(run), "--data", str(tmp_path)]) != 0
    line = _one_error_line(capsys)
    assert str(run / "model.pt") in line and "unexpected key 'extra.weight'" in line, line

    del blob["model"]["extra.weight"]
    first = next(iter(blob["model"]))
    blob["model"][first] = blob["model"][first][:1]
    torch.save(blob, run / "model.pt")
    assert main(["eval", str(run), "--data", str(tmp_path)]) != 0
    line = _one_error_line(capsys)
    assert str(run / "model.pt") in line and f"key '{first}' has shape" in line, line


@pytest.mark.parametrize("content", [b"not a torch file", b""])
def test_corrupt_model_file_is_a_one_line_error(tmp_path, capsys, content):
    run = tmp_path / "run"
    _trained_run(run, "dnn")
    (run / "model.pt").write_bytes(content)
    assert main(["eval", str(run), "--data", str(tmp_path)]) != 0
    line = _one_error_line(capsys)
    assert str(run / "model.pt") in line and "not a readable model file" in line, line


@pytest.mark.slow
def test_ngsgd_lstm_run_evaluates_its_trained_model(tmp_path):
    """End to end: `asrdist eval` on the validation split scores what the run's own final
    validation scored (the same model, the same split)."""
    corpus = make_tone_corpus(tmp_path / "corpus", utterances_per_speaker=4)
    run = tmp_path / "run"
    assert main(["train", "configs/lstm.yaml", "optim.natural_gradient=true", "data.batch_size=16",
                 "model.hidden_dim=8", "model.hidden_layers=1", "train.max_steps=6", "train.log_every=2",
                 "train.threads=1", "--data", str(corpus), "--epochs", "1", "--out", str(run),
                 "--no-progress"]) == 0
    final = json.loads((run / "summary.json").read_text())["final"]
    assert main(["eval", str(run), "--data", str(corpus / "valid")]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["frame_accuracy"] == final["frame_accuracy"]
    assert result["loss"] == pytest.approx(final["valid_loss"], rel=1e-6)
