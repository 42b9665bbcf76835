"""`asrdist bench simulator`: the simulator against real `asrdist train` runs it never saw.

1. Calibration, before any run trains, in this process: microbenchmarks of one learner alone
   (`measure_microbenchmarks`): its training step per frame through `Trainer.train_step` on the
   corpus at each learner count's share of the global minibatch and threads, for every
   strategy's own recipe (compare's per-strategy recipes: NG-SGD for averaging and AdaGrad for
   onebit cost their own step; strategy `single`, so no exchange is in it), an epoch's end
   (validation and checkpoint), onebit's quantizer and dequantizer and its whole exchange on one
   learner alone (which scales the two: residuals, copies, packing), how much one thread's
   arithmetic slows when every core computes (`asrdist.bench.corun`), a parameter average and
   sync's gradient mean per value, and the link between two learners on the emulated network
   carrying the model (`measure_link`: its rate one way, the share of it each direction
   keeps in a pairwise exchange, the learners' CPU per byte, half a one-value message's round
   trip for its latency). `asrdist.sim.calibration.calibrate`
   turns these, and nothing else, into the simulator's inputs.
2. Prediction: every strategy at every learner count, from its resolved config and those inputs.
3. Validation: the same runs trained for real (`asrdist train`, the recipe on the corpus, one
   learner per emulated host on `--network`, a lone learner on loopback), each run's frames/s
   from its summary.json (`asrdist.utils.throughput`: the job's frames over its longest learner's
   loop). Each run is trained `--run-repeats` times, in rounds (every run once, then every run
   again), because this machine's speed is not steady: identical runs a minute apart have measured
   4,508 and 8,862 frames/s. Each row: measured (the median over its repeats), every repeat,
   their spread (max / min - 1: the noise the row's error is read against), predicted, relative
   error; target: every row within TARGET.

The default corpus is the built-in synthetic one, built once under OUT/corpus and reused (a cache:
its features and audio never come from the runs).
"""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from asrdist.bench.corun import corun_slowdown
from asrdist.checks import cli_list, cli_number
from asrdist.cluster.netem import network_label
from asrdist.compare import runs as compare_runs
from asrdist.compare.runs import Hosts, parse_strategies, resolve_all
from asrdist.compare.stepcost import config_step_seconds_per_frame
from asrdist.corpus.synth import synth_command
from asrdist.errors import ConfigError
from asrdist.parallel.base import LearnerContext
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.onebit_kernel import get_quantizer, quantization_buffers
from asrdist.run.prepare import build_targets, ensure_features
from asrdist.run.task import SpeechTask, model_kind
from asrdist.sim import calibration
from asrdist.sim.calibration import Microbenchmarks, predict_run, threads_of
from asrdist.sim.cluster import LINKS, parameter_count
from asrdist.sim.link import measure_link
from asrdist.sim.scenario import config_shapes
from asrdist.utils.machine import median_seconds

