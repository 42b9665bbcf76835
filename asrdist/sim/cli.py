"""`asrdist simulate`: predicted frames/s, speed-up, time per epoch and communication share of a
strategy on a cluster; without --strategy, every strategy ranked (the advisor); --validate, the
source documents' figures against the simulator's."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import MAX_SLOWDOWN, cli_number
from asrdist.commands import help_of
from asrdist.errors import ConfigError

DEFAULT_CLUSTER = "1x8"


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.sim.cluster import (
        DEVICES,
        LINKS,
        MAX_LEARNER_STEPS,
        MAX_LEARNERS,
        MAX_ONEBIT_SPAN,
        MODELS,
    )

    p = sub.add_parser("simulate", help=help_of("simulate"))
    p.add_argument("--validate", action="store_true", help="print the source documents' figures vs the simulator's")
    p.add_argument("--strategy", default=None,
                   help="sync | onebit | averaging | adpsgd | hierarchical | hybrid (default: rank them all)")
    p.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                   help="a strategy setting, e.g. --set double_buffering=true --set pattern=random")
    p.add_argument("--cluster", default=None,
                   help=f"NODESxLEARNERS_PER_NODE (default {DEFAULT_CLUSTER}), at most {MAX_LEARNERS} learners. "
                        f"Learners that move alike are simulated once (sync, averaging; hierarchical, hybrid: 2 per node), others one by "
                        f"one (adpsgd, onebit, any with --jitter), at most {MAX_LEARNER_STEPS // 24} learners x 24 "
                        f"steps; hierarchical onebit: at most {MAX_ONEBIT_SPAN} learners per node")
    p.add_argument("--device", default="v100", help=f"compute preset: {', '.join(DEVICES)}, a measured one "
                                                   f"(python -m asrdist.sim.measured show), or cpu:CORES: every "
                                                   f"node a dedicated CPU host of CORES cores (asrdist train "
                                                   f"--cpus-per-host), shared by its learners")
    p.add_argument("--seconds-per-frame", type=cli_number(float, above=0), default=None,
                   help="measured compute per frame and learner (instead of --device); with --device cpu:CORES, "
                        "one learner's on one core")
    p.add_argument("--model", default="swbd", help=f"model preset: {', '.join(MODELS)}")
    p.add_argument("--inside", default=None, help=f"link inside a node: {', '.join(LINKS)} or a rate (25gbit); "
                                                 f"default nvlink (loopback with --device cpu:CORES)")
    p.add_argument("--network", default="100gbit", help="link between nodes (same names)")
    p.add_argument("--global-batch", type=cli_number(int, at_least=1), default=None,
                   help="frames per minibatch over all learners (default: 256 per learner)")
    p.add_argument("--quantize-ns", type=cli_number(float, at_least=0), default=0.6,
                   help="1-bit cost per value and pass, ns")
    p.add_argument("--frames-per-epoch", type=cli_number(float, above=0), default=SWB300,
                   help="default: 309 h at 100 frames/s")
    p.add_argument("--epochs", type=cli_number(int, at_least=1), default=1)
    p.add_argument("--straggler", default=None, metavar="RANK:SLOWDOWN", help="e.g. 3:3.0 (slowdown >= 1)")
    p.add_argument("--jitter", type=cli_number(float, at_least=0, at_most=MAX_SLOWDOWN), default=0.0,
                   help="every step's compute x (1 + uniform(0, J))")
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
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.sim.cluster import (
        MODELS,
        Cluster,
        model_shapes,
        parameter_count,
        seconds_per_frame,
    )
    from asrdist.sim.scenario import CPU_COPY_COST, Job
    from asrdist.sim.spec import simulated_names

    cluster_text = args.cluster or DEFAULT_CLUSTER
    nodes, per_node = _cluster(cluster_text)
    if args.strategy is not None and args.strategy not in simulated_names():
        raise ConfigError(f"--strategy: unknown strategy {args.strategy!r} (known: {', '.join(simulated_names())})")
    if args.strategy is None and nodes * per_node < 2:
        raise ConfigError(f"--cluster: ranking the strategies needs at least 2 learners (or name one with --strategy), "
                          f"got {cluster_text!r}")
    if args.model not in MODELS:
        raise ConfigError(f"--model: unknown model preset {args.model!r} (known: {', '.join(MODELS)})")
    m = MODELS[args.model]
    shapes = model_shapes(m["model"], m["feature_dim"], m["num_classes"])
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.sim.dedicated import CPU_CORE_FLOPS, parse_cpu_device, share_of

    quota = parse_cpu_device(args.device)
    share = 1.0 if quota is None else share_of(quota, per_node)
    if quota is not None:  # a dedicated CPU host: one core's compute (measured, or the preset) over the share
        from asrdist.sim.cluster import Device  # (the command's work: `--help` stays light)

        one_core = args.seconds_per_frame or seconds_per_frame(Device(CPU_CORE_FLOPS), parameter_count(shapes))
        spf = one_core / share
    elif args.seconds_per_frame is not None:
        spf = args.seconds_per_frame
    else:
        from asrdist.sim.measured import all_devices  # imported when the command runs: `--help` stays light

        devices = all_devices()  # the papers' presets and those measured by scripts/gpu_check.sh
        if args.device not in devices:
            raise ConfigError(f"--device: unknown device preset {args.device!r} (known: {', '.join(devices)})")
        spf = seconds_per_frame(devices[args.device], parameter_count(shapes))
    inside = args.inside or ("loopback" if quota is not None else "nvlink")
    cluster = Cluster(nodes, per_node, _link("--inside", inside), _link("--network", args.network),
                      cpu_hosts=quota is not None)
    batch = 256 * cluster.learners if args.global_batch is None else args.global_batch
    if batch < cluster.learners:
        raise ConfigError(f"--global-batch: must be at least {cluster.learners} (one frame per learner), got {batch}")
    if batch % cluster.learners:
        low = batch // cluster.learners * cluster.learners
        raise ConfigError(f"--global-batch: {batch} frames do not split evenly over {cluster.learners} learners; "
                          f"use a multiple of {cluster.learners}, e.g. {max(low, cluster.learners)} or "
                          f"{low + cluster.learners}")
    if batch > args.frames_per_epoch:
        raise ConfigError(f"--global-batch: a minibatch of {batch} frames is more than --frames-per-epoch "
                          f"({args.frames_per_epoch:g})")
    slowdown = _straggler(args.straggler, cluster.learners) if args.straggler is not None else {}
    settings = dict(_setting(s) for s in args.settings)
    cfg = None
    if args.strategy is not None:
        cfg = _strategy_config(args.strategy, settings)
    elif settings:
        raise ConfigError("--set needs --strategy")
    # a dedicated host's CPU work (1-bit coding, the copies of an average) runs at its share too
    copy_cost = {} if quota is None else {"copy_cost": CPU_COPY_COST / share, "mean_cost": CPU_COPY_COST / share}
    return Job(args.strategy or "sync", cfg, shapes, cluster, batch, spf,
               quantize_cost=args.quantize_ns * 1e-9 / share, frames_per_epoch=args.frames_per_epoch,
               epochs=args.epochs, slowdown=slowdown, jitter=args.jitter, **copy_cost)


def _cluster(text: str):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.sim.cluster import parse_cluster

    return parse_cluster(text)


def _link(option: str, text: str):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.sim.cluster import LINKS, link_named

    try:
        return link_named(text)
    except ConfigError:
        raise ConfigError(f"{option}: expected {', '.join(LINKS)} or a positive rate like 25gbit, "
                          f"got {text!r}") from None


def _straggler(text: str, learners: int) -> dict[int, float]:
    rank, colon, factor = text.partition(":")
    try:
        rank, factor = int(rank), float(factor)
    except ValueError:
        colon = ""
    if not colon or not 0 <= rank < learners or not 1 <= factor <= MAX_SLOWDOWN:
        raise ConfigError(f"--straggler: expected RANK:SLOWDOWN with 0 <= RANK < {learners} and 1 <= SLOWDOWN <= "
                          f"{MAX_SLOWDOWN:g}, like 3:3.0, got {text!r}")
    return {rank: factor}


def _strategy_config(name: str, settings: dict):
    # the command's work, imported when it runs: `asrdist --help` stays light
    import dataclasses

    from asrdist.parallel import strategy_config_class  # imported when the command runs: `--help` stays light
    from asrdist.sim.scenario import strategy_config  # imported when the command runs: `--help` stays light

    config_class = strategy_config_class(name)
    known = [f.name for f in dataclasses.fields(config_class)] if config_class is not None else []
    unknown = sorted(set(settings) - set(known))
    if unknown:
        raise ConfigError(f"--set: {name} has no setting {unknown[0]!r} (known: {', '.join(known)})")
    try:
        return strategy_config(name, settings)
    except ConfigError as e:
        raise ConfigError(f"--set: {e}") from None


def _setting(text: str):
    if "=" not in text:
        raise ConfigError(f"--set: expected KEY=VALUE, got {text!r}")
    key, value = text.split("=", 1)
    return key.strip(), _value(value.strip())


def _figure(value: float, decimals: int) -> str:
    """`decimals` places, or three significant digits for the tiny and huge figures of extreme
    clusters (a 1 kbit/s link, a thousand hosts), which would otherwise read 0.000 or fill a row."""
    return f"{value:.{decimals}f}" if value == 0 or 10 ** -decimals <= abs(value) < 1e6 else f"{value:.3g}"


def table(predictions, nearest: list | None = None) -> str:
    """One row per strategy; every column right-aligned after at least one space, however wide.
    `nearest`: per prediction, its nearest validated case (`asrdist.sim.uncertainty`): its error
    in a column, the cases named below the table."""
    lines = [f"{'strategy':<26} {'frames/s':>11} {'speed-up':>9} {'h/epoch':>9} {'comm %':>7} {'wait %':>7} "
             f"{'MB/step':>9}" + (f" {'validated':>10}" if nearest else "")]
    cases: list = []
    for i, p in enumerate(predictions):
        fps = f"{p.frames_per_second:,.0f}" if p.frames_per_second >= 1 else _figure(p.frames_per_second, 0)
        extra = ""
        if nearest:
            case = nearest[i]
            if case is not None and case not in cases:
                cases.append(case)
            extra = f" {'-' if case is None else f'{100 * case.relative_error:+.0f}% [{cases.index(case) + 1}]':>10}"
        lines.append(f"{p.name:<26} {fps:>11} {_figure(p.speedup, 2):>9} "
                     f"{_figure(p.epoch_seconds / 3600, 3):>9} {100 * p.comm_share:>7.0f} {100 * p.wait_share:>7.0f} "
                     f"{_figure(p.bytes_per_step / 1e6, 1):>9}{extra}")
    if cases:
        lines.append("validated: the error the simulator made on the nearest validated case (predicted vs measured):")
        lines += [f"  [{i + 1}] {c.source}: {c.case} ({c.strategy}, {c.learners} learners)"
                  for i, c in enumerate(cases)]
    return "\n".join(lines)


def within_error_of_winner(ranked, nearest: list) -> list[str]:
    """The ranked strategies the winner (the first) does not beat beyond the simulator's error:
    their epoch times' bands (`asrdist.sim.uncertainty.apart`, from each one's nearest validated
    case) overlap the winner's."""
    from asrdist.sim.uncertainty import apart  # imported when the command runs: `--help` stays light

    def timed(i: int) -> tuple[float, float | None]:
        return ranked[i].epoch_seconds, None if nearest[i] is None else nearest[i].relative_error

    return [p.name for i, p in enumerate(ranked) if i and not apart(timed(0), timed(i))]


