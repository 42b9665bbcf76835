"""`asrdist bench scaling`: frames/s of 1, 2, 4 learners per strategy, with compute emulation.

Every learner runs the trainer's own `Trainer.train_step` on the real model with
`train.emulate_compute_ms` (a sleep and synthetic gradients for forward/backward), one per
emulated host: weak scaling, `speedup[strategy][n]` against one learner. `--nodes A --per-node B`
times `NODE_CONFIGS` on A hosts of B learners and `hierarchical_allreduce_speedup`, flat against
hierarchical sync exchange. Details and keys:
docs/benchmarks.md#asrdist-bench-scaling-framess-with-compute-emulation."""
from __future__ import annotations

import argparse
import os
import statistics
from typing import Any

from asrdist.checks import cli_list, cli_number
from asrdist.cluster import launcher, netem
from asrdist.cluster.netem import parse_rate, resolve_network
from asrdist.errors import ConfigError
from asrdist.models.registry import ModelConfig
from asrdist.parallel import strategy_config_class

SWBD = {"name": "swbd"}
DEFAULT_LEARNERS = [1, 2, 4]
DEFAULT_NODES, DEFAULT_PER_NODE = 2, 2
PREDICTION_RATE = "1gbit"
"""The link rate of the bandwidth model when the run itself is on loopback."""

