"""`asrdist bench faults`: what a real `asrdist train` job does when learners die or hang.

Every case runs the `asrdist train` command itself on a small DNN and injects the fault from
outside (SIGKILL, SIGSTOP): sync and hang detection time, adpsgd's and hierarchical's survival of
lost learners, and what their run directories hold after the loss. The cases and their keys:
docs/reliability.md#what-asrdist-bench-faults-does."""
from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asrdist.checks import cli_number
from asrdist.errors import ConfigError, TrainingError
from asrdist.run.summary import SUMMARY_NAME, RunSummary

TINY = ["model.hidden_dim=128", "model.hidden_layers=2", "data.batch_size=256", "train.log_every=5",
        "optim.warmup_steps=0"]
CASES = ("sync", "hang", "adpsgd", "hierarchical")
POLL_S = 0.1


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=Path("demo/corpus"), help="corpus (default the demo corpus)")
    parser.add_argument("--config", type=Path, default=Path(__file__).resolve().parents[2] / "configs" / "default.yaml")
    parser.add_argument("--learners", type=cli_number(int, at_least=2), default=4)
    parser.add_argument("--timeout-seconds", type=cli_number(float, above=0), default=20.0, help="train.timeout_seconds of the hang case")
    parser.add_argument("--only", default=",".join(CASES), help=f"comma-separated cases of {', '.join(CASES)}")
    parser.add_argument("--deadline", type=cli_number(float, above=0), default=900.0, help="seconds any one case may take")


def run(args) -> dict[str, Any]:
    cases = [c.strip() for c in args.only.split(",") if c.strip()]
    if not cases:
        raise ConfigError(f"bench faults --only {args.only!r} names no case; choose from {', '.join(CASES)}")
    unknown = sorted(set(cases) - set(CASES))
    if unknown:
        raise ConfigError(f"bench faults --only: unknown case(s) {', '.join(unknown)}; choose from {', '.join(CASES)}")
    if "adpsgd" in cases and args.learners < 4:
        raise ConfigError("bench faults --learners: the adpsgd case kills ranks 1, 2 and 3: at least 4 learners")
    if "hierarchical" in cases and (args.learners < 4 or args.learners % 2):
        raise ConfigError("bench faults --learners: the hierarchical case needs nodes of 2 and a node left when "
                          "one is lost: an even number, at least 4")
    if not (args.data / "train").is_dir():
        raise ConfigError(f"{args.data}: not a corpus directory (build one with `asrdist corpus synth` or `make demo`)")
    out: dict[str, Any] = {"learners": args.learners, "cores": len(os.sched_getaffinity(0)),
                           "corpus": str(args.data), "model": " ".join(TINY)}
    with tempfile.TemporaryDirectory(prefix="asrdist-faults-") as tmp:
        job = _Job.factory(args, Path(tmp))
        if "sync" in cases:
            out.update(_sync_kill(job("sync", "sync")))
        if "hang" in cases:
            out.update(_hang(job("hang", "sync", f"train.timeout_seconds={args.timeout_seconds}"), args.timeout_seconds))
        if "adpsgd" in cases:
            out.update(_adpsgd(job("adpsgd", "adpsgd", epochs=8), args.learners))
        if "hierarchical" in cases:
            out.update(_hierarchical(job("hierarchical", "hierarchical", "train.group_size=2", epochs=4)))
    return out


