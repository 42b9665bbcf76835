"""`asrdist bench straggler`: time to a target accuracy with one learner s times slower, sync
against adpsgd, and what delay-by-one buys (DESIGN.md §5.5, §5.8).

Every run is a real `asrdist train` job, one learner per emulated host; the straggler is the
trainer's own `train.straggler`. A run's time to target is the wall time of its first validation
at or below the target loss. Keys `sync_time_to_target_ratio`, `adpsgd_time_to_target_ratio`,
`delay_by_one_time_to_target_ratio`, `adpsgd_copes_with_straggler`; the runs and the rules:
docs/benchmarks.md#asrdist-bench-straggler-time-to-a-target-with-a-slow-learner."""
from __future__ import annotations

import argparse
import os
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from asrdist.checks import MAX_SLOWDOWN, cli_number
from asrdist.cluster import netem
from asrdist.cluster.netem import parse_rate
from asrdist.corpus.synth import synth_command
from asrdist.errors import ConfigError, TrainingError
from asrdist.run.summary import RunSummary
from asrdist.run.train_cli import add_cpus_per_host_option
from asrdist.train.metrics import read_metrics
from asrdist.utils import environ
from asrdist.utils.throughput import job_frames_per_second

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
DEFAULT_UTTERANCES = 150
COPES_FACTOR = 0.6
"""adpsgd's time-to-target ratio must be at most this times sync's (issue 34, from the seeds' claim)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None,
                        help="corpus directory (default: the built-in espeak corpus, built once into a cache)")
    parser.add_argument("--utterances", type=cli_number(int, at_least=30), default=DEFAULT_UTTERANCES,
                        help="size of the default corpus")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="recipe (default: configs/default.yaml)")
    parser.add_argument("--epochs", type=cli_number(int, at_least=2), default=6,
                        help="epochs of every run (one validation each)")
    parser.add_argument("--network", default="1gbit",
                        help="link rate between the learners' emulated hosts (root), or loopback (one host)")
    parser.add_argument("--delay-network", default=None,
                        help="links of the delay-by-one pair (default: one exchange ~ one step's compute; "
                             "on loopback: loopback)")
    parser.add_argument("--learners", type=cli_number(int, at_least=2), default=2)
    add_cpus_per_host_option(parser)
    parser.add_argument("--straggler-rank", type=cli_number(int, at_least=0), default=None, help="default: the last")
    parser.add_argument("--slowdown", type=cli_number(float, at_least=1, at_most=MAX_SLOWDOWN), default=3.0)
    parser.add_argument("--target", type=cli_number(float, above=0), default=None,
                        help="validation loss to reach (default: the best every compared run reached)")
    parser.add_argument("--deadline", type=cli_number(float, above=0), default=1800.0,
                        help="seconds any one run may take")
    parser.add_argument("--keep", type=Path, default=None,
                        help="keep the run directories here (default: a temporary one)")
    parser.set_defaults(overrides=[])  # `section.key=value` after the options, for every run (asrdist.cli appends them)


def run(args) -> dict[str, Any]:
    load_start = list(os.getloadavg())
    n = args.learners
    straggler = n - 1 if args.straggler_rank is None else args.straggler_rank
    if straggler >= n:
        raise ConfigError(f"bench straggler: --straggler-rank must be below --learners ({n}), got {straggler}")
    for rate in (args.network, args.delay_network):
        if rate not in (None, "loopback"):
            parse_rate(rate)
    if not args.config.is_file():
        raise ConfigError(f"bench straggler --config {args.config}: no such recipe")
    if args.data is not None and not (args.data / "train").is_dir():
        raise ConfigError(f"bench straggler --data {args.data}: not a corpus directory (build one with "
                          f"`asrdist corpus synth`)")
    if any(rate not in (None, "loopback") for rate in (args.network, args.delay_network)):
        ok, reason = netem.available()
        if not ok:
            raise ConfigError(f"bench straggler: the learners run on emulated hosts: {reason} (or --network loopback)")
    corpus = args.data if args.data is not None else cached_corpus(args.utterances)
    slow = [f"train.straggler.ranks=[{straggler}]", f"train.straggler.slowdown={args.slowdown}"]
    with tempfile.TemporaryDirectory(prefix="asrdist-straggler-") as tmp:
        out = args.keep or Path(tmp)

        def job(name: str, strategy: str, network: str, *extra: str) -> dict[str, Any]:
            return _train(args, corpus, out / name, strategy, network, list(extra))

        runs = {"sync": job("sync", "sync", args.network),
                "sync_straggler": job("sync_straggler", "sync", args.network, *slow),
                "adpsgd": job("adpsgd", "adpsgd", args.network),
                "adpsgd_straggler": job("adpsgd_straggler", "adpsgd", args.network, *slow)}
        delay_network = args.delay_network or _rate_for_exchange_like_compute(runs["adpsgd"], args.network)
        runs["adpsgd_plain"] = job("adpsgd_plain", "adpsgd", delay_network)
        runs["adpsgd_delay_by_one"] = job("adpsgd_delay_by_one", "adpsgd", delay_network, "strategy.delay_by_one=true")
    target = args.target or _shared_target([runs[k] for k in ("sync", "sync_straggler", "adpsgd", "adpsgd_straggler")])
    target2 = args.target or _shared_target([runs["adpsgd_plain"], runs["adpsgd_delay_by_one"]])
    delay_pair = ("adpsgd_plain", "adpsgd_delay_by_one")
    ttt = {name: time_to_target(r["validations"], target2 if name in delay_pair else target) for name, r in runs.items()}
    ratio = lambda a, b: ttt[a] / ttt[b] if ttt[a] is not None and ttt[b] else None  # noqa: E731
    sync_ratio, adpsgd_ratio = ratio("sync_straggler", "sync"), ratio("adpsgd_straggler", "adpsgd")
    return {
        "sync_time_to_target_ratio": sync_ratio,
        "adpsgd_time_to_target_ratio": adpsgd_ratio,
        "delay_by_one_time_to_target_ratio": ratio("adpsgd_delay_by_one", "adpsgd_plain"),
        "exchange_vs_compute": _exchange_vs_compute(runs["adpsgd_plain"]),
        "regime": regime(runs["sync"], n, args.slowdown),
        "adpsgd_copes_with_straggler": copes_check(sync_ratio, adpsgd_ratio, args.slowdown),
        "target_valid_loss": target,
        "delay_by_one_target_valid_loss": target2,
        "time_to_target_seconds": ttt,
        "frames_per_second": {name: r["frames_per_second"] for name, r in runs.items()},
        "final_valid_loss": {name: r["validations"][-1]["valid_loss"] if r["validations"] else None
                             for name, r in runs.items()},
        "runs": runs,
        "network": _label(args.network),
        "delay_by_one_network": _label(delay_network),
        "overrides": list(args.overrides),
        "learners": n,
        "cores": len(os.sched_getaffinity(0)),
        "threads_per_learner": runs["sync"]["threads_per_learner"],
        "straggler": {"rank": straggler, "slowdown": args.slowdown,
                      "how": "sleeps (slowdown - 1) x its measured compute after every step (train.straggler)"},
        "corpus": str(corpus),
        "config": str(args.config),
        "epochs": args.epochs,
        "time_to_target": "wall seconds of the first validation (one per epoch) at or below the target "
                          "validation loss; target: the best loss every compared run reached, unless --target",
        "load_average": {"start": load_start, "end": list(os.getloadavg())},
    }


def copes_check(sync_ratio: float | None, adpsgd_ratio: float | None, slowdown: float) -> dict[str, Any]:
    """The seeds' claim as a check: adpsgd's time-to-target ratio at most COPES_FACTOR x sync's
    (`passed` None when a run never reached the target: no ratio to judge). Beside it, what the
    straggler cost each in time (`extra_time`: ratio - 1) and adpsgd's share of sync's
    (`adpsgd_extra_vs_sync`): where a straggler barely slows sync (communication-bound steps, or a
    sleeping straggler lending its core to learners that share it), the ratio check cannot pass
    however little adpsgd loses, and the share still says which strategy the slow learner hurt more."""
    passed = None if sync_ratio is None or adpsgd_ratio is None else adpsgd_ratio <= COPES_FACTOR * sync_ratio
    extra = {"sync": None if sync_ratio is None else sync_ratio - 1.0,
             "adpsgd": None if adpsgd_ratio is None else adpsgd_ratio - 1.0}
    share = (extra["adpsgd"] / extra["sync"] if extra["sync"] is not None and extra["adpsgd"] is not None
             and extra["sync"] > 0 else None)
    return {"passed": passed, "rule": f"adpsgd_time_to_target_ratio <= {COPES_FACTOR} x sync_time_to_target_ratio",
            "limit": None if sync_ratio is None else COPES_FACTOR * sync_ratio, "slowdown": slowdown,
            "why_none": None if passed is not None else "a run did not reach the target",
            "extra_time": extra, "adpsgd_extra_vs_sync": share}


def _label(network: str) -> str:
    return network if network == "loopback" else f"emulated-{network}"


CACHED_CORPUS = "corpus-espeak-{}-seed0"
"""The name of `cached_corpus`'s directory for a number of utterances."""


