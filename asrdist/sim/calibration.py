"""The simulator's inputs for asrdist's own runs on this machine, from microbenchmarks of one
learner only, never from the runs it predicts.

`Microbenchmarks` holds what one learner measures alone, in one process, before any run of a
validation trains (`asrdist.calibrate.microbench.measure_microbenchmarks`): its training step per frame
at each learner count's share of the minibatch and threads, an epoch's end (validation and
checkpoint), 1-bit coding, parameter averaging and sync's gradient mean per value, and the link
between two learners on the emulated network. `calibrate` turns them into one run's simulator
inputs; its only input is a `Microbenchmarks` (a test poisons the runs' timings and checks that no
prediction moves). `predict_run` simulates a run's resolved config with them.
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field

from asrdist.errors import ConfigError
from asrdist.parallel import STRATEGIES
from asrdist.parallel.adpsgd import exchange_traffic
from asrdist.parallel.comm import Transfer, ring_allreduce_bytes
from asrdist.parallel.descriptor import Pairwise
from asrdist.sim.cluster import Link
from asrdist.sim.resources import latency_steps
from asrdist.sim.scenario import config_job, run_job


@dataclass(frozen=True)
class Microbenchmarks:
    """One learner's figures on this machine, measured alone (see the module docstring)."""

    cores: int
    step_seconds_per_frame: dict[str, float]
    """"NxT" -> seconds per frame of one learner's training step (`Trainer.train_step` of the
    recipe on the corpus, strategy single) at the global minibatch over N, on T torch threads."""
    epoch_end_seconds: dict[str, float]
    """"NxT" -> seconds of one epoch's end of that learner: validation of the model on the
    corpus' valid split and the checkpoint, on T threads."""
    frames_per_epoch: float
    """Training frames of one epoch of the corpus (the sampler's minibatches x their size: data,
    not timing)."""
    quantize_seconds_per_value: float
    dequantize_seconds_per_value: float
    average_seconds_per_value: float
    mean_seconds_per_value: float
    network: str = "loopback"
    """The network between the emulated hosts that `link_*` measured."""
    link_bytes_per_second: float = 0.0
    link_duplex: float = 1.0
    link_cpu_seconds_per_byte: float = 0.0
    link_latency_seconds: float = 0.0
    recipe_step_seconds_per_frame: dict[str, dict[str, float]] = field(default_factory=dict)
    """strategy -> "NxT" -> the same step of that strategy's own recipe (its optimizer: NG-SGD,
    AdaGrad, ...), where it was measured; `step_seconds_per_frame` is the first run's recipe."""
    onebit_exchange_seconds_per_value: float = 0.0
    """onebit's whole exchange on one learner alone (`OneBitStrategy.after_backward` in a world of one:
    quantize with error feedback, reduce and re-quantize its stripes as their owner, dequantize),
    per value, 1 thread; 0 = not measured. Its kernels are two quantizations and two
    dequantizations; the rest (residuals, copies, packing, the chunks' bookkeeping) scales the
    quantizer's and dequantizer's costs (`calibrate`)."""
    corun_slowdown: float = 1.0
    """One thread's arithmetic with every core computing over the same alone
    (`asrdist.calibrate.corun`): a run's learners compute on the cores its lone step left idle."""
    lockstep_wait_seconds: float = 0.0
    """How long a one-value allreduce after a step's compute waits, beyond its wait back to back,
    among the run's learners on this machine's cores (`asrdist.calibrate.lockstep`); 0 = not measured."""
    claim_seconds: float = 0.0
    """What a learner of a job-wide pool (adpsgd) spends on the job's store per minibatch, its claim
    and its progress, among the run's learners on this machine's cores while ADPSGD exchanges of the
    model load the links (`asrdist.calibrate.lockstep`); 0 = not measured."""
    answer_delay_seconds: float = 0.0
    """How much longer an ADPSGD exchange of the model's values takes among the run's learners on
    this machine's cores after the active's step with the passive training than the link's own
    pairwise exchange of them, the simulator's wire (`asrdist.calibrate.microbench.answer_delay`); 0 =
    not measured."""
    collective_seconds: float = 0.0
    """Mean seconds of an allreduce of `collective_values` values back to back among the run's
    learners on this machine's cores (`asrdist.calibrate.lockstep`); 0 = not measured."""
    collective_cpu_seconds: float = 0.0
    """A learner's CPU seconds (all its threads) in that allreduce."""
    collective_values: int = 0
    exchanging_step_slowdown: float = 0.0
    """A learner's training step's CPU per frame among the run's learners on this machine's cores
    while ADPSGD exchanges of the model run (their traffic's wake-ups preempt the step and its caches
    are refilled) over the same step's alone (`asrdist.calibrate.lockstep`, the recipe's step); 0 = not
    measured."""
    exchange_cpu_seconds: float = 0.0
    """CPU seconds, all threads, of one side of an ADPSGD exchange of `exchange_values` values among
    those training learners, the two sides' mean (`asrdist.calibrate.lockstep`); 0 = not measured."""
    exchange_values: int = 0

    def __post_init__(self):
        recipes = [v for by_key in self.recipe_step_seconds_per_frame.values() for v in by_key.values()]
        figures = [*self.step_seconds_per_frame.values(), *recipes, self.frames_per_epoch]
        if self.cores < 1 or not figures or not all(v > 0 for v in figures) or not self.corun_slowdown > 0:
            raise ConfigError("calibration: need cores >= 1 and positive step times and epoch frames")
        if not 0 <= self.lockstep_wait_seconds < 1:
            raise ConfigError(f"calibration: lock-step wait {self.lockstep_wait_seconds!r} s is not in [0, 1)")
        if not 0 <= self.claim_seconds < 1:
            raise ConfigError(f"calibration: claim {self.claim_seconds!r} s is not in [0, 1)")
        if not 0 <= self.answer_delay_seconds < 1:
            raise ConfigError(f"calibration: answer delay {self.answer_delay_seconds!r} s is not in [0, 1)")
        if not (0 <= self.collective_seconds < 1 and 0 <= self.collective_cpu_seconds < 1
                and self.collective_values >= 0):
            raise ConfigError(f"calibration: a collective of {self.collective_values!r} values taking "
                              f"{self.collective_seconds!r} s ({self.collective_cpu_seconds!r} s of CPU) is out of range")
        if not (self.exchanging_step_slowdown == 0 or 0.5 <= self.exchanging_step_slowdown < 10):
            raise ConfigError(f"calibration: a step's slowdown among exchanges {self.exchanging_step_slowdown!r} "
                              f"is not 0 (not measured) or in [0.5, 10)")
        if not (0 <= self.exchange_cpu_seconds < 1 and self.exchange_values >= 0):
            raise ConfigError(f"calibration: an exchange of {self.exchange_values!r} values taking "
                              f"{self.exchange_cpu_seconds!r} s of CPU is out of range")


