"""`asrdist train` on a bad config stops before it makes the run directory, and `--resume` keeps
the first start's config.yaml (the record of what produced the first steps), writes the resumed
config beside it, and trains a run without a checkpoint from the start."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from asrdist.cli import main
from asrdist.config import load_config
from asrdist.run import launch
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.paths import ROOT

RECIPE = str(ROOT / "configs/default.yaml")
TINY = ["data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1", "optim.warmup_steps=0",
        "optim.anneal_after_epoch=null", "train.log_every=5", "train.threads=1"]

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus", utterances_per_speaker=6)
    assert main(["features", str(path)]) == 0
    return path


@pytest.mark.slow
@pytest.mark.parametrize("argv,key", [
    (["train.log_every=0"], "train.log_every"),
    (["data.batch_size=100", "--learners", "3", "--strategy", "sync"], "data.batch_size"),
    (["train.straggler.ranks=[4]", "--learners", "2", "--strategy", "sync"], "train.straggler.ranks"),
    (["--learners", "2", "--strategy", "single"], "train.learners"),
])
def test_train_on_a_real_corpus_refuses_without_a_run_directory(corpus, tmp_path, capsys, argv, key):
    out = tmp_path / "run"
    assert main(["train", RECIPE, *TINY, *argv, "--data", str(corpus), "--epochs", "1", "--out", str(out),
                 "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"asrdist: error: {key}:"), err
    assert not out.exists()


def _resume(run: Path, *argv: str) -> int:
    return main(["train", RECIPE, "--resume", str(run), *argv, "--no-progress"])


def _snapshot(run: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run)): (p.stat().st_mtime_ns, p.stat().st_size) for p in run.rglob("*")}


@pytest.mark.slow
def test_resume_keeps_config_yaml_and_records_the_resumed_config(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", RECIPE, *TINY, "train.checkpoint_every=3", "train.max_steps=4", "--data", str(corpus),
                 "--epochs", "1", "--out", str(run), "--no-progress"]) == 0
    original = (run / "config.yaml").read_bytes()

    assert _resume(run, "--epochs", "2", "train.max_steps=0") == 0
    assert (run / "config.yaml").read_bytes() == original
    assert yaml.safe_load(original)["train"]["epochs"] == 1
    resumed = yaml.safe_load((run / "config-resume-1.yaml").read_text())
    assert resumed["train"]["epochs"] == 2 and resumed["train"]["max_steps"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2  # the learner ran with the resumed config
    assert torch.load(run / "model.pt", weights_only=False)["config"]["train"]["epochs"] == 2
    assert launch.run_config_path(run) == run / "config-resume-1.yaml"  # what learners read next

    # a resume that fails (unknown key, bad value) writes nothing at all
    before = _snapshot(run)
    assert _resume(run, "train.bogus=1") != 0
    assert _resume(run, "train.log_every=0") != 0
    assert capsys.readouterr().err.count("asrdist: error:") == 2
    assert _snapshot(run) == before


def test_run_config_path_picks_the_latest_resume(tmp_path):
    for name in ("config.yaml", "config-resume-1.yaml", "config-resume-2.yaml", "config-resume-10.yaml",
                 "config-resume-x.yaml"):
        (tmp_path / name).write_text("{}\n")
    assert launch.run_config_path(tmp_path) == tmp_path / "config-resume-10.yaml"


@pytest.mark.slow
def test_resume_without_a_checkpoint_trains_from_the_start(corpus, tmp_path, capsys):
    """A run with no checkpoint (prepared and never started, or killed before its first): --resume
    trains it from the start and says so (rather than pointing at torchrun, or back at --resume)."""
    run = tmp_path / "run"
    cfg = load_config(RECIPE, [f"data.corpus={corpus}", *TINY])
    launch.prepare_run_dir(cfg, run, progress=False)
    (run / "launcher.log").write_text("a start that stopped before its first checkpoint\n")
    assert _resume(run, "--epochs", "1") == 0
    err = capsys.readouterr().err
    assert f"{run}: no checkpoint to resume from (prepared" in err and "training from the start" in err, err
    assert "asrdist: error" not in err and (run / "summary.json").is_file()
    assert json.loads((run / "state.json").read_text())["state"] == "finished"

