"""Entry point of one learner under torch.distributed.run / torchrun.

The launcher's environment is read by `asrdist.cluster.process_group.JobEnv` and the job is
joined by its `start_learner`; everything below receives rank, groups and store as arguments.
"""
from __future__ import annotations

import argparse
import os
import sys
from dataclasses import replace
from datetime import timedelta
from pathlib import Path

import yaml

from asrdist.cluster.failures import record_failure, report_path
from asrdist.cluster.process_group import JobEnv, start_learner
from asrdist.cluster.supervisor import die_with_agent
from asrdist.config import config_from_tree
from asrdist.errors import ConfigError
from asrdist.run.learner import run_learner
from asrdist.run.rundir import describe, has_no_checkpoint, record_resume, run_config_path
from asrdist.run.summary import SUMMARY_NAME
from asrdist.train.checkpoint import latest_step_dir
from asrdist.train.state import write_state


def slowed_by_quota(cfg, env: JobEnv) -> None:
    """A straggler whose dedicated host's CPU quota already makes it `slowdown` times slower sleeps
    no stand-in on top (its jitter, which a quota cannot give, stays)."""
    if env.quota_slowdown > 1:
        cfg.train.straggler = replace(cfg.train.straggler, slowdown=1.0)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="asrdist.run.worker")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    die_with_agent()
    env = JobEnv.from_environ()
    rank = env.rank
    try:
        cfg = config_from_tree(yaml.safe_load(run_config_path(args.run_dir).read_text()))
        slowed_by_quota(cfg, env)
        resume = (args.resume and not _nothing_to_resume(args.run_dir, rank)) or _restarted(args.run_dir, env)
        check_start(args.run_dir, cfg.train.learners, env.world_size, resume)
        _record_start(args.run_dir, cfg, env, resumed=args.resume)
        ctx = start_learner(env, seed=cfg.seed, timeout=timedelta(seconds=cfg.train.timeout_seconds),
                            group_size=cfg.train.group_size)

        run_learner(cfg, args.run_dir, env, ctx, resume=resume, progress=not args.no_progress)
        sys.stdout.flush()
        sys.stderr.flush()
        # leave at once: after a lost learner, a communication thread may still wait on it in gloo
        os._exit(0)
    except Exception as exc:  # report this learner's own failure, naming its rank, then exit non-zero
        message = record_failure(args.run_dir, rank, exc)
        if _outside_torchrun_started(args.run_dir, env):  # asrdist's launcher records the job's own failure
            try:
                write_state(args.run_dir, "failed", reason=message[:300])
            except OSError:  # a full disk: the line on stderr still reaches the launcher's log
                pass
        print(f"asrdist: error: {message}", file=sys.stderr, flush=True)
        # leave at once: a communication thread still blocked in a gloo call would make the
        # interpreter's shutdown abort (SIGABRT) and hide this report behind a signal
        os._exit(1)


def check_start(run_dir: Path, learners: int, world_size: int, resume: bool) -> None:
    """Before joining the job: torchrun started as many learners as the run was prepared for, and
    a run that already trained is continued (--resume), never trained again over its results (a
    requeued cluster job started without --resume would otherwise discard its progress)."""
    if world_size != learners:
        raise ConfigError(f"{run_dir}: prepared for {learners} learner(s), torchrun started {world_size}; start "
                          f"nodes x --nproc-per-node = {learners} learners, or prepare the run again with "
                          f"--learners {world_size}")
    if resume:
        return
    done = (run_dir / SUMMARY_NAME).is_file()
    latest = latest_step_dir(run_dir)
    if done or latest is not None:
        what = "finished training (summary.json)" if done else f"has trained (checkpoint {latest.name})"
        raise ConfigError(f"{run_dir}: {what}; continue it with `--resume` after the run directory, or prepare "
                          f"a new one")


def _nothing_to_resume(run_dir: Path, rank: int) -> bool:
    """`--resume` of a run without a complete checkpoint trains it from the start (rank 0 says so)."""
    if not has_no_checkpoint(run_dir):
        return False
    if rank == 0:
        print(f"[asrdist] {run_dir}: no checkpoint to resume from ({describe(run_dir)}); training from the start",
              file=sys.stderr, flush=True)
    return True


def _record_start(run_dir: Path, cfg, env: JobEnv, resumed: bool) -> None:
    """What `asrdist train` keeps of a start, kept as well when an outside torchrun started this
    job (asrdist's launcher, which gives its learners `env.network`, keeps it itself): this
    learner's report of an earlier failed start goes, and rank 0 records a `--resume` as
    `config-resume-K.yaml`, which summary.json's `starts` counts."""
    if env.network is not None:
        return
    report_path(run_dir, env.rank).unlink(missing_ok=True)
    if env.rank == 0:
        if resumed:
            record_resume(cfg, run_dir, ["(asrdist.run.worker under torchrun)"])
        write_state(run_dir, "started", learners=cfg.train.learners)


def _outside_torchrun_started(run_dir: Path, env: JobEnv) -> bool:
    return env.network is None and (run_dir / "state.json").is_file()


def _restarted(run_dir: Path, env: JobEnv) -> bool:
    """Whether torch's launcher restarted this learner (`train.max_restarts`) and a checkpoint
    exists to resume from; without one the restart trains from the start."""
    if env.restart == 0:
        return False
    latest = latest_step_dir(run_dir)
    if env.rank == 0:
        where = f"resuming from {latest.name}" if latest is not None else "no checkpoint yet: from the start"
        print(f"[asrdist] restart {env.restart} after a learner failed: {where}", file=sys.stderr, flush=True)
    return latest is not None


if __name__ == "__main__":
    sys.exit(main())