STRATEGIES = "sync,onebit,averaging,adpsgd"
LEARNERS = [1, 2, 4]
TARGET = 0.20
DEFAULT_OUT = Path("runs/bench-simulator")
DEFAULT_CONFIG = Path("configs/default.yaml")
EPOCH_ENDS = 3
"""Epoch ends timed per learner count (the median)."""
RUN_REPEATS = 2
"""Trainings of each run (the module docstring says why)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help=f"recipe (default: {DEFAULT_CONFIG})")
    parser.add_argument("--data", type=Path, default=None,
                        help="corpus (default: OUT/corpus, the built-in synthetic corpus, built once)")
    parser.add_argument("--utterances", type=cli_number(int, at_least=3), default=200,
                        help="utterances of the built-in corpus when it is built (default: 200)")
    parser.add_argument("--strategies", default=STRATEGIES, help=f"comma-separated (default: {STRATEGIES})")
    parser.add_argument("--learners", type=cli_list(int, at_least=1), default=LEARNERS,
                        help="comma-separated learner counts (default: 1,2,4)")
    parser.add_argument("--network", default="1gbit", help="between the emulated hosts (default: 1gbit)")
    parser.add_argument("--epochs", type=cli_number(int, at_least=1), default=1, help="epochs per run (default: 1)")
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT, help=f"corpus cache and runs (default: {DEFAULT_OUT})")
    parser.add_argument("--repeats", type=cli_number(int, at_least=1), default=5,
                        help="timings per microbenchmark (default 5; the median)")
    parser.add_argument("--run-repeats", type=cli_number(int, at_least=1), default=RUN_REPEATS,
                        help=f"times each run is trained, in rounds (default {RUN_REPEATS}; measured = the median)")
    parser.add_argument("--timeout", type=cli_number(float, above=0), default=300.0,
                        help="seconds for the link measurement's learners")
    parser.set_defaults(overrides=[])  # `section.key=value` after the options (asrdist.cli appends them)


def _with_threads(threads: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def per_value_figures(shapes: list[tuple[int, ...]], repeats: int) -> dict[str, float]:
    """Seconds per value on one thread of onebit's quantizer and dequantizer, a parameter average
    (add, scale) and sync's gradient mean (into the bucket, divide, back), on the model's shapes."""
    values = parameter_count(shapes)
    flat, other, bucket = torch.zeros(values), torch.ones(values), torch.empty(values)

    def mean():
        bucket.copy_(other)
        bucket.div_(2)
        flat.copy_(bucket)

    average = _with_threads(1, lambda: median_seconds(lambda: flat.add_(other).mul_(0.5), repeats))
    mean_s = _with_threads(1, lambda: median_seconds(mean, repeats))
    quantize, dequantize = _with_threads(1, lambda: _onebit_seconds(shapes, repeats))
    exchange = _with_threads(1, lambda: _onebit_exchange_seconds(shapes, repeats))
    return {"quantize_seconds_per_value": quantize / values, "dequantize_seconds_per_value": dequantize / values,
            "average_seconds_per_value": average / values, "mean_seconds_per_value": mean_s / values,
            "onebit_exchange_seconds_per_value": exchange / values}


def _onebit_exchange_seconds(shapes: list[tuple[int, ...]], repeats: int) -> float:
    """Median seconds of onebit's whole exchange of gradients of `shapes` on one learner alone
    (`OneBitStrategy.exchange` in a world of one: nothing crosses a wire, every phase's CPU is
    there), after a few exchanges to settle its residuals."""
    strategy = OneBitStrategy(OneBitConfig())
    strategy.setup_exchange([torch.Size(s) for s in shapes], LearnerContext())
    gen = torch.Generator().manual_seed(0)
    grads = [torch.randn(s, generator=gen) for s in shapes]
    for _ in range(2):
        strategy.exchange(grads)
    return median_seconds(lambda: strategy.exchange(grads), repeats)


def _onebit_seconds(shapes: list[tuple[int, ...]], repeats: int) -> tuple[float, float]:
    """Median seconds of 1-bit quantization (with error feedback and packing) and of
    dequantization of gradients of `shapes`, with onebit's own quantizer."""
    quantizer = get_quantizer("auto")
    gen = torch.Generator().manual_seed(0)
    quantize, dequantize = [], []
    for shape in shapes:
        grad, residual, words, recon = quantization_buffers(shape, gen)
        rows, cols = grad.shape
        out = torch.empty_like(grad)
        quantize.append(median_seconds(lambda: quantizer.quantize(grad, residual, [0, cols], words, recon), repeats))
        dequantize.append(median_seconds(lambda: quantizer.dequantize(words, recon, rows, [0, cols], out), repeats))
    return sum(quantize), sum(dequantize)