NODE_CONFIGS: dict[str, tuple[str, dict[str, Any]]] = {
    "sync_flat": ("sync", {"hierarchical": "false"}),
    "sync_hierarchical": ("sync", {"hierarchical": "true"}),
    "onebit_hierarchical": ("onebit", {"hierarchical": "true"}),
    "adpsgd": ("adpsgd", {}),
    "hierarchical": ("hierarchical", {}),
    "hybrid": ("hybrid", {"sync_epochs": 0}),  # epoch 0 is past the synchronous start: ADPSGD phase
}
"""`--nodes` mode: configuration name -> (strategy, strategy config)."""
EXCHANGE_JOB = "sync_flat"
"""The `--nodes` job whose learners, after their timed steps, also time the flat and the
hierarchical allreduce of the model's gradient (`scaling_worker.time_exchanges`)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", default="1gbit", help="1gbit | 10gbit | loopback | any tc rate")
    parser.add_argument("--strategies", default="sync,onebit", help="comma-separated strategy names")
    parser.add_argument("--learners", type=cli_list(int, at_least=1), default=None,
                        help="learner counts, e.g. 1,2,4 (default 1,2,4; with --nodes: none unless given)")
    # at least 2: hierarchical differs from flat only across nodes
    parser.add_argument("--nodes", type=cli_number(int, at_least=2), default=None,
                        help=f"emulated hosts of --per-node learners each (default {DEFAULT_NODES} when "
                             "--per-node is given): time sync flat/hierarchical, onebit hierarchical, "
                             "adpsgd, hierarchical, hybrid")
    parser.add_argument("--per-node", type=cli_number(int, at_least=1), default=None,
                        help=f"learners per emulated host (default {DEFAULT_PER_NODE} when --nodes is given)")
    parser.add_argument("--configs", default=None,
                        help="--nodes: the configurations to time (comma list of "
                             f"{', '.join(NODE_CONFIGS)}; default all; {EXCHANGE_JOB} always runs: it times the "
                             "allreduces)")
    parser.add_argument("--exchange-repeats", type=cli_number(int, at_least=1), default=5,
                        help="--nodes: timed flat and hierarchical allreduces of the model's gradient")
    parser.add_argument("--compute-ms", type=cli_number(float, above=0), default=200.0, help="emulated forward/backward per minibatch")
    parser.add_argument("--local-batch", type=cli_number(int, at_least=1), default=1024, help="frames per learner per minibatch")
    parser.add_argument("--model", default="swbd", help="model name (swbd: 429 -> 7 x 2048 -> 9304)")
    parser.add_argument("--hidden-layers", type=cli_number(int, at_least=1), default=None)
    parser.add_argument("--hidden-dim", type=cli_number(int, at_least=1), default=None)
    parser.add_argument("--feature-dim", type=cli_number(int, at_least=1), default=39, help="features per frame (x 11 spliced)")
    parser.add_argument("--num-classes", type=cli_number(int, at_least=2), default=9304)
    parser.add_argument("--steps", type=cli_number(int, at_least=1), default=8, help="timed minibatches per run")
    parser.add_argument("--warmup", type=cli_number(int, at_least=0), default=2, help="untimed minibatches first")
    parser.add_argument("--lr", type=cli_number(float, above=0), default=1e-3, help="plain SGD learning rate")
    parser.add_argument("--timeout", type=cli_number(float, above=0), default=900.0, help="seconds per learner job")


def run(args) -> dict:
    nodes_mode = args.nodes is not None or args.per_node is not None
    sweep = args.learners if args.learners is not None else (None if nodes_mode else DEFAULT_LEARNERS)
    strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
    if not strategies and not nodes_mode:
        raise ConfigError(f"bench scaling: --strategies {args.strategies!r} names no strategy")
    for name in strategies:
        strategy_config_class(name)  # unknown names fail before anything starts
    if nodes_mode:
        nodes = DEFAULT_NODES if args.nodes is None else args.nodes
        per_node = DEFAULT_PER_NODE if args.per_node is None else args.per_node
        node_configs(args.configs)  # unknown names fail before anything starts
    elif args.configs is not None:
        raise ConfigError("bench scaling: --configs chooses among the --nodes configurations; give --nodes too")
    model = {"name": args.model, "hidden_layers": args.hidden_layers, "hidden_dim": args.hidden_dim}
    ModelConfig(**model)  # validate now
    network, label = resolve_network(args.network)
    job: dict[str, Any] = {"model": model, "feature_dim": args.feature_dim, "num_classes": args.num_classes,
                           "optim": {"name": "sgd", "lr": args.lr}, "compute_ms": args.compute_ms,
                           "local_batch": args.local_batch, "steps": args.steps, "warmup": args.warmup}
    out: dict[str, Any] = {"network": label, "requested_network": args.network}
    if label == "loopback" and args.network != "loopback":
        out["network_fallback"] = _fallback_reason(args.network)
    parameters = None
    if sweep is not None:
        swept = _run_sweep(job, strategies, sweep, network, args.timeout)
        parameters = swept.pop("parameters")
        out.update(swept)
    if nodes_mode:
        section = _run_nodes(job, nodes, per_node, network, label, args)
        parameters = section["parameters"]
        out["nodes"] = section
        out["hierarchical_allreduce_speedup"] = section["hierarchical_allreduce_speedup"]
    out["cores"] = len(os.sched_getaffinity(0))
    if sweep is not None:
        out["threads_per_learner"] = out.pop("threads_per_learner")
        out["details"] = out.pop("details")
    out.update({
        "model": f"{args.model} ({parameters:,} parameters)",
        "compute_ms": args.compute_ms,
        "local_batch_frames": args.local_batch,
        "steps": args.steps,
        "warmup": args.warmup,
        "optimizer": f"sgd lr={args.lr}",
        "scaling": "weak: every learner's minibatch is local_batch_frames; ideal speedup = learners",
    })
    return out


def _fallback_reason(requested: str) -> str:
    _, reason = netem.available()
    return f"network '{requested}' unavailable ({reason}); every learner ran on loopback"


def _run_sweep(job: dict[str, Any], strategies: list[str], learners: list[int], network: str,
               timeout: float) -> dict[str, Any]:
    """The learner-count sweep: 1, 2, 4 (`learners`) learners per strategy, one per emulated host."""
    counts = sorted(set(learners) | {1})
    results: dict[str, dict[str, float]] = {}
    details: dict[str, dict[str, dict]] = {}
    parameters, threads = None, {}
    for name in strategies:
        results[name], details[name] = {}, {}
        for n in counts:
            r0 = launcher.run_learners(__package__ + ".scaling_worker", "scaling_learner", n, None,
                              network if n > 1 else "loopback", {**job, "strategy": name},
                              timeout=timeout)[0]
            results[name][str(n)] = r0["frames_per_second"]
            details[name][str(n)] = {k: v for k, v in r0.items()
                                     if k not in ("rank", "parameters", "strategy", "lockstep")}
            parameters = r0["parameters"]
            threads[str(n)] = r0["threads"]
    speedup = {name: {n: fps / by_n["1"] for n, fps in by_n.items()} for name, by_n in results.items()}
    return {"results": results, "speedup": speedup, "threads_per_learner": threads, "details": details,
            "parameters": parameters}


def predict_hierarchical_allreduce(gradient_bytes: float, nodes: int, per_node: int,
                                   rate_bits_per_second: float) -> dict[str, float]:
    """The bandwidth model of one allreduce of `gradient_bytes` (S) over n = A x B learners, A =
    `nodes` hosts of B = `per_node` learners, hosts joined by links of `rate_bits_per_second`,
    traffic inside a host free (loopback). Only the busiest link between hosts counts:

        flat ring over n learners:  a ring edge carries 2·S·(n−1)/n bytes, and a ring of the
                                    ranks in node order crosses every host's link once each way:
                                    t_flat = 2·S·(n−1)/n · 8 / rate
        hierarchical:               the cross-host allreduce runs on S/B bytes over A hosts, each
                                    learner sends 2·(S/B)·(A−1)/A, and the B learners of a host
                                    share its link: B · 2·(S/B)·(A−1)/A = 2·S·(A−1)/A bytes,
                                    t_hier = 2·S·(A−1)/A · 8 / rate
        ratio = t_flat / t_hier = ((n−1)/n) / ((A−1)/A)     (2 x 2: 0.75 / 0.5 = 1.5)

    Latency (the 0.1 ms delay per hop) and the reduction's CPU time are left out."""
    if nodes < 2 or per_node < 1 or rate_bits_per_second <= 0:
        raise ValueError("predict_hierarchical_allreduce: need nodes >= 2, per_node >= 1, rate > 0")
    n, size = nodes * per_node, float(gradient_bytes)
    flat_link_bytes = 2 * size * (n - 1) / n
    hier_link_bytes = per_node * 2 * (size / per_node) * (nodes - 1) / nodes
    flat_s = flat_link_bytes * 8 / rate_bits_per_second
    hier_s = hier_link_bytes * 8 / rate_bits_per_second
    return {"flat_seconds": flat_s, "hierarchical_seconds": hier_s, "ratio": flat_s / hier_s,
            "flat_link_bytes": flat_link_bytes, "hierarchical_link_bytes": hier_link_bytes}


