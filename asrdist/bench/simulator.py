"""`asrdist bench simulator`: the simulator against real `asrdist train` runs it never saw.

Every row (a strategy at a learner count) is measured `--run-repeats` times, in rounds; each
repeat is 1. calibrated just before it trains (`asrdist.calibrate.microbench`), 2. predicted from
its resolved config and those inputs alone, 3. trained for real, its frames/s read from its
summary.json only now. A row's error is the median of its repeats'; target: every row within
TARGET. The steps, the JSON and why a calibration per repeat:
docs/simulator.md#asrdists-own-runs-asrdist-bench-simulator."""
from __future__ import annotations

import argparse
import dataclasses
import os
import statistics
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from asrdist.calibrate.microbench import LINK_TIMEOUT, REPEATS, measure_microbenchmarks
from asrdist.checks import cli_list, cli_number
from asrdist.cluster.netem import network_label
from asrdist.compare import runs as compare_runs
from asrdist.compare.runs import Hosts, parse_strategies, resolve_all
from asrdist.compare.target import STEAL_NOTE
from asrdist.corpus.synth import synth_command
from asrdist.errors import ConfigError
from asrdist.run.prepare import ensure_features
from asrdist.run.summary import RunSummary
from asrdist.sim import calibration
from asrdist.sim.calibration import predict_run

STRATEGIES = "sync,onebit,averaging,adpsgd"
LEARNERS = [1, 2, 4]
TARGET = 0.20
DEFAULT_OUT = Path("runs/bench-simulator")
DEFAULT_CONFIG = Path("configs/default.yaml")
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
    parser.add_argument("--repeats", type=cli_number(int, at_least=1), default=REPEATS,
                        help=f"timings per microbenchmark (default {REPEATS}; the median)")
    parser.add_argument("--run-repeats", type=cli_number(int, at_least=1), default=RUN_REPEATS,
                        help=f"times each run is trained, in rounds (default {RUN_REPEATS}; measured = the median)")
    parser.add_argument("--timeout", type=cli_number(float, above=0), default=LINK_TIMEOUT,
                        help="seconds for the link measurement's learners")
    parser.set_defaults(overrides=[])  # `section.key=value` after the options (asrdist.cli appends them)


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


def bench_rows(args, corpus: Path, configs: dict, out: Path) -> dict[tuple[str, int], list[dict]]:
    """Every run, `args.run_repeats` times under `out`, in rounds (every run once, then every run
    again: a slow spell of the machine hits several runs, not every repeat of one); each repeat
    calibrated, predicted, then trained (`calibrated_run`). (strategy, learners) -> its repeats."""
    repeats = args.run_repeats
    seen: dict[tuple[str, int], list[dict]] = {key: [] for key in configs}
    for r in range(repeats):
        base = out if repeats == 1 else out / f"round{r + 1}"
        for (name, n), cfg in configs.items():
            print(f"[bench simulator] {name} on {n} learner(s)" + (f", round {r + 1} of {repeats}" if repeats > 1 else "")
                  + ": calibrating, predicting, training", flush=True)
            seen[(name, n)].append(calibrated_run(args, corpus, name, n, cfg, base))
    return seen


def calibrated_run(args, corpus: Path, name: str, n: int, cfg, base: Path) -> dict:
    """One repeat of one row, in this order: microbenchmarks of one learner of this run's config,
    timed just before it trains (this machine's speed holds for minutes, so a calibration is read
    in the spell of the run it predicts); the prediction, from those alone; the run trained
    (`asrdist train`) and its summary read: frames/s (the one throughput), its frames, longest
    loop seconds, threads, cores and run directory."""
    micro, detail = measure_microbenchmarks(name, n, cfg, args.network, args.repeats, args.timeout)
    inputs = calibration.calibrate(micro, n, name)
    predicted = predict_run(cfg, inputs, _hosts(n, args.network).nodes, args.network,
                            feature_dim=detail["feature_dim"], num_classes=detail["num_classes"])
    overrides = [f"train.epochs={args.epochs}", *args.overrides]
    run_dir = compare_runs.train_missing(args.config, {name: cfg}, base / f"learners{n}", corpus, overrides,
                                         hosts=_hosts(n, args.network))[name]
    summary = RunSummary.read(run_dir)
    measured = {"frames_per_second": summary.frames_per_second, "train_frames": summary.train_frames,
                "loop_seconds": max(summary.stepping_seconds()),
                "threads_per_learner": summary.threads_per_learner, "nodes": summary.nodes,
                "network": summary.network, "run": str(run_dir), "steal_share": summary.steal_share,
                "cpu_share": summary.cpu_share, "contended": summary.contended}
    return {"micro": micro, "detail": detail, "inputs": inputs, "predicted": predicted, "measured": measured}