class _Job:
    """One `asrdist train` command under observation."""

    @staticmethod
    def factory(args, tmp: Path):
        def make(name: str, strategy: str, *extra: str, epochs: int = 1000) -> "_Job":
            return _Job(args, tmp / name, strategy, list(extra), epochs)
        return make

    def __init__(self, args, run_dir: Path, strategy: str, extra: list[str], epochs: int):
        self.run_dir, self.deadline = run_dir, args.deadline
        cmd = [sys.executable, "-m", "asrdist.cli", "train", str(args.config), *TINY, *extra, "--data", str(args.data),
               "--learners", str(args.learners), "--strategy", strategy, "--epochs", str(epochs),
               "--out", str(run_dir), "--no-progress"]
        self.proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
        self.err = ""

    def until(self, condition, what: str) -> None:
        end = time.monotonic() + self.deadline
        while not condition():
            if self.proc.poll() is not None:
                code = self.finish()
                if code == 0:
                    raise TrainingError(f"bench faults: the job finished before {what}: its corpus is too small "
                                        f"for the fault to land mid-run; give --data a larger one (the demo corpus)")
                said = self.last_line() or _last_line(_launcher_log(self)) or "it printed nothing"
                raise TrainingError(f"bench faults: the job ended before {what} (exit code {code}): {said}")
            if time.monotonic() > end:
                self.proc.kill()
                raise TrainingError(f"bench faults: gave up waiting for {what} after {self.deadline:g} s")
            time.sleep(POLL_S)  # polling an outside process, not synchronisation

    def records(self, kind: str) -> list[dict]:
        path = self.run_dir / "metrics.jsonl"
        if not path.is_file():
            return []
        lines = path.read_text(errors="replace").splitlines()
        return [r for r in (json.loads(x) for x in lines if x.strip().endswith("}")) if r.get("kind") == kind]

    def learners(self) -> dict[int, int]:
        return learner_pids(self.run_dir)

    def finish(self) -> int:
        _, err = self.proc.communicate(timeout=self.deadline)
        self.err += err
        return self.proc.returncode

    def last_line(self) -> str:
        return _last_line(self.err)


def learner_pids(run_dir: Path) -> dict[int, int]:
    """rank -> pid of the live learner processes of the `asrdist train` job writing `run_dir`
    (not torch's launcher agent, which names the worker module too; not zombies)."""
    found = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes().split(b"\0")
            environ = (entry / "environ").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(") ", 1)[-1][:1]
        except OSError:
            continue
        if b"asrdist.run.worker" in cmdline and str(run_dir).encode() in cmdline \
                and b"torch.distributed.run" not in cmdline and state != "Z":
            env = dict(e.split(b"=", 1) for e in environ if b"=" in e)
            if b"RANK" in env:
                found[int(env[b"RANK"])] = int(entry.name)
    return found


def _training(job: _Job) -> None:
    job.until(lambda: job.records("train") and len(job.learners()) >= 2, "training to start")


def _sync_kill(job: _Job) -> dict[str, Any]:
    _training(job)
    os.kill(job.learners()[1], signal.SIGKILL)
    t0 = time.monotonic()
    rc = job.finish()
    seconds = time.monotonic() - t0
    message = job.last_line()
    return {"sync_detect_seconds": seconds, "sync_exit_code": rc, "sync_message": message,
            "sync_named_rank": "rank 1" in message}


def _hang(job: _Job, timeout_s: float) -> dict[str, Any]:
    _training(job)
    pid = job.learners()[1]
    os.kill(pid, signal.SIGSTOP)
    t0 = time.monotonic()
    try:
        rc = job.finish()
    finally:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    seconds = time.monotonic() - t0
    message = job.last_line()
    return {"hang_detect_seconds": seconds, "hang_timeout_seconds": timeout_s, "hang_exit_code": rc,
            "hang_message": message, "hang_named_as_hung": "rank 1 hung" in message}


