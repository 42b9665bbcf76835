"""Entry point of one learner under torch.distributed.run / torchrun.

This is the only place that reads the launcher's environment (RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE); everything below receives them as arguments.
"""
from __future__ import annotations

import argparse
import os
import sys
import traceback
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import yaml

from asrdist.config import config_from_tree
from asrdist.errors import AsrdistError
from asrdist.parallel.base import LearnerContext


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="asrdist.train.worker")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--no-progress", action="store_true")
    args = p.parse_args(argv)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    local_rank, local_world = int(os.environ.get("LOCAL_RANK", 0)), int(os.environ.get("LOCAL_WORLD_SIZE", world))
    try:
        cfg = config_from_tree(yaml.safe_load((args.run_dir / "config.yaml").read_text()))
        timeout = timedelta(seconds=cfg.train.timeout_seconds)
        cuda = torch.cuda.is_available()
        device = torch.device("cuda", local_rank) if cuda else torch.device("cpu")
        if cuda:
            torch.cuda.set_device(device)
        dist.init_process_group("nccl" if cuda else "gloo", rank=rank, world_size=world, timeout=timeout)
        ctx = LearnerContext(rank=rank, world_size=world, local_rank=local_rank, local_world_size=local_world,
                             device=device, timeout=timeout, seed=cfg.seed)
        from asrdist.train.learner import run_learner

        run_learner(cfg, args.run_dir, ctx, resume=args.resume, progress=not args.no_progress)
        dist.barrier()  # nobody tears the group down while a peer is still inside a collective
        dist.destroy_process_group()
        return 0
    except Exception as exc:  # report this learner's own failure, naming its rank, then exit non-zero
        detail = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        message = f"learner rank {rank}: {detail}"
        (args.run_dir / f"failed-rank-{rank}.txt").write_text(message + "\n" + traceback.format_exc())
        print(f"asrdist: error: {message}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    sys.exit(main())