def cached_corpus(utterances: int) -> Path:
    """The built-in espeak corpus of `utterances` (seed 0), built once under the user's cache
    directory (`$XDG_CACHE_HOME/asrdist`, default ~/.cache/asrdist) and reused by later runs."""
    root = environ.cache_home() / "asrdist"
    out = root / CACHED_CORPUS.format(utterances)
    if not (out / "summary.json").is_file():  # synth writes summary.json last: a finished corpus
        root.mkdir(parents=True, exist_ok=True)
        synth_command(argparse.Namespace(out=out, utterances=utterances, seed=0, synthesizer="espeak", jobs=0,
                                         noise_snr=None, skip_bad=False, overwrite=True))
    return out


def cached_corpus_utterances(path: Path) -> int | None:
    """The utterances of the cached built-in corpus at `path` (None: not one `cached_corpus` names)."""
    match = re.fullmatch(CACHED_CORPUS.format(r"(\d+)"), Path(path).name)
    return int(match.group(1)) if match else None


def _train(args, corpus: Path, run_dir: Path, strategy: str, network: str, extra: list[str]) -> dict[str, Any]:
    """One `asrdist train` job on emulated hosts; its validations and learners' figures."""
    hosts = ["--nodes", "1"] if network == "loopback" else ["--nodes", str(args.learners), "--network", network]
    if getattr(args, "cpus_per_host", None) is not None:
        hosts += ["--cpus-per-host", str(args.cpus_per_host)]
    seconds = run_train([str(args.config), *args.overrides, *extra, "--data", str(corpus),
                         "--learners", str(args.learners), *hosts, "--strategy", strategy,
                         "--epochs", str(args.epochs)], run_dir, args.deadline, "bench straggler")
    return read_run(run_dir) | {"strategy": strategy, "network": network, "extra": extra,
                                "command_seconds": seconds}