@dataclass(frozen=True)
class CalibratedInputs:
    """The simulator's inputs for a run of `learners` learners of `threads` threads each."""

    learners: int
    threads: int
    seconds_per_frame: float
    """A learner's step per frame as if it had every core (the simulator shares the cores out)."""
    epoch_end_seconds: float
    frames_per_epoch: float
    quantize_cost: float
    dequantize_cost: float
    copy_cost: float
    mean_cost: float
    network_cost: float
    link_bytes_per_second: float
    link_duplex: float
    link_latency_seconds: float
    lockstep_wait_seconds: float = 0.0
    """CPU learners: the extra wait of a step's first lock-step collective for its last learner
    (SimSpec.lockstep_wait)."""
    claim_seconds: float = 0.0
    """A pool's learner's store round trips per minibatch (SimSpec.claim_seconds)."""
    answer_delay_seconds: float = 0.0
    """The extra time of an ADPSGD exchange whose passive trains (SimSpec.answer_delay)."""
    collective_step_seconds: float = 0.0
    """CPU learners: the least time of a lock-step collective's sequential message
    (SimSpec.collective_step_seconds)."""
    collective_step_cpu: float = 0.0
    """CPU learners: a lock-step collective's CPU per sequential message beyond its bytes'
    (SimSpec.collective_step_cpu)."""
    exchange_cpu: float = 0.0
    """CPU learners: each side's CPU per ADPSGD exchange beyond its bytes' and the halfway step's
    copies (SimSpec.exchange_cpu)."""
    validations_per_epoch: int = 1
    """Validations an epoch makes (its end's and `train.validate_every`'s within it), each
    `epoch_end_seconds / validations_per_epoch` of the leader's work: on dedicated hosts each adds
    its collectives and, for asynchronous learners, their pause (`validation_seconds`)."""
    sources: dict[str, str] = field(default_factory=dict)
    """Input -> the microbenchmark it was calibrated on."""


