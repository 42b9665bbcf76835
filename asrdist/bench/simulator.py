"""`asrdist bench simulator`: the simulator against asrdist's own runs on this machine.

1. Runs `bench scaling`'s sweep (the real strategies through `Trainer.train_step`, compute
   emulation, swbd shapes, one learner per emulated host on the emulated network) at 1, 2 and 4
   learners, `--repeats` times, and keeps each figure's median.
2. Takes this machine's figures from the one-learner runs: the emulated compute (a sleep, not
   shared) and the rest of a step (synthetic gradient, optimizer update: CPU work that learners
   share); the link is the emulated network's (rate and delay as `tc` sets them) or loopback.
3. Simulates every strategy and learner count with these figures and reports measured,
   predicted and the relative error per case (`predictions`) and the largest (`max_relative_error`).
"""
from __future__ import annotations

import argparse
import math
import os
import statistics
from typing import Any

from asrdist.errors import ConfigError

STRATEGIES = "sync,onebit,averaging,adpsgd"
TARGET = 0.15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from asrdist.bench import scaling

    scaling.add_arguments(parser)
    parser.set_defaults(strategies=STRATEGIES, learners=[1, 2, 4])
    parser.add_argument("--repeats", type=int, default=1, help="sweeps; each figure is the median")


def _predict(strategy: str, n: int, args, shapes, cpu_seconds: float, link) -> float:
    from asrdist.sim.cluster import LINKS, Cluster
    from asrdist.sim.engine import SimSpec, simulate
    from asrdist.sim.scenario import CPU_COPY_COST, CPU_QUANTIZE_COST, strategy_config

    cores = len(os.sched_getaffinity(0))
    cluster = Cluster(n, 1, LINKS["loopback"], link, shared_cores=cores, one_machine=True)
    spec = SimSpec(strategy if n > 1 else "single", strategy_config(strategy) if n > 1 else None, shapes, cluster,
                   args.local_batch, cpu_seconds / args.local_batch, step_overhead=args.compute_ms / 1000,
                   quantize_cost=CPU_QUANTIZE_COST, copy_cost=CPU_COPY_COST, steps=max(args.steps, 4))
    return simulate(spec).frames_per_second


def run(args) -> dict[str, Any]:
    from asrdist.bench import scaling
    from asrdist.cluster.netem import parse_rate
    from asrdist.sim.cluster import LINKS, Link, model_shapes

    if args.repeats < 1:
        raise ConfigError(f"bench simulator: --repeats must be >= 1, got {args.repeats}")
    if args.nodes is not None or args.per_node is not None:
        raise ConfigError("bench simulator: --nodes/--per-node are not supported (one learner per emulated host)")
    sweeps = [scaling.run(args) for _ in range(args.repeats)]
    network = sweeps[0]["network"]
    strategies = list(sweeps[0]["results"])
    # tc's rate; its 0.1 ms delay only where the kernel has netem (the label says "nodelay" otherwise)
    delay = 20e-6 if "nodelay" in network else 0.1e-3
    link = LINKS["loopback"] if network == "loopback" else Link(parse_rate(args.network) / 8, delay, network)
    model = {"name": args.model, "hidden_layers": args.hidden_layers, "hidden_dim": args.hidden_dim}
    shapes = model_shapes({k: v for k, v in model.items() if v is not None}, args.feature_dim, args.num_classes)

    def median(strategy: str, n: int, key: str) -> float:
        if key == "frames_per_second":
            return statistics.median(s["results"][strategy][str(n)] for s in sweeps)
        return statistics.median(s["details"][strategy][str(n)][key] for s in sweeps)

    one_step = statistics.median(median(s, 1, "seconds_per_step") for s in strategies)
    cpu_seconds = max(one_step - args.compute_ms / 1000, 1e-6)
    predictions: dict[str, dict[str, dict[str, float]]] = {}
    worst = 0.0
    for strategy in strategies:
        predictions[strategy] = {}
        for n in sorted(int(k) for k in sweeps[0]["results"][strategy]):
            measured = median(strategy, n, "frames_per_second")
            predicted = _predict(strategy, n, args, shapes, cpu_seconds, link)
            error = (predicted - measured) / measured
            worst = max(worst, abs(error))
            predictions[strategy][str(n)] = {"measured": measured, "predicted": predicted, "relative_error": error}
    return {
        "predictions": predictions,
        "max_relative_error": worst,
        "target": TARGET,
        "network": network,
        "machine_figures": {"compute_ms": args.compute_ms, "cpu_seconds_per_step_one_learner": cpu_seconds,
                            "link_bytes_per_second": link.bandwidth, "link_latency_seconds": link.latency},
        "repeats": args.repeats,
        "cores": len(os.sched_getaffinity(0)),
        "learners_share_cores": "all learners run on this machine's cores (threads per learner = max(1, cores // n))",
        "parameters": sum(math.prod(s) for s in shapes),
        "sweeps": sweeps,
    }
