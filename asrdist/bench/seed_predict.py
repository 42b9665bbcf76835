"""`bench seeds`' simulator predictions and validation points, settled before each run trains.

For every run, before it starts: 1. its config resolved as `asrdist train` resolves it; 2. one
learner of it microbenchmarked alone on this machine, on 1 thread (its step at the run's local
minibatch, an epoch's end, coding and copies), and the link between two emulated hosts
(`measure_microbenchmarks(dedicated=True)`; one measurement serves the runs of a claim whose
steps are the same: a straggler, a seed or a pattern changes no microbenchmark); 3. `k`
(`train.validate_every`) chosen so that the run validates at least `VALIDATIONS` times; 4. the
simulator's prediction for learners on dedicated hosts of the run's share (`asrdist.sim.dedicated`),
from 2 and 3 alone. After the run: its frames/s against the prediction (`simulator_error`) and,
once the claim has a target, the predicted time to it (the predicted training seconds per epoch
x the epochs the run took to reach it: the simulator predicts speed, not convergence) against the
measured one. docs/seeds.md#the-simulators-predictions.
"""
from __future__ import annotations

import dataclasses
import time
from pathlib import Path
from typing import Any

from asrdist.bench.seed_claims import RunSpec, Setup
from asrdist.calibrate.microbench import measure_microbenchmarks
from asrdist.compare.runs import Hosts, resolve_all
from asrdist.models.registry import model_kind
from asrdist.run.prepare import ensure_features
from asrdist.sim.calibration import predict_run
from asrdist.sim.dedicated import dedicated_inputs, share_of

VALIDATIONS = 10
"""Validations a run makes at least (within epochs and at their ends)."""
UNCHANGED_STEP = ("seed=", "train.straggler.", "strategy.pattern=", "strategy.delay_by_one=", "strategy.seed=")
"""Overrides that change no microbenchmark: runs differing only in them share one measurement."""


def validate_every(steps_per_epoch: int, epochs: int, at_least: int = VALIDATIONS) -> int:
    """The largest k at which `epochs` epochs of `steps_per_epoch` minibatches give `at_least`
    validations (every k-th minibatch within an epoch, and its end); 1 when none does."""
    for k in range(max(steps_per_epoch, 1), 0, -1):
        if epochs * (1 + (steps_per_epoch - 1) // k) >= at_least:
            return k
    return 1


def run_overrides(spec: RunSpec, setup: Setup, args) -> list[str]:
    """The run's overrides after the recipe, as `train_run` passes them (epochs last)."""
    return [*args.overrides, f"data.batch_size={setup.batch_size}", *spec.overrides, f"train.epochs={setup.epochs}"]


def plan_run(spec: RunSpec, setup: Setup, corpus: Path, args, cache: dict) -> dict[str, Any]:
    """Steps 1-4 of the module docstring: {"validate_every": k, "predicted": {...}} (`cache`:
    microbenchmarks by what decides them, for the claim's later runs)."""
    cpus = spec.cpus_per_host or setup.cpus_per_host
    hosts = Hosts(spec.nodes, spec.network, cpus)
    cfg = resolve_all(args.config, [spec.strategy], spec.learners, corpus, run_overrides(spec, setup, args),
                      hosts)[spec.strategy]
    ensure_features(corpus, cfg, progress=False)
    network = spec.network if spec.nodes > 1 else "loopback"
    key = (spec.strategy, spec.learners, spec.nodes, network,
           tuple(o for o in spec.overrides if not o.startswith(UNCHANGED_STEP)))
    t0 = time.monotonic()
    if key not in cache:
        cache[key] = measure_microbenchmarks(spec.strategy, spec.learners, cfg, network, dedicated=True)
    micro, detail = cache[key]
    frames_per_step = cfg.data.batch_size * (cfg.model.chunk if model_kind(cfg.model) == "chunk" else 1)
    steps = max(1, round(micro.frames_per_epoch / frames_per_step))
    k = validate_every(steps, setup.epochs)
    within = (steps - 1) // k
    share = share_of(cpus, spec.learners // spec.nodes)
    inputs = dedicated_inputs(micro, spec.learners, share, spec.strategy, validations_per_epoch=within)
    predicted = predict_run(cfg, inputs, spec.nodes, network, feature_dim=detail["feature_dim"],
                            num_classes=detail["num_classes"], dedicated=True)
    return {"validate_every": k, "predicted": {
        "frames_per_second": predicted.frames_per_second, "epoch_seconds": predicted.epoch_seconds,
        "training_seconds_per_epoch": predicted.epoch_seconds - inputs.epoch_end_seconds,
        "validations_per_epoch": 1 + within, "steps_per_epoch": steps, "share_cores": share,
        "comm_share": predicted.comm_share, "wait_share": predicted.wait_share, "time_to_target_seconds": None,
        "microbenchmarks": dataclasses.asdict(micro), "link": detail.get("link"), "sources": inputs.sources,
        "seconds": round(time.monotonic() - t0, 1)}}


def relative_error(predicted: float | None, measured: float | None) -> float | None:
    return None if predicted is None or not measured else (predicted - measured) / measured


def progress_at(run: dict, seconds: float | None) -> float | None:
    """Epochs done (`epoch_progress`) at the validation whose time to target is `seconds`."""
    return next((v.get("epoch_progress") for v in run.get("validations", [])
                 if v.get("seconds", v.get("wall_seconds")) == seconds), None)


def fill_time_to_target(runs: dict[str, dict], times: dict[str, float | None]) -> None:
    """The predicted time to the claim's target of each run of `times` (run -> measured seconds):
    the predicted training seconds per epoch x the epochs the run took to reach it."""
    for name, seconds in times.items():
        run = runs.get(name)
        predicted = run.get("predicted") if run else None
        if not predicted or seconds is None:
            continue
        progress = progress_at(run, seconds)
        if progress is None:
            continue
        guess = predicted["training_seconds_per_epoch"] * progress
        predicted["time_to_target_seconds"] = guess
        run["time_to_target_seconds"] = seconds
        run["simulator_error_time_to_target"] = relative_error(guess, seconds)


def claim_times(measured: Any) -> dict[str, float | None]:
    """run -> measured time to target, from a claim's `measured` (`time_to_target_seconds`, at
    the top or per layout: S10's `4x2` etc., whose run names carry the layout)."""
    if not isinstance(measured, dict):
        return {}
    out = dict(measured.get("time_to_target_seconds") or {})
    for tag, part in measured.items():
        if isinstance(part, dict) and isinstance(part.get("time_to_target_seconds"), dict):
            out.update({f"{k}_{tag}": v for k, v in part["time_to_target_seconds"].items()})
    return out
