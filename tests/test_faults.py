"""Fault injection against a real `asrdist train` job (2 learners on the tone corpus): stop signals
to the command stop every learner and the launcher; a SIGKILLed command takes its learners with it
(they never train unsupervised). Polling with generous deadlines, no sleeps as synchronisation."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

TINY = ["model.hidden_dim=64", "model.hidden_layers=2", "data.batch_size=128", "train.log_every=1",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null"]
DEADLINE_S = 180.0


def _processes_of(run_dir: Path) -> list[int]:
    """Pids of every process whose command line names the run directory (agents and learners)."""
    pids = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit() and int(entry.name) != os.getpid():
            try:
                cmdline = (entry / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
                state = (entry / "stat").read_text().split(") ")[-1][:1]
            except OSError:
                continue
            if str(run_dir) in cmdline and "asrdist" in cmdline and state != "Z":
                pids.append(int(entry.name))
    return pids


def _until(condition, what: str) -> None:
    end = time.monotonic() + DEADLINE_S
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)  # polling interval, not synchronisation


def _start(corpus: Path, run_dir: Path) -> subprocess.Popen:
    proc = subprocess.Popen([sys.executable, "-m", "asrdist.cli", "train", "configs/default.yaml", *TINY,
                             "--data", str(corpus), "--learners", "2", "--strategy", "sync", "--epochs", "500",
                             "--out", str(run_dir), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    metrics = run_dir / "metrics.jsonl"
    _until(lambda: metrics.is_file() and metrics.stat().st_size > 0 or proc.poll() is not None, "training to start")
    assert proc.poll() is None, proc.stderr.read()
    return proc


def test_a_stop_signal_stops_every_learner_with_one_line(tone_corpus, tmp_path, sig=signal.SIGTERM):
    run_dir = tmp_path / "run"
    proc = _start(tone_corpus, run_dir)
    assert len(_processes_of(run_dir)) >= 3  # the agent and two learners
    proc.send_signal(sig)
    _, err = proc.communicate(timeout=DEADLINE_S)
    assert proc.returncode != 0
    lines = err.strip().splitlines()
    assert lines[-1] == f"asrdist: error: stopped by {sig.name}: every learner and launcher was stopped", err
    assert "Traceback" not in err
    _until(lambda: not _processes_of(run_dir), "every learner to be gone")


def test_learners_die_with_a_sigkilled_command(tone_corpus, tmp_path):
    run_dir = tmp_path / "run"
    proc = _start(tone_corpus, run_dir)
    proc.kill()
    proc.wait(DEADLINE_S)
    _until(lambda: not _processes_of(run_dir), "the orphaned agent and learners to stop by themselves")
