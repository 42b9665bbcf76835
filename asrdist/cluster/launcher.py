"""The one launcher of local learners: torch's own elastic launcher, `torch.distributed.run`.

`launch_learners("asrdist.train.worker", [RUN_DIR, ...], n, RUN_DIR)` runs
`python -m torch.distributed.run --standalone --nproc-per-node n -m MODULE ARGS`, which is exactly
what `torchrun --nnodes A --nproc-per-node B` runs on a cluster. Each learner gets `cores / n`
threads. A learner that fails writes `failed-rank-R.txt` (its one-line error, then the traceback)
into the report directory; a failed job becomes one `TrainingError` line naming the learner that
failed first.
"""
from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

from asrdist.errors import TrainingError


def launch_learners(module: str, args: list[str], learners: int, report_dir: Path,
                    timeout: float | None = None) -> None:
    """Run `python -m module *args` as `learners` local learners; raise TrainingError on failure."""
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1",
           "--nproc-per-node", str(learners), "--max-restarts", "0", "--monitor-interval", "0.5",
           "-m", module, *args]
    env = dict(os.environ, OMP_NUM_THREADS=str(max(1, (os.cpu_count() or 1) // learners)))
    run_distributed_command(cmd, env, report_dir, timeout=timeout)


def run_distributed_command(cmd: list[str], env: dict, report_dir: Path, timeout: float | None) -> None:
    """Run torch.distributed.run, echo its output, and turn a failure into one line naming the rank."""
    for f in report_dir.glob("failed-rank-*.txt"):
        f.unlink()
    proc = subprocess.Popen(cmd, env=env, stdout=None, stderr=subprocess.PIPE, text=True, bufsize=1)
    tail: list[str] = []

    def pump():
        for line in proc.stderr:
            tail.append(line)
            del tail[:-200]
            if not _launcher_noise(line):
                sys.stderr.write(line)

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    try:
        rc = proc.wait(timeout=timeout)
    except (KeyboardInterrupt, subprocess.TimeoutExpired):
        proc.terminate()
        proc.wait(30)
        raise
    t.join(5)
    if rc != 0:
        raise TrainingError(failure_message(report_dir, "".join(tail), rc))


def _launcher_noise(line: str) -> bool:
    return "torch.distributed.run" in line and "OMP_NUM_THREADS" in line or line.startswith("*****")


def failure_message(report_dir: Path, launcher_output: str, rc: int) -> str:
    """One line naming the learner that failed first.

    A learner killed by a signal (not the launcher's own SIGTERM) without a report of its own is
    the root cause even when its peers wrote errors of their own (their collectives broke because
    it vanished); otherwise the first learner that reported its own error is named.
    """
    failures = [(int(r), int(c)) for r, c in
                re.findall(r"rank\s*:\s*(\d+)[^\n]*\n\s*exitcode\s*:\s*(-?\d+)", launcher_output)]
    for rank, code in failures:
        if code < 0 and code != -15 and not (report_dir / f"failed-rank-{rank}.txt").is_file():
            return f"learner rank {rank} died (killed by signal {-code}); the job was stopped"
    reports = sorted(report_dir.glob("failed-rank-*.txt"), key=lambda p: p.stat().st_mtime)
    if reports:
        return reports[0].read_text().strip().splitlines()[0]
    if failures:
        rank, code = failures[0]
        return f"learner rank {rank} failed (exit code {code}); the job was stopped"
    return f"learners failed (launcher exit code {rc})"
