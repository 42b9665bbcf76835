"""Issue 59 items 2 and 3: `asrdist compare` run again after a kill trains on what it lost (a run killed
before its first checkpoint from the start), and a full disk is the machine's fault: the failed step
is undone, one line names the disk, no report row blames the strategy (`not run: disk full`).
Quick tests stand in for the training (or train one learner in this process); the kill is real in
the last test (slow)."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

import asrdist.run.launch as launch
from asrdist.cli import main
from asrdist.compare.runs import resolve_all, train_missing
from asrdist.errors import TrainingError
from asrdist.run import rundir
from asrdist.sim.calibration import Microbenchmarks
from asrdist.train import state as run_state
from tests.support.compare_fixture import CONFIG, TINY, fabricate_runs, make_corpus
from tests.support.full_disk import fill_disk
from tests.support.paths import ROOT

MICRO = Microbenchmarks(2, {"1x2": 1e-3, "2x1": 2.5e-3}, {"1x2": 0.05, "2x1": 0.05}, 20_000.0, 2e-9, 1e-9,
                        0.5e-9, 1e-9, "loopback", 1e9, 0.8, 2e-10, 50e-6)


@pytest.fixture(autouse=True)
def fake_calibration(monkeypatch):
    """No learner is timed: every calibration is MICRO (written to OUT/calibration/ as for real)."""
    from asrdist.calibrate import microbench

    def calibrate_run(name, cfg, nodes, network, when):
        return microbench.RunCalibration(MICRO, {"feature_dim": 40, "num_classes": 9, "link": {}, "parameters": 1,
                                                 "corun": {"slowdown": 1.0}}, when, "2026-11-28T10:00:00+00:00",
                                         json.loads(json.dumps(cfg.to_dict())))
    monkeypatch.setattr(microbench, "calibrate_run", calibrate_run)


def _compare(out: Path, corpus: Path, strategies: str, *extra: str) -> int:
    return main(["compare", str(CONFIG), "--strategies", strategies, "--learners", "2", "--out", str(out),
                 "--data", str(corpus), *TINY, *extra])


# -- item 2: a run lost before its first checkpoint --------------------------------------------------

def test_a_run_killed_before_its_first_checkpoint_is_trained_again(tmp_path, monkeypatch, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    made = fabricate_runs(tmp_path / "made", corpus, ["sync", "onebit"])
    killed, half = out / "sync", out / "onebit"
    killed.mkdir(parents=True)  # a start SIGKILLed in its first epoch: config, state "started", no checkpoint
    (killed / "config.yaml").write_text((made["sync"] / "config.yaml").read_text())
    run_state.write_state(killed, "prepared", learners=2)
    run_state.write_state(killed, "started", learners=2)
    half.mkdir()  # a start SIGKILLed while it prepared: targets only
    (half / "targets.pt").write_bytes(b"half")
    trained = []

    def train(args):
        trained.append((args.strategy, args.resume))
        assert args.resume is not None or not args.out.exists() or not any(args.out.iterdir())
        return 0
    monkeypatch.setattr(launch, "train_command", train)
    configs = resolve_all(CONFIG, ["sync", "onebit"], 2, corpus, TINY)
    train_missing(CONFIG, configs, out, corpus, TINY)
    # the killed run goes through `train --resume`, which trains a run without a checkpoint from the start
    assert trained == [("sync", killed), ("onebit", None)]
    said = capsys.readouterr().out
    assert f"sync: {killed} ended before its first checkpoint (started" in said
    assert f"onebit: {half} was left while its run was prepared (targets.pt); removed" in said


def test_a_run_another_command_trains_is_refused(tmp_path, monkeypatch, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    run = out / "sync"
    run.mkdir(parents=True)
    monkeypatch.setattr(launch, "train_command", lambda args: pytest.fail("trained a run held by another"))
    with rundir.locked(run):  # as `asrdist train` holds it (a lock of another open file: refused here too)
        code = _compare(out, corpus, "sync")
    err = capsys.readouterr().err
    assert code != 0 and "another asrdist command is training this run now" in err and err.count("\n") == 1, err


# -- item 3: a full disk -------------------------------------------------------------------------------

def _disk_line(err: str, out: Path) -> str:
    assert err.count("\n") == 1 and err.startswith(f"asrdist: error: {out}: the disk is full (the file system "
                                                    f"mounted at "), err
    assert "Traceback" not in err and "training failed" not in err, err
    return err


def test_a_full_disk_in_a_later_run_is_no_strategys_row(tmp_path, monkeypatch, capsys):
    """The learners report the full disk (their failure reports are what is left): compare removes
    the step's files, stops, and the report marks the run `not run: disk full`."""
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single"])
    trained = []

    def train(args):  # as a 2-learner job that filled the disk: its failure reports stay in the run directory
        trained.append(args.strategy)
        args.out.mkdir()
        (args.out / "failed-rank-0.txt").write_text("learner rank 0: ...: cannot write: No space left on device\n")
        (args.out / "launcher.log").write_text("...\n")
        raise TrainingError(f"learner rank 0: {args.out}/checkpoints/epoch-0001/rank-0.pt: cannot write: No space "
                            f"left on device")
    monkeypatch.setattr(launch, "train_command", train)
    assert _compare(out, corpus, "single,sync,onebit") != 0
    err = _disk_line(capsys.readouterr().err, out)
    assert "sync's run stopped" in err and f"the report of the runs so far: {out / 'report.html'}" in err, err
    assert trained == ["sync"]  # nothing more trains on a full disk
    assert not (out / "sync").exists() and not (out / "calibration" / "sync.json").exists()
    summary = json.loads((out / "summary.json").read_text())
    rows = {r["run"]: r for r in summary["runs"]}
    assert rows["single"]["failed"] is None
    assert rows["sync"]["failed"] == rows["onebit"]["failed"] == "not run: disk full"
    assert rows["sync"]["prediction"] == "not run: disk full"
    page = (out / "report.html").read_text()
    assert "<li>sync: not run: disk full</li>" in page and "training failed" not in page