def run_train(argv: list[str], run_dir: Path, deadline: float, bench: str) -> float:
    """`asrdist train *argv --out RUN_DIR --no-progress` in a process of its own, the way a user runs
    it; its wall seconds. A failure, or a run past `deadline` seconds, is one line naming the run."""
    cmd = [sys.executable, "-m", "asrdist.cli", "train", *argv, "--out", str(run_dir), "--no-progress"]
    t0 = time.monotonic()
    try:
        done = subprocess.run(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, timeout=deadline,
                              stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired as e:
        raise TrainingError(f"{bench}: {run_dir.name} did not finish within {deadline:g} s") from e
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["(no output)"])[-1]
        raise TrainingError(f"{bench}: {run_dir.name} failed (exit code {done.returncode}): {last}")
    return time.monotonic() - t0


def read_run(run_dir: Path) -> dict[str, Any]:
    """A finished run's validations (wall seconds, loss, PER) and its learners' figures."""
    summary = RunSummary.read(run_dir)
    learners = summary.comm.per_learner
    return {"validations": validations(run_dir, summary),
            "frames_per_second": job_frames_per_second([p.frames for p in learners], summary.stepping_seconds()),
            "threads_per_learner": summary.threads_per_learner,
            "per_learner": [{k: p.to_json().get(k) for k in ("rank", "steps", "frames", "loop_seconds",
                                                              "compute_seconds", "comm_seconds", "wait_seconds",
                                                              "exchanges", "bytes_sent")}
                            for p in learners]}


