"""A simulated job: model, strategy, cluster and compute; its frames/s, speed-up and time per
epoch; and the advisor that ranks every strategy for one cluster."""
from __future__ import annotations

import dataclasses
import os
import sys
from dataclasses import dataclass, field
from typing import Any

from tqdm import tqdm

from asrdist.errors import ConfigError
from asrdist.models.dnn import SWBD_FEATURE_DIM, SWBD_NUM_CLASSES
from asrdist.models.registry import model_kind
from asrdist.parallel import STRATEGIES, strategy_config_class
from asrdist.parallel.comm import Transfer, ring_allreduce_bytes
from asrdist.parallel.descriptor import Pairwise, Pipelined
from asrdist.sim.alike import simulated_learners
from asrdist.sim.cluster import (
    LINKS,
    MAX_LEARNER_STEPS,
    MAX_ONEBIT_SPAN,
    Cluster,
    link_named,
    model_shapes,
    parameter_count,
)
from asrdist.sim.engine import simulate
from asrdist.sim.resources import transfer_seconds
from asrdist.sim.spec import SimResult, SimSpec, sim_shape, simulated_steps

ADVISED: dict[str, tuple[str, dict[str, Any]]] = {
    variant: (name, dict(settings)) for name in STRATEGIES for variant, settings in STRATEGIES[name].advised.items()}
"""Every variant the advisor ranks: name -> (strategy, strategy config), as each strategy declares them."""


def strategy_config(name: str, settings: dict[str, Any] | None = None) -> Any:
    cls = strategy_config_class(name)
    return None if cls is None else cls(**(settings or {}))


