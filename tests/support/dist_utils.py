"""Run a function on N gloo learners (spawned processes) and collect what each returns.

    results = run_distributed(fn, world_size, tmp_path, *args)

`fn(rank, world_size, *args)` must be a module-level function (it is pickled into the new
processes). Learners are started from a fork server that has imported torch (and the dynamo
machinery torch's optimizers pull in) once per test session: a fresh `spawn` pays those
seconds in every learner of every test. The default process group is initialised from a fresh FileStore in `tmp_path` (no
ports), with a short timeout, one torch thread per learner; `results[rank]` is fn's return
value (anything torch.save can store). A learner that raises makes run_distributed raise.
"""
from __future__ import annotations

import uuid
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

TIMEOUT = timedelta(seconds=30)
_PRELOAD = ["torch", "torch._dynamo", "torch.distributed", "asrdist.parallel.comm", "asrdist.cluster.process_group"]
START_METHOD = "forkserver" if "forkserver" in mp.get_all_start_methods() else "spawn"
if START_METHOD == "forkserver":
    mp.set_forkserver_preload(_PRELOAD)


_CONTEXT = None


def learner_context():
    """This learner's `LearnerContext` (groups and the job store), as `start_learner` built it."""
    return _CONTEXT


def _learner(rank: int, fn, world_size: int, store_path: str, result_dir: str, args: tuple) -> None:
    global _CONTEXT
    from asrdist.cluster.process_group import JobEnv, start_learner

    torch.set_num_threads(1)
    store = dist.FileStore(store_path, world_size)
    _CONTEXT = start_learner(JobEnv(rank, world_size, rank, world_size), seed=0, timeout=TIMEOUT, store=store,
                             backend="gloo")
    try:
        result = fn(rank, world_size, *args)
        torch.save(result, Path(result_dir) / f"rank{rank}.pt")
    finally:
        if dist.is_initialized():
            dist.destroy_process_group()


def run_distributed(fn, world_size: int, tmp_path: Path, *args) -> list:
    run_dir = Path(tmp_path) / f"dist-{uuid.uuid4().hex[:8]}"
    run_dir.mkdir(parents=True)
    mp.start_processes(_learner, args=(fn, world_size, str(run_dir / "store"), str(run_dir), args),
                       nprocs=world_size, join=True, start_method=START_METHOD)
    return [torch.load(run_dir / f"rank{r}.pt", weights_only=False) for r in range(world_size)]