def threads_of(cores: int, learners: int) -> int:
    """Torch threads per learner of asrdist's launcher: its cores over the learners it starts."""
    return max(1, cores // learners)


def collective_steps(micro: Microbenchmarks, learners: int) -> tuple[float, float]:
    """(seconds, CPU seconds) per sequential message of a lock-step collective on shared cores, from
    the allreduce measured among the run's learners (`micro.collective_*`), over its 2(n-1)
    messages: its time (the simulator's least time of a message: a collective takes the longer of
    the link's time and its messages'), and its CPU less the measured CPU of its bytes (which the
    simulator charges apart); (0, 0) for a lone learner or where it was not measured."""
    if learners < 2 or not micro.collective_values or not micro.collective_seconds:
        return 0.0, 0.0
    allreduce = Transfer("allreduce", "world", learners, ring_allreduce_bytes(4 * micro.collective_values, learners))
    messages = latency_steps(allreduce)
    cpu = micro.link_cpu_seconds_per_byte * 2 * allreduce.bytes_sent
    return micro.collective_seconds / messages, max(0.0, micro.collective_cpu_seconds - cpu) / messages


def exchanging(strategy: str) -> bool:
    """Whether `strategy`'s learners compute while ADPSGD exchanges of the model run beside them
    (each learner exchanges pairwise, not its node's leader alone)."""
    described = STRATEGIES[strategy]
    return described.shape is Pairwise and not described.moves_by_node


def exchange_cpu(micro: Microbenchmarks) -> float:
    """Each side's CPU per ADPSGD exchange beyond what the simulator already charges it: its bytes'
    (the link's CPU per byte, both messages) and the halfway step's copies (2 x the average's cost
    per value). 0 where not measured."""
    if not micro.exchange_cpu_seconds or not micro.exchange_values:
        return 0.0
    traffic = exchange_traffic(micro.exchange_values)
    moved = micro.link_cpu_seconds_per_byte * (traffic["exchange"].bytes_sent + traffic["answer"].bytes_sent)
    return max(0.0, micro.exchange_cpu_seconds - moved - 2 * micro.average_seconds_per_value * micro.exchange_values)


def calibrate(micro: Microbenchmarks, learners: int, strategy: str | None = None) -> CalibratedInputs:
    """The inputs of a run of `learners` learners on this machine, from `micro` alone: the step of
    `strategy`'s own recipe where `micro` measured it, else the first run's recipe's."""
    threads = threads_of(micro.cores, learners)
    key = f"{learners}x{threads}"
    if key not in micro.step_seconds_per_frame or key not in micro.epoch_end_seconds:
        raise ConfigError(f"calibration: no microbenchmark of a learner among {learners} on {threads} thread(s)")
    own = micro.recipe_step_seconds_per_frame.get(strategy or "", {}).get(key)
    # the simulator gives each learner cores / learners of the cores (threads linear): the
    # measured step on `threads` threads, stated as if it had them all
    spf = (own if own is not None else micro.step_seconds_per_frame[key]) * threads / micro.cores
    many = learners > 1
    recipe = f"{strategy}'s recipe" if own is not None else "the first run's recipe"
    step = (f"microbenchmark: one learner's training step alone ({recipe}), global minibatch / {learners}, "
            f"{threads} thread(s)")
    if many and strategy is not None and exchanging(strategy) and micro.exchanging_step_slowdown > 0:
        # its peers compute beside it and the exchanges' traffic preempts it: that step measured so
        spf *= micro.exchanging_step_slowdown
        step += (f", x {micro.exchanging_step_slowdown:.2f}: that step's CPU per frame among the run's learners "
                 f"while ADPSGD exchanges of the model run over alone")
    elif many and threads < micro.cores:  # in the run, its peers compute on the cores it had to itself
        spf *= micro.corun_slowdown
        step += f", x {micro.corun_slowdown:.2f}: one thread's arithmetic with every core computing over alone"
    quantize, dequantize = micro.quantize_seconds_per_value, micro.dequantize_seconds_per_value
    coding = ""
    kernels = 2 * (quantize + dequantize)
    if micro.onebit_exchange_seconds_per_value > 0 and kernels > 0:
        factor = micro.onebit_exchange_seconds_per_value / kernels
        quantize, dequantize = quantize * factor, dequantize * factor
        coding = (f", x {factor:.2f}: onebit's whole exchange on one learner alone over its kernels' "
                  f"(2 quantizations + 2 dequantizations), 1 thread")
    return CalibratedInputs(
        learners, threads, spf, micro.epoch_end_seconds[key], micro.frames_per_epoch,
        quantize, dequantize, micro.average_seconds_per_value,
        micro.mean_seconds_per_value, micro.link_cpu_seconds_per_byte if many else 0.0,
        micro.link_bytes_per_second, micro.link_duplex, micro.link_latency_seconds,
        micro.lockstep_wait_seconds if many else 0.0, micro.claim_seconds if many else 0.0,
        micro.answer_delay_seconds if many else 0.0, *collective_steps(micro, learners),
        exchange_cpu(micro) if many else 0.0,
        sources={
            "seconds_per_frame": step,
            "epoch_end_seconds": f"microbenchmark: that learner's validation and checkpoint, {threads} thread(s)",
            "frames_per_epoch": "the corpus: its sampler's minibatches per epoch x their frames (no timing)",
            "quantize_cost": f"microbenchmark: onebit's quantizer on the model's gradients, 1 thread{coding}",
            "dequantize_cost": f"microbenchmark: onebit's dequantizer on the model's gradients, 1 thread{coding}",
            "copy_cost": "microbenchmark: a parameter average (add, scale) over the model's values, 1 thread",
            "mean_cost": "microbenchmark: sync's mean (copy into a bucket, divide, copy back), 1 thread",
            "network_cost": f"microbenchmark: two learners' CPU per byte of one message over {micro.network}",
            "link": f"microbenchmark: a message of the model's size one way, a pairwise exchange and a one-value "
                    f"message's round trip (the latency) between two learners over {micro.network}",
            "lockstep_wait_seconds": f"microbenchmark: {learners} learners of {threads} thread(s) on this machine, a "
                                     f"one-value allreduce after a stand-in for one step's compute less back to back",
            "claim_seconds": f"microbenchmark: {learners} learners of {threads} thread(s) on this machine, a claim "
                             f"and a progress record on the job's store before a stand-in for one step's "
                             f"compute, among ADPSGD exchanges of the model",
            "answer_delay_seconds": f"microbenchmark: {learners} learners of {threads} thread(s) on this machine, an "
                                    f"ADPSGD exchange of the model's values after a stand-in step, the passive "
                                    f"training a stand-in, less the link's pairwise exchange of them",
            "collective_step": f"microbenchmark: {learners} learners of {threads} thread(s) on this machine, an "
                               f"allreduce of {micro.collective_values} values back to back, its time and its CPU "
                               f"less the link's CPU for its bytes, over its {2 * (learners - 1)} messages",
            "exchange_cpu": f"microbenchmark: {learners} learners of {threads} thread(s) on this machine, each "
                            f"side's CPU (all threads) of an ADPSGD exchange of the model among training learners, "
                            f"less the link's CPU for its bytes and the halfway step's copies",
        })


def predict_run(cfg, inputs: CalibratedInputs, nodes: int, network: str, *, feature_dim: int | None = None,
                num_classes: int | None = None, dedicated: bool = False):
    """The simulator's `Prediction` of the run of resolved config `cfg` on `inputs.learners`
    learners as `nodes` emulated hosts of this machine joined by `network` (1 node: loopback);
    the model's input and output sizes from the corpus where given (`config_shapes`).
    `dedicated`: every learner computes on a CPU share of its own (`asrdist.sim.dedicated`): no
    learner's work queues for another's cores, and a straggler's share is `slowdown` times smaller."""
    if inputs.learners != cfg.train.learners:
        raise ConfigError(f"calibration: inputs for {inputs.learners} learners, the run has {cfg.train.learners}")
    job = config_job(cfg, inputs.learners, inputs.seconds_per_frame, nodes=nodes,
                     network="loopback" if nodes == 1 else network, network_cost=inputs.network_cost,
                     feature_dim=feature_dim, num_classes=num_classes)
    if dedicated:
        straggler = cfg.train.straggler
        job = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, shared_cores=0, one_machine=False,
                                                                   cpu_hosts=True),
                                  slowdown={r: straggler.slowdown for r in straggler.ranks if r < inputs.learners},
                                  validations_per_epoch=inputs.validations_per_epoch)
    if inputs.learners == 1 and STRATEGIES[cfg.strategy_name].codes_alone:  # a lone onebit learner still codes
        job = dataclasses.replace(job, strategy="onebit", strategy_config=cfg.strategy)
    if inputs.learners > 1 and inputs.link_bytes_per_second > 0:  # the measured link, between the hosts or,
        # all learners on one host, over its loopback
        link = Link(inputs.link_bytes_per_second, inputs.link_latency_seconds, f"{network}, measured",
                    duplex=inputs.link_duplex)
        where = {"between": link} if nodes > 1 else {"inside": link, "between": link}
        job = dataclasses.replace(job, cluster=dataclasses.replace(job.cluster, **where))
    epochs, frames, epoch_end = cfg.train.epochs, inputs.frames_per_epoch, inputs.epoch_end_seconds
    cap = cfg.train.max_steps * job.global_batch  # train.max_steps: every learner stops after that many steps
    if cap and cap < epochs * frames:  # stopped inside an epoch: no epoch's end (its checkpoint aside)
        epochs, frames, epoch_end = 1, cap, 0.0
    job = dataclasses.replace(job, quantize_cost=inputs.quantize_cost, dequantize_cost=inputs.dequantize_cost,
                              copy_cost=inputs.copy_cost, mean_cost=inputs.mean_cost, epochs=epochs,
                              frames_per_epoch=frames, epoch_end_seconds=epoch_end,
                              lockstep_wait=inputs.lockstep_wait_seconds, claim_seconds=inputs.claim_seconds,
                              answer_delay=inputs.answer_delay_seconds,
                              collective_step_seconds=inputs.collective_step_seconds,
                              collective_step_cpu=inputs.collective_step_cpu, exchange_cpu=inputs.exchange_cpu)
    return run_job(job)
