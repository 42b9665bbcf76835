"""A run directory is data (issue 59): a pickled object planted in a copy of a run (in model.pt, in a
checkpoint, in targets.pt) never runs. `eval`, `decode`, `align`, `train --resume` (1 and 2
learners) and `compare` refuse the file with one line naming it; files an older asrdist wrote
(numpy arrays, a pickled PhoneBigram) still load."""
from __future__ import annotations

import json
import pathlib
import random
import shutil
from pathlib import Path

import numpy as np
import pytest
import torch
import yaml

from asrdist.cli import main
from asrdist.errors import TrainingError
from asrdist.eval.decode import PhoneBigram
from asrdist.io.torch_data import load_data
from asrdist.run.prepare import load_targets
from asrdist.train import checkpoint as ckpt
from tests.support.corpus_fixture import RECIPE, TINY, tiny_run_with_checkpoints, tone_corpus_with_features

REFUSED = "holds objects other than tensors and plain data"


class Payload:
    """Unpickling it creates `marker`: what a planted object could do instead."""

    def __init__(self, marker: Path):
        self.marker = marker

    def __reduce__(self):
        return pathlib.Path.touch, (pathlib.Path(self.marker),)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    return tone_corpus_with_features(tmp_path_factory.mktemp("data") / "corpus")


@pytest.fixture(scope="module")
def finished(corpus, tmp_path_factory) -> Path:
    """A finished one-learner run with checkpoints at steps 2 and 4 (latest: step 4)."""
    return tiny_run_with_checkpoints(corpus, tmp_path_factory.mktemp("finished") / "run")


def _copy(finished: Path, tmp: Path, unfinished: bool = False, learners: int = 1, name: str = "run") -> Path:
    """A copy of the run; `unfinished`: without its end (a resume trains from step 4); `learners` 2:
    as a 2-learner sync run would have left it."""
    run = tmp / name
    shutil.copytree(finished, run)
    if unfinished:
        (run / "summary.json").unlink()
        (run / "model.pt").unlink()
    if learners == 2:
        tree = yaml.safe_load((run / "config.yaml").read_text())
        tree["train"]["learners"], tree["strategy"] = 2, {"name": "sync"}
        (run / "config.yaml").write_text(yaml.safe_dump(tree))
        for d in ckpt.complete_checkpoints(run):
            shutil.copy(d / "rank-0.pt", d / "rank-1.pt")
    return run


def _plant(path: Path, marker: Path) -> None:
    blob = torch.load(path, weights_only=False)  # the test's own file: made by asrdist just now
    blob["planted"] = Payload(marker)
    torch.save(blob, path)


def _latest(run: Path, rank: int = 0) -> Path:
    return ckpt.latest_step_dir(run) / f"rank-{rank}.pt"


def _refused(capsys, path: Path, marker: Path) -> None:
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and not line.startswith("[")]
    assert len(lines) == 1 and lines[0].startswith("asrdist: error: "), lines
    assert str(path) in lines[0] and REFUSED in lines[0], lines[0]
    assert not marker.exists(), "the planted payload ran"


def _command(name: str, run: Path, corpus: Path) -> list[str]:
    wav = sorted((corpus / "test" / "wav").glob("*.wav"))[0]
    return {"eval": ["eval", str(run), "--data", str(corpus / "test")],
            "decode": ["decode", str(run), str(wav)],
            "align": ["align", str(run), "--data", str(corpus), "--no-progress"],
            "resume": ["train", RECIPE, "--resume", str(run), "--no-progress"]}[name]


@pytest.mark.parametrize("command, planted", [
    ("eval", "model.pt"), ("eval", "targets.pt"), ("decode", "model.pt"), ("decode", "targets.pt"),
    ("align", "model.pt"), ("align", "targets.pt"), ("resume", "checkpoint"), ("resume", "targets.pt"),
])
def test_a_planted_payload_never_runs(finished, corpus, tmp_path, capsys, command, planted):
    run = _copy(finished, tmp_path, unfinished=command == "resume")
    path = _latest(run) if planted == "checkpoint" else run / planted
    marker = tmp_path / "payload-ran"
    _plant(path, marker)
    assert main(_command(command, run, corpus)) != 0
    _refused(capsys, path, marker)


def test_two_learners_refuse_a_planted_checkpoint_before_they_start(finished, corpus, tmp_path, capsys):
    """The launcher reads the checkpoint's pickle opcodes without running them: no learner starts
    (the quick loop's guard would fail this test if one did)."""
    run = _copy(finished, tmp_path, unfinished=True, learners=2)
    marker = tmp_path / "payload-ran"
    _plant(_latest(run, rank=1), marker)
    assert main(_command("resume", run, corpus)) != 0
    _refused(capsys, _latest(run, rank=1), marker)


