"""The seeds' claims as checks that can fail (`asrdist bench seeds`): for each, the runs that test
it and the rule that judges them, fixed before any run starts.

A claim is `Claim(id, source, statement, rule, plan, judge)`: `plan(setup)` lists its runs
(`RunSpec`: strategy, learners, hosts, overrides), `judge(runs, setup)` turns the finished runs
into `(measured, passed, reason)`. Every run trains the bench's recipe on dedicated emulated hosts
(`--cpus-per-host`), validating every `train.validate_every` minibatches as well; time to target
is the training time (wall less validating) of the first validation at or below the claim's
target error (the worst of the runs' best errors: every run can reach it).
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass
from typing import Any, Callable

from asrdist.bench.straggler import _exchange_vs_compute, _rate_for_exchange_like_compute
from asrdist.compare.recipes import recipe_overrides

ADAGRAD = ["optim.name=adagrad", "optim.lr=3.0", "optim.momentum=0.0", "optim.nesterov=false",
           "optim.adagrad_skip_unseen=true"]
"""CNTK's AdaGrad at the rate chosen for the default DNN (docs/measurements.md: compare's onebit
recipe until 2026-12-02)."""
NO_LOSS = 1.03
"""'No or nearly no loss': a final error at most 3% relative above the reference's."""


@dataclass(frozen=True)
class Setup:
    """What every claim's runs share: learners, the share of each host, links, epochs, batch."""
    learners: int
    cpus_per_host: float
    network: str
    epochs: int
    batch_size: int
    seeds: tuple[int, ...] = (0, 1, 2)


@dataclass(frozen=True)
class RunSpec:
    name: str
    strategy: str
    learners: int
    nodes: int
    network: str = "1gbit"
    overrides: tuple[str, ...] = ()
    cpus_per_host: float | None = None
    """None: the setup's share."""


@dataclass(frozen=True)
class Claim:
    id: str
    source: str
    statement: str
    rule: str
    plan: Callable[[Setup], list[RunSpec]]
    judge: Callable[[dict[str, dict], Setup], tuple[Any, bool | None, str]]
    needs_learners: int = 2
    runs_after: Callable[[dict[str, dict], Setup], list[RunSpec]] | None = None
    """Runs whose settings depend on earlier ones' measurements (S8's links)."""


def final_error(run: dict) -> float | None:
    return run["validations"][-1]["error"] if run.get("validations") else None


def best_error(run: dict) -> float | None:
    errors = [v["error"] for v in run.get("validations", []) if v["error"] is not None]
    return min(errors) if errors else None


def shared_target(runs: list[dict]) -> float | None:
    """The worst of the runs' best errors: the lowest error every run reached."""
    bests = [best_error(r) for r in runs]
    return None if any(b is None for b in bests) or not bests else max(bests)


def time_to(run: dict, target: float | None) -> float | None:
    """Seconds to the first validation at or below `target`: its training seconds (`seconds`: wall
    less the time spent validating before it) where the run recorded them, else its wall seconds."""
    if target is None:
        return None
    return next((v.get("seconds", v["wall_seconds"]) for v in run.get("validations", []) if v["error"] is not None
                 and v["error"] <= target), None)


def _ratio(a: float | None, b: float | None) -> float | None:
    return None if a is None or not b else a / b


def _nodes(setup: Setup) -> int:
    return setup.learners


# --------------------------------------------------------------------------- S1, S2: no loss
def _pairs(strategy_a: str, strategy_b: str, extra: list[str]) -> Callable[[Setup], list[RunSpec]]:
    def plan(s: Setup) -> list[RunSpec]:
        return [RunSpec(f"{name}_seed{seed}", name, s.learners, _nodes(s), s.network,
                        (*extra, f"seed={seed}"))
                for seed in s.seeds for name in (strategy_a, strategy_b)]
    return plan


