"""Issue 59 item 4: a damaged `state.json` (garbage, empty, a list, an unknown state, "prepared" for a
trained run) is named in one note line, and `--resume` goes on from the checkpoints with the run's
starts counted again from its config records. Quick: `asrdist train --resume` in-process, its
learners stood in for; the end-to-end case is the last test (slow)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

import asrdist.run.launch as launch
from asrdist.cli import main
from asrdist.config import config_from_tree
from asrdist.run import rundir
from asrdist.train import checkpoint as ckpt, state as run_state
from tests.support.paths import CONFIGS

DAMAGE = {  # content of state.json -> what the note says of it
    "garbage": (b"\x00\xff{not json", "not JSON"),
    "empty": (b"", "empty"),
    "list": (b'[{"state": "started"}]', "a JSON list, not a record"),
    "unknown state": (b'{"state": "exploded", "starts": 1}', "unknown state 'exploded'"),
    "prepared for a trained run": (b'{"state": "prepared", "starts": 0, "learners": 1}',
                                   "says 'prepared', but the run has trained"),
}


def _trained_once(tmp_path: Path) -> Path:
    """A run directory as one start that checkpointed its first epoch and was killed leaves it."""
    run = tmp_path / "run"
    run.mkdir()
    cfg = config_from_tree({"data": {"corpus": str(tmp_path / "corpus")}, "train": {"epochs": 2}})
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    (run / "env.json").write_text(json.dumps({"argv": ["asrdist", "train"]}))
    run_state.write_state(run, "prepared", learners=1)
    run_state.write_state(run, "started", learners=1)
    ckpt.save_learner(run, "epoch-0001", 0, {"rank": 0})
    ckpt.publish(run, "epoch-0001", 1, progress={"epoch": 1, "epochs": 2})
    (run / "metrics.jsonl").write_text(json.dumps({"kind": "epoch", "step": 10, "epoch": 0}) + "\n")
    assert run_state.read_state(run)["starts"] == 1
    return run


@pytest.fixture
def learners_stood_in(monkeypatch):
    """`asrdist train` up to its learners: what they were asked to resume from."""
    started = []

    def start(cfg, run_dir, args, nodes, network, resume, cpu=None):
        started.append(resume)
        return None
    monkeypatch.setattr(launch, "_start_learners", start)
    return started


@pytest.mark.parametrize("kind", list(DAMAGE))
def test_a_damaged_state_record_is_named_and_the_resume_counts_the_starts_again(tmp_path, capsys, kind,
                                                                                  learners_stood_in):
    run = _trained_once(tmp_path)
    content, what = DAMAGE[kind]
    (run / "state.json").write_bytes(content)
    assert main(["train", str(CONFIGS / "default.yaml"), "--resume", str(run), "--no-progress"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "state.json" in line]
    assert len(notes) == 1 and notes[0].startswith(f"[asrdist] note: {run / 'state.json'}: {what}"), notes
    assert "goes on from its checkpoints" in notes[0]
    assert learners_stood_in == [True]  # from the checkpoint, not from the start
    record = run_state.read_state(run)
    assert record["state"] == "started" and record["starts"] == 2, record


def test_a_sound_record_says_nothing_and_counts_on(tmp_path, capsys, learners_stood_in):
    run = _trained_once(tmp_path)
    assert main(["train", str(CONFIGS / "default.yaml"), "--resume", str(run), "--no-progress"]) == 0
    assert "state.json" not in capsys.readouterr().err
    assert run_state.read_state(run)["starts"] == 2


def test_a_prepared_record_of_a_trained_run_is_not_advice_to_start_it(tmp_path):
    run = _trained_once(tmp_path)
    (run / "state.json").write_bytes(DAMAGE["prepared for a trained run"][0])
    assert not rundir.prepared_not_started(run)
    with pytest.raises(Exception) as told:
        launch.check_new_run_dir(run, tmp_path / "corpus")
    assert "already used" in str(told.value) and "asrdist prepare" not in str(told.value)


def test_starts_are_counted_from_the_config_records(tmp_path):
    run = _trained_once(tmp_path)
    assert rundir.counted_starts(run) == 1
    (run / "config-resume-1.yaml").write_text("{}\n")
    (run / "config-resume-2.yaml").write_text("{}\n")
    assert rundir.counted_starts(run) == 3
    (run / "env.json").write_text(json.dumps({"argv": ["asrdist", "prepare"]}))  # prepare wrote config.yaml
    assert rundir.counted_starts(run) == 2


@pytest.mark.slow
def test_a_real_run_with_a_damaged_record_resumes_exactly_and_says_so(tone_corpus, tmp_path, capsys):
    """End to end, one learner in this process: train one epoch, break state.json, resume to two."""
    run = tmp_path / "run"
    tiny = ["model.hidden_dim=16", "model.hidden_layers=1", "data.batch_size=256", "train.epochs=1"]
    assert main(["train", str(CONFIGS / "default.yaml"), "--data", str(tone_corpus), "--out", str(run),
                 "--no-progress", *tiny]) == 0
    (run / "state.json").write_text("[]")
    capsys.readouterr()
    assert main(["train", str(CONFIGS / "default.yaml"), "--resume", str(run), "--no-progress",
                 "train.epochs=2"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "state.json" in line]
    assert len(notes) == 1 and "a JSON list, not a record" in notes[0], notes
    record = run_state.read_state(run)
    assert record["state"] == "finished" and record["starts"] == 2, record
    assert len(json.loads((run / "summary.json").read_text())["history"]) == 2
