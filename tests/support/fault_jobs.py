"""Real 2-learner `asrdist train` jobs on the tone corpus for the fault tests (run/test_faults.py,
test_fault_matrix.py, test_fault_recovery.py): started as a process, their processes found by run
directory, and polling with generous deadlines (no sleeps as synchronisation)."""
from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

TINY = ["model.hidden_dim=64", "model.hidden_layers=2", "data.batch_size=128", "train.log_every=1",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null"]
DEADLINE_S = 180.0


def processes_of(run_dir: Path) -> list[int]:
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


def until(condition, what: str, deadline_s: float = DEADLINE_S) -> None:
    end = time.monotonic() + deadline_s
    while not condition():
        if time.monotonic() > end:
            raise AssertionError(f"gave up waiting for {what}")
        time.sleep(0.2)  # polling interval, not synchronisation


def start_job(corpus: Path, run_dir: Path, strategy: str = "sync", *extra: str) -> subprocess.Popen:
    """A 2-learner `asrdist train` job, once its first minibatch is logged."""
    return started(launch_job(corpus, run_dir, strategy, *extra), run_dir)


def launch_job(corpus: Path, run_dir: Path, strategy: str = "sync", *extra: str) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "asrdist.cli", "train", "configs/default.yaml", *TINY, *extra,
                             "--data", str(corpus), "--learners", "2", "--strategy", strategy, "--epochs", "500",
                             "--out", str(run_dir), "--no-progress"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)


def started(proc: subprocess.Popen, run_dir: Path) -> subprocess.Popen:
    metrics = run_dir / "metrics.jsonl"
    until(lambda: metrics.is_file() and metrics.stat().st_size > 0 or proc.poll() is not None, "training to start")
    assert proc.poll() is None, proc.stderr.read()
    return proc