def validations(run_dir: Path, summary: RunSummary) -> list[dict[str, Any]]:
    """(epoch, wall seconds, validation loss, PER) of every validation of a run: the seconds from
    the record's own `wall_seconds` where the trainer writes it, else from the `seconds` of its
    line in metrics.jsonl (seconds since the run's metrics log opened, before its first step)."""
    logged = {r["epoch"]: r["seconds"] for r in read_metrics(run_dir) if r.get("kind") == "epoch"}
    out = []
    for epoch, record in zip(summary.epoch_numbers(), summary.history):  # both numbered from 1
        if record.valid_loss is None:
            continue
        seconds = record.wall_seconds if record.wall_seconds is not None else logged.get(epoch)
        if seconds is None:
            raise TrainingError(f"{run_dir}: validation of epoch {epoch} has no wall time")
        out.append({"epoch": epoch, "wall_seconds": seconds, "valid_loss": record.valid_loss,
                    "per": record.per})
    return out


def time_to_target(points: list[dict[str, Any]], target: float) -> float | None:
    """Wall seconds of the first validation at or below `target`; None if none reached it."""
    return next((p["wall_seconds"] for p in points if p["valid_loss"] <= target), None)


def compute_share(run: dict[str, Any]) -> float | None:
    """The share of its training loop a learner spent computing (forward, backward), averaged
    over the run's learners: it bounds what a straggler can cost a lock-step strategy (a learner s
    times slower stretches every step by at most (s - 1) x this share of it)."""
    shares = [p["compute_seconds"] / p["loop_seconds"] for p in run["per_learner"]
              if p.get("compute_seconds") is not None and p.get("loop_seconds")]
    return sum(shares) / len(shares) if shares else None


def regime(sync_run: dict[str, Any], learners: int, slowdown: float) -> dict[str, Any]:
    """What the check can show in this run's regime. A straggler stretches a lock-step step by at
    most (s - 1) x its compute share, so sync's ratio is at most `sync_ratio_bound`; adpsgd keeps
    the other learners' pace, and if its time to target grew only with the throughput it lost its
    ratio would be n / (n - 1 + 1/s) (`adpsgd_ratio_from_throughput`).
    `passes_if_time_follows_throughput` says whether that is within COPES_FACTOR x the bound: when
    it is not, communication dominates the step, a straggler costs sync little, and the check
    passes only if adpsgd loses less time to target than throughput (the seeds' claim is made where
    compute dominates: a larger minibatch per learner or a faster network)."""
    share = compute_share(sync_run)
    bound = None if share is None else 1.0 + (slowdown - 1.0) * share
    from_throughput = learners / (learners - 1 + 1.0 / slowdown)
    return {"sync_compute_share": share, "sync_ratio_bound": bound,
            "adpsgd_ratio_from_throughput": from_throughput,
            "passes_if_time_follows_throughput": None if bound is None else from_throughput <= COPES_FACTOR * bound,
            "how": "sync_compute_share: each learner's compute seconds over its loop seconds in the sync run "
                   "without the straggler, averaged; the bound and the throughput ratio follow from it and "
                   "from n and s (arithmetic, not measured)"}


def _shared_target(runs: list[dict[str, Any]]) -> float:
    """The best validation loss that every run reached (the largest of their best losses)."""
    bests = [min(p["valid_loss"] for p in r["validations"]) for r in runs if r["validations"]]
    if len(bests) < len(runs):
        raise TrainingError("bench straggler: a run recorded no validation; raise --epochs")
    return max(bests)


def _active_exchange_and_compute(run: dict[str, Any]) -> tuple[float, float]:
    """Seconds per exchange and compute seconds per step of adpsgd's active learners (even ranks
    with a partner: the ones that start exchanges)."""
    learners = run["per_learner"]
    actives = [p for p in learners if p["rank"] % 2 == 0 and p["rank"] + 1 < len(learners)]
    exchange = sum(p["comm_seconds"] / max(1, p["exchanges"]) for p in actives) / len(actives)
    compute = sum(p["compute_seconds"] / max(1, p["steps"]) for p in actives) / len(actives)
    return exchange, compute


def _exchange_vs_compute(run: dict[str, Any]) -> float:
    exchange, compute = _active_exchange_and_compute(run)
    return exchange / compute if compute > 0 else float("inf")


def _rate_for_exchange_like_compute(run: dict[str, Any], network: str) -> str:
    """A link rate at which one exchange takes about one step's compute: `network` scaled by the
    exchange / compute ratio measured in `run` (an exchange is mostly bytes over the link)."""
    if network == "loopback":
        return "loopback"
    ratio = _exchange_vs_compute(run)
    mbit = max(1, round(parse_rate(network) * ratio / 1e6))
    return f"{mbit}mbit"