def measure_microbenchmarks(configs: dict, network: str, repeats: int, timeout: float):
    """`Microbenchmarks` of one learner of each resolved run config in `configs` ((strategy,
    learners) -> config; the first one's corpus features in place) on this machine: see the
    module docstring. Reads no run."""
    cores = len(os.sched_getaffinity(0))
    (first_name, _), cfg = next(iter(configs.items()))
    learners = sorted({n for _, n in configs})
    targets = build_targets(Path(cfg.data.corpus), cfg, model_kind(cfg))
    # every strategy's own recipe (its optimizer costs its own step), all timed in one session
    # whose rounds take turns; the epoch's end (the same validation and checkpoint) of the first's
    requests = {(name, f"{n}x{threads_of(cores, n)}"): (c, targets, n, threads_of(cores, n))
                for (name, n), c in configs.items()}
    timed, ended = config_step_seconds_per_frame(requests, epoch_ends=EPOCH_ENDS,
                                                 ends_of={k for k in requests if k[0] == first_name})
    steps = {key: seconds for (name, key), seconds in timed.items() if name == first_name}
    ends = {key: seconds for (_, key), seconds in ended.items()}
    recipes: dict[str, dict[str, float]] = {}
    for (name, key), seconds in timed.items():
        if name != first_name:
            recipes.setdefault(name, {})[key] = seconds
    lone = SpeechTask(cfg, targets, 0, 1)
    frames_per_epoch = float(len(lone.sampler) * lone.samples_per_step)
    shapes = config_shapes(cfg, lone.store.dim, targets.num_classes)
    figures = per_value_figures(shapes, repeats)
    many = any(n > 1 for n in learners)
    corun = corun_slowdown(cores, repeats) if many else {"slowdown": 1.0}
    link: dict[str, Any] = {}
    if many:
        link = measure_link(network, parameter_count(shapes), repeats, timeout)
    micro = Microbenchmarks(
        cores, steps, ends, frames_per_epoch, figures["quantize_seconds_per_value"],
        figures["dequantize_seconds_per_value"], figures["average_seconds_per_value"],
        figures["mean_seconds_per_value"], network, link.get("bytes_per_second", 0.0), link.get("duplex", 1.0),
        link.get("cpu_seconds_per_byte", 0.0), link.get("latency_seconds") or _link_latency(network), recipes,
        figures["onebit_exchange_seconds_per_value"], corun["slowdown"])
    return micro, {"link": link, "parameters": parameter_count(shapes), "feature_dim": lone.store.dim,
                   "num_classes": targets.num_classes, "first_recipe": first_name, "corun": corun}


def _link_latency(network: str) -> float:
    """Where no link was measured (one learner): the emulated network's delay, tc's 0.1 ms where
    the kernel has netem (20 us otherwise, the veth pair's own), loopback's preset on loopback (a
    setting of the emulation, not a timing); the measured link's latency replaces it."""
    if network == "loopback":
        return LINKS["loopback"].latency
    return 20e-6 if network_label(network).endswith("nodelay") else 0.1e-3


def _network_label(network: str) -> str:
    return network_label(network)


def _corpus(args) -> Path:
    """--data, or the built-in synthetic corpus under OUT/corpus (built once, then reused)."""
    if args.data is not None:
        return args.data
    out = args.out / "corpus"
    if not (out / "summary.json").is_file():
        synth_command(argparse.Namespace(out=out, utterances=args.utterances, seed=0, synthesizer="espeak", jobs=0,
                                         noise_snr=None, skip_bad=False, overwrite=out.exists()))
    return out


def _hosts(n: int, network: str):
    """One learner per emulated host on `network`; a lone learner, or every learner with
    `--network loopback`, on this machine's loopback."""
    return Hosts(n, network) if n > 1 and network != "loopback" else Hosts()


def resolve_runs(args, corpus: Path, strategies: list[str]) -> dict[tuple[str, int], Any]:
    """(strategy, learners) -> the run's resolved config, as `asrdist train` resolves it."""
    overrides = [f"train.epochs={args.epochs}", *args.overrides]
    return {(name, n): resolve_all(args.config, [name], n, corpus, overrides, _hosts(n, args.network))[name]
            for n in args.learners for name in strategies}


