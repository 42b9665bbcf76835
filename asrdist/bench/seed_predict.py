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
import json
import sys
import time
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from asrdist.bench.seed_claims import RunSpec, Setup
from asrdist.bench.straggler import cached_corpus, cached_corpus_utterances
from asrdist.calibrate.microbench import link_cpu_per_byte, measure_microbenchmarks
from asrdist.compare.runs import Hosts, resolve_all
from asrdist.errors import AsrdistError
from asrdist.models.registry import model_kind
from asrdist.run.prepare import build_targets, ensure_features
from asrdist.sim.calibration import Microbenchmarks, predict_run
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
    inputs, predicted = _predict(cfg, micro, spec, share, within, detail["feature_dim"], detail["num_classes"])
    return {"validate_every": k, "predicted": {
        "frames_per_second": predicted.frames_per_second, "epoch_seconds": predicted.epoch_seconds,
        "training_seconds_per_epoch": predicted.epoch_seconds - inputs.epoch_end_seconds,
        "validations_per_epoch": 1 + within, "steps_per_epoch": steps, "share_cores": share,
        "comm_share": predicted.comm_share, "wait_share": predicted.wait_share, "time_to_target_seconds": None,
        "microbenchmarks": dataclasses.asdict(micro), "link": detail.get("link"), "sources": inputs.sources,
        "feature_dim": detail["feature_dim"], "num_classes": detail["num_classes"],
        "seconds": round(time.monotonic() - t0, 1)}}


def _predict(cfg, micro: Microbenchmarks, spec: RunSpec, share: float, within: int, feature_dim: int,
             num_classes: int):
    """(inputs, prediction) of run `spec` of resolved config `cfg` on dedicated hosts of `share`
    cores per learner, validating `within` times inside each epoch (step 4 of the module docstring)."""
    inputs = dedicated_inputs(micro, spec.learners, share, spec.strategy, validations_per_epoch=within)
    network = spec.network if spec.nodes > 1 else "loopback"
    return inputs, predict_run(cfg, inputs, spec.nodes, network, feature_dim=feature_dim, num_classes=num_classes,
                               dedicated=True)


def repredict(result: dict[str, Any]) -> list[dict[str, Any]]:
    """Every run of a `bench seeds` JSON predicted again by today's simulator from the
    microbenchmarks the run stored (no timing): {claim, run, measured, stored, now} frames/s.
    An in-sample check for a change to the simulator: these runs may have shaped it; a change is
    judged on fresh runs (docs/seeds.md#the-simulators-predictions). Needs the runs' corpus: the
    built-in one `bench seeds` trained on (`corpus-espeak-N-seed0`) is built again where it is
    missing (a fresh machine), with its features where the JSON predates `feature_dim` /
    `num_classes` in `predicted`."""
    setup = Setup(**{**result["setup"], "seeds": tuple(result["setup"]["seeds"])})
    args = SimpleNamespace(overrides=result.get("overrides", []), config=Path(result["config"]))
    corpus = Path(result["corpus"])
    utterances = cached_corpus_utterances(corpus)
    if not (corpus / "train").is_dir() and utterances is not None:
        corpus = cached_corpus(utterances)
    rows = []
    for claim_id, claim in result["claims"].items():
        for name, run in (claim.get("runs") or {}).items():
            predicted = run.get("predicted")
            if not predicted or not run.get("frames_per_second"):
                continue
            spec = RunSpec(name, run["strategy"], run["learners"], run["nodes"], run["network"],
                           tuple(run["overrides"]), run["cpus_per_host"])
            # resolved without its hosts (their checks probe namespaces and cgroups): the hosts
            # are the simulator's (`nodes`, `network`, the share), not the config's
            cfg = resolve_all(args.config, [spec.strategy], spec.learners, corpus,
                              run_overrides(spec, setup, args))[spec.strategy]
            shapes = {k: predicted.get(k) for k in ("feature_dim", "num_classes")}
            if None in shapes.values():
                ensure_features(corpus, cfg, progress=False)
                targets = build_targets(corpus, cfg, model_kind(cfg.model))
                shapes = {"feature_dim": cfg.data.num_mel_bins, "num_classes": targets.num_classes}
            stored = predicted["microbenchmarks"]
            link = predicted.get("link") or {"cpu_seconds_per_byte": stored["link_cpu_seconds_per_byte"]}
            # the link's CPU per byte as dedicated hosts take it today
            micro = Microbenchmarks(**{**stored, "link_cpu_seconds_per_byte": link_cpu_per_byte(link, dedicated=True)})
            _, now = _predict(cfg, micro, spec, predicted["share_cores"], predicted["validations_per_epoch"] - 1,
                              **shapes)
            rows.append({"claim": claim_id, "run": name, "measured": run["frames_per_second"],
                         "stored": predicted["frames_per_second"], "now": now.frames_per_second})
    return rows


def main(argv: list[str] | None = None) -> int:
    """`python -m asrdist.bench.seed_predict JSON...`: `repredict` every file, one line a run."""
    paths = argv if argv is not None else sys.argv[1:]
    if not paths:
        print("usage: python -m asrdist.bench.seed_predict SEEDS_JSON...", file=sys.stderr)
        return 2
    errors: dict[str, list[float]] = {"stored": [], "now": []}
    for path in paths:
        try:
            rows = repredict(json.loads(Path(path).read_text()))
        except (OSError, ValueError, KeyError, TypeError) as e:  # not a bench seeds JSON of today's keys
            print(f"asrdist: error: seed_predict {path}: not a readable bench seeds JSON ({type(e).__name__}: {e})",
                  file=sys.stderr)
            return 2
        except AsrdistError as e:  # its corpus or recipe: one line, as every command
            print(f"asrdist: error: seed_predict {path}: {e}", file=sys.stderr)
            return 2
        for row in rows:
            err = {k: relative_error(row[k], row["measured"]) for k in errors}
            for k in errors:
                errors[k].append(err[k])
            print(f"{row['claim']:4s} {row['run']:28s} measured {row['measured']:8.0f}  stored {row['stored']:8.0f} "
                  f"({err['stored']:+.2f})  now {row['now']:8.0f} ({err['now']:+.2f})")
    for k, v in errors.items():
        print(f"{k}: {sum(abs(e) <= 0.2 for e in v)} of {len(v)} runs within +-20%")
    return 0


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


if __name__ == "__main__":
    raise SystemExit(main())