def run(args) -> dict[str, Any]:
    strategies = parse_strategies(args.strategies)
    if "single" in strategies:
        raise ConfigError("bench simulator: --strategies: every strategy runs at each learner count; drop single")
    corpus = _corpus(args)
    configs = resolve_runs(args, corpus, strategies)  # every run checked before anything is measured

    first = next(iter(configs.values()))
    ensure_features(corpus, first, progress=False)  # as `asrdist train` does first: the runs' features
    load_before = os.getloadavg()
    out = args.out / f"runs-{datetime.now(timezone.utc).strftime('%Y%m%dT%H%M%SZ')}"
    rows = bench_rows(args, corpus, configs, out)
    load_after = os.getloadavg()
    return result(rows, args, corpus, {"before": list(load_before), "after": list(load_after)})


def _spread(values: list[float]) -> float:
    """max / min - 1 (0 for one value)."""
    return max(values) / min(values) - 1.0 if min(values) > 0 else float("inf")


def result(rows: dict[tuple[str, int], list[dict]], args, corpus: Path, load: dict) -> dict[str, Any]:
    """The bench's JSON: per strategy and learner count measured, predicted and relative error,
    repeat by repeat and as the row's median; every repeat's calibration and what each input was
    calibrated on."""
    predictions: dict[str, dict[str, dict]] = {}
    by_run: dict[str, dict[str, list]] = {}
    for (name, n), repeats in rows.items():
        rates = [r["measured"]["frames_per_second"] for r in repeats]
        guesses = [r["predicted"].frames_per_second for r in repeats]
        errors = [(p - m) / m for p, m in zip(guesses, rates)]
        error = statistics.median(errors)
        first = repeats[0]
        predictions.setdefault(name, {})[str(n)] = {
            "measured": statistics.median(rates), "predicted": statistics.median(guesses), "relative_error": error,
            "within_target": abs(error) <= TARGET, "measured_repeats": rates, "measured_spread": _spread(rates),
            "predicted_repeats": guesses, "predicted_spread": _spread(guesses), "relative_errors_by_repeat": errors,
            "predicted_comm_share": first["predicted"].comm_share, "predicted_wait_share": first["predicted"].wait_share,
            "steal_shares": [r["measured"]["steal_share"] for r in repeats],
            "cpu_shares": [r["measured"].get("cpu_share") for r in repeats],
            "contended": any(r["measured"].get("contended") for r in repeats),
            "measured_run": {**first["measured"], "runs": [r["measured"]["run"] for r in repeats]}}
        by_run.setdefault(name, {})[str(n)] = [
            {"microbenchmarks": dataclasses.asdict(r["micro"]), "inputs": dataclasses.asdict(r["inputs"]),
             "link_measurement": r["detail"]["link"], "corun_measurement": r["detail"]["corun"],
             "lockstep_measurement": r["detail"].get("lockstep", {}),
             "claim_measurement": r["detail"].get("claim", {}),
             "collective_measurement": r["detail"].get("collective", {}),
             "answer_measurement": r["detail"].get("answer", {}),
             "step_measurement": r["detail"].get("step", {})} for r in repeats]
    all_rows = [row for by_n in predictions.values() for row in by_n.values()]
    worst = max((abs(row["relative_error"]) for row in all_rows), default=0.0)
    spreads = [row["measured_spread"] for row in all_rows]
    steals = [share for row in all_rows for share in row["steal_shares"] if share is not None]
    first = next(iter(rows.values()))[0]
    return {
        "predictions": predictions,
        "max_relative_error": worst,
        "max_relative_error_of_any_repeat": max((abs(e) for row in all_rows for e in row["relative_errors_by_repeat"]),
                                                default=0.0),
        "target": TARGET,
        "all_within_target": worst <= TARGET,
        "relative_error": "each repeat's prediction, from the calibration timed just before it, against that "
                          "repeat's run; a row's relative_error is the median over its repeats",
        "machine_noise": {
            "run_repeats": args.run_repeats,
            "max_spread": max(spreads, default=0.0), "median_spread": statistics.median(spreads) if spreads else 0.0,
            "max_steal_share": max(steals, default=None),
            "runs_with_busy_host": sum(share > STEAL_NOTE for share in steals), "runs": sum(map(len, rows.values())),
            "note": "each run trained again in later rounds, nothing changed; spread = its fastest repeat's "
                    "frames/s over its slowest's, less 1: how far this machine's speed moved between identical "
                    "runs, against which each row's error is read; runs_with_busy_host: the runs during which "
                    f"the machine's host took more than {STEAL_NOTE:.0%} of its CPU (steal, each run's "
                    "steal_share), max_steal_share the most any took"},
        "throughput": "the job's training frames over its longest learner's loop seconds, epoch ends included "
                      "(asrdist.utils.throughput), for the runs and the simulator alike",
        "network": network_label(args.network),
        "recipe": str(args.config), "overrides": [f"train.epochs={args.epochs}", *args.overrides],
        "corpus": str(corpus),
        "calibration": {
            "by_run": by_run,
            "parameters": first["detail"]["parameters"],
            "calibrated_on": "microbenchmarks of one learner of the predicted run's config alone in the bench's "
                             "process (and two learners exchanging the model's size for the link), timed just "
                             "before that run trained, repeat by repeat; no figure of any run feeds them",
        },
        "finished_at": datetime.now(timezone.utc).isoformat(timespec="seconds"),
        "load_average": {**load, "note": "1, 5 and 15 minute load averages before the first calibration and "
                                          "after the last run; above the core count, other jobs shared the cores"},
        "cores": first["micro"].cores,
        "learners_share_cores": f"all learners run on this machine's {first['micro'].cores} cores (threads per "
                                f"learner = max(1, {first['micro'].cores} // learners))",
    }


