"""Dedicated CPU hosts in the simulator: learners that each compute on a CPU share of their own
(`--cpus-per-host X`: a cgroup quota per emulated host; `asrdist simulate --device cpu:X`).

A quota caps a host's CPU time at X cores whatever its neighbours do, so nothing is shared:
1. one learner's CPU work on one core (its step at the run's local minibatch on 1 thread, its
   epoch end, 1-bit coding, copies, the CPU per byte of its messages) is measured alone;
2. its share is the host's quota over the host's learners (`train.group_size` hosts share theirs);
3. every CPU figure of step 1 takes 1 / share as long (`scale`: a quota is a fraction of each
   scheduler period, so CPU-bound work runs at that fraction of a core's speed);
4. the job is simulated as learners with devices of their own (`Cluster.shared_cores = 0`): no
   queueing for cores, none of the shared-core terms (co-run slowdown, lock-step wait, claims,
   answer delay: measured among learners that share cores, they are 0 here); a straggler's host
   has `slowdown` times less quota, so all its CPU work takes `slowdown` times as long;
5. on hosts of one learner a message's CPU comes after its wire time, not beside it
   (`Cluster.serial_message_cpu`): a throttled host moves no bytes, so a collective lasts its wire
   time plus its slowest member's CPU for it (learners sharing a host lend each other the quota
   they leave waiting on the wire: there the two overlap).
Why and how well: docs/simulator.md#dedicated-cpu-hosts.
"""
from __future__ import annotations

import dataclasses

from asrdist.errors import ConfigError
from asrdist.sim.calibration import CalibratedInputs, Microbenchmarks, calibrate

CPU_CORE_FLOPS = 4.1e10
"""One core of the 2-core VM asrdist is developed on, sustained on the DNN's step: 6 FLOP per
parameter and frame over 1.5e-4 s per frame (1.03M parameters, 64 frames a step, 1 thread:
`asrdist bench simulator`'s microbenchmarks, docs/measured/bench_simulator_hosts_2026-11-29e.json).
An assumption for any other machine: `asrdist simulate --seconds-per-frame` takes a measured one."""


def parse_cpu_device(text: str) -> float | None:
    """The host's quota in cores of `--device cpu:X` (None: not a CPU host)."""
    if not text.lower().startswith("cpu:"):
        return None
    try:
        quota = float(text[4:])
    except ValueError:
        quota = float("nan")
    if not 0.01 <= quota <= 1024:
        raise ConfigError(f"--device: expected cpu:CORES with 0.01 <= CORES <= 1024 (a host's CPU quota), got {text!r}")
    return quota


def share_of(quota: float, per_host: int) -> float:
    """Cores of each learner of a host of `quota` cores shared by `per_host` learners."""
    return quota / per_host


def dedicated_inputs(micro: Microbenchmarks, learners: int, share: float, strategy: str | None = None,
                     validations_per_epoch: int = 0) -> CalibratedInputs:
    """The simulator's inputs for `learners` learners of `share` cores each, from `micro` measured
    with `dedicated=True` (one thread, no shared-core measurements): every CPU figure over `share`
    (steps 1-4 of the module docstring). `validations_per_epoch`: validations within each epoch
    (`train.validate_every`), each as long as an epoch end's."""
    if share <= 0:
        raise ConfigError(f"dedicated hosts: a learner's share must be > 0 cores, got {share}")
    one_core = dataclasses.replace(micro, cores=1, corun_slowdown=1.0, lockstep_wait_seconds=0.0, claim_seconds=0.0,
                                   answer_delay_seconds=0.0, collective_seconds=0.0, collective_cpu_seconds=0.0,
                                   exchanging_step_slowdown=0.0)
    base = calibrate(one_core, learners, strategy)  # on 1 core: cores / threads = 1
    scale = 1.0 / share
    sources = {k: f"{v}; x 1/{share:.4g}: a learner's CPU share on its dedicated host" for k, v in base.sources.items()
               if k in ("seconds_per_frame", "epoch_end_seconds", "quantize_cost", "dequantize_cost", "copy_cost",
                        "mean_cost", "network_cost")}
    if base.exchange_cpu:
        sources["exchange_cpu"] = (f"microbenchmark: 2 learners of 1 thread on two hosts of the run's network, each "
                                   f"side's CPU (all threads) of an ADPSGD exchange of the model among training "
                                   f"learners, less the link's CPU for its bytes and the halfway step's copies; "
                                   f"x 1/{share:.4g}: a learner's CPU share on its dedicated host")
    if validations_per_epoch:
        sources["epoch_end_seconds"] += f"; x {1 + validations_per_epoch}: validations within the epoch as well"
    return dataclasses.replace(
        base, seconds_per_frame=base.seconds_per_frame * scale,
        epoch_end_seconds=base.epoch_end_seconds * scale * (1 + validations_per_epoch),
        quantize_cost=base.quantize_cost * scale, dequantize_cost=base.dequantize_cost * scale,
        copy_cost=base.copy_cost * scale, mean_cost=base.mean_cost * scale, network_cost=base.network_cost * scale,
        lockstep_wait_seconds=0.0, claim_seconds=0.0, answer_delay_seconds=0.0, collective_step_seconds=0.0,
        collective_step_cpu=0.0, exchange_cpu=base.exchange_cpu * scale,
        validations_per_epoch=1 + validations_per_epoch, sources={**base.sources, **sources})
