"""`asrdist simulate`: predicted frames/s, speed-up, time per epoch and communication share of a
strategy on a cluster; without --strategy, every strategy ranked (the advisor); --validate, the
source documents' figures against the simulator's."""
from __future__ import annotations

import argparse
import math
from pathlib import Path

from asrdist.errors import ConfigError


def register(sub: argparse._SubParsersAction) -> None:
    from asrdist.sim.cluster import DEVICES, LINKS, MODELS

    p = sub.add_parser("simulate", help="scaling simulator and strategy advisor (--validate: the papers' figures)")
    p.add_argument("--validate", action="store_true", help="print the source documents' figures vs the simulator's")
    p.add_argument("--strategy", default=None,
                   help="sync | onebit | averaging | adpsgd | hierarchical | hybrid (default: rank them all)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="a strategy setting, e.g. --set double_buffering=true --set pattern=random")
    p.add_argument("--cluster", default="1x8", help="NODESxLEARNERS_PER_NODE (default 1x8)")
    p.add_argument("--device", default="v100", help=f"compute preset: {', '.join(DEVICES)}")
    p.add_argument("--seconds-per-frame", type=float, default=None,
                   help="measured compute per frame and learner (instead of --device)")
    p.add_argument("--model", default="swbd", help=f"model preset: {', '.join(MODELS)}")
    p.add_argument("--inside", default="nvlink", help=f"link inside a node: {', '.join(LINKS)} or a rate (25gbit)")
    p.add_argument("--network", default="100gbit", help="link between nodes (same names)")
    p.add_argument("--global-batch", type=int, default=None, help="frames per minibatch over all learners "
                                                                  "(default: 256 per learner)")
    p.add_argument("--quantize-ns", type=float, default=0.6, help="1-bit cost per value and pass, ns")
    p.add_argument("--frames-per-epoch", type=float, default=SWB300, help="default: 309 h at 100 frames/s")
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--straggler", default=None, metavar="RANK:SLOWDOWN", help="e.g. 3:3.0")
    p.add_argument("--jitter", type=float, default=0.0, help="every step's compute x (1 + uniform(0, J))")
    p.add_argument("--json", type=Path, default=None, help="also write the result as JSON")
    p.set_defaults(func=run)


SWB300 = 309 * 360_000.0


def _value(text: str):
    low = text.lower()
    if low in ("true", "false"):
        return low == "true"
    for kind in (int, float):
        try:
            return kind(text)
        except ValueError:
            pass
    return text


def build_job(args):
    from asrdist.sim.cluster import (DEVICES, MODELS, Cluster, link_named, model_shapes, seconds_per_frame,
                                     step_overhead)
    from asrdist.sim.scenario import Job, strategy_config

    nodes, per_node = _cluster(args.cluster)
    if args.model not in MODELS:
        raise ConfigError(f"--model: unknown model preset {args.model!r} (known: {', '.join(MODELS)})")
    m = MODELS[args.model]
    shapes = model_shapes(m["model"], m["feature_dim"], m["num_classes"])
    if args.seconds_per_frame is not None:
        if not args.seconds_per_frame > 0:
            raise ConfigError(f"--seconds-per-frame: must be > 0, got {args.seconds_per_frame}")
        spf, overhead = args.seconds_per_frame, 0.0
    else:
        if args.device not in DEVICES:
            raise ConfigError(f"--device: unknown device preset {args.device!r} (known: {', '.join(DEVICES)})")
        device = DEVICES[args.device]
        spf, overhead = seconds_per_frame(device, sum(math.prod(s) for s in shapes)), step_overhead(device, m)
    cluster = Cluster(nodes, per_node, link_named(args.inside), link_named(args.network))
    batch = args.global_batch or 256 * cluster.learners
    if batch < cluster.learners:
        raise ConfigError(f"--global-batch: must be at least {cluster.learners} (one frame per learner), got {batch}")
    slowdown = {}
    if args.straggler:
        try:
            rank, factor = args.straggler.split(":")
            slowdown = {int(rank): float(factor)}
        except ValueError:
            raise ConfigError(f"--straggler: expected RANK:SLOWDOWN like 3:3.0, got {args.straggler!r}") from None
        if not 0 <= int(rank) < cluster.learners or float(factor) < 1:
            raise ConfigError(f"--straggler: rank must be in [0, {cluster.learners - 1}] and slowdown >= 1")
    if args.quantize_ns < 0 or args.jitter < 0 or args.epochs < 1 or not args.frames_per_epoch > 0:
        raise ConfigError("simulate: --quantize-ns, --jitter must be >= 0, --epochs >= 1, --frames-per-epoch > 0")
    settings = dict(_setting(s) for s in args.settings)
    cfg = None
    if args.strategy is not None:
        try:
            cfg = strategy_config(args.strategy, settings)
        except TypeError as e:
            raise ConfigError(f"--set: {e}") from None
    elif settings:
        raise ConfigError("--set needs --strategy")
    return Job(args.strategy or "sync", cfg, shapes, cluster, batch, spf, step_overhead=overhead,
               quantize_cost=args.quantize_ns * 1e-9, frames_per_epoch=args.frames_per_epoch,
               epochs=args.epochs, slowdown=slowdown, jitter=args.jitter)


def _cluster(text: str):
    from asrdist.sim.cluster import parse_cluster

    return parse_cluster(text)


def _setting(text: str):
    if "=" not in text:
        raise ConfigError(f"--set: expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), _value(value.strip())


def table(predictions) -> str:
    lines = [f"{'strategy':<26}{'frames/s':>12}{'speed-up':>10}{'h/epoch':>10}{'comm %':>8}{'wait %':>8}{'MB/step':>10}"]
    for p in predictions:
        lines.append(f"{p.name:<26}{p.frames_per_second:>12,.0f}{p.speedup:>10.2f}{p.epoch_seconds / 3600:>10.3f}"
                     f"{100 * p.comm_share:>8.0f}{100 * p.wait_share:>8.0f}{p.bytes_per_step / 1e6:>10.1f}")
    return "\n".join(lines)


def run(args) -> int:
    from asrdist.utils.io import write_json_atomic

    if args.validate:
        from asrdist.sim.validate import format_table, validate

        result = validate()
        print(format_table(result))
    else:
        from asrdist.sim.scenario import advise, run_job

        job = build_job(args)
        c = job.cluster
        head = (f"{args.model} ({sum(math.prod(s) for s in job.shapes):,} parameters), {c.nodes}x{c.per_node} "
                f"learners, {args.device if args.seconds_per_frame is None else 'measured compute'}, "
                f"inside {args.inside}, between {args.network}, global batch {job.global_batch} frames")
        if args.strategy is None:
            ranked, why = advise(job)
            print(head)
            print(table(ranked))
            print(why)
            result = {"setting": head, "ranking": [p.as_dict() for p in ranked], "why": why}
        else:
            p = run_job(job)
            print(head)
            print(table([p]))
            result = {"setting": head, "prediction": p.as_dict()}
    if args.json is not None:
        write_json_atomic(args.json, result)
    return 0