def train_runs(args, corpus: Path, configs: dict, out: Path) -> dict[tuple[str, int], dict]:
    """Train every run (`asrdist train`) `args.run_repeats` times under `out`, in rounds (every run
    once, then every run again: a slow spell of the machine hits several runs, not every repeat of
    one); (strategy, learners) -> what the summaries measured: frames/s (the one throughput; the
    median over the repeats), every repeat's, their spread, and the first repeat's frames, longest
    loop seconds, threads, cores and run directory."""
    overrides = [f"train.epochs={args.epochs}", *args.overrides]
    repeats = args.run_repeats
    seen: dict[tuple[str, int], list[dict]] = {key: [] for key in configs}
    for r in range(repeats):
        base = out if repeats == 1 else out / f"round{r + 1}"
        for (name, n), cfg in configs.items():
            print(f"[bench simulator] training {name} on {n} learner(s)"
                  + (f", round {r + 1} of {repeats}" if repeats > 1 else ""), flush=True)
            run_dir = compare_runs.train_missing(args.config, {name: cfg}, base / f"learners{n}", corpus, overrides,
                                                 hosts=_hosts(n, args.network))[name]
            summary = compare_runs.load_summary(run_dir)
            per = summary["comm"]["per_learner"]
            seen[(name, n)].append({
                "frames_per_second": summary["frames_per_second"], "train_frames": summary["train_frames"],
                "loop_seconds": max(p.get("loop_seconds") or p["train_seconds"] for p in per),
                "threads_per_learner": summary["threads_per_learner"], "nodes": summary.get("nodes", 1),
                "network": summary.get("network", "loopback"), "run": str(run_dir)})
    return {key: repeated(runs) for key, runs in seen.items()}


def repeated(runs: list[dict]) -> dict:
    """One row's measurement from its repeats: the first's figures, frames/s the median of all,
    `repeats_frames_per_second` and `spread` (max / min - 1; 0 for one run)."""
    rates = [r["frames_per_second"] for r in runs]
    return {**runs[0], "frames_per_second": statistics.median(rates), "repeats_frames_per_second": rates,
            "spread": max(rates) / min(rates) - 1.0 if min(rates) > 0 else float("inf"),
            "runs": [r["run"] for r in runs]}


def run(args) -> dict[str, Any]:
    strategies = parse_strategies(args.strategies)
    if "single" in strategies:
        raise ConfigError("bench simulator: --strategies: every strategy runs at each learner count; drop single")
    corpus = _corpus(args)
    configs = resolve_runs(args, corpus, strategies)  # every run checked before anything is measured

    first = next(iter(configs.values()))
    ensure_features(corpus, first, progress=False)  # as `asrdist train` does first: the runs' features
    load_before = os.getloadavg()
    # 1. calibration: microbenchmarks of one learner, before any run trains
    micro, micro_detail = measure_microbenchmarks(configs, args.network, args.repeats, args.timeout)
    inputs = {(name, n): calibration.calibrate(micro, n, name) for (name, n) in configs}
    # 2. prediction, from the runs' configs and those inputs only
    predicted = {(name, n): predict_run(cfg, inputs[(name, n)], _hosts(n, args.network).nodes, args.network,
                                        feature_dim=micro_detail["feature_dim"], num_classes=micro_detail["num_classes"])
                 for (name, n), cfg in configs.items()}
    # 3. validation: the runs themselves
    out = args.out / f"runs-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    measured = train_runs(args, corpus, configs, out)
    load_after = os.getloadavg()
    return result(micro, micro_detail, inputs, predicted, measured, args, corpus,
                  {"before": list(load_before), "after": list(load_after)})