def _busy_host(noise: dict) -> str:
    """'; the host took ...' where some run's host took more than STEAL_NOTE of the CPU, else ''."""
    busy = noise.get("runs_with_busy_host")
    if not busy:
        return ""
    return (f"; the machine's host took more than {STEAL_NOTE:.0%} of its CPU in {busy} of {noise['runs']} runs "
            f"(up to {noise['max_steal_share']:.0%}: steal)")


def format_result(result: dict) -> str:
    lines = [f"{'strategy':12s} {'learners':>8s} {'measured':>10s} {'spread':>7s} {'predicted':>10s} {'spread':>7s} "
             f"{'error':>8s}"]
    for name, by_n in result["predictions"].items():
        for n, r in by_n.items():
            lines.append(f"{name:12s} {n:>8s} {r['measured']:10,.0f} {100 * r['measured_spread']:6.1f}% "
                         f"{r['predicted']:10,.0f} {100 * r['predicted_spread']:6.1f}% "
                         f"{100 * r['relative_error']:+7.1f}%" + (" (contended)" if r.get("contended") else ""))
    lines.append(f"largest error {100 * result['max_relative_error']:.1f}% (target {100 * result['target']:.0f}%), "
                 f"frames/s on {result['cores']} cores, network {result['network']}, load "
                 f"{result['load_average']['before'][0]:.2f} -> {result['load_average']['after'][0]:.2f}; "
                 f"identical runs' spread up to {100 * result['machine_noise']['max_spread']:.1f}% "
                 f"({result['machine_noise']['run_repeats']} repeats each)" + _busy_host(result["machine_noise"]))
    return "\n".join(lines)
