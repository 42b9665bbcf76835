"""One learner of `asrdist bench scaling`: the real model, optimizer, strategy and `Trainer`, fed
synthetic minibatches, with the trainer's compute emulation (DESIGN.md §5.8).

`scaling_learner(spec, args)`, run by `launcher.run_learners`, builds the learner with
`build_learner` and times the last `steps` of the trainer's own `Trainer.train_step`;
`time_exchanges` times the flat and hierarchical sync allreduce side by side. Details:
docs/benchmarks.md#one-learner-of-the-bench-benchscaling_workerpy."""
from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asrdist.cluster.process_group import start_learner
from asrdist.config import RunConfig, config_from_tree
from asrdist.models.registry import build_model, count_parameters
from asrdist.parallel.standin import StandIn
from asrdist.parallel.sync import SyncConfig, SyncStrategy
from asrdist.run.learner import build_learner
from asrdist.train.synthetic import SyntheticTask
from asrdist.utils.throughput import job_frames_per_second, learner_frames_per_second


def scaling_config(spec, args: dict[str, Any]) -> RunConfig:
    """The run config of one learner: args' model, optimizer and strategy, one epoch, compute
    emulation and the optional straggler, `local_batch` frames per learner."""
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

    if args["compute_ms"] <= 0:
        raise ValueError("scaling benchmark: compute_ms must be > 0")
    cfg = scaling_config(spec, args)
    distributed = spec.world_size > 1
    ctx = start_learner(spec, seed=cfg.seed, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    warmup, steps = int(args["warmup"]), int(args["steps"])
    torch.manual_seed(cfg.seed)  # the same initial model everywhere, as run_learner does
    model = build_model(cfg.model, args["feature_dim"], args["num_classes"])
    task = SyntheticTask(model, int(args["local_batch"]), warmup + steps, emulate=True)
    with tempfile.TemporaryDirectory(prefix="asrdist-scaling-") as run_dir:
        learner = build_learner(cfg, Path(run_dir), ctx, task)
        trainer, strategy = learner.trainer, learner.strategy
        strategy.start_epoch(int(args.get("epoch", 0)))  # as Trainer.fit does at an epoch's start
        lockstep = bool(strategy.lockstep_now)
        frames = 0
        t0 = time.perf_counter()
        counters0 = compute0 = None
        for i, batch in enumerate(task.sampler):  # every learner its own warmup + steps minibatches
            if i == warmup:  # the timed window starts together on every learner
                if distributed:
                    dist.barrier()
                t0, cpu0 = time.perf_counter(), time.process_time()
                counters0, compute0 = dict(strategy.counters.as_dict()), trainer.stepper.compute_seconds
            _, n = trainer.train_step(batch)
            trainer.state.step += 1
            if i >= warmup:
                frames += n
        elapsed = time.perf_counter() - t0
        cpu = time.process_time() - cpu0
    # the timed window's counters, before finalize's goodbyes and consensus average (which wait
    # for the slowest learner and are not a step's cost)
    counters = {k: v - counters0[k] for k, v in strategy.counters.as_dict().items()}
    strategy.close(None)
    strategy.finalize()
    exchange = None
    if args.get("exchange_repeats") and distributed:
        shapes = [p.shape for p in learner.model.parameters() if p.requires_grad]
        exchange = time_exchanges(ctx, shapes, int(args["exchange_repeats"]), spec.rank)
    totals = torch.tensor([elapsed, frames], dtype=torch.float64)
    rates = torch.tensor([learner_frames_per_second(frames, elapsed)], dtype=torch.float64)
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
        "strategy": strategy.name,
        "lockstep": lockstep,
        "threads": torch.get_num_threads(),
        "parameters": count_parameters(learner.model),
        # the one definition (asrdist.utils.throughput): the job's frames over its longest learner's
        # timed window (every learner starts it at the barrier), lock-step or not
        "frames_per_second": job_frames_per_second([frames_all], [elapsed_max]),
        # each learner's own frames/s, summed: an extra key, never the job's figure
        "sum_of_learner_rates": float(rates),
        "seconds": elapsed_max,
        "frames": frames_all,
        "steps": steps,
        "seconds_per_step": elapsed / steps,
        "compute_seconds_per_step": (trainer.stepper.compute_seconds - compute0) / steps,
        # this learner process's CPU (every thread, user and system, the kernel's work on its sends
        # and receives included): more than its cores' share means it queued for them
        "cpu_seconds_per_step": cpu / steps,
        "comm_seconds_per_step": counters["comm_seconds"] / steps,
        "wait_seconds_per_step": counters["wait_seconds"] / steps,
        "bytes_sent_per_step": counters["bytes_sent"] / steps,
        **({} if exchange is None else {"exchange": exchange}),
    }


def time_exchanges(ctx, shapes: list[torch.Size], repeats: int, rank: int) -> dict[str, Any]:
    """Time the sync strategy's bucketed allreduce of gradients of `shapes`, flat
    (`hierarchical: false`) and hierarchical (`true`: reduce-scatter inside the node, allreduce of
    1/L across nodes, all-gather inside the node), through the strategy's own `after_backward` on
    a stand-in model of those shapes (`asrdist.parallel.standin`), on every
    learner of the job in `ctx` (collective: every rank calls it at the same point). Every learner
    holds random gradients; per repeat each exchange runs once after a barrier, the two
    alternating which goes first so machine noise hits both alike. A repeat's time is its slowest
    learner's; bytes are all learners'."""

    gen = torch.Generator().manual_seed(1000 + rank)
    grads = [torch.randn(s, generator=gen) * 1e-3 for s in shapes]
    strategies = {"flat": SyncStrategy(SyncConfig(hierarchical="false")),
                  "hierarchical": SyncStrategy(SyncConfig(hierarchical="true"))}
    stand_ins = {}
    for name, s in strategies.items():  # the same order on every rank: setup builds groups
        stand_ins[name] = StandIn(s, shapes, ctx)
        stand_ins[name].set_gradients(grads)
        stand_ins[name].after_backward()  # warm-up: connections opened, buffers paged in
    names = list(strategies)
    seconds: dict[str, list[float]] = {name: [] for name in names}
    sent: dict[str, int] = {}
    error = 0.0
    for r in range(repeats):
        out = {}
        for name in names if r % 2 == 0 else names[::-1]:
            strategy = strategies[name]
            before = strategy.counters.bytes_sent
            stand_ins[name].set_gradients(grads)
            dist.barrier()
            t0 = time.perf_counter()
            out[name] = stand_ins[name].after_backward()
            seconds[name].append(time.perf_counter() - t0)
            sent[name] = strategy.counters.bytes_sent - before
        # the same mean in another summation order
        error = max(error, max(float((a - b).abs().max()) for a, b in zip(out["flat"], out["hierarchical"])))
    slowest = torch.tensor(seconds["flat"] + seconds["hierarchical"], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    total_bytes = torch.tensor([sent["flat"], sent["hierarchical"]], dtype=torch.float64)
    dist.all_reduce(total_bytes)
    worst_error = torch.tensor([error], dtype=torch.float64)
    dist.all_reduce(worst_error, op=dist.ReduceOp.MAX)
    return {
        "flat_seconds": slowest[:repeats].tolist(),
        "hierarchical_seconds": slowest[repeats:].tolist(),
        "flat_bytes": int(total_bytes[0]),
        "hierarchical_bytes": int(total_bytes[1]),
        "max_abs_difference": float(worst_error),
    }