def _adpsgd(job: _Job, learners: int) -> dict[str, Any]:
    batch = int(next(o.split("=")[1] for o in TINY if o.startswith("data.batch_size=")))
    job.until(lambda: job.records("epoch") and len(job.learners()) == learners, "the first epoch's end")
    killed = []
    for rank in (1, 2):
        seen = len(job.records("train"))
        job.until(lambda: len(job.records("train")) > seen + 5, f"training before killing rank {rank}")
        os.kill(job.learners()[rank], signal.SIGKILL)
        killed.append(rank)
        job.until(lambda: f"learner rank {rank} lost" in _launcher_log(job), f"rank {rank} to be reported lost")
    rc, final, lost, survived = _went_on_without(job, killed)
    return {"adpsgd": after_loss(job), "adpsgd_survived": survived, "adpsgd_frames_lost": len(lost) * batch // learners,
            "adpsgd_restarts": _launcher_log(job).count("[asrdist] restart "), "adpsgd_exit_code": rc,
            "adpsgd_lost_learners": lost, "adpsgd_message": "" if survived else job.last_line(),
            "adpsgd_final": final, "adpsgd_killed": killed}


def _hierarchical(job: _Job) -> dict[str, Any]:
    # at once: node 1 trains on while node 0's leader validates, and on a small corpus it may take a
    # whole epoch meanwhile (node 0 then logs no training record to wait for)
    job.until(lambda: job.records("epoch") and len(job.learners()) >= 4, "the first epoch's end")
    os.kill(job.learners()[3], signal.SIGKILL)
    rc, final, lost, survived = _went_on_without(job, [2, 3])
    return {"hierarchical": after_loss(job), "hierarchical_survived": survived, "hierarchical_exit_code": rc, "hierarchical_lost_learners": lost,
            "hierarchical_message": "" if survived else job.last_line(), "hierarchical_final": final}


def after_loss(job: _Job) -> dict[str, Any]:
    """What the finished job's run directory holds after its first loss (see the module docstring)."""
    epochs = job.records("epoch")
    at = next((i for i, r in enumerate(epochs) if r.get("lost_learners")), None)
    pointer = job.run_dir / "checkpoints" / "latest"
    latest = pointer.read_text().strip() if pointer.is_file() else None
    if at is None:
        return {"checkpoint_after_loss": False, "minibatches_lost": None, "loss_epoch": None,
                "latest_checkpoint": latest, "why": "no epoch record names a lost learner"}
    loss_epoch = epochs[at]["epoch"]  # numbered from 1, as its end's checkpoint: epoch-(loss_epoch)
    number = int(latest.split("-")[1]) if latest and latest.startswith("epoch-") else -1
    lost, retrained = 0, 0
    for record in epochs[at:]:
        total = record.get("minibatches_in_epoch")
        shares = record.get("minibatches_by_learner") or {}
        lost += (total if total is not None else 0) - (sum(shares.values()) if total is not None else 0)
        retrained += record.get("minibatches_retrained") or 0
    unrecorded = sum(1 for r in epochs[at:] if r.get("minibatches_in_epoch") is None)
    return {"checkpoint_after_loss": number >= loss_epoch, "minibatches_lost": lost if not unrecorded else None,
            "minibatches_retrained": retrained, "loss_epoch": loss_epoch, "latest_checkpoint": latest,
            "epochs_recorded": len(epochs), "epochs_without_the_count": unrecorded}


def _went_on_without(job: _Job, lost_ranks: list[int]) -> tuple[int, dict, list[dict], bool]:
    """Wait for the job's end: its exit code, its summary's `final` and `lost_learners` ({} and []
    without one), and whether it survived (exit 0, a summary, and exactly `lost_ranks` lost)."""
    rc = job.finish()
    if rc != 0 or not (job.run_dir / SUMMARY_NAME).is_file():
        return rc, {}, [], False
    summary = RunSummary.read(job.run_dir)
    lost = [x.to_json() for x in summary.lost_learners]
    return rc, summary.final.to_json(), lost, sorted(x.rank for x in summary.lost_learners) == lost_ranks


def _last_line(text: str) -> str:
    lines = text.strip().splitlines()
    return lines[-1] if lines else ""


def _launcher_log(job: _Job) -> str:
    """Everything the learners and launcher printed so far (the command's own stderr is read once
    it ends)."""
    log = job.run_dir / "launcher.log"
    return log.read_text(errors="replace") if log.is_file() else ""
