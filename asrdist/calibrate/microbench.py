"""Microbenchmarks of one learner of a run's config on this machine: what the simulator is
calibrated on (`asrdist.sim.calibration.Microbenchmarks`), never a timing of the run it predicts.
`measure_microbenchmarks` times them just before the run trains; `RunCalibration` keeps one such
measurement as JSON so that a rebuilt report predicts what the first one did. What each figure is:
docs/calibration.md#one-runs-microbenchmarks-calibratemicrobench."""
from __future__ import annotations

import dataclasses
import json
import os
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import torch

from asrdist.calibrate.corun import corun_slowdown, lower_spell
from asrdist.calibrate.link import measure_link
from asrdist.calibrate.lockstep import measure_waits
from asrdist.calibrate.stepcost import config_step_seconds_per_frame
from asrdist.cluster.netem import network_label
from asrdist.errors import AsrdistError, DataError, Stopped
from asrdist.io.atomic import write_json_atomic
from asrdist.parallel import STRATEGIES
from asrdist.parallel.base import LearnerContext
from asrdist.parallel.descriptor import Pairwise
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.onebit_kernel import get_quantizer, quantization_buffers
from asrdist.parallel.standin import StandIn
from asrdist.run.launch import prepare_features
from asrdist.run.prepare import build_targets
from asrdist.run.task import SpeechTask, model_kind
from asrdist.sim.calibration import Microbenchmarks, calibrate, predict_run, threads_of
from asrdist.sim.cluster import LINKS, parameter_count
from asrdist.sim.scenario import config_shapes
from asrdist.utils.machine import median_seconds