def _error_text(errors: list[float | None]) -> str:
    """The simulator's error band over some strategies: the largest |error| of their nearest
    validated cases, or that one of them has no case to bound it."""
    if any(e is None for e in errors):
        return "error unbounded: no validated case near some of them"
    return f"error \u00b1{100 * max(abs(e) for e in errors):.0f}%"


def advice(ranked, nearest: list) -> tuple[str, list[list[str]]]:
    """One advice from a ranking and each strategy's nearest validated case: the tiers of
    strategies the simulator cannot tell apart (the winner's: those whose epoch-time bands overlap
    its own, `within_error_of_winner`; after it, each next strategy joins the tier before when its
    band overlaps one of that tier's), and one sentence. Either the winner is apart from every
    other, and the sentence is the ranking, "X, then Y, then Z or W" (a later tier's strategies
    joined by "or"); or it is not, and the sentence says only that "X and Y cannot be told apart
    by the simulator here (error ±E%)", and which are slower than the winner beyond that error."""
    from asrdist.sim.uncertainty import apart  # imported when the command runs: `--help` stays light

    def timed(i: int) -> tuple[float, float | None]:
        return ranked[i].epoch_seconds, None if nearest[i] is None else nearest[i].relative_error

    close = set(within_error_of_winner(ranked, nearest))
    first = [0] + [i for i in range(1, len(ranked)) if ranked[i].name in close]
    tiers: list[list[int]] = [first]
    for i in range(1, len(ranked)):
        if i in first:
            continue
        if len(tiers) > 1 and any(not apart(timed(i), timed(j)) for j in tiers[-1]):
            tiers[-1].append(i)
        else:
            tiers.append([i])
    names = [[ranked[i].name for i in tier] for tier in tiers]
    errors = [timed(i)[1] for i in range(len(ranked))]
    if len(first) > 1:
        tied = names[0]
        who = ", ".join(tied[:-1]) + f" and {tied[-1]}"
        line = f"{who} cannot be told apart by the simulator here ({_error_text([errors[i] for i in first])})"
        rest = [n for tier in names[1:] for n in tier]
        if rest:
            line += f"; slower than {tied[0]} beyond that error: {', '.join(rest)}"
        return line, names
    order = ", then ".join(" or ".join(tier) for tier in names)
    return f"{order} (fastest epoch first, each apart beyond the simulator's {_error_text(errors)})", names


