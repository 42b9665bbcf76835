"""Two learners on one device for `scripts/gpu_check.sh` (`python -m asrdist.bench.gpu pair`):
each a process started by `launcher.run_learners` (on loopback), as every bench's learners
are, joined over gloo (the device's tensors then staged through the CPU where gloo needs it) or
NCCL, timing the trainer's own step on a fixed synthetic minibatch."""
from __future__ import annotations

import math
import tempfile
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asrdist.bench.gpu import one_line, peak_memory, reset_peak, synchronize
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import start_learner
from asrdist.config import config_from_tree
from asrdist.parallel.base import DEFAULT_TIMEOUT_SECONDS
from asrdist.errors import TrainingError
from asrdist.models.registry import build_model
from asrdist.run.learner import build_learner
from asrdist.sim.cluster import MODELS
from asrdist.train.synthetic import SyntheticTask


def _pair_config(model: dict, strategy: str, local_batch: int, world: int, threads: int, timeout_s: float):
    return config_from_tree({
        "seed": 0, "model": model, "optim": {"name": "sgd", "lr": 0.01, "momentum": 0.9},
        "strategy": {"name": strategy}, "data": {"batch_size": local_batch * world},
        "train": {"epochs": 1, "learners": world, "threads": threads, "timeout_seconds": timeout_s}})


def _pair_steps(spec, args: dict[str, Any]) -> dict[str, Any]:
    """One learner: joins over `args['backend']`, computes on `args['device']` (gloo included: its
    tensors are then CUDA tensors, which asrdist's collectives stage through the CPU where gloo
    needs it), and times `steps` of the trainer's own step on a fixed synthetic minibatch."""

    device = torch.device(args["device"])
    rank, world, threads = spec.rank, spec.world_size, spec.num_threads
    cfg = _pair_config(args["model"], args["strategy"], args["local_batch"], world, threads, args["timeout_s"])
    # every learner on the one device: local rank 0 (NCCL then sees two ranks on one GPU)
    ctx = start_learner(replace(spec, local_rank=0), seed=0, timeout=timedelta(seconds=args["timeout_s"]),
                        backend=args["backend"])
    ctx = replace(ctx, device=device)
    warmup, steps = args["warmup"], args["steps"]
    torch.manual_seed(0)
    model = build_model(cfg.model, args["feature_dim"], args["num_classes"])
    with tempfile.TemporaryDirectory(prefix="asrdist-gpu-pair-") as run_dir:
        learner = build_learner(cfg, Path(run_dir), ctx, SyntheticTask(model, args["local_batch"], warmup + steps))
        trainer, strategy = learner.trainer, learner.strategy
        frames, t0, counters0 = 0, time.perf_counter(), None
        for i, batch in enumerate(trainer.sampler):
            if i == warmup:
                synchronize(device)
                dist.barrier()
                reset_peak(device)
                t0, counters0 = time.perf_counter(), dict(strategy.counters.as_dict())
            _, n = trainer.train_step(batch)
            trainer.state.step += 1
            frames += n if i >= warmup else 0
        synchronize(device)
        elapsed = time.perf_counter() - t0
        counters = {k: v - counters0[k] for k, v in strategy.counters.as_dict().items()}
        strategy.finalize()
    parameters = [p.detach().double().sum().item() for p in learner.model.parameters()]
    dist.barrier()
    dist.destroy_process_group()
    return {"rank": rank, "device": str(next(learner.model.parameters()).device), "frames": frames,
            "seconds": elapsed, "seconds_per_step": elapsed / steps, "threads": threads,
            "comm_seconds_per_step": counters["comm_seconds"] / steps,
            "bytes_sent_per_step": counters["bytes_sent"] / steps, "parameter_sum": math.fsum(parameters),
            **peak_memory(device)}


def pair_learner(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function (run by `run_learners`): its figures, or its failure as one line."""
    try:
        return _pair_steps(spec, args)
    except BaseException as exc:  # reported by the parent as this learner's one line
        return {"rank": spec.rank, "error": one_line(exc)}


def pair_status(backend: str, reason: str) -> str:
    """refused: NCCL would not put two ranks on one GPU (its "Duplicate GPU detected", an invalid
    usage error) -- a limit of the library on one device, not a fault of asrdist; else failed."""
    refused = backend == "nccl" and any(w in reason.lower() for w in ("duplicate gpu", "invalid usage"))
    return "refused" if refused else "failed"


def pair(device: torch.device, backend: str, strategy: str, quick: bool, steps: int,
         timeout_s: float = DEFAULT_TIMEOUT_SECONDS) -> dict[str, Any]:
    """Two learners on `device` over `backend`, each a process. A backend that cannot run here
    (NCCL without CUDA, or refusing two ranks on one GPU, as NCCL >= 2.5 does) is reported with
    its reason as `status` refused or unavailable, not raised: the check goes on."""

    if backend == "nccl" and not (device.type == "cuda" and dist.is_nccl_available()):
        return {"backend": backend, "status": "unavailable",
                "reason": f"NCCL needs CUDA tensors and a torch built with NCCL (device {device}, "
                          f"torch {torch.__version__}, NCCL available: {dist.is_nccl_available()})"}
    m = MODELS["swbd"]
    model = {"name": "dnn", "hidden_layers": 2, "hidden_dim": 256} if quick else dict(m["model"])
    args = {"device": str(device), "backend": backend, "strategy": strategy, "model": model,
            "feature_dim": m["feature_dim"], "num_classes": 500 if quick else m["num_classes"],
            "local_batch": 256 if quick else 1024, "warmup": 3, "steps": steps, "timeout_s": timeout_s / 2}
    try:
        results, ended = run_learners(__name__, "pair_learner", 2, 1, "loopback", args, timeout=timeout_s), None
    except TrainingError as exc:  # a learner killed by its library (NCCL aborts), or one that hung
        results, ended = [None, None], one_line(exc)
    base = {"backend": backend, "strategy": strategy, "device": str(device), "model": model["name"]}
    errors = [r["error"] for r in results if r and "error" in r]
    if None in results or errors:
        reason = errors[0] if errors else ended or f"a learner gave no result within {timeout_s:g} s"
        return {**base, "status": pair_status(backend, reason), "reason": reason}
    seconds = max(r["seconds"] for r in results)
    return {**base, "status": "ok", "frames_per_second": sum(r["frames"] for r in results) / seconds,
            "seconds_per_step": max(r["seconds_per_step"] for r in results),
            "consensus": results[0]["parameter_sum"] == results[1]["parameter_sum"], "learners": results}
