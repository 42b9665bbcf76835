"""`asrdist bench seeds --json OUT [--claims S1,S7,...] [--learners N] [--keep DIR]`: the source
papers' claims reproduced in miniature on dedicated emulated hosts, each a check that can fail.

Every run is a real `asrdist train` job, each learner on an emulated host of its own with
`--cpus-per-host` cores; the claims, their runs and their rules are in `asrdist.bench.seed_claims`.
OUT is rewritten after every claim, so a claim can be rerun alone. Where and how the claims are
tested, and what each run records: docs/seeds.md#where-the-claims-are-tested."""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from asrdist.bench import seed_predict
from asrdist.bench.seed_claims import CLAIMS, NOT_BUILT, Claim, RunSpec, Setup, describe
from asrdist.bench.straggler import cached_corpus, run_train
from asrdist.checks import cli_number
from asrdist.cluster import cpushare, netem
from asrdist.cluster.netem import parse_rate
from asrdist.errors import ConfigError
from asrdist.io.atomic import write_json_atomic
from asrdist.run.summary import RunSummary
from asrdist.utils.throughput import job_frames_per_second

DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"
ERROR_KEYS = ("per", "cer", "wer")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--claims", default=",".join(CLAIMS), help=f"comma-separated (default: {','.join(CLAIMS)})")
    parser.add_argument("--learners", type=cli_number(int, at_least=2), default=8,
                        help="learners of the flat claims, one per emulated host (default 8)")
    parser.add_argument("--cpus-per-host", type=cli_number(float, above=0), default=None,
                        help="cores of each host's quota (default: this machine's cores / learners, less the "
                             "launcher's margin)")
    parser.add_argument("--network", default="1gbit", help="links between hosts (default 1gbit)")
    parser.add_argument("--config", type=Path, default=DEFAULT_CONFIG, help="recipe (default configs/default.yaml)")
    parser.add_argument("--data", type=Path, default=None, help="corpus (default: the built-in espeak corpus)")
    parser.add_argument("--utterances", type=cli_number(int, at_least=30), default=160,
                        help="size of the built-in corpus (default 160)")
    parser.add_argument("--epochs", type=cli_number(int, at_least=2), default=6, help="epochs of every run")
    parser.add_argument("--batch-size", type=cli_number(int, at_least=8), default=256,
                        help="global minibatch in frames (S3 also runs 6x it, S8 4x)")
    parser.add_argument("--seeds", type=cli_number(int, at_least=1), default=3, help="seeds of S1 and S2")
    parser.add_argument("--deadline", type=cli_number(float, above=0), default=1800.0, help="seconds any one run may take")
    parser.add_argument("--keep", type=Path, default=None, help="keep the run directories here")
    parser.set_defaults(overrides=[])


def _check(args) -> list[str]:
    ids = [c.strip().upper() for c in args.claims.split(",") if c.strip()]
    known = set(CLAIMS) | set(NOT_BUILT)
    bad = [c for c in ids if c not in known]
    if not ids or bad:
        raise ConfigError(f"bench seeds --claims {args.claims!r}: unknown claim {bad[0] if bad else '(none)'} "
                          f"(known: {', '.join(sorted(known, key=lambda c: int(c[1:])))})")
    parse_rate(args.network)
    if not args.config.is_file():
        raise ConfigError(f"bench seeds --config {args.config}: no such recipe")
    if args.data is not None and not (args.data / "train").is_dir():
        raise ConfigError(f"bench seeds --data {args.data}: not a corpus directory (build one with `asrdist corpus synth`)")
    for name, (ok, reason) in (("emulated network", netem.available()), ("dedicated CPU shares", cpushare.available())):
        if not ok:
            raise ConfigError(f"bench seeds: the claims run on dedicated emulated hosts; {name}: {reason}")
    for c in ids:
        if c in CLAIMS and args.learners < CLAIMS[c].needs_learners:
            raise ConfigError(f"bench seeds: {c} needs --learners >= {CLAIMS[c].needs_learners}")
    return ids


def run(args) -> dict[str, Any]:
    ids = _check(args)
    cpus = args.cpus_per_host or cpushare.default_cpus_per_host(args.learners)
    setup = Setup(args.learners, cpus, args.network, args.epochs, args.batch_size, tuple(range(args.seeds)))
    corpus = args.data if args.data is not None else cached_corpus(args.utterances)
    result: dict[str, Any] = {
        "claims": {}, "setup": asdict(setup), "corpus": str(corpus), "config": str(args.config),
        "cores": len(os.sched_getaffinity(0)), "overrides": list(args.overrides),
        "time_to_target": "training seconds (wall seconds since the job's training began, less the time spent "
                          "validating before it) of the first validation at or below the claim's target error: the "
                          f"worst of its runs' best errors; every run validates at least {seed_predict.VALIDATIONS} "
                          "times (train.validate_every, within epochs and at their ends)",
        "simulator_error": "each run's predicted frames/s (made before it trained, from microbenchmarks of one "
                           "learner alone and the link, for learners on dedicated hosts: asrdist.sim.dedicated) "
                           "less the measured, over the measured; simulator_error_time_to_target the same for the "
                           "time to the claim's target (predicted training seconds per epoch x the epochs it took)"}
    for c in ids:  # every rule is on record before any run starts
        result["claims"][c] = (dict(describe(CLAIMS[c], setup), status="pending") if c in CLAIMS
                               else dict(NOT_BUILT[c], status="not reproduced by bench seeds", passed=None))
    _save(args, result)
    with tempfile.TemporaryDirectory(prefix="asrdist-seeds-") as tmp:
        out = args.keep or Path(tmp)
        for c in ids:
            if c in CLAIMS:
                result["claims"][c]["status"] = "running"
                _save(args, result)
                result["claims"][c] = run_claim(CLAIMS[c], setup, corpus, out / c, args)
                _save(args, result)
    return result


