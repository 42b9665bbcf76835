"""How long a lock-step collective waits for its last learner when a run's learners share this
machine's cores, measured: the wait the simulator's processor sharing leaves out.

The simulator shares a machine's cores out evenly and continuously (`SharedCores`): learners that
start a step together finish its compute together. Linux's scheduler shares them in time slices
of milliseconds instead, so with more runnable learners than cores they finish a step's compute at
staggered times, and the first collective after it (sync's first bucket, onebit's exchange, an
average) waits for the last of them to arrive and be running again. On the 2 cores of this machine
a one-value allreduce after 13 ms of one-thread compute waited about 6 ms with 4 learners and 1-2
ms with 2 (2026-11-28), against 0.2-0.6 ms back to back.

`lockstep_timing` (a learner function, launched as a run's learners are, `run_learners`) has
every learner repeat a stand-in for a step's compute (matrix products on its threads, as many as
take `work_seconds` alone) followed by a one-value allreduce, and, apart, the allreduce back to
back. `measure_lockstep_wait` returns the mean wait after compute less the mean back-to-back wait
(the link's own latency, which the simulator already charges). It reads no run: the learner count,
threads, network and step work are the run's settings; the step work comes from the step
microbenchmark (`asrdist.compare.stepcost`)."""
from __future__ import annotations

import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import start_learner

ROWS, COLS = 64, 512
"""The stand-in product's sizes: about half a millisecond on one thread, so that a step's work is
met to within that."""
ROUNDS, WARMUP = 40, 5
"""Timed rounds of compute-then-allreduce (and of back-to-back allreduces), after WARMUP untimed."""


def lockstep_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function: `args` = {threads, work_seconds, rounds}. Returns this learner's waits in a
    one-value allreduce after each round's compute (`after_compute`), and back to back (`bare`),
    in seconds, and the number of products a round computed."""
    torch.set_num_threads(int(args["threads"]))
    start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    x, w = torch.randn(ROWS, COLS), torch.randn(COLS, COLS)
    torch.mm(x, w)  # first touch
    t0 = time.perf_counter()
    for _ in range(20):
        torch.mm(x, w)
    per_product = (time.perf_counter() - t0) / 20
    products = torch.tensor([max(1, round(float(args["work_seconds"]) / max(per_product, 1e-9)))])
    dist.broadcast(products, 0)  # rank 0's count: every learner does the same work, as a run's do
    tiny = torch.zeros(1)
    rounds = int(args["rounds"])

    def waits(compute: bool) -> list[float]:
        out = []
        dist.barrier()
        for i in range(WARMUP + rounds):
            if compute:
                for _ in range(int(products)):
                    torch.mm(x, w)
            t0 = time.perf_counter()
            dist.all_reduce(tiny)
            if i >= WARMUP:
                out.append(time.perf_counter() - t0)
        return out

    result = {"rank": spec.rank, "products": int(products), "after_compute": waits(True), "bare": waits(False)}
    dist.barrier()
    return result


def measure_lockstep_wait(network: str, learners: int, threads: int, work_seconds: float, timeout: float,
                          rounds: int = ROUNDS) -> dict[str, float]:
    """The mean seconds a lock-step collective waits for its last learner beyond the link's own
    latency (`wait_seconds`, >= 0), for `learners` learners of this machine, one per emulated host
    joined by `network` ("loopback": this machine's), `threads` torch threads each, each step computing
    about `work_seconds` of one learner's work alone; with the means behind it (over learners and
    rounds)."""
    results = run_learners("asrdist.sim.lockstep", "lockstep_timing", learners, network=network,
                           args={"threads": threads, "work_seconds": work_seconds, "rounds": rounds},
                           timeout=timeout)
    after = statistics.fmean(s for r in results for s in r["after_compute"])
    bare = statistics.fmean(s for r in results for s in r["bare"])
    return {"wait_seconds": max(0.0, after - bare), "after_compute_seconds": after, "bare_seconds": bare,
            "work_seconds": work_seconds, "products": results[0]["products"], "learners": learners,
            "threads": threads, "rounds": rounds}