def _nearest(predictions, strategy_of, device: str, cluster, network: str) -> list:
    """Each prediction's nearest validated case. CPU learners of one node share its cores and
    loopback (`placement_of`); GPU learners have a device each, as in the papers' clusters."""
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.sim.uncertainty import load_cases, nearest, placement_of

    cases = load_cases()
    placement = placement_of(cluster.learners, cluster.nodes, network) if device == "cpu" else "hosts"
    return [nearest(strategy_of(p), p.learners, device, cases, placement=placement) for p in predictions]


def run(args) -> int:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.io.atomic import check_output_file, write_json_atomic
    from asrdist.sim.cluster import parameter_count

    if args.json is not None:
        check_output_file(args.json)  # before the simulation, not after it has printed
    if args.validate:
        from asrdist.sim.validate import format_table, validate  # imported when the command runs: `--help` stays light

        asked = [flag for flag, value in (("--cluster", args.cluster), ("--strategy", args.strategy),
                                          ("--set", args.settings)) if value]
        if asked:  # the papers' clusters, strategies and settings are fixed: these would be ignored
            raise ConfigError(f"--validate: runs the source papers' own cases, which {' and '.join(asked)} cannot "
                              f"change; leave {'it' if len(asked) == 1 else 'them'} out, or drop --validate")

        result = validate()
        print(format_table(result))
    else:
        from asrdist.sim.scenario import advise, run_job  # imported when the command runs: `--help` stays light

        job = build_job(args)
        c = job.cluster
        dedicated = args.device.lower().startswith("cpu:")
        compute = ("measured compute" if args.seconds_per_frame is not None and not dedicated else args.device
                   + (" (dedicated CPU hosts" + (", one core measured)" if args.seconds_per_frame else ")")
                      if dedicated else ""))
        head = (f"{args.model} ({parameter_count(job.shapes):,} parameters), {c.nodes}x{c.per_node} "
                f"learners, {compute}, inside {args.inside or ('loopback' if dedicated else 'nvlink')}, "
                f"between {args.network}, global batch {job.global_batch} frames")
        from asrdist.sim.scenario import ADVISED  # imported when the command runs: `--help` stays light
        from asrdist.sim.uncertainty import describe  # imported when the command runs: `--help` stays light

        device = "gpu" if args.seconds_per_frame is None and not dedicated else "cpu"
        if args.strategy is None:
            from asrdist.sim.scenario import explain, left_out_note  # imported when the command runs

            ranked, why, left_out = advise(job, progress=True)
            nearest = _nearest(ranked, lambda p: ADVISED[p.name][0], device, c, args.network)
            said, tiers = advice(ranked, nearest)
            why = explain(ranked, tied=len(tiers[0])) + left_out_note(left_out)  # no winner where tied
            print(head)
            print(table(ranked, nearest))
            print(why)
            print(f"advice: {said}")
            result = {"setting": head, "ranking": [{**p.as_dict(), "nearest_validated": describe(case)}
                                                   for p, case in zip(ranked, nearest)],
                      "why": why, "advice": said, "advice_tiers": tiers,
                      "within_error_of_winner": tiers[0][1:], "not_simulated": left_out}
        else:
            p = run_job(job)
            nearest = _nearest([p], lambda p: job.strategy, device, c, args.network)
            print(head)
            print(table([p], nearest))
            result = {"setting": head, "prediction": {**p.as_dict(), "nearest_validated": describe(nearest[0])}}
    if args.json is not None:
        write_json_atomic(args.json, result)
    return 0
