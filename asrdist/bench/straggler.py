"""`asrdist bench straggler`: how much aggregate throughput sync and adpsgd keep when one of
`--learners` (4) learners is 3x slower, and what delay-by-one buys (DESIGN.md §5.5, §5.8).

Every run is `bench scaling`'s learner (the trainer's own `Trainer.train_step`, compute emulated
by a sleep and synthetic gradients of the real model's shapes), one learner per emulated host on
the emulated network (1 Gbit/s; loopback when emulation is unavailable, recorded in `network`).
The straggler is the trainer's own `train.straggler`: rank `--straggler-rank` sleeps
(slowdown − 1) x its compute time after every step.

- `*_kept` = aggregate frames/s with the straggler / without it. Aggregate = the sum of every
  learner's own frames/s over its timed steps (for lock-step sync that is learners x the slowest
  pace). Regime 1 (`--compute-ms` 400, default DNN 4 x 512): sync spends at most ~20% of a step
  communicating, so arithmetic alone caps sync at (C+m)/(3C+m) <= 0.4; the JSON records the
  measured share (`sync_comm_share`).
- `adpsgd_delay_by_one_speedup` = frames/s of adpsgd with delay-by-one / without, equal learners,
  in regime 2 (`--overlap-compute-ms`), where one exchange takes about as long as one step's
  compute (`exchange_vs_compute` records the measured ratio).
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from asrdist.checks import cli_number
from asrdist.config import MAX_SLOWDOWN
from asrdist.errors import ConfigError


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", default="1gbit", help="1gbit | 10gbit | loopback | any tc rate")
    parser.add_argument("--learners", type=cli_number(int, at_least=2), default=4)
    parser.add_argument("--straggler-rank", type=cli_number(int, at_least=0), default=3)
    parser.add_argument("--slowdown", type=cli_number(float, at_least=1, at_most=MAX_SLOWDOWN), default=3.0)
    parser.add_argument("--hidden-dim", type=cli_number(int, at_least=1), default=512, help="default DNN width (4 hidden layers)")
    parser.add_argument("--compute-ms", type=cli_number(float, above=0), default=400.0, help="regime 1: emulated compute per step")
    parser.add_argument("--overlap-compute-ms", type=cli_number(float, at_least=0), default=0.0,
                        help="regime 2: compute per step ~ one exchange (0: measured from regime 1's adpsgd run)")
    parser.add_argument("--local-batch", type=cli_number(int, at_least=1), default=256, help="frames per learner per minibatch")
    parser.add_argument("--steps", type=cli_number(int, at_least=1), default=12, help="timed minibatches per learner")
    parser.add_argument("--warmup", type=cli_number(int, at_least=0), default=2)
    parser.add_argument("--timeout", type=cli_number(float, above=0), default=600.0, help="seconds per learner job")


def _run(job: dict, strategy: str, config: dict, n: int, network: str, timeout: float,
         straggler: int | None = None, slowdown: float = 1.0) -> dict:
    from asrdist.cluster.netem_launch import run_learners

    args = {**job, "strategy": strategy, "strategy_config": config}
    if straggler is not None:
        args.update(straggler_rank=straggler, slowdown=slowdown)
    results = run_learners("asrdist.bench.scaling_worker", "scaling_learner", n, None, network, args,
                           timeout=timeout)
    r0 = results[0]
    return {"frames_per_second": r0["sum_of_learner_rates"], "parameters": r0["parameters"],
            "per_learner": [{k: r[k] for k in ("rank", "seconds_per_step", "comm_seconds_per_step",
                                               "wait_seconds_per_step", "bytes_sent_per_step")} for r in results]}


def run(args) -> dict:
    from asrdist.cluster.netem import resolve_network

    n = args.learners
    if args.straggler_rank >= n:
        raise ConfigError(f"bench straggler: --straggler-rank must be below --learners ({n}), got {args.straggler_rank}")
    network, label = resolve_network(args.network)
    model = {"name": "dnn", "hidden_dim": args.hidden_dim, "hidden_layers": 4}
    job: dict[str, Any] = {"model": model, "feature_dim": 40, "num_classes": 40,
                           "optim": {"name": "sgd", "lr": 1e-3}, "compute_ms": args.compute_ms,
                           "local_batch": args.local_batch, "steps": args.steps, "warmup": args.warmup}
    go = lambda name, cfg, **kw: _run(job, name, cfg, n, network, args.timeout, **kw)  # noqa: E731
    slow = {"straggler": args.straggler_rank, "slowdown": args.slowdown}
    runs = {
        "sync": go("sync", {}), "sync_straggler": go("sync", {}, **slow),
        "adpsgd": go("adpsgd", {"pattern": "fixed"}), "adpsgd_straggler": go("adpsgd", {"pattern": "fixed"}, **slow),
        "adpsgd_random": go("adpsgd", {"pattern": "random"}),
        "adpsgd_random_straggler": go("adpsgd", {"pattern": "random"}, **slow),
    }
    kept = lambda name: runs[f"{name}_straggler"]["frames_per_second"] / runs[name]["frames_per_second"]  # noqa: E731
    sync_learners = runs["sync"]["per_learner"]
    share = sum(r["comm_seconds_per_step"] / r["seconds_per_step"] for r in sync_learners) / n
    actives = [r for r in runs["adpsgd"]["per_learner"] if r["rank"] % 2 == 0 and r["rank"] + 1 < n]
    exchange_s = sum(r["comm_seconds_per_step"] for r in actives) / len(actives)
    overlap_ms = args.overlap_compute_ms or max(1.0, round(1000 * exchange_s))
    job2 = {**job, "compute_ms": overlap_ms}
    plain = _run(job2, "adpsgd", {"pattern": "fixed"}, n, network, args.timeout)
    delayed = _run(job2, "adpsgd", {"pattern": "fixed", "delay_by_one": True}, n, network, args.timeout)
    actives2 = [r for r in plain["per_learner"] if r["rank"] % 2 == 0 and r["rank"] + 1 < n]
    exchange2 = sum(r["comm_seconds_per_step"] for r in actives2) / len(actives2)
    return {
        "sync_kept": kept("sync"),
        "adpsgd_kept": kept("adpsgd"),
        "adpsgd_random_kept": kept("adpsgd_random"),
        "adpsgd_delay_by_one_speedup": delayed["frames_per_second"] / plain["frames_per_second"],
        "sync_comm_share": share,
        "sync_kept_by_arithmetic": (1 + share / (1 - share)) / (args.slowdown + share / (1 - share)),
        "exchange_vs_compute": exchange2 / (overlap_ms / 1000.0),
        "frames_per_second": {name: r["frames_per_second"] for name, r in runs.items()}
        | {"adpsgd_regime2": plain["frames_per_second"], "adpsgd_delay_by_one_regime2": delayed["frames_per_second"]},
        "runs": runs | {"adpsgd_regime2": plain, "adpsgd_delay_by_one_regime2": delayed},
        "network": label,
        "learners": n,
        "cores": len(os.sched_getaffinity(0)),
        "threads_per_learner": max(1, len(os.sched_getaffinity(0)) // n),
        "model": f"dnn 440 -> 4 x {args.hidden_dim} -> 40 ({runs['sync']['parameters']:,} parameters)",
        "compute_ms": args.compute_ms,
        "overlap_compute_ms": overlap_ms,
        "local_batch_frames": args.local_batch,
        "straggler": {"rank": args.straggler_rank, "slowdown": args.slowdown},
        "steps": args.steps,
        "aggregate": "sum over learners of each learner's frames / its own timed seconds",
    }