@pytest.mark.slow
def test_two_learners_refuse_a_planted_targets_file_inside_the_learners(finished, corpus, tmp_path, capsys):
    """targets.pt is read inside each learner process: refused there, one line naming it."""
    run = _copy(finished, tmp_path, unfinished=True, learners=2)
    marker = tmp_path / "payload-ran"
    _plant(run / "targets.pt", marker)
    assert main(_command("resume", run, corpus)) != 0
    _refused(capsys, run / "targets.pt", marker)


def test_a_learner_loading_a_checkpoint_refuses_it_too(finished, tmp_path, monkeypatch):
    """Past the launcher's check (a file swapped after it), the learner's own load refuses."""
    run = _copy(finished, tmp_path, unfinished=True)
    marker = tmp_path / "payload-ran"
    _plant(_latest(run), marker)
    monkeypatch.setattr(ckpt, "foreign_globals", lambda path: [])
    with pytest.raises(TrainingError, match=REFUSED) as caught:
        ckpt.load_learner(run, 0, 1)
    assert str(_latest(run)) in str(caught.value) and not marker.exists()


def test_compare_reusing_runs_never_runs_a_payload(finished, corpus, tmp_path, capsys, monkeypatch):
    """A finished run's model.pt and targets.pt are not read; an unfinished one's checkpoint is
    refused when compare resumes it (a failed row, the command non-zero)."""
    from asrdist.compare.runs import resolve_all

    overrides = [*TINY[:-3], "train.epochs=1"]
    out, marker = tmp_path / "cmp", tmp_path / "payload-ran"
    cfg = resolve_all(Path(RECIPE), ["single"], 1, corpus, overrides)["single"]
    run = _copy(finished, out, unfinished=True, name="single")
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    for path in (run / "targets.pt", _latest(run)):
        _plant(path, marker)
    assert main(["compare", RECIPE, "--strategies", "single", "--learners", "1", "--out", str(out),
                 "--data", str(corpus), *overrides]) != 0
    err = capsys.readouterr().err
    assert REFUSED in err and str(_latest(run)) in err and not marker.exists(), err


# ------------------------------------------------------------------ what an older asrdist wrote

def _as_older_asrdist(run: Path) -> None:
    """targets.pt with numpy arrays and a pickled PhoneBigram, the checkpoints' numpy RNG key an array."""
    blob = torch.load(run / "targets.pt", weights_only=True)
    for key in ("class_to_phone", "priors"):
        blob[key] = blob[key].numpy()
    blob["bigram"] = PhoneBigram(**{k: v.numpy() for k, v in blob["bigram"].items()})
    home = PhoneBigram.__module__
    PhoneBigram.__module__ = "asrdist.eval.decode"  # where an older asrdist kept it (it re-exports it)
    try:
        torch.save(blob, run / "targets.pt")
    finally:
        PhoneBigram.__module__ = home
    for d in ckpt.complete_checkpoints(run):
        state = torch.load(d / "rank-0.pt", weights_only=True)
        kind, key, *rest = state["rng"]["numpy"]
        state["rng"]["numpy"] = (kind, key.numpy().astype(np.uint32), *rest)
        torch.save(state, d / "rank-0.pt")


def test_files_of_an_older_asrdist_still_load(finished, corpus, tmp_path):
    run = _copy(finished, tmp_path)
    new = load_targets(run)
    _as_older_asrdist(run)
    assert "asrdist.eval.decode.PhoneBigram" in torch.serialization.get_unsafe_globals_in_checkpoint(run / "targets.pt")
    old = load_targets(run)
    assert np.array_equal(old.priors, new.priors) and old.priors.dtype == new.priors.dtype
    assert np.array_equal(old.class_to_phone, new.class_to_phone)
    for key in ("log_start", "log_trans", "log_end"):
        assert np.array_equal(getattr(old.bigram, key), getattr(new.bigram, key))
    assert main(_command("eval", run, corpus)) == 0
    (run / "summary.json").unlink()
    (run / "model.pt").unlink()
    assert main(_command("resume", run, corpus)) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] >= 4 and (run / "model.pt").is_file()


def test_rng_state_is_plain_data_and_restores_every_generator(tmp_path):
    state = ckpt.rng_state()
    torch.save(state, tmp_path / "rng.pt")
    assert torch.serialization.get_unsafe_globals_in_checkpoint(tmp_path / "rng.pt") == []
    expected = (np.random.rand(3), random.random(), torch.rand(2))
    np.random.rand(5), random.random(), torch.rand(4)
    ckpt.set_rng_state(load_data(tmp_path / "rng.pt", TrainingError))
    got = (np.random.rand(3), random.random(), torch.rand(2))
    assert np.array_equal(got[0], expected[0]) and got[1] == expected[1] and torch.equal(got[2], expected[2])


def test_a_new_run_directory_is_tensors_and_plain_data_only(finished):
    for path in [finished / "model.pt", finished / "targets.pt", *finished.glob("checkpoints/*/*.pt")]:
        assert torch.serialization.get_unsafe_globals_in_checkpoint(path) == [], path
