"""`train.accumulate` and `train.precision` end to end: `asrdist train` (one learner, in-process) on
the tone corpus. Four micro-batches a step train the model one batch does (model.pt within float
rounding); bf16 trains to a loss near fp32's; bad values stop before a run directory exists."""
from __future__ import annotations

import json

import pytest
import torch

from tests.support.tone_runs import train_on_tones

pytestmark = pytest.mark.slow  # four trainings end to end


def _train(corpus, out, *extra) -> int:
    return train_on_tones(corpus, out, *extra, epochs=1)


def _final(run) -> dict:
    return json.loads((run / "summary.json").read_text())["final"]


def _model(run) -> dict:
    return torch.load(run / "model.pt", map_location="cpu", weights_only=True)["model"]


@pytest.fixture(scope="module")
def runs(tone_corpus, tmp_path_factory):
    out = {}
    # two steps for the comparison of the models: early training here is at the edge of stability,
    # where a difference of float rounding (4e-9 after a step, another sum order of the gradient)
    # grows about 8x a step (1.5e-5 after 5 steps, 2e-3 after the epoch's 13)
    for name, extra in (("plain", ()), ("bf16", ("train.precision=bf16",)), ("two_steps", ("train.max_steps=2",)),
                        ("accumulate", ("train.max_steps=2", "train.accumulate=4"))):
        out[name] = tmp_path_factory.mktemp(name) / "run"
        assert _train(tone_corpus, out[name], *extra) == 0
    return out


def test_four_micro_batches_train_the_model_one_batch_does(runs):
    plain, accumulated = _model(runs["two_steps"]), _model(runs["accumulate"])
    assert plain.keys() == accumulated.keys()
    for key in plain:
        torch.testing.assert_close(accumulated[key], plain[key], rtol=0, atol=1e-6, msg=key)
    assert max((accumulated[k] - _model(runs["plain"])[k]).abs().max() for k in plain) > 1e-3  # (it trained 2 steps)


def test_bf16_trains_near_fp32(runs):
    bf16, fp32 = _final(runs["bf16"]), _final(runs["plain"])
    assert bf16["train_loss"] == pytest.approx(fp32["train_loss"], rel=0.05)
    assert bf16["train_loss"] != fp32["train_loss"]  # it did run in bf16
    assert all(t.dtype in (torch.float32, torch.int64) for t in _model(runs["bf16"]).values())


@pytest.mark.parametrize("bad", ["train.accumulate=0", "train.precision=fp8"])
def test_bad_values_stop_with_one_line_and_no_run_directory(tone_corpus, tmp_path, capsys, bad):
    assert _train(tone_corpus, tmp_path / "run", bad) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and bad.split("=")[0] in err[0], err
    assert not (tmp_path / "run").exists()