EPOCH_ENDS = 3
"""Epoch ends timed (the median)."""
REPEATS = 5
"""Timings per microbenchmark (the median)."""
LINK_TIMEOUT = 300.0
"""Seconds for the link measurement's learners (catches a hang only)."""


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
    (its `after_backward` on a stand-in model, in a world of one: nothing crosses a wire, every
    phase's CPU is there), after a few exchanges to settle its residuals. Each exchange starts
    from the last one's result in p.grad (refilling it would time a copy too)."""
    stand_in = StandIn(OneBitStrategy(OneBitConfig()), shapes, LearnerContext())
    gen = torch.Generator().manual_seed(0)
    stand_in.set_gradients([torch.randn(s, generator=gen) for s in shapes])
    for _ in range(2):
        stand_in.after_backward()
    return median_seconds(stand_in.after_backward, repeats)


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


def measure_microbenchmarks(name: str, learners: int, cfg, network: str, repeats: int = REPEATS,
                            timeout: float = LINK_TIMEOUT, *, dedicated: bool = False):
    """`Microbenchmarks` of one learner of the resolved config `cfg` of strategy `name` on
    `learners` learners (its corpus' features in place) on this machine, the link measured on
    `network` ("loopback": this machine's), and the details behind them (docs/calibration.md).
    `dedicated`: the run's learners are on hosts of their own CPU share (`--cpus-per-host`): its
    step on 1 thread (the launcher's threads under a quota below 1.5 cores) and the link only, no
    measurement of learners sharing the cores (`asrdist.sim.dedicated`). Reads no run."""
    cores = len(os.sched_getaffinity(0))
    threads = 1 if dedicated else threads_of(cores, learners)
    key = f"{learners}x{threads}"
    targets = build_targets(Path(cfg.data.corpus), cfg, model_kind(cfg))
    timed, ended = config_step_seconds_per_frame({key: (cfg, targets, learners, threads)}, epoch_ends=EPOCH_ENDS)
    lone = SpeechTask(cfg, targets, 0, 1)
    frames_per_epoch = float(len(lone.sampler) * lone.samples_per_step)
    shapes = config_shapes(cfg, lone.store.dim, targets.num_classes)
    figures = per_value_figures(shapes, repeats)
    many = learners > 1
    corun = corun_slowdown(cores, repeats) if many and not dedicated else {"slowdown": 1.0}
    link: dict[str, Any] = {}
    waits: dict[str, Any] = {"lockstep": {}, "claim": {}, "collective": {}, "answer": {}, "step": {}}
    step_work = timed[key] * lone.samples_per_step / learners  # one learner's step alone, seconds
    if many:
        link = measure_link(network, parameter_count(shapes), repeats, timeout)
    if many and dedicated and STRATEGIES[name].shape is Pairwise:
        waits.update(pair_cpu(network, learners, cfg, step_work, parameter_count(shapes), timeout))
    if many and not dedicated:
        waits = measure_waits(network, learners, threads, step_work, timeout, values=parameter_count(shapes),
                              recipe=cfg.to_dict())
        corun = lower_spell(corun, corun_slowdown(cores, repeats))  # a second spell, the link's and waits' time later
        answer = waits["answer"]
        if answer:  # the simulator's wire is the link's exchange: the delay is over that, not back to back
            answer.update(training_over_back_to_back_seconds=answer["delay_seconds"],
                          delay_seconds=answer_delay(answer, link), delay_over="the link's pairwise exchange")
    micro = Microbenchmarks(
        cores, timed, ended, frames_per_epoch, figures["quantize_seconds_per_value"],
        figures["dequantize_seconds_per_value"], figures["average_seconds_per_value"],
        figures["mean_seconds_per_value"], network, link.get("bytes_per_second", 0.0), link.get("duplex", 1.0),
        link_cpu_per_byte(link, dedicated), link.get("latency_seconds") or _link_latency(network),
        {name: dict(timed)}, figures["onebit_exchange_seconds_per_value"], corun["slowdown"],
        waits["lockstep"].get("wait_seconds", 0.0), waits["claim"].get("seconds", 0.0),
        waits["answer"].get("delay_seconds", 0.0), waits["collective"].get("seconds", 0.0),
        waits["collective"].get("cpu_seconds", 0.0), waits["collective"].get("values", 0),
        exchanging_step_slowdown=waits.get("step", {}).get("exchanging_slowdown", 0.0),
        exchange_cpu_seconds=_exchange_cpu(waits["answer"]), exchange_values=waits["answer"].get("values", 0))
    return micro, {"link": link, "parameters": parameter_count(shapes), "feature_dim": lone.store.dim,
                   "num_classes": targets.num_classes, "corun": corun, **waits}


def pair_cpu(network: str, learners: int, cfg, step_work: float, values: int, timeout: float) -> dict[str, Any]:
    """On dedicated hosts, the CPU an ADPSGD exchange costs each side beyond its bytes, which its
    host's quota pays (the exchanging thread's hand-offs, copies, gloo's threads): two learners of
    the run's recipe at its share of the minibatch, 1 thread each, on two hosts joined by `network`,
    `measure_waits`' exchanges among training learners. Its waits (of learners sharing cores) are
    left out: {"answer": {active_cpu_seconds, passive_cpu_seconds, values, ...}}."""
    tree = cfg.to_dict()
    tree["data"]["batch_size"] = max(1, cfg.data.batch_size // learners) * 2  # each of the pair: the run's share
    pair = measure_waits(network, 2, 1, step_work, timeout, values=values, recipe=tree)
    answer = {k: pair["answer"][k] for k in ("active_cpu_seconds", "passive_cpu_seconds", "values")}
    return {"answer": {**answer, "learners": 2, "threads": 1, "cpu_only": True}}


def link_cpu_per_byte(link: dict[str, Any], dedicated: bool) -> float:
    """The link's CPU per byte (`measure_link`): the machine's (the kernel's work on the messages'
    behalf included) where learners share the cores; on dedicated hosts the processes' own, which
    is what a host's quota is charged, and which other jobs on the machine do not inflate."""
    if dedicated and link.get("process_cpu_seconds_per_byte"):
        return float(link["process_cpu_seconds_per_byte"])
    return float(link.get("cpu_seconds_per_byte", 0.0))


def _exchange_cpu(answer: dict[str, Any]) -> float:
    """The mean of an exchange's two sides' CPU seconds (`measure_waits`' answer), 0 if not measured."""
    sides = [answer.get("active_cpu_seconds", 0.0), answer.get("passive_cpu_seconds", 0.0)]
    return sum(sides) / 2 if all(sides) else 0.0


def answer_delay(answer: dict[str, Any], link: dict[str, Any]) -> float:
    """Seconds an ADPSGD exchange of the model among training learners (`answer`, from
    `measure_waits`) takes beyond the link's pairwise exchange of it (`link`, from `measure_link`),
    which is what the simulator charges for its wire: the exchange's own work (the header's turn,
    the copies and the halfway step on data the network just wrote, the answering thread's
    wake-up: its back-to-back time over the link's) and what training beside it adds (its time
    among training learners over back to back). 0 where either was not measured."""
    training, wire = answer.get("exchange_training_seconds"), link.get("exchange_seconds")
    if not training or not wire:
        return 0.0
    return max(0.0, training - wire)


def _link_latency(network: str) -> float:
    """Where no link was measured (one learner): the emulated network's delay, tc's 0.1 ms where
    the kernel has netem (20 us otherwise, the veth pair's own), loopback's preset on loopback (a
    setting of the emulation, not a timing); the measured link's latency replaces it."""
    if network == "loopback":
        return LINKS["loopback"].latency
    return 20e-6 if network_label(network).endswith("nodelay") else 0.1e-3


@dataclass(frozen=True)
class RunCalibration:
    """One run's microbenchmarks, when they were timed (`when`: before or after the run trained;
    `measured_at`, UTC) and the details behind them (the link's and the co-run's measurements,
    the model's parameters, the corpus' feature dimension and classes)."""

    micro: Microbenchmarks
    detail: dict
    when: str
    measured_at: str
    config: dict
    """The resolved config the microbenchmarks timed (`RunConfig.to_dict()`)."""

    def to_json(self) -> dict:
        return {"when": self.when, "measured_at": self.measured_at, "microbenchmarks": dataclasses.asdict(self.micro),
                "detail": self.detail, "config": self.config}


def calibrate_run(name: str, cfg, nodes: int, network: str, when: str) -> RunCalibration:
    """Microbenchmarks of one learner of the run of strategy `name` and resolved config `cfg` on
    `nodes` hosts joined by `network` (1 node: loopback), its corpus' features prepared first as
    the run would prepare them (`launch.prepare_features`: a comparison on a corpus without
    features times its first run as it times the others). Raises AsrdistError or OSError."""
    prepare_features(cfg, progress=True)
    micro, detail = measure_microbenchmarks(name, cfg.train.learners, cfg, network if nodes > 1 else "loopback",
                                            REPEATS, LINK_TIMEOUT)
    return RunCalibration(micro, detail, when, datetime.now(timezone.utc).isoformat(timespec="seconds"),
                          cfg.to_dict())


def save(path: Path, calibration: RunCalibration) -> None:
    write_json_atomic(path, calibration.to_json())


def load(path: Path) -> RunCalibration:
    """A saved `RunCalibration`. Raises DataError naming the file when it is unreadable."""
    try:
        tree = json.loads(path.read_text(encoding="utf-8"))
        return RunCalibration(Microbenchmarks(**tree["microbenchmarks"]), tree["detail"], tree["when"],
                              tree["measured_at"], tree["config"])
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not a run calibration ({type(exc).__name__}: {exc})") from None


# -- a comparison's runs: each calibrated just before it trains, the calibration kept beside them --

def calibration_path(out: Path, name: str) -> Path:
    """Where a comparison in OUT keeps the calibration of its run of strategy `name`."""
    return out / "calibration" / f"{name}.json"


def measure_and_save(out: Path, name: str, cfg, nodes: int, network: str, when: str) -> RunCalibration | str:
    """`calibrate_run`, saved at `calibration_path`; or why it could not be measured (one line:
    the prediction is then missing, the run still trains)."""
    try:
        calibration = calibrate_run(name, cfg, nodes, network, when)
        save(calibration_path(out, name), calibration)
        return calibration
    except Stopped:  # a stop signal during the calibration stops the comparison, as during a run
        raise
    except (AsrdistError, OSError) as exc:
        return f"not calibrated: {exc}"


def saved_or_measured(out: Path, name: str, cfg, nodes: int, network: str) -> RunCalibration | str:
    """The calibration saved for the run of `cfg` (timed before it trained), or, where there is
    none for that config, one measured now, after the training, and said to be."""
    path = calibration_path(out, name)
    if path.is_file():
        try:
            calibration = load(path)
            if calibration.config == json.loads(json.dumps(cfg.to_dict())):
                return calibration
        except DataError:
            pass  # unreadable: measured again
    return measure_and_save(out, name, cfg, nodes, network, "after it trained (none was saved before)")


def predict(calibration: RunCalibration, cfg, strategy: str, nodes: int, network: str):
    """The simulator's `Prediction` of the run of resolved config `cfg` from its calibration alone,
    and the calibrated inputs (`CalibratedInputs`). Raises AsrdistError."""
    inputs = calibrate(calibration.micro, cfg.train.learners, strategy)
    prediction = predict_run(cfg, inputs, nodes, network, feature_dim=calibration.detail["feature_dim"],
                             num_classes=calibration.detail["num_classes"])
    return prediction, inputs
