"""One learner of `asrdist bench scaling`: the real model, optimizer, strategy and `Trainer`, fed
synthetic minibatches, with the trainer's compute emulation (DESIGN.md §5.8).

`scaling_learner(spec, args)` is run by `netem_launch.run_learners`. It builds the learner with
`build_learner`, the way `run_learner` does (same seed on every learner, the strategy's `setup`),
from a `RunConfig` made of its args and a `SyntheticTask`, then calls the trainer's own
`Trainer.train_step` on `warmup + steps` minibatches of `local_batch` frames and times the last
`steps`. `train.emulate_compute_ms` makes the trainer sleep instead of computing and write
synthetic gradients of the model's shapes, so the step's real work is the strategy's
communication and the optimizer update.
"""
from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch

from asrdist.config import RunConfig


def scaling_config(spec, args: dict[str, Any]) -> RunConfig:
    """The run config of one learner: args' model, optimizer and strategy, one epoch, compute
    emulation and the optional straggler, `local_batch` frames per learner."""
    from asrdist.config import config_from_tree

    straggler = args.get("straggler_rank")
    return config_from_tree({
        "seed": 0,
        "model": args["model"],
        "optim": args["optim"],
        "strategy": {"name": args["strategy"], **args.get("strategy_config", {})},
        "data": {"batch_size": int(args["local_batch"]) * spec.world_size},
        "train": {"epochs": 1, "learners": spec.world_size, "threads": spec.num_threads,
                  "timeout_seconds": float(spec.timeout_s), "emulate_compute_ms": float(args["compute_ms"]),
                  "straggler": {"ranks": [] if straggler is None else [int(straggler)],
                                "slowdown": float(args.get("slowdown", 1.0))}},
    })


def scaling_learner(spec, args: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from asrdist.cluster.process_group import start_learner
    from asrdist.models.registry import build_model, count_parameters
    from asrdist.train.learner import build_learner
    from asrdist.train.synthetic import SyntheticTask

    if args["compute_ms"] <= 0:
        raise ValueError("scaling benchmark: compute_ms must be > 0")
    cfg = scaling_config(spec, args)
    distributed = spec.world_size > 1
    ctx = start_learner(spec.job_env(), seed=cfg.seed, timeout=timedelta(seconds=spec.timeout_s),
                        init_method=spec.init_method, backend="gloo")
    warmup, steps = int(args["warmup"]), int(args["steps"])
    torch.manual_seed(cfg.seed)  # the same initial model everywhere, as run_learner does
    model = build_model(cfg.model, args["feature_dim"], args["num_classes"])
    task = SyntheticTask(model, int(args["local_batch"]), warmup + steps, emulate=True)
    with tempfile.TemporaryDirectory(prefix="asrdist-scaling-") as run_dir:
        learner = build_learner(cfg, Path(run_dir), ctx, task)
        trainer, strategy = learner.trainer, learner.strategy
        frames = 0
        t0 = time.perf_counter()
        counters0 = compute0 = None
        for i, batch in enumerate(task.sampler):  # every learner its own warmup + steps minibatches
            if i == warmup:  # the timed window starts together on every learner
                if distributed:
                    dist.barrier()
                t0 = time.perf_counter()
                counters0, compute0 = dict(strategy.counters.as_dict()), trainer.compute_seconds
            _, n = trainer.train_step(batch)
            trainer.state.step += 1
            if i >= warmup:
                frames += n
        elapsed = time.perf_counter() - t0
    strategy.finalize()
    counters = {k: v - counters0[k] for k, v in strategy.counters.as_dict().items()}
    totals = torch.tensor([elapsed, frames], dtype=torch.float64)
    rates = torch.tensor([frames / elapsed], dtype=torch.float64)
    if distributed:
        slowest = totals[:1].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        all_frames = totals[1:].clone()
        dist.all_reduce(all_frames)
        dist.all_reduce(rates)
        elapsed_max, frames_all = float(slowest), float(all_frames)
    else:
        elapsed_max, frames_all = elapsed, float(frames)
    return {
        "rank": spec.rank,
        "network": spec.network if distributed else "none (one learner)",
        "threads": torch.get_num_threads(),
        "parameters": count_parameters(learner.model),
        "frames_per_second": frames_all / elapsed_max,
        # each learner's own frames/s, summed: the aggregate when learners move at their own pace
        "sum_of_learner_rates": float(rates),
        "seconds": elapsed_max,
        "frames": frames_all,
        "steps": steps,
        "seconds_per_step": elapsed / steps,
        "compute_seconds_per_step": (trainer.compute_seconds - compute0) / steps,
        "comm_seconds_per_step": counters["comm_seconds"] / steps,
        "wait_seconds_per_step": counters["wait_seconds"] / steps,
        "bytes_sent_per_step": counters["bytes_sent"] / steps,
    }