def _judge_no_loss(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    per_seed = {seed: {"sync": final_error(runs[f"sync_seed{seed}"]), "onebit": final_error(runs[f"onebit_seed{seed}"])}
                for seed in s.seeds}
    if any(v is None for pair in per_seed.values() for v in pair.values()):
        return {"per_seed": per_seed}, None, "a run recorded no validation"
    mean_sync = statistics.mean(p["sync"] for p in per_seed.values())
    mean_onebit = statistics.mean(p["onebit"] for p in per_seed.values())
    measured = {"per_seed": {k: {**v, "relative": v["onebit"] / v["sync"] - 1 if v["sync"] else None}
                             for k, v in per_seed.items()},
                "mean_sync": mean_sync, "mean_onebit": mean_onebit,
                "mean_relative": mean_onebit / mean_sync - 1 if mean_sync else None}
    passed = mean_onebit <= NO_LOSS * mean_sync
    return measured, passed, "" if passed else f"onebit's mean final error is {measured['mean_relative']:+.1%} of sync's"


# ------------------------------------------------------------------------ S3: speed-ups
def _plan_speedups(s: Setup) -> list[RunSpec]:
    out = []
    for label, batch in (("small", s.batch_size), ("large", 6 * s.batch_size)):
        b = f"data.batch_size={batch}"
        out += [RunSpec(f"single_{label}", "single", 1, 1, s.network, (b,)),
                RunSpec(f"sync_{label}", "sync", s.learners, _nodes(s), s.network, (b,)),
                RunSpec(f"onebit_{label}", "onebit", s.learners, _nodes(s), s.network, (b,))]
    return out


def _judge_speedups(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    speed = {f"{name}_{label}": _ratio(runs[f"{name}_{label}"]["frames_per_second"],
                                       runs[f"single_{label}"]["frames_per_second"])
             for name in ("sync", "onebit") for label in ("small", "large")}
    measured = {"frames_per_second_speedup": speed}
    grows = speed["onebit_large"] > speed["onebit_small"]
    beats = speed["onebit_small"] > speed["sync_small"] and speed["onebit_large"] > speed["sync_large"]
    reason = "" if grows and beats else "; ".join(
        ([] if grows else ["onebit's speed-up does not grow with the minibatch"])
        + ([] if beats else ["onebit's speed-up does not beat sync's at both minibatch sizes"]))
    return measured, grows and beats, reason


# ---------------------------------------------------------- S5: averaging needs NG-SGD
AVERAGE_EVERY_MINIBATCHES = 10
"""S5's averaging period in each learner's minibatches. Kaldi's jobs average every 400k samples or
so, tens of times an epoch of a Switchboard-sized corpus; on the bench's corpus averaging's
default (20,000 samples a learner) came after the 4 epochs' 14,336 (2026-12-02: never averaged)."""


def _plan_ngsgd(s: Setup) -> list[RunSpec]:
    # Kaldi's optimizer (averaging's recipe in compare: no momentum, a geometric decay), both arms
    kaldi = (*recipe_overrides("averaging"),
             f"strategy.average_every={AVERAGE_EVERY_MINIBATCHES * max(1, s.batch_size // s.learners)}")
    return [RunSpec("averaging_ngsgd", "averaging", s.learners, _nodes(s), s.network,
                    (*kaldi, "optim.natural_gradient=true", "optim.max_change=true")),
            RunSpec("averaging_sgd", "averaging", s.learners, _nodes(s), s.network,
                    (*kaldi, "optim.natural_gradient=false", "optim.max_change=true"))]


def _judge_ngsgd(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    ng, plain = final_error(runs["averaging_ngsgd"]), final_error(runs["averaging_sgd"])
    measured = {"final_error_ngsgd": ng, "final_error_sgd": plain}
    if ng is None or plain is None:
        return measured, None, "a run recorded no validation"
    return measured, ng < plain, "" if ng < plain else "plain SGD averaged as well as NG-SGD"


# ---------------------------------------------------------------- S7: slow learners
SLOWDOWN = 3.0


def _plan_straggler(s: Setup) -> list[RunSpec]:
    def slow(rank: int) -> tuple[str, ...]:
        return (f"train.straggler.ranks=[{rank}]", f"train.straggler.slowdown={SLOWDOWN}")
    active, passive = 2, 3  # on the fixed ring, even ranks start the exchanges
    n, net = s.learners, s.network
    return [RunSpec("sync", "sync", n, n, net), RunSpec("sync_slow", "sync", n, n, net, slow(passive)),
            RunSpec("adpsgd", "adpsgd", n, n, net),
            RunSpec("adpsgd_slow_active", "adpsgd", n, n, net, slow(active)),
            RunSpec("adpsgd_slow_passive", "adpsgd", n, n, net, slow(passive)),
            RunSpec("adpsgd_random", "adpsgd", n, n, net, ("strategy.pattern=random",)),
            RunSpec("adpsgd_random_slow", "adpsgd", n, n, net, ("strategy.pattern=random", *slow(active)))]


def _judge_straggler(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    target = shared_target(list(runs.values()))
    ttt = {name: time_to(r, target) for name, r in runs.items()}
    ratios = {"sync": _ratio(ttt["sync_slow"], ttt["sync"]),
              "adpsgd_fixed_active": _ratio(ttt["adpsgd_slow_active"], ttt["adpsgd"]),
              "adpsgd_fixed_passive": _ratio(ttt["adpsgd_slow_passive"], ttt["adpsgd"]),
              "adpsgd_random": _ratio(ttt["adpsgd_random_slow"], ttt["adpsgd_random"])}
    measured = {"target_error": target, "time_to_target_seconds": ttt, "ratio_with_over_without": ratios}
    if any(v is None for v in ratios.values()):
        return measured, None, "a run did not reach the shared target"
    limit = 0.6 * ratios["sync"]
    failing = [k for k, v in ratios.items() if k != "sync" and v > limit]
    return measured, not failing, "" if not failing else f"{', '.join(failing)} above 0.6 x sync's ratio ({limit:.2f})"


# -------------------------------------------------------------------- S8: delay-by-one
def _plan_delay_probe(s: Setup) -> list[RunSpec]:
    return [RunSpec("adpsgd_probe", "adpsgd", s.learners, _nodes(s), s.network, (f"data.batch_size={4 * s.batch_size}",))]


def _plan_delay(runs: dict[str, dict], s: Setup) -> list[RunSpec]:
    rate = _rate_for_exchange_like_compute(runs["adpsgd_probe"], s.network)
    b = f"data.batch_size={4 * s.batch_size}"
    return [RunSpec("sync", "sync", s.learners, _nodes(s), rate, (b,)),
            RunSpec("adpsgd", "adpsgd", s.learners, _nodes(s), rate, (b,)),
            RunSpec("adpsgd_delay_by_one", "adpsgd", s.learners, _nodes(s), rate, (b, "strategy.delay_by_one=true"))]


def _judge_delay(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    compared = {k: runs[k] for k in ("sync", "adpsgd", "adpsgd_delay_by_one")}
    target = shared_target(list(compared.values()))
    ttt = {k: time_to(r, target) for k, r in compared.items()}
    measured = {"target_error": target, "time_to_target_seconds": ttt, "network": runs["adpsgd"]["network"],
                "exchange_vs_compute": _exchange_vs_compute(runs["adpsgd"]),
                "probe_exchange_vs_compute": _exchange_vs_compute(runs["adpsgd_probe"])}
    if any(v is None for v in ttt.values()):
        return measured, None, "a run did not reach the shared target"
    passed = ttt["adpsgd_delay_by_one"] < min(ttt["sync"], ttt["adpsgd"])
    return measured, passed, "" if passed else "delay-by-one did not reach the target first"


# ------------------------------------------------------------ S9: randomized pattern
def _plan_random(s: Setup) -> list[RunSpec]:
    n = 2 * s.learners
    return [RunSpec("adpsgd_fixed", "adpsgd", n, n, s.network, cpus_per_host=s.cpus_per_host / 2),
            RunSpec("adpsgd_random", "adpsgd", n, n, s.network, ("strategy.pattern=random",),
                    cpus_per_host=s.cpus_per_host / 2)]


def _judge_random(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    target = shared_target(list(runs.values()))
    ttt = {k: time_to(r, target) for k, r in runs.items()}
    distance = {k: [v.get("consensus_distance") for v in r["validations"]] for k, r in runs.items()}
    measured = {"target_error": target, "time_to_target_seconds": ttt, "consensus_distance": distance}
    if any(v is None for v in ttt.values()):
        return measured, None, "a run did not reach the shared target"
    passed = ttt["adpsgd_random"] <= ttt["adpsgd_fixed"]
    return measured, passed, "" if passed else "the random pattern reached the target later than the fixed ring"


# ---------------------------------------------------------------- S10: hierarchies
LAYOUTS = ((4, 2), (2, 4))


def _plan_hier(s: Setup) -> list[RunSpec]:
    out = []
    for nodes, per in LAYOUTS:
        n, share = nodes * per, s.cpus_per_host * per  # each learner the flat setup's share
        tag = f"{nodes}x{per}"
        group = (f"train.group_size={per}",)
        out += [RunSpec(f"sync_{tag}", "sync", n, nodes, s.network, cpus_per_host=share),
                RunSpec(f"adpsgd_{tag}", "adpsgd", n, nodes, s.network, cpus_per_host=share),
                RunSpec(f"hierarchical_{tag}", "hierarchical", n, nodes, s.network, group, cpus_per_host=share),
                RunSpec(f"hybrid_{tag}", "hybrid", n, nodes, s.network, group, cpus_per_host=share)]
    return out


def _judge_hier(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    measured, verdicts, reasons = {}, [], []
    for nodes, per in LAYOUTS:
        tag = f"{nodes}x{per}"
        layout = {k: runs[f"{k}_{tag}"] for k in ("sync", "adpsgd", "hierarchical", "hybrid")}
        target = shared_target(list(layout.values()))
        ttt = {k: time_to(r, target) for k, r in layout.items()}
        errors = {k: final_error(r) for k, r in layout.items()}
        measured[tag] = {"target_error": target, "time_to_target_seconds": ttt, "final_error": errors}
        if any(v is None for v in ttt.values()) or any(v is None for v in errors.values()):
            verdicts.append(None)
            reasons.append(f"{tag}: a run did not reach the shared target")
            continue
        for k in ("hierarchical", "hybrid"):
            sooner = ttt[k] < min(ttt["sync"], ttt["adpsgd"])
            no_loss = errors[k] <= NO_LOSS * errors["sync"]
            verdicts.append(sooner and no_loss)
            if not sooner:
                reasons.append(f"{tag}: {k} not sooner than sync and adpsgd")
            if not no_loss:
                reasons.append(f"{tag}: {k}'s final error {errors[k] / errors['sync'] - 1:+.1%} of sync's")
    passed = None if None in verdicts else all(verdicts)
    return measured, passed, "; ".join(reasons)


# --------------------------------------------------------- S6: the largest batch that converges
GRID = 7
"""Global minibatches of S6: the setup's x sqrt(2)^i, i = 0 .. GRID - 1 (up to 8x)."""
S6_SCALING = ("optim.lr_scaling=sqrt",)
"""S6's learning rate follows the batch (x sqrt(batch / reference), the recipe's reference_batch) for
both strategies alike: a larger batch takes fewer steps per epoch."""


def batch_grid(s: Setup) -> list[int]:
    """The setup's batch x sqrt(2)^i, each rounded to a multiple of the learners (an even split)."""
    out: list[int] = []
    for i in range(GRID):
        b = max(s.learners, round(s.batch_size * 2 ** (i / 2) / s.learners) * s.learners)
        if b not in out:
            out.append(b)
    return out


def _plan_batches(s: Setup) -> list[RunSpec]:
    return [RunSpec(f"{name}_b{b}", name, s.learners, _nodes(s), s.network,
                    (f"data.batch_size={b}", f"optim.reference_batch={s.batch_size}", *S6_SCALING))
            for name in ("sync", "adpsgd") for b in batch_grid(s)]


def _judge_batches(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    grid = batch_grid(s)
    reference = final_error(runs[f"sync_b{grid[0]}"])
    if reference is None:
        return {"batches": grid}, None, "sync at the setup's batch recorded no validation"
    target = NO_LOSS * reference
    reached = {name: {str(b): (best_error(runs[f"{name}_b{b}"]) or float("inf")) <= target for b in grid}
               for name in ("sync", "adpsgd")}
    largest = {name: max((b for b in grid if reached[name][str(b)]), default=None) for name in reached}
    measured = {"batches": grid, "target_error": target, "reached": reached, "largest_batch": largest,
                "ratio": _ratio(largest["adpsgd"], largest["sync"]),
                "time_to_target_seconds": {name: time_to(r, target) for name, r in runs.items()}}
    if largest["sync"] == grid[-1]:
        return measured, None, (f"sync reached the target at the grid's largest batch ({grid[-1]}): the grid does "
                                f"not find sync's limit (raise --batch-size)")
    if largest["adpsgd"] is None:
        return measured, False, "adpsgd reached the target at no batch of the grid"
    passed = largest["adpsgd"] >= 2 * largest["sync"]
    return measured, passed, "" if passed else (f"adpsgd's largest batch {largest['adpsgd']} is under 2 x sync's "
                                                f"{largest['sync']}")


# ----------------------------------------------- S11: hierarchical allreduce against a flat ring
def _plan_allreduce(s: Setup) -> list[RunSpec]:
    nodes, per = 2, 4
    share, group = s.cpus_per_host * per, f"train.group_size={per}"  # each learner the flat setup's share
    return [RunSpec(f"sync_{kind}", "sync", nodes * per, nodes, s.network, (group, f"strategy.hierarchical={flag}"),
                    cpus_per_host=share) for kind, flag in (("hierarchical", "true"), ("flat", "false"))]


def _judge_allreduce(runs: dict[str, dict], s: Setup) -> tuple[Any, bool | None, str]:
    target = shared_target(list(runs.values()))
    ttt = {k: time_to(r, target) for k, r in runs.items()}
    speed = _ratio(runs["sync_hierarchical"]["frames_per_second"], runs["sync_flat"]["frames_per_second"])
    measured = {"frames_per_second_ratio": speed, "target_error": target, "time_to_target_seconds": ttt,
                "time_to_target_ratio": _ratio(ttt["sync_flat"], ttt["sync_hierarchical"])}
    if speed is None:
        return measured, None, "a run recorded no frames/s"
    passed = speed >= 1.3
    return measured, passed, "" if passed else f"the hierarchical allreduce is {speed:.2f}x the flat ring's frames/s"


CLAIMS: dict[str, Claim] = {c.id: c for c in [
    Claim("S1", "Seide et al. 2014", "1-bit SGD trains at no or nearly no loss of accuracy",
          f"onebit's mean final error over seeds <= {NO_LOSS} x sync's; same recipe and epochs",
          _pairs("sync", "onebit", []), _judge_no_loss),
    Claim("S2", "Seide et al. 2014", "quantization with error feedback benefits AdaGrad",
          f"onebit + AdaGrad's mean final error over seeds <= {NO_LOSS} x sync + AdaGrad's",
          _pairs("sync", "onebit", ADAGRAD), _judge_no_loss),
    Claim("S3", "Seide et al. 2014", "1-bit SGD speeds 8 devices up 3.6x at a small minibatch, 6.3x at a large one",
          "frames/s over one learner of the same quota, minibatches 6x apart on the setup's links: onebit's "
          "speed-up grows with the minibatch and beats sync's at both", _plan_speedups, _judge_speedups),
    Claim("S5", "Povey, Zhang, Khudanpur 2015", "model averaging needs NG-SGD",
          "averaging with NG-SGD ends at a lower final error than with plain SGD (both with max-change, "
          f"Kaldi's optimizer as in configs/recipes/averaging.yaml, an average every {AVERAGE_EVERY_MINIBATCHES} "
          "minibatches)",
          _plan_ngsgd, _judge_ngsgd),
    Claim("S6", "Zhang et al. (IBM) 2019", "ADPSGD converges at 3x sync's batch",
          f"global batches of the setup's x sqrt(2)^i (i < {GRID}), the learning rate x sqrt(batch / the setup's) "
          f"for both; target: sync's final error at the setup's batch x {NO_LOSS}; the largest batch at which "
          "adpsgd reaches it within the epochs >= 2 x sync's (no verdict if sync reaches it at every batch)",
          _plan_batches, _judge_batches, needs_learners=2),
    Claim("S7", "Zhang et al. (IBM) 2020", "ADPSGD copes with slow learners",
          f"one learner {SLOWDOWN:g}x slower (an active, a passive; the random ring): every adpsgd time-to-target "
          "ratio (with / without) <= 0.6 x sync's", _plan_straggler, _judge_straggler, needs_learners=4),
    Claim("S8", "Zhang et al. (IBM) 2020", "delay-by-one converges fastest with large batches and equal learners",
          "4x the batch, links where an exchange costs about one step's compute: delay-by-one reaches the "
          "shared target before sync and plain adpsgd", _plan_delay_probe, _judge_delay, needs_learners=2,
          runs_after=_plan_delay),
    Claim("S9", "Zhang et al. (IBM) ICASSP 2020", "the randomized pattern helps at many learners",
          "2x the setup's learners (half the share each): the random pattern reaches the shared target no "
          "later than the fixed ring", _plan_random, _judge_random, needs_learners=4),
    Claim("S10", "Zhang et al. (IBM) Interspeech 2019", "H-ADPSGD and HYBRID reach the target sooner at no loss",
          f"4 hosts x 2 and 2 x 4 (loopback inside a host, the setup's links between): hierarchical and hybrid "
          f"each reach the shared target before sync and adpsgd, final error <= {NO_LOSS} x sync's",
          _plan_hier, _judge_hier, needs_learners=8),
    Claim("S11", "Cho et al. (PowerAI DDL) 2017", "a hierarchical allreduce beats a flat ring",
          "sync on 2 hosts x 4 learners (each learner the setup's share, loopback inside a host, the setup's "
          "links between): frames/s with the hierarchical allreduce >= 1.3 x with the flat ring",
          _plan_allreduce, _judge_allreduce, needs_learners=2),
]}

NOT_BUILT: dict[str, dict[str, str]] = {
    "S4": {"source": "Povey, Zhang, Khudanpur 2015", "statement": "NG-SGD costs 10-25% more per step",
           "where": "asrdist bench ngsgd --json OUT (step ratios beside their floors)"},
}
"""Claims `bench seeds` does not reproduce in this version, with where to look instead."""


def describe(claim: Claim, setup: Setup) -> dict[str, Any]:
    return {"source": claim.source, "statement": claim.statement, "rule": claim.rule,
            "planned_runs": [r.name for r in claim.plan(setup)]}
