"""A run directory another command holds (`rundir.locked`: an `asrdist train` preparing or training
it) is refused as such to a second new run, whatever its files would otherwise say, and nothing of
it is touched (issue 59 item 6)."""
from __future__ import annotations

import contextlib
import json

import pytest

from asrdist.cli import main
from asrdist.errors import ConfigError
from asrdist.run import rundir
from asrdist.train.state import write_state
from tests.support.paths import ROOT

TINY = ["train.threads=1", "data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.max_steps=6"]


def _snapshot(run):
    return {p.name: p.read_bytes() for p in run.iterdir()}


@pytest.mark.parametrize("state", ["prepared", "started"])
def test_a_second_train_is_told_another_command_holds_the_run_dir(tone_corpus, tmp_path, capsys, state):
    """What a preparing train leaves before it starts its learners (its files, state "prepared"),
    or once started (state "started", no checkpoint yet), while it holds the directory: a second
    train on that --out is told another command is preparing or training there, not that
    `asrdist prepare` made it or that a start ended."""
    run = tmp_path / "run"
    recipe = str(ROOT / "configs/default.yaml")
    assert main(["prepare", recipe, "--out", str(run), "--data", str(tone_corpus), *TINY]) == 0
    write_state(run, state, learners=1)
    before = _snapshot(run)
    capsys.readouterr()
    with rundir.locked(run):  # as the first train holds it from its first file to its end
        for again in (["train", recipe, "--out", str(run), "--data", str(tone_corpus), *TINY],
                      ["prepare", recipe, "--out", str(run), "--data", str(tone_corpus), *TINY]):
            assert main(again) == 2
            err = capsys.readouterr().err.strip().splitlines()
            assert len(err) == 1, err
            assert "another asrdist command (train or prepare) is preparing or training" in err[0], err
            assert err == [f"asrdist: error: {rundir.busy_new_run(run)}"]
        assert main(["train", recipe, "--resume", str(run), *TINY]) == 2  # the resume's own line, unchanged
        err = capsys.readouterr().err.strip().splitlines()
        assert "another asrdist command is training this run now" in err[-1], err
    assert _snapshot(run) == before  # nothing of the other command's run written or removed
    assert json.loads((run / "state.json").read_text())["state"] == state


def test_a_start_refused_a_held_directory_undoes_nothing_of_it(tmp_path):
    """Two new runs that both passed the check on an empty --out: the first takes the directory
    and writes while the second prepares; the second is refused at its lock, and its undo leaves
    the first's files (on the old code it removed them as its own)."""
    run = tmp_path / "run"
    run.mkdir()
    with contextlib.ExitStack() as first:
        with pytest.raises(ConfigError, match="another asrdist command"), rundir.undone_on_failure(run):
            first.enter_context(rundir.locked(run))
            (run / "targets.pt").write_text("the first run's")
            with rundir.locked(run):  # the second's, once its features are done
                (run / "targets.pt").write_text("the second run's")
        assert (run / "targets.pt").read_text() == "the first run's"
