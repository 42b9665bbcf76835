"""How long a run's learners wait for each other when they share this machine's cores, measured:
the waits the simulator's processor sharing leaves out.

**A lock-step collective waits for its last learner.** The simulator shares a machine's cores out
evenly and continuously (`SharedCores`): learners that start a step together finish its compute
together. Linux's scheduler shares them in time slices of milliseconds instead, so with more
runnable learners than cores they finish a step's compute at staggered times, and the first
collective after it (sync's first bucket, onebit's exchange, an average) waits for the last of them
to arrive and be running again. On the 2 cores of this machine a one-value allreduce after 13 ms
of one-thread compute waited about 6 ms with 4 learners and 1-2 ms with 2 (2026-11-28), against
0.2-0.6 ms back to back.

**A learner of a job-wide pool pays the job's store each minibatch.** ADPSGD's learners claim
their minibatches from one pool kept in the launcher's c10d store and record their progress there:
two round trips per minibatch. With the run's learners computing on the shared cores they took
about 2 ms (4 learners, 2026-11-28), a tenth of a passive's step; a lone learner's step (the step
microbenchmark) has none.

**An ADPSGD exchange among training learners takes longer than back to back.** A passive answers
from a thread of the process whose main thread trains: on shared cores that thread, and gloo's,
must first get a core and the interpreter, and the parameter copy waits for the update's lock;
the active's own threads have just left a step. On this machine an exchange of the default
model's 1.04 M values took 11-13 ms with 2 learners training against 5-7 ms back to back, and
18-21 ms against 10-12 ms with 4 (2026-11-28), as the runs' actives waited (12-14 and 19-22 ms).

**A collective's messages wait for their receivers to be woken.** A ring allreduce among more
learners than cores passes 2(n-1) messages in turn, and the receiver of each is often not running:
it must be woken and get a core first. On this machine an allreduce of 16,384 values among 4
learners on the 2 cores took 6.3 ms and 2.3 ms of each learner's CPU back to back, against about 1 ms
for the link's 6 latencies; of 1,024 values, 5.6 ms and 2.1 ms; of one value (gloo's short path)
0.95 ms and 0.3 ms; of the default model's 1.03 M values in one piece 8.4 ms and 3.6 ms, in 8 pieces
38 ms and 16 ms (2026-11-29). A sync run of that model (2 buckets) spent 7.2 ms of each learner's CPU
per step in gloo's threads, where the simulator charged 3.5 ms for the bytes alone.

`lockstep_timing` (a learner function, launched as a run's learners are, `run_learners`) has
every learner repeat a stand-in for a step's compute (matrix products on its threads, as many as
take `work_seconds` alone) followed by a one-value allreduce, and, apart, the allreduce back to
back. Then every learner repeats the stand-in step followed by what a learner of a job-wide pool
(adpsgd's) does on the job's c10d store for each minibatch: its claim (an add) and its progress (a
set), the round trips to the store's server on host 0 whose threads share the busy cores, and an
allreduce of `COLLECTIVE_VALUES` values back to back (its wall and CPU seconds). Then,
given the model's values, ADPSGD's pairs (`topology`: each active with its first
partner) exchange them as the strategy does (a header and the active's values, the passive's
reply from its answering thread, each moving halfway): back to back with the passives idle, then
after each of the active's stand-in steps with the passives training (the stand-in step in a
loop, its update under the lock the answer copies under). `measure_waits` returns the mean
lock-step wait less the back-to-back wait, the mean claim, and the mean exchange among training learners less back
to back: the back-to-back figures are what the link's microbenchmark measured and the simulator
already charges (`asrdist.sim.link`). It reads no run: the learner count,
threads, network, model size and step work are the run's settings; the step work comes from the
step microbenchmark (`asrdist.compare.stepcost`)."""
from __future__ import annotations

import statistics
import threading
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import start_learner
from asrdist.parallel import topology

