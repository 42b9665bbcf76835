"""`asrdist prepare CONFIG --out RUN_DIR [overrides]`: a run directory for a cluster job.

Does everything `asrdist train` does before its learners start (resolve and check the config,
features with the recipe's settings, targets, config.yaml, env.json) and starts nothing; the
learners are then `torchrun ... -m asrdist.run.worker RUN_DIR` on every host (docs/clusters.md has a
SLURM script). RUN_DIR and the corpus must lie on storage every host sees.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from asrdist.commands import help_of
from asrdist.run.train_cli import add_job_arguments


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("prepare", help=help_of("prepare"))
    add_job_arguments(p, out=dict(required=True, help="run directory (on storage every host sees)"),
                      learners_help="learners in the whole job (nodes x per node)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=prepare_command, resume=None)


def worker_command(run_dir: Path, learners: int) -> str:
    """The torchrun line to start on every host (A hosts x B learners = `learners`)."""
    return (f"torchrun --nnodes A --nproc-per-node B --rdzv-backend c10d --rdzv-endpoint HOST0:29400 "
            f"-m asrdist.run.worker {run_dir} --no-progress   # A x B = {learners}")


def prepare_command(args) -> int:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.run.launch import check_new_run_dir, prepare_run_dir, resolve_config

    cfg = resolve_config(args)
    cfg.data.corpus = str(Path(cfg.data.corpus).resolve())
    run_dir = args.out.resolve()
    check_new_run_dir(args.out, Path(cfg.data.corpus), hint="pick another --out")
    prepare_run_dir(cfg, run_dir, progress=not args.no_progress)
    print(json.dumps({"run_dir": str(run_dir), "corpus": cfg.data.corpus, "learners": cfg.train.learners,
                      "strategy": cfg.strategy_name, "global_batch": cfg.data.batch_size}, indent=2))
    print(f"[asrdist] prepared {run_dir}; start the learners on every host with:\n"
          f"  {worker_command(run_dir, cfg.train.learners)}")
    return 0