def result(micro, micro_detail: dict, inputs: dict, predicted: dict, measured: dict, args, corpus: Path,
           load: dict) -> dict[str, Any]:
    """The bench's JSON: per strategy and learner count measured, predicted, relative error; the
    calibration's figures and what each was calibrated on."""
    rows: dict[str, dict[str, dict]] = {}
    worst = 0.0
    for (name, n), m in measured.items():
        p = predicted[(name, n)]
        error = (p.frames_per_second - m["frames_per_second"]) / m["frames_per_second"]
        worst = max(worst, abs(error))
        rows.setdefault(name, {})[str(n)] = {
            "measured": m["frames_per_second"], "predicted": p.frames_per_second, "relative_error": error,
            "within_target": abs(error) <= TARGET, "predicted_comm_share": p.comm_share,
            "predicted_wait_share": p.wait_share, "measured_repeats": m["repeats_frames_per_second"],
            "measured_spread": m["spread"],
            "relative_errors_by_repeat": [(p.frames_per_second - x) / x for x in m["repeats_frames_per_second"]],
            "measured_run": m}
    spreads = [m["spread"] for m in measured.values()]
    return {
        "predictions": rows,
        "max_relative_error": worst,
        "target": TARGET,
        "all_within_target": worst <= TARGET,
        "machine_noise": {
            "run_repeats": len(next(iter(measured.values()))["repeats_frames_per_second"]) if measured else 0,
            "max_spread": max(spreads, default=0.0), "median_spread": statistics.median(spreads) if spreads else 0.0,
            "note": "each run trained again in later rounds, nothing changed; spread = its fastest repeat's "
                    "frames/s over its slowest's, less 1: how far this machine's speed moved between identical "
                    "runs, against which each row's error is read"},
        "throughput": "the job's training frames over its longest learner's loop seconds, epoch ends included "
                      "(asrdist.utils.throughput), for the runs and the simulator alike",
        "network": _network_label(args.network),
        "recipe": str(args.config), "overrides": [f"train.epochs={args.epochs}", *args.overrides],
        "corpus": str(corpus),
        "calibration": {
            "microbenchmarks": dataclasses.asdict(micro), "link_measurement": micro_detail["link"],
            "corun_measurement": micro_detail["corun"],
            "parameters": micro_detail["parameters"],
            "inputs_by_learners": {str(n): dataclasses.asdict(i) for (name, n), i in inputs.items()
                                   if name == micro_detail["first_recipe"]},
            "inputs_by_run": {name: {str(n): dataclasses.asdict(i) for (other, n), i in inputs.items() if other == name}
                              for name in dict.fromkeys(name for name, _ in inputs)},
            "calibrated_on": "microbenchmarks of one learner alone in the bench's process (and two learners "
                             "exchanging the model's size for the link), measured before any predicted run "
                             "trained; no figure of the predicted runs feeds them",
        },
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average": {**load, "note": "1, 5 and 15 minute load averages before the microbenchmarks and "
                                          "after the runs; above the core count, other jobs shared the cores"},
        "cores": micro.cores,
        "learners_share_cores": f"all learners run on this machine's {micro.cores} cores (threads per learner = "
                                f"max(1, {micro.cores} // learners))",
    }


def format_result(result: dict) -> str:
    lines = [f"{'strategy':12s} {'learners':>8s} {'measured':>10s} {'spread':>7s} {'predicted':>10s} {'error':>8s}"]
    for name, by_n in result["predictions"].items():
        for n, r in by_n.items():
            lines.append(f"{name:12s} {n:>8s} {r['measured']:10,.0f} {100 * r['measured_spread']:6.1f}% "
                         f"{r['predicted']:10,.0f} {100 * r['relative_error']:+7.1f}%")
    lines.append(f"largest error {100 * result['max_relative_error']:.1f}% (target {100 * result['target']:.0f}%), "
                 f"frames/s on {result['cores']} cores, network {result['network']}, load "
                 f"{result['load_average']['before'][0]:.2f} -> {result['load_average']['after'][0]:.2f}; "
                 f"identical runs' spread up to {100 * result['machine_noise']['max_spread']:.1f}% "
                 f"({result['machine_noise']['run_repeats']} repeats each)")
    return "\n".join(lines)