def test_a_full_disk_in_the_first_run_leaves_nothing(tone_corpus, tmp_path, monkeypatch, capsys):
    """One learner in this process fills the disk as it prepares its run: its calibration goes too,
    and OUT, which this comparison made."""
    out = tmp_path / "cmp"
    fill_disk(monkeypatch, out / "single")
    assert main(["compare", str(CONFIG), "--strategies", "single", "--out", str(out), "--data", str(tone_corpus),
                 *TINY]) != 0
    err = _disk_line(capsys.readouterr().err, out)
    assert "single's run stopped" in err and "No space left on device" in err, err
    assert not out.exists()


def test_a_full_disk_while_the_report_is_written_puts_the_old_one_back(tmp_path, monkeypatch, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync"])
    monkeypatch.setattr(launch, "train_command", lambda args: pytest.fail("trained a finished run"))
    assert _compare(out, corpus, "single,sync") == 0
    before = {name: (out / name).read_bytes() for name in ("summary.json", "report.html")}
    capsys.readouterr()
    fill_disk(monkeypatch, out, only="report.html")
    assert _compare(out, corpus, "single,sync", "--target", "0.25") != 0
    err = _disk_line(capsys.readouterr().err, out)
    assert "the report stopped" in err, err
    assert {name: (out / name).read_bytes() for name in before} == before
    assert not [p for p in out.iterdir() if p.name.startswith(".")]  # no temporaries


# -- item 2, for real: SIGKILL a comparison, run it again ----------------------------------------------

@pytest.mark.slow
def test_a_killed_comparison_run_again_finishes(tone_corpus, tmp_path):
    """`asrdist compare` of sync (2 learners) killed with its whole process group while its learners
    start (before the first checkpoint), then run again: it trains sync from the start, to the end.
    No learner is timed for the report (tests/support/hook_site)."""
    out = tmp_path / "cmp"
    cmd = [sys.executable, "-m", "asrdist", "compare", str(CONFIG), "--strategies", "sync", "--learners", "2",
           "--out", str(out), "--data", str(tone_corpus), *TINY, "train.epochs=1"]
    env = {**os.environ, "ASRDIST_TEST_NO_CALIBRATION": "1",  # what is tested is the runs, not their timing
           "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "support" / "hook_site"), str(ROOT)])}
    first = subprocess.Popen(cmd, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                             stderr=subprocess.DEVNULL, start_new_session=True)
    run = out / "sync"
    try:
        deadline = time.monotonic() + 300  # only to catch a hang
        while (run_state.read_state(run) or {}).get("state") != "started":
            assert first.poll() is None, "the comparison ended before its run started"
            assert time.monotonic() < deadline, "the run never started"
            time.sleep(0.05)  # polling a condition, not waiting for one to come true
    finally:
        os.killpg(first.pid, signal.SIGKILL)
        first.wait(timeout=60)
    assert rundir.has_no_checkpoint(run), "killed too late for this test: the run had checkpointed"
    again = subprocess.run(cmd, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert "ended before its first checkpoint" in again.stdout and "training from the start" in again.stderr
    summary = json.loads((out / "summary.json").read_text())
    assert summary["runs"][0]["failed"] is None and summary["runs"][0]["epochs"] == 1
    assert run_state.read_state(run)["state"] == "finished"