@dataclass
class Job:
    """One strategy on one cluster; `frames_per_epoch` and `epochs` give the job's time."""

    strategy: str
    strategy_config: Any
    shapes: list[tuple[int, ...]]
    cluster: Cluster
    global_batch: int
    """Frames per minibatch over all learners (split evenly)."""
    seconds_per_frame: float
    step_overhead: float = 0.0
    quantize_cost: float = 1e-9
    copy_cost: float = 0.0
    frames_per_epoch: float = 1e6
    epochs: int = 1
    slowdown: dict[int, float] = field(default_factory=dict)
    jitter: float = 0.0
    steps: int = 24
    state_copies: int = 0
    """averaging: optimizer tensors per parameter that an average carries (SimSpec.state_copies)."""
    network_cost: float = 0.0
    """CPU learners: CPU seconds per byte sent or received (SimSpec.network_cost)."""
    dequantize_cost: float | None = None
    """Seconds per value of 1-bit dequantization (SimSpec.dequantize_cost; None: `quantize_cost`)."""
    mean_cost: float = 0.0
    """Seconds per value of the sync gradient mean's arithmetic (SimSpec.mean_cost)."""
    epoch_end_seconds: float = 0.0
    """Seconds of each epoch's end in which the job trains nothing (validation of the consensus
    model, the checkpoint), paid once per epoch."""
    validations_per_epoch: int = 0
    """Dedicated CPU hosts: the validations in each epoch (its end's included), each of which adds
    its collectives and pause (`validation_seconds`) to the leader's work in `epoch_end_seconds`;
    0: not modelled."""
    lockstep_wait: float = 0.0
    """CPU learners: a step's first lock-step collective's extra wait for its last learner
    (SimSpec.lockstep_wait)."""
    claim_seconds: float = 0.0
    """A pool's learner's store round trips per minibatch (SimSpec.claim_seconds)."""
    answer_delay: float = 0.0
    """CPU learners: an ADPSGD exchange's extra time while its passive trains (SimSpec.answer_delay)."""
    collective_step_seconds: float = 0.0
    """CPU learners: the least time of a lock-step collective's message (SimSpec.collective_step_seconds)."""
    collective_step_cpu: float = 0.0
    """CPU learners: a lock-step collective's CPU per sequential message (SimSpec.collective_step_cpu)."""
    exchange_cpu: float = 0.0
    """CPU learners: each side's CPU per ADPSGD exchange beyond its bytes' (SimSpec.exchange_cpu)."""

    def spec(self, learners_cluster: Cluster | None = None, **changes) -> SimSpec:
        cluster = learners_cluster or self.cluster
        local = max(1, self.global_batch // cluster.learners)
        return SimSpec(self.strategy, self.strategy_config, self.shapes, cluster, local, self.seconds_per_frame,
                       step_overhead=self.step_overhead, quantize_cost=self.quantize_cost,
                       copy_cost=self.copy_cost, slowdown=self.slowdown, jitter=self.jitter, steps=self.steps,
                       state_copies=self.state_copies, network_cost=self.network_cost,
                       dequantize_cost=self.dequantize_cost, mean_cost=self.mean_cost,
                       lockstep_wait=self.lockstep_wait, claim_seconds=self.claim_seconds,
                       answer_delay=self.answer_delay, collective_step_seconds=self.collective_step_seconds,
                       collective_step_cpu=self.collective_step_cpu, exchange_cpu=self.exchange_cpu, **changes)


@dataclass
class Prediction:
    name: str
    learners: int
    frames_per_second: float
    speedup: float
    epoch_seconds: float
    job_seconds: float
    comm_share: float
    wait_share: float
    bytes_per_step: float
    detail: SimResult

    def as_dict(self) -> dict[str, Any]:
        d = {k: v for k, v in dataclasses.asdict(self).items() if k != "detail"}
        d["seconds_per_step"] = self.detail.seconds_per_step
        d["compute_seconds_per_step"] = self.detail.compute_seconds_per_step
        return d


def check_size(job: Job, ranked: bool = False) -> None:
    """A one-line ConfigError up front if simulating `job` would take minutes (see the limits)."""
    c = job.cluster
    where = f"--cluster {c.nodes}x{c.per_node}: {job.strategy}{' (ranked without --strategy)' if ranked else ''}"
    phases = [job.spec()] + ([job.spec(synchronous=True)] if STRATEGIES[job.strategy].synchronous_epochs else [])
    for spec in phases:
        learners, steps = simulated_learners(spec), simulated_steps(spec)
        if learners * steps > MAX_LEARNER_STEPS:
            raise ConfigError(f"{where} would simulate {learners} learners one by one, {steps} steps each; the limit "
                              f"is {MAX_LEARNER_STEPS} learner-steps (sync and averaging without --jitter simulate "
                              f"alike learners once)")
    shape = sim_shape(phases[0])
    if isinstance(shape, Pipelined) and shape.node_span > MAX_ONEBIT_SPAN:
        raise ConfigError(f"{where} would span {c.per_node} learners per node in one exchange; the limit is "
                          f"{MAX_ONEBIT_SPAN} (every learner's column shards grow with them)")


def run_job(job: Job, name: str | None = None) -> Prediction:
    """Simulate `job` and one learner alone (with the whole global batch: the speed-up's base)."""
    check_size(job)
    synchronous_epochs = STRATEGIES[job.strategy].synchronous_epochs
    if synchronous_epochs is not None:  # a synchronous phase first (hybrid), simulated apart
        sync_phase = simulate(job.spec(synchronous=True))
        async_phase = simulate(job.spec())
        sync_epochs = min(synchronous_epochs(job.strategy_config), job.epochs)
        phases = [(sync_phase, sync_epochs), (async_phase, job.epochs - sync_epochs)]
        times = [epochs * (epoch_seconds(r, job.frames_per_epoch) + job.epoch_end_seconds
                           + job.validations_per_epoch * validation_seconds(job, r)) for r, epochs in phases]
        seconds = sum(times)
        result = async_phase if job.epochs > sync_epochs else sync_phase
        fps = job.epochs * job.frames_per_epoch / seconds
        # the shares over the job's time in each phase, the bytes over its minibatches in each
        comm = sum(r.comm_share * t for (r, _), t in zip(phases, times)) / seconds
        wait = sum(r.wait_share * t for (r, _), t in zip(phases, times)) / seconds
        sent = sum(_bytes_per_step(r) * epochs for r, epochs in phases) / job.epochs
    else:
        result = simulate(job.spec())
        seconds = job.epochs * (epoch_seconds(result, job.frames_per_epoch) + job.epoch_end_seconds
                                + job.validations_per_epoch * validation_seconds(job, result))
        fps = job.epochs * job.frames_per_epoch / seconds
        comm, wait, sent = result.comm_share, result.wait_share, _bytes_per_step(result)
    # the speed-up's base is a healthy learner, whichever rank the straggler is
    one = simulate(dataclasses.replace(job.spec(Cluster(1, 1, job.cluster.inside, job.cluster.between,
                                                          job.cluster.shared_cores)), strategy="single", slowdown={}))
    return Prediction(name or job.strategy, job.cluster.learners, fps, fps / one.frames_per_second,
                      seconds / job.epochs, seconds, comm, wait, sent, result)


def epoch_seconds(result: SimResult, frames_per_epoch: float) -> float:
    """An epoch's time: its frames at the simulated pace while every learner is busy, and once the
    end of the pool (the wait for the last minibatches and exchanges in flight when it ran dry).
    The job's frames/s is then its frames over this time: asrdist's one throughput."""
    return frames_per_epoch * result.pace_seconds_per_frame + result.tail_seconds


def validation_seconds(job: Job, result: SimResult) -> float:
    """What each validation costs on dedicated CPU hosts (`Cluster.cpu_hosts`) beside the leader's
    work (`Job.epoch_end_seconds`), as asrdist's trainer validates: the consensus model, an allreduce
    of the model (float32) over every learner, and for strategies whose learners' models differ
    (pairwise) first their spread (consensus distance: an allreduce in float64); each its wire, then
    its CPU on a host of one learner (`Cluster.serial_message_cpu`), beside it on hosts of several.
    Pairwise learners are out of lock step: each stops at the end of its step in progress, so the
    collectives wait for the last, about one step (`result.seconds_per_step`). 0 off CPU hosts."""
    cluster, n = job.cluster, job.cluster.learners
    if not cluster.cpu_hosts or n < 2:
        return 0.0
    pairwise = isinstance(sim_shape(job.spec()), Pairwise)
    values = parameter_count(job.shapes)
    seconds = result.seconds_per_step if pairwise else 0.0
    for width in (4, 8) if pairwise else (4,):
        allreduce = Transfer("allreduce", "world", n, ring_allreduce_bytes(width * values, n), values)
        wire, cpu = transfer_seconds(allreduce, cluster), job.network_cost * 2 * allreduce.bytes_sent
        seconds += wire + cpu if cluster.serial_message_cpu else max(wire, cpu)
    return seconds


def _bytes_per_step(result: SimResult) -> float:
    """Bytes sent per learner and minibatch over the job (a passive that answers many exchanges
    and a straggler that made few steps of its own in the same figure)."""
    return sum(result.bytes_sent) / max(sum(result.steps), 1)


def advise(job: Job, variants: dict[str, tuple[str, dict[str, Any]]] | None = None, progress: bool = False
           ) -> tuple[list[Prediction], str, dict[str, str]]:
    """Every strategy variant of `ADVISED` on `job`'s cluster that is small enough to simulate
    (`check_size`), fastest epoch first; why the winner wins; and {variant: why not simulated}
    for the others (a ConfigError when none is left). `progress`: a bar on stderr (a terminal's)."""
    if job.cluster.learners < 2:
        raise ConfigError("simulate: the advisor needs at least 2 learners")
    jobs = {name: dataclasses.replace(job, strategy=strategy, strategy_config=strategy_config(strategy, settings))
            for name, (strategy, settings) in (variants or ADVISED).items()}
    left_out = {}
    for name, each in jobs.items():  # sized up before any runs
        try:
            check_size(each, ranked=True)
        except ConfigError as e:
            left_out[name] = str(e)
    if len(left_out) == len(jobs):
        raise ConfigError(next(iter(left_out.values())))
    todo = [(name, each) for name, each in jobs.items() if name not in left_out]
    ranked = [run_job(each, name) for name, each in tqdm(todo, desc="simulate", unit="strategy", file=sys.stderr,
                                                         disable=None if progress else True)]
    ranked.sort(key=lambda p: p.epoch_seconds)
    return ranked, explain(ranked) + left_out_note(left_out), left_out


def explain(ranked: list[Prediction], tied: int = 1) -> str:
    """Why the ranking is what it is. `tied`: how many leading strategies the simulator cannot
    tell apart (their epoch times within its error, `asrdist.sim.cli.advice`): then none of them
    is said to win and no runner-up is said to be slower."""
    best, rest = ranked[0], ranked[1:]
    sync = next((p for p in ranked if p.name == "sync"), None)
    if best.speedup < 1:  # distributing costs more than it brings: say so before naming a winner
        why = [f"no strategy beats one learner here (the fastest, {best.name}, runs {best.speedup:.2f}x one "
               f"learner's speed, {100 * best.wait_share:.0f}% of each step waiting on communication): train on "
               f"one learner, or on a faster network"]
    else:
        hours = best.epoch_seconds / 3600
        hours_text = f"{hours:.2f}" if hours >= 0.1 else f"{hours:.2g}"  # 0.00013 h, not 0.00
        lead = f"{best.name} wins" if tied <= 1 else f"{best.name} predicted fastest"
        why = [f"{lead}: {hours_text} h per epoch, {best.speedup:.1f}x one learner, "
               f"{100 * best.wait_share:.0f}% of each step waiting on communication"]
    if sync is not None and sync is not best:
        bound = "wire-bound" if sync.wait_share > 0.3 else "compute-bound"
        why.append(f"sync is {bound}: {100 * sync.wait_share:.0f}% of each step blocked communicating "
                   f"({sync.bytes_per_step / 1e6:.0f} MB sent per learner and step)")
    if rest and tied <= 1:
        runner = rest[0]
        why.append(f"runner-up {runner.name} is {runner.epoch_seconds / best.epoch_seconds:.2f}x slower")
    return "; ".join(why)


def left_out_note(left_out: dict[str, str]) -> str:
    """What `advise` adds to its `why` for the variants too large to simulate ('' for none)."""
    return f"; not simulated at this size: {', '.join(left_out)}" if left_out else ""


CPU_QUANTIZE_COST = 1e-9
"""Assumption: seconds per value and pass of the fused 1-bit kernel on a CPU core."""
CPU_COPY_COST = 0.5e-9
"""Assumption: seconds per value of a parameter average's arithmetic on a CPU."""


def config_shapes(cfg, feature_dim: int | None = None, num_classes: int | None = None) -> list[tuple[int, ...]]:
    """Parameter shapes of `cfg.model` from the registry; features per frame and classes from the
    config (swbd: the paper's 39 and 9304) unless given."""
    swbd = cfg.model.name == "swbd"
    if feature_dim is None:
        feature_dim = SWBD_FEATURE_DIM if swbd else cfg.data.num_mel_bins
    if num_classes is None:
        classes = {"monophone": 40, "tied": cfg.data.tied_states, "phones": 41, "chars": 30}
        num_classes = SWBD_NUM_CLASSES if swbd else classes[cfg.data.targets]
    return model_shapes(cfg.model, feature_dim, num_classes)


def config_job(cfg, learners: int, seconds_per_frame: float, *, nodes: int = 1, network: str = "loopback",
               cores: int | None = None, feature_dim: int | None = None, num_classes: int | None = None,
               network_cost: float = 0.0) -> Job:
    """The simulated job of run config `cfg` on this machine: `learners` CPU learners sharing its
    cores (`nodes` emulated hosts joined by `network`, loopback inside one), each spending
    `network_cost` CPU seconds per byte it moves."""
    if learners < 1 or nodes < 1 or learners % nodes:
        raise ConfigError(f"simulate: {learners} learners do not split into {nodes} equal nodes")
    cores = cores or len(os.sched_getaffinity(0))
    cluster = Cluster(nodes, learners // nodes, LINKS["loopback"], link_named(network), shared_cores=cores,
                      one_machine=True)
    frames = cfg.data.batch_size * (cfg.model.chunk if model_kind(cfg.model) == "chunk" else 1)
    strategy = cfg.strategy_name if learners > 1 else "single"
    return Job(strategy, cfg.strategy if learners > 1 else None, config_shapes(cfg, feature_dim, num_classes),
               cluster, frames, seconds_per_frame, quantize_cost=CPU_QUANTIZE_COST, copy_cost=CPU_COPY_COST,
               epochs=cfg.train.epochs, state_copies=averaged_state_copies(cfg) if learners > 1 else 0,
               network_cost=network_cost)


def averaged_state_copies(cfg) -> int:
    """Parameter-sized optimizer tensors per parameter that an average of run config `cfg` carries
    (`strategy.average_momentum`: SGD's momentum buffer, CNTK AdaGrad's accumulator and momentum)."""
    if cfg.strategy_name != "averaging" or not cfg.strategy.average_momentum:
        return 0
    return (cfg.optim.momentum > 0) + (cfg.optim.name == "adagrad")


def simulate_config(cfg, learners: int, seconds_per_frame: float, *, nodes: int = 1,
                    network: str = "loopback", **kwargs) -> Prediction:
    """`run_job` of `config_job` (see there)."""
    return run_job(config_job(cfg, learners, seconds_per_frame, nodes=nodes, network=network, **kwargs))