def node_configs(text: str | None) -> list[str]:
    """The `--configs` names (None: all) in NODE_CONFIGS order, EXCHANGE_JOB always among them."""
    if text is None:
        return list(NODE_CONFIGS)
    asked = {c.strip() for c in text.split(",") if c.strip()}
    unknown = sorted(asked - set(NODE_CONFIGS))
    if unknown:
        raise ConfigError(f"bench scaling --configs: unknown {', '.join(unknown)} (choose from {', '.join(NODE_CONFIGS)})")
    return [c for c in NODE_CONFIGS if c in asked or c == EXCHANGE_JOB]


def _run_nodes(job: dict[str, Any], nodes: int, per_node: int, network: str, label: str, args) -> dict[str, Any]:
    """`--nodes` mode: NODE_CONFIGS at nodes x per_node learners, and the allreduce speed-up."""
    world = nodes * per_node
    results: dict[str, float] = {}
    details: dict[str, Any] = {}
    runs: dict[str, list[dict]] = {}
    ex: dict[str, Any] = {}  # the exchange timing, from EXCHANGE_JOB's learners
    for config in node_configs(args.configs):
        strategy, strategy_config = NODE_CONFIGS[config]
        extra = {"exchange_repeats": args.exchange_repeats} if config == EXCHANGE_JOB else {}
        rs = launcher.run_learners(__package__ + ".scaling_worker", "scaling_learner", world, nodes, network,
                          {**job, "strategy": strategy, "strategy_config": strategy_config, **extra},
                          timeout=args.timeout)
        runs[config] = rs
        r0 = dict(rs[0])
        if "exchange" in r0:
            ex = r0.pop("exchange")
        lockstep = bool(r0["lockstep"])
        results[config] = r0["frames_per_second"]  # one definition for every strategy (utils.throughput)
        details[config] = {
            "strategy": strategy, "strategy_config": strategy_config, "lockstep": lockstep,
            "aggregate": "the job's frames / its longest learner's seconds (asrdist.utils.throughput)",
            **{k: v for k, v in r0.items() if k not in ("rank", "parameters", "strategy", "lockstep")},
            "per_learner": [{k: r[k] for k in ("rank", "seconds_per_step", "comm_seconds_per_step",
                                               "wait_seconds_per_step", "cpu_seconds_per_step",
                                               "bytes_sent_per_step")} for r in rs],
        }
    if "hybrid" in details:
        details["hybrid"]["phase"] = ("synchronous (allreduce over all learners)" if details["hybrid"]["lockstep"]
                                      else "asynchronous (sync_epochs 0, start_epoch(0): ADPSGD between nodes, "
                                           "sync inside)")
    flat_median = statistics.median(ex["flat_seconds"])
    hier_median = statistics.median(ex["hierarchical_seconds"])
    parameters = runs[EXCHANGE_JOB][0]["parameters"]
    gradient_bytes = 4 * parameters  # float32
    rate_name = network if network != "loopback" else PREDICTION_RATE
    predicted = predict_hierarchical_allreduce(gradient_bytes, nodes, per_node, parse_rate(rate_name))

    def comm(config: str) -> float:  # mean over learners
        return statistics.fmean(r["comm_seconds_per_step"] for r in runs[config])

    in_training = (comm("sync_flat") / comm("sync_hierarchical")
                   if "sync_hierarchical" in runs and comm("sync_hierarchical") > 0 else None)
    details["exchange"] = {
        "flat_seconds": ex["flat_seconds"], "hierarchical_seconds": ex["hierarchical_seconds"],
        "flat_seconds_median": flat_median, "hierarchical_seconds_median": hier_median,
        "flat_bytes_per_exchange": ex["flat_bytes"], "hierarchical_bytes_per_exchange": ex["hierarchical_bytes"],
        "max_abs_difference": ex["max_abs_difference"], "repeats": args.exchange_repeats,
        "gradient_bytes": gradient_bytes,
        "timing": "one sync exchange (bucketed allreduce + mean) of the model's gradient shapes, flat vs "
                  "hierarchical alternating in one job; median over repeats of the slowest learner's time",
    }
    details["hierarchical_comm_speedup_in_training"] = in_training
    details["prediction"] = {**predicted, "rate": rate_name, "rate_bits_per_second": parse_rate(rate_name),
                             "formula": "flat link bytes 2S(n-1)/n, hierarchical B*2(S/B)(A-1)/A; "
                                        "ratio ((n-1)/n)/((A-1)/A)"}
    return {
        "nodes": nodes,
        "per_node": per_node,
        "learners": world,
        "network": label,
        "requested_network": args.network,
        "inside_node": "loopback",
        "results": results,
        "details": details,
        "hierarchical_allreduce_speedup": flat_median / hier_median,
        "hierarchical_allreduce_predicted": predicted["ratio"],
        "hierarchical_allreduce_target": 1.3,
        "parameters": parameters,
        "threads_per_learner": runs[EXCHANGE_JOB][0]["threads"],
    }