def _save(args, result: dict) -> None:
    if getattr(args, "json", None) is not None:
        write_json_atomic(args.json, result)


def run_claim(claim: Claim, setup: Setup, corpus: Path, out: Path, args) -> dict[str, Any]:
    """Each run predicted (`seed_predict.plan_run`), then trained; the rule judges them; each
    run's predicted time to the claim's target beside the measured one."""
    t0 = time.monotonic()
    cache: dict = {}

    def planned_and_trained(specs: list[RunSpec]) -> dict[str, dict]:
        return {spec.name: train_run(spec, setup, corpus, out / spec.name, args,
                                     seed_predict.plan_run(spec, setup, corpus, args, cache))
                for spec in specs}

    runs = planned_and_trained(claim.plan(setup))
    if claim.runs_after is not None:
        runs.update(planned_and_trained(claim.runs_after(runs, setup)))
    measured, passed, reason = claim.judge(runs, setup)
    seed_predict.fill_time_to_target(runs, seed_predict.claim_times(measured))
    return {**describe(claim, setup), "status": "done", "measured": measured, "passed": passed, "reason": reason,
            "runs": runs, "seconds": round(time.monotonic() - t0, 1),
            "conditions": {"learners": setup.learners, "cpus_per_host": setup.cpus_per_host,
                           "network": setup.network, "epochs": setup.epochs, "batch_size": setup.batch_size,
                           "cores": len(os.sched_getaffinity(0))}}


def train_run(spec: RunSpec, setup: Setup, corpus: Path, run_dir: Path, args, plan: dict) -> dict[str, Any]:
    """One `asrdist train` job on dedicated emulated hosts, validating every `plan["validate_every"]`
    minibatches; what the claim reads of it, beside `plan["predicted"]` (made before it trained)."""
    cpus = spec.cpus_per_host or setup.cpus_per_host
    load_before = os.getloadavg()
    seconds = run_train([str(args.config), *seed_predict.run_overrides(spec, setup, args),
                         f"train.validate_every={plan['validate_every']}",
                         "--data", str(corpus), "--learners", str(spec.learners), "--nodes", str(spec.nodes),
                         "--network", spec.network, "--cpus-per-host", repr(cpus), "--strategy", spec.strategy],
                        run_dir, args.deadline, "bench seeds")
    summary = RunSummary.read(run_dir)
    learners = summary.comm.per_learner
    validations = [{"epoch": r.epoch, "epoch_progress": r.epoch_progress, "step": r.step,
                    "wall_seconds": r.wall_seconds, "seconds": r.training_seconds,
                    "error": r.error_rate(ERROR_KEYS)[1], "valid_loss": r.valid_loss,
                    "consensus_distance": r.consensus_distance}
                   for r in summary.validations or [] if r.valid_loss is not None]
    dedicated = summary.dedicated.to_json() if summary.dedicated is not None else {}
    fps = job_frames_per_second([p.frames for p in learners], summary.stepping_seconds())
    return {"strategy": spec.strategy, "learners": spec.learners, "nodes": spec.nodes, "network": spec.network,
            "cpus_per_host": cpus, "overrides": list(spec.overrides), "validate_every": plan["validate_every"],
            "validations": validations, "final_error": validations[-1]["error"] if validations else None,
            "frames_per_second": fps,
            "hosts": dedicated.get("hosts"), "straggler_emulation": dedicated.get("straggler_emulation"),
            "outside_hosts": dedicated.get("outside_hosts"),
            "per_learner": [{k: p.to_json().get(k) for k in ("rank", "steps", "frames", "loop_seconds", "compute_seconds",
                                                              "comm_seconds", "wait_seconds", "exchanges", "cpu_seconds",
                                                              "cpu_wall_seconds")}
                            for p in learners],
            "command_seconds": round(seconds, 1),
            "load_average": {"before": list(load_before), "after": list(os.getloadavg())},
            "predicted": plan["predicted"],
            "simulator_error": seed_predict.relative_error(plan["predicted"]["frames_per_second"], fps)}


def format_result(result: dict) -> str:
    lines = [f"bench seeds: {result['setup']['learners']} learners, {result['setup']['cpus_per_host']:g} cores "
             f"per host, {result['setup']['network']} links"]
    for c, claim in result["claims"].items():
        verdict = {True: "passed", False: "FAILED", None: "no verdict"}[claim.get("passed")]
        why = claim.get("reason") or claim.get("where") or ""
        lines.append(f"{c:>4} {verdict:<10} {claim.get('statement', '')}" + (f" ({why})" if why else ""))
    return "\n".join(lines)
