"""`asrdist bench scaling`: frames/s of 1, 2, 4 learners per strategy, with compute emulation.

Every learner runs the trainer's own `Trainer.train_step` on the real model (default the
46M-parameter `swbd` DNN) with `train.emulate_compute_ms`: forward/backward become a sleep of
`--compute-ms` and synthetic gradients of the model's shapes, so a 2-core machine drives the
real communication and optimizer update of many learners (DESIGN.md §5.8). Learners sit one per
emulated host on the emulated network (default 1 Gbit/s links; loopback when emulation is
unavailable, recorded in `network`); one learner needs no network and runs alone.

Weak scaling: each learner's minibatch is `--local-batch` frames whatever the learner count
(as each GPU of the seeds takes its own share), so the ideal is `speedup` = learners.
`speedup[strategy][n]` = frames/s of n learners / frames/s of 1 learner of that strategy. All
learners share this machine's cores: `cores` says how many, `threads_per_learner` how they were
split; the synthetic gradients and the optimizer update are real CPU work that the learners
share.
"""
from __future__ import annotations

import argparse
import os
from typing import Any

from asrdist.errors import ConfigError

SWBD = {"name": "swbd"}


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated integers, got {text!r}") from None
    if not values or min(values) < 1:
        raise argparse.ArgumentTypeError(f"expected positive integers, got {text!r}")
    return values


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", default="1gbit", help="1gbit | 10gbit | loopback | any tc rate")
    parser.add_argument("--strategies", default="sync,onebit", help="comma-separated strategy names")
    parser.add_argument("--learners", type=_int_list, default=[1, 2, 4], help="learner counts, e.g. 1,2,4")
    parser.add_argument("--compute-ms", type=float, default=200.0, help="emulated forward/backward per minibatch")
    parser.add_argument("--local-batch", type=int, default=1024, help="frames per learner per minibatch")
    parser.add_argument("--model", default="swbd", help="model name (swbd: 429 -> 7 x 2048 -> 9304)")
    parser.add_argument("--hidden-layers", type=int, default=None)
    parser.add_argument("--hidden-dim", type=int, default=None)
    parser.add_argument("--feature-dim", type=int, default=39, help="features per frame (x 11 spliced)")
    parser.add_argument("--num-classes", type=int, default=9304)
    parser.add_argument("--steps", type=int, default=8, help="timed minibatches per run")
    parser.add_argument("--warmup", type=int, default=2, help="untimed minibatches first")
    parser.add_argument("--lr", type=float, default=1e-3, help="plain SGD learning rate")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per learner job")


def run(args) -> dict:
    from asrdist.models.registry import ModelConfig
    from asrdist.parallel import strategy_config_class
    from asrdist.cluster.netem import resolve_network
    from asrdist.cluster.netem_launch import run_learners

    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    for name in strategies:
        strategy_config_class(name)  # unknown names fail before anything starts
    if args.compute_ms <= 0 or args.steps < 1 or args.warmup < 0 or args.local_batch < 1:
        raise ConfigError("bench scaling: need --compute-ms > 0, --steps >= 1, --warmup >= 0, --local-batch >= 1")
    model = {"name": args.model, "hidden_layers": args.hidden_layers, "hidden_dim": args.hidden_dim}
    ModelConfig(**model)  # validate now
    network, label = resolve_network(args.network)
    counts = sorted(set(args.learners) | {1})
    job: dict[str, Any] = {"model": model, "feature_dim": args.feature_dim, "num_classes": args.num_classes,
                           "optim": {"name": "sgd", "lr": args.lr}, "compute_ms": args.compute_ms,
                           "local_batch": args.local_batch, "steps": args.steps, "warmup": args.warmup}
    results: dict[str, dict[str, float]] = {}
    details: dict[str, dict[str, dict]] = {}
    parameters, threads = None, {}
    for name in strategies:
        results[name], details[name] = {}, {}
        for n in counts:
            r0 = run_learners(__package__ + ".scaling_worker", "scaling_learner", n, None,
                              network if n > 1 else "loopback", {**job, "strategy": name},
                              timeout=args.timeout)[0]
            results[name][str(n)] = r0["frames_per_second"]
            details[name][str(n)] = {k: v for k, v in r0.items() if k not in ("rank", "parameters")}
            parameters = r0["parameters"]
            threads[str(n)] = r0["threads"]
    speedup = {name: {n: fps / by_n["1"] for n, fps in by_n.items()} for name, by_n in results.items()}
    return {
        "network": label,
        "requested_network": args.network,
        "results": results,
        "speedup": speedup,
        "cores": len(os.sched_getaffinity(0)),
        "threads_per_learner": threads,
        "details": details,
        "model": f"{args.model} ({parameters:,} parameters)",
        "compute_ms": args.compute_ms,
        "local_batch_frames": args.local_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "optimizer": f"sgd lr={args.lr}",
        "scaling": "weak: every learner's minibatch is local_batch_frames; ideal speedup = learners",
    }
