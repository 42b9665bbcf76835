"""Fault injection against a real `asrdist train` job (2 learners on the tone corpus): stop signals
to the command stop every learner and the launcher; a SIGKILLed command takes its learners with it
(they never train unsupervised). Polling with generous deadlines, no sleeps as synchronisation."""
from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from asrdist.bench.faults import learner_pids
from tests.support.fault_jobs import DEADLINE_S, TINY, processes_of, start_job, started, until

pytestmark = pytest.mark.slow

def test_a_stop_signal_stops_every_learner_with_one_line(tone_corpus, tmp_path, sig=signal.SIGTERM):
    run_dir = tmp_path / "run"
    proc = start_job(tone_corpus, run_dir)
    assert len(processes_of(run_dir)) >= 3  # the agent and two learners
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert lines[-1] == f"asrdist: error: stopped by {sig.name}: every learner and launcher was stopped", err
    assert "Traceback" not in err
    until(lambda: not processes_of(run_dir), "every learner to be gone")


def test_learners_die_with_a_sigkilled_command(tone_corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc = start_job(tone_corpus, run_dir)
    proc.kill()
    proc.wait(DEADLINE_S)
    until(lambda: not processes_of(run_dir), "the orphaned agent and learners to stop by themselves")


def test_a_killed_learner_is_restarted_from_the_last_checkpoint_and_the_run_ends_as_uninterrupted(
        tone_corpus, tmp_path):
    import json

    common = ["train", "configs/default.yaml", *TINY, "--data", str(tone_corpus), "--learners", "2",
              "--strategy", "sync", "--epochs", "2", "--no-progress", "train.checkpoint_every=10"]
    run_dir = tmp_path / "run"
    # the uninterrupted reference runs side by side with the run that loses a learner (neither reads
    # the other's files; sharing the cores only slows both, which leaves the kill more time to land)
    reference = subprocess.Popen([sys.executable, "-m", "asrdist.cli", *common, "--out", str(tmp_path / "ref")],
                                 stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    proc = subprocess.Popen([sys.executable, "-m", "asrdist.cli", *common, "--out", str(run_dir),
                             "train.max_restarts=1"], stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        until(lambda: (run_dir / "checkpoints" / "latest").is_file() or proc.poll() is not None, "a checkpoint")
        victims = learner_pids(run_dir)
        assert proc.poll() is None and len(victims) == 2
        os.kill(victims[1], signal.SIGKILL)
        _, err = proc.communicate(timeout=DEADLINE_S * 2)
        assert proc.returncode == 0, err
        assert "[asrdist] restart 1 after a learner failed: resuming from step-" in err
        _, ref_err = reference.communicate(timeout=DEADLINE_S * 2)
        assert reference.returncode == 0, ref_err
    finally:
        for p in (reference, proc):
            if p.poll() is None:
                p.kill()  # its learners die with it
                p.communicate()

    ref = json.loads((tmp_path / "ref" / "summary.json").read_text())
    got = json.loads((run_dir / "summary.json").read_text())
    assert got["steps"] == ref["steps"]
    assert got["final"]["valid_loss"] == pytest.approx(ref["final"]["valid_loss"], rel=1e-6)
    assert ref["starts"] == 1 and got["starts"] == 2  # the restart is a start of its own


def test_bench_faults_times_the_detection_of_a_killed_learner(tone_corpus, tmp_path):
    import json

    from asrdist.cli import main

    out = tmp_path / "faults.json"
    assert main(["bench", "faults", "--data", str(tone_corpus), "--learners", "2", "--only", "sync",
                 "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["sync_named_rank"] and "rank 1 died" in result["sync_message"], result
    assert 0 < result["sync_detect_seconds"] < DEADLINE_S and result["learners"] == 2


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_stop_signal_stops_a_single_learner_with_one_line_and_cleans_up(tone_corpus, tmp_path, sig):
    """One learner trains in the command's own process: a `kill` or a closed terminal ends it as
    with several learners (one line, non-zero exit), and a run without a checkpoint leaves nothing."""
    run_dir = tmp_path / "run"
    proc = started(subprocess.Popen(
        [sys.executable, "-m", "asrdist.cli", "train", "configs/default.yaml", *TINY, "--data", str(tone_corpus),
         "--epochs", "500", "train.checkpoint_every=0", "--out", str(run_dir), "--no-progress"],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
        # a command started under nohup ignores SIGHUP by design (and would never stop here): give
        # the learner the default a terminal's shell gives it, whatever this test runs under
        preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL)), run_dir)
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode == 128 + sig, err  # the shell's status for a process a signal ended
    assert err.strip().splitlines()[-1].startswith(f"asrdist: error: stopped by {sig.name}"), err
    assert "Traceback" not in err
    if (run_dir / "checkpoints").is_dir():  # a slow machine may reach the end of the first epoch
        assert f"asrdist train --resume {run_dir}" in err, err
    else:
        assert not run_dir.exists() or not any(p.name != "launcher.log" for p in run_dir.iterdir()), \
            list(run_dir.iterdir())