ROWS, COLS = 64, 512
"""The stand-in product's sizes: about half a millisecond on one thread, so that a step's work is
met to within that."""
COLLECTIVE_VALUES = 16384
"""The allreduce timed for a collective's cost per message: 64 KB, gloo's ring as for a bucket of
gradients (a one-value allreduce takes a shorter path), its bytes a small part of its time."""
ROUNDS, WARMUP = 40, 5
"""Timed rounds of compute-then-allreduce (and of back-to-back allreduces; of exchanges back to back,
and among training learners), after WARMUP untimed."""
_EXCHANGE, _GOODBYE = 1, 2  # header kinds, as adpsgd's


def lockstep_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function: `args` = {threads, work_seconds, rounds, values (0: no exchanges)}. Returns
    this learner's waits in a one-value allreduce after each round's compute (`after_compute`) and
    back to back (`bare`), its claims of a minibatch on the job's store after each round's compute
    (`claim`: an add to the pool's count and a set of its progress, as `JobEpochSampler` and
    `JobEpochs` do), an active's exchanges back to back with its passive idle
    (`exchange_bare`) and after its step with its passive training (`exchange_training`), in
    seconds, and the number of products a step computed."""
    torch.set_num_threads(int(args["threads"]))
    ctx = start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
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

    def step() -> None:
        for _ in range(int(products)):
            torch.mm(x, w)

    def timed(operation, compute: bool) -> list[float]:
        """Seconds of `operation(round)` in each timed round, each after a stand-in step if `compute`."""
        out = []
        dist.barrier()
        for i in range(WARMUP + rounds):
            if compute:
                step()
            t0 = time.perf_counter()
            operation(i)
            if i >= WARMUP:
                out.append(time.perf_counter() - t0)
        return out

    def claim(i: int) -> None:  # as a learner of a job-wide pool does each minibatch (JobEpochSampler, JobEpochs)
        ctx.store.add("lockstep/claimed", 1)
        ctx.store.set(f"lockstep/progress/{spec.rank}", str(i))

    def allreduce(i: int) -> None:
        dist.all_reduce(tiny)

    values = torch.randn(COLLECTIVE_VALUES)
    cpu: list[float] = []

    def collective(i: int) -> None:  # wall by `timed`, the CPU of all this process' threads (gloo's) here
        c0 = time.process_time()
        dist.all_reduce(values)
        if i >= WARMUP:
            cpu.append(time.process_time() - c0)

    result = {"rank": spec.rank, "products": int(products), "after_compute": timed(allreduce, True),
              "bare": timed(allreduce, False), "claim": timed(claim, True),
              "collective": timed(collective, False), "collective_cpu": cpu}
    if int(args.get("values", 0)) > 0 and spec.world_size > 1:
        pair = _Pair(spec.rank, spec.world_size, int(args["values"]), step)
        result["exchange_bare"] = pair.exchanges(rounds, training=False)
        result["exchange_training"] = pair.exchanges(rounds, training=True)
    dist.barrier()
    return result


class _Pair:
    """This learner's part in ADPSGD's exchanges among the run's learners: an active exchanges
    with its first partner; a passive answers from a thread."""

    def __init__(self, rank: int, world: int, values: int, step):
        self.rank, self.step = rank, step
        self.active = topology.is_active(rank, world)
        self.partner = topology.partner(rank, world, 0, "fixed") if self.active else None
        self.askers = sum(topology.partner(a, world, 0, "fixed") == rank for a in topology.active_ranks(world))
        self.flat, self.mine, self.theirs = torch.randn(values), torch.empty(values), torch.empty(values)
        self.update = torch.full((values,), 1e-6)  # a stand-in for the optimizer's update of every value
        self.lock = threading.Lock()

    def exchanges(self, rounds: int, training: bool) -> list[float]:
        """An active's seconds per exchange (empty for a passive) over `rounds`, after WARMUP: after
        each of its stand-in steps with the passive training (`training`), else back to back with
        the passive idle."""
        dist.barrier()
        if self.active:
            out = [self._exchange(training) for _ in range(WARMUP + rounds)][WARMUP:]
            dist.send(torch.tensor([_GOODBYE, 0]), self.partner, tag=1)
        else:
            out = []
            answering = threading.Thread(target=self._answer_all, name="answer")
            answering.start()
            while answering.is_alive():
                if training:
                    self.step()
                    with self.lock:
                        self.flat.add_(self.update)
                else:
                    answering.join()
        dist.barrier()
        return out

    def _exchange(self, after_step: bool) -> float:
        if after_step:
            self.step()
        start = time.perf_counter()
        self.mine.copy_(self.flat)
        sends = [dist.isend(torch.tensor([_EXCHANGE, 0]), self.partner, tag=1),
                 dist.isend(self.mine, self.partner, tag=2)]
        dist.irecv(self.theirs, self.partner, tag=3).wait()
        for work in sends:
            work.wait()
        self.flat.add_(self.theirs.sub_(self.mine).mul_(0.5))
        return time.perf_counter() - start

    def _answer_all(self) -> None:
        header, goodbyes = torch.empty(2, dtype=torch.int64), 0
        while goodbyes < self.askers:
            work = dist.irecv(header, tag=1)
            work.wait()
            source = work._source_rank()
            if int(header[0]) == _GOODBYE:
                goodbyes += 1
                continue
            with self.lock:
                self.mine.copy_(self.flat)
            receive, send = dist.irecv(self.theirs, source, tag=2), dist.isend(self.mine, source, tag=3)
            receive.wait()
            send.wait()
            delta = self.theirs.sub_(self.mine).mul_(0.5)
            with self.lock:
                self.flat.add_(delta)


def measure_waits(network: str, learners: int, threads: int, work_seconds: float, timeout: float,
                  values: int = 0, rounds: int = ROUNDS) -> dict[str, dict[str, float]]:
    """For `learners` learners of this machine, one per emulated host joined by `network`
    ("loopback": this machine's), `threads` torch threads each, each step computing about
    `work_seconds` of one learner's work alone:
    - `lockstep`: the mean seconds a lock-step collective waits for its last learner beyond the
      link's own latency (`wait_seconds`, >= 0), with the means behind it (over learners and rounds);
    - `claim`: the mean seconds (`seconds`) a learner of a job-wide pool spends on the job's store
      per minibatch, its claim and the progress it records, after a step's compute;
    - `collective`: the mean seconds (`seconds`) and a learner's CPU seconds (`cpu_seconds`, all its
      threads) of an allreduce of `values` values back to back;
    - `answer` (given the model's `values`, else empty): the mean seconds an ADPSGD exchange of them
      after the active's step, its passive training, takes beyond one back to back, both idle
      (`delay_seconds`, >= 0), with the means behind it (over the actives and rounds)."""
    results = run_learners("asrdist.sim.lockstep", "lockstep_timing", learners, network=network,
                           args={"threads": threads, "work_seconds": work_seconds, "rounds": rounds,
                                 "values": values}, timeout=timeout)
    after = statistics.fmean(s for r in results for s in r["after_compute"])
    bare = statistics.fmean(s for r in results for s in r["bare"])
    common = {"work_seconds": work_seconds, "products": results[0]["products"], "learners": learners,
              "threads": threads, "rounds": rounds}
    out = {"lockstep": {"wait_seconds": max(0.0, after - bare), "after_compute_seconds": after,
                        "bare_seconds": bare, **common},
           "claim": {"seconds": statistics.fmean(s for r in results for s in r["claim"]), **common},
           "collective": {"seconds": statistics.fmean(s for r in results for s in r["collective"]),
                          "cpu_seconds": statistics.fmean(s for r in results for s in r["collective_cpu"]),
                          "values": COLLECTIVE_VALUES, **common},
           "answer": {}}
    if values and learners > 1:
        bare = statistics.fmean(s for r in results for s in r["exchange_bare"])
        training = statistics.fmean(s for r in results for s in r["exchange_training"])
        out["answer"] = {"delay_seconds": max(0.0, training - bare), "exchange_training_seconds": training,
                         "exchange_bare_seconds": bare, "values": values, **common}
    return out
