"""How long a run's learners wait for each other when they share this machine's cores: the lock-step
wait, the job's store claims, a collective's cost per message and an ADPSGD exchange among training
learners, measured by launching the run's learners (`lockstep_timing`, `measure_waits`). Why each
is there and how it is measured: docs/calibration.md#the-runs-learners-on-shared-cores-calibratelockstep."""
from __future__ import annotations

import statistics
import threading
import time
from contextlib import ExitStack
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist

from asrdist.calibrate.stepcost import StepTimer
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import start_learner
from asrdist.config import config_from_tree
from asrdist.parallel import topology
from asrdist.run.prepare import build_targets
from asrdist.run.task import model_kind

ROWS, COLS = 64, 512
"""The stand-in product's sizes: about half a millisecond on one thread, so that a step's work is
met to within that."""
COLLECTIVE_VALUES = 16384
"""The allreduce timed for a collective's cost per message: 64 KB, gloo's ring as for a bucket of
gradients (a one-value allreduce takes a shorter path), its bytes a small part of its time."""
ROUNDS, WARMUP = 40, 5
"""Timed rounds of compute-then-allreduce (and of back-to-back allreduces; of exchanges back to back,
and among training learners), after WARMUP untimed."""
PHASE_SECONDS, MIN_ROUNDS = 2.0, 8
"""A recipe whose step is slow gets fewer rounds (`rounds_for`): each phase about PHASE_SECONDS of
steps, never fewer than MIN_ROUNDS."""


def rounds_for(work_seconds: float) -> int:
    """Timed rounds per phase for a step of `work_seconds` alone: ROUNDS, fewer for a slow step."""
    return max(MIN_ROUNDS, min(ROUNDS, int(PHASE_SECONDS / max(work_seconds, 1e-9))))
_EXCHANGE, _GOODBYE = 1, 2  # header kinds, as adpsgd's


def lockstep_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function: `args` = {threads, work_seconds, rounds, values (0: no exchanges), recipe
    (a resolved run config as a tree, or absent)}. Every learner's step is the recipe's training step
    (a lone learner's at the run's share of the minibatch, `StepTimer`) where a recipe is given, else
    matrix products that take `work_seconds` alone. Returns this learner's waits in a one-value
    allreduce after each round's step (`after_compute`) and back to back (`bare`), its claims of a
    minibatch on the job's store after each round's step (`claim`: an add to the pool's count and a
    set of its progress, as `JobEpochSampler` and `JobEpochs` do), an active's exchanges back to
    back with its passive idle (`exchange_bare`) and after its step with its passive training
    (`exchange_training`), in seconds, the number of products a stand-in step computed (0 with a
    recipe), and its steps' CPU (`step_cpu`: {phase: [(thread CPU seconds, frames)]}; phases `alone`,
    rank 0's while the others wait, `together`, every learner stepping with nothing in flight, and
    `exchanging`, among the exchanges) with the exchanges' CPU (`exchange_cpu`, see `_Pair`)."""
    torch.set_num_threads(int(args["threads"]))
    ctx = start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    with ExitStack() as stack:
        work, products = _step_work(spec, args, stack)
        return _timings(spec, args, ctx, work, products)


def _step_work(spec, args: dict[str, Any], stack: ExitStack) -> tuple[Callable[[], int], int]:
    """(a step: runs it, returns its frames; products per stand-in step, 0 for the recipe's step)."""
    if args.get("recipe"):
        cfg = config_from_tree(args["recipe"])
        timer = StepTimer(stack, cfg, build_targets(Path(cfg.data.corpus), cfg, model_kind(cfg)),
                          spec.world_size, int(args["threads"]))
        for _ in range(WARMUP):  # first touch of the buffers
            timer.step()
        return timer.step, 0
    x, w = torch.randn(ROWS, COLS), torch.randn(COLS, COLS)
    torch.mm(x, w)  # first touch
    t0 = time.perf_counter()
    for _ in range(20):
        torch.mm(x, w)
    per_product = (time.perf_counter() - t0) / 20
    products = torch.tensor([max(1, round(float(args["work_seconds"]) / max(per_product, 1e-9)))])
    dist.broadcast(products, 0)  # rank 0's count: every learner does the same work, as a run's do

    def stand_in() -> int:
        for _ in range(int(products)):
            torch.mm(x, w)
        return 1
    return stand_in, int(products)


def _timings(spec, args: dict[str, Any], ctx, work: Callable[[], int], products: int) -> dict[str, Any]:
    tiny = torch.zeros(1)
    rounds = int(args["rounds"])
    step_cpu: dict[str, list[tuple[float, int]]] = {"alone": [], "together": [], "exchanging": []}
    phase = ["together"]

    def step() -> None:
        c0 = time.thread_time()
        frames = work()
        step_cpu[phase[0]].append((time.thread_time() - c0, frames))

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

    phase[0] = "alone"
    dist.barrier()
    if spec.rank == 0:  # the others wait in the barrier: rank 0's steps with the machine to itself
        for _ in range(rounds):
            step()
    dist.barrier()
    phase[0] = "together"
    result = {"rank": spec.rank, "products": products, "after_compute": timed(allreduce, True),
              "bare": timed(allreduce, False), "claim": timed(claim, True),
              "collective": timed(collective, False), "collective_cpu": cpu}
    if int(args.get("values", 0)) > 0 and spec.world_size > 1:
        pair = _Pair(spec.rank, spec.world_size, int(args["values"]), step, claim)
        result["exchange_bare"] = pair.exchanges(rounds, training=False)
        phase[0] = "exchanging"
        result["exchange_training"] = pair.exchanges(rounds, training=True)
        result["claim_exchanging"], result["exchange_cpu"] = pair.claims, pair.cpu
    dist.barrier()
    result["step_cpu"] = step_cpu
    return result


class _Pair:
    """This learner's part in ADPSGD's exchanges among the run's learners: an active exchanges
    with its first partner; a passive answers from a thread."""

    def __init__(self, rank: int, world: int, values: int, step, claim):
        self.rank, self.step, self.claim = rank, step, claim
        self.claims: list[float] = []
        """Seconds of each claim this learner made before a step among the exchanges."""
        self.cpu: dict[str, Any] = {}
        """Among training learners, the CPU seconds of this learner's side of an exchange, all its
        threads (`seconds`, over `exchanges`): an active's process CPU while it exchanges, a
        passive's process CPU beside its main thread's (its answering thread's and gloo's) per
        exchange it answered."""
        self._exchange_cpu: list[float] = []
        self._answered = 0
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
            self._exchange_cpu = []
            out = [self._exchange(training) for _ in range(WARMUP + rounds)][WARMUP:]
            dist.send(torch.tensor([_GOODBYE, 0]), self.partner, tag=1)
            cpu = self._exchange_cpu[WARMUP:]
            if training:
                self.cpu = {"role": "active", "seconds": statistics.fmean(cpu), "exchanges": len(cpu)}
        else:
            out = []
            self._answered = 0
            main, process = time.thread_time(), time.process_time()
            answering = threading.Thread(target=self._answer_all, name="answer")
            answering.start()
            while answering.is_alive():
                if training:
                    self._timed_claim()
                    self.step()
                    with self.lock:
                        self.flat.add_(self.update)
                else:
                    answering.join()
            beside = (time.process_time() - process) - (time.thread_time() - main)
            if training and self._answered:
                self.cpu = {"role": "passive", "seconds": max(0.0, beside) / self._answered,
                            "exchanges": self._answered}
        dist.barrier()
        return out

    def _timed_claim(self) -> None:
        """A claim before a stand-in step, as the loop makes one before each minibatch; timed."""
        t0 = time.perf_counter()
        self.claim(len(self.claims))
        self.claims.append(time.perf_counter() - t0)

    def _exchange(self, after_step: bool) -> float:
        if after_step:
            self._timed_claim()
            self.step()
        start, cpu = time.perf_counter(), time.process_time()
        self.mine.copy_(self.flat)
        sends = [dist.isend(torch.tensor([_EXCHANGE, 0]), self.partner, tag=1),
                 dist.isend(self.mine, self.partner, tag=2)]
        dist.irecv(self.theirs, self.partner, tag=3).wait()
        for work in sends:
            work.wait()
        self.flat.add_(self.theirs.sub_(self.mine).mul_(0.5))
        self._exchange_cpu.append(time.process_time() - cpu)
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
            self._answered += 1


def measure_waits(network: str, learners: int, threads: int, work_seconds: float, timeout: float,
                  values: int = 0, rounds: int | None = None, recipe: dict | None = None) -> dict[str, dict[str, Any]]:
    """For `learners` learners of this machine, one per emulated host joined by `network`
    ("loopback": this machine's), `threads` torch threads each, each step the training step of
    `recipe` (a resolved run config's tree: a lone learner's at the run's share of the minibatch),
    or without one, matrix products of about `work_seconds` of one learner's work alone:
    - `step`: a step's CPU seconds per frame (its thread's; per product for the stand-in), rank 0's
      alone (`alone_cpu_per_frame`), every learner's with all stepping and nothing in flight
      (`together_...`) and, given `values`, among the ADPSGD exchanges (`exchanging_...`), with
      each over alone (`together_slowdown`, `exchanging_slowdown`);
    - `lockstep`: the mean seconds a lock-step collective waits for its last learner beyond the
      link's own latency (`wait_seconds`, >= 0), with the means behind it (over learners and rounds);
    - `claim`: the mean seconds (`seconds`) a learner of a job-wide pool spends on the job's store
      per minibatch, its claim and the progress it records, before a step's compute: among the
      ADPSGD exchanges given `values` (`among_exchanges`, with `claims` timed, and the claims after
      a step with nothing in flight as `quiet_seconds`), else with nothing in flight;
    - `collective`: the mean seconds (`seconds`) and a learner's CPU seconds (`cpu_seconds`, all its
      threads) of an allreduce of COLLECTIVE_VALUES values back to back;
    - `answer` (given the model's `values`, else empty): the mean seconds an ADPSGD exchange of them
      after the active's step, its passive training, takes beyond one back to back, both idle
      (`delay_seconds`, >= 0), with the means behind it (over the actives and rounds), and the CPU
      seconds of each side of one exchange among training learners, all its threads
      (`active_cpu_seconds`, `passive_cpu_seconds`).
    Each phase times `rounds` rounds (default `rounds_for(work_seconds)`)."""
    rounds = rounds or rounds_for(work_seconds)
    results = run_learners("asrdist.calibrate.lockstep", "lockstep_timing", learners, network=network,
                           args={"threads": threads, "work_seconds": work_seconds, "rounds": rounds,
                                 "values": values, "recipe": recipe}, timeout=timeout)
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
           "answer": {}, "step": _step_cpu(results, recipe is not None)}
    if values and learners > 1:
        bare = statistics.fmean(s for r in results for s in r["exchange_bare"])
        training = statistics.fmean(s for r in results for s in r["exchange_training"])
        out["answer"] = {"delay_seconds": max(0.0, training - bare), "exchange_training_seconds": training,
                         "exchange_bare_seconds": bare, "values": values, **common}
        # a pool's claims cross the links the exchanges load (the store lives on host 0): these,
        # every learner's claim before each of its stand-in steps, are the ones its run makes
        claims = [s for r in results for s in r["claim_exchanging"]]
        out["claim"].update(quiet_seconds=out["claim"]["seconds"], seconds=statistics.fmean(claims),
                            claims=len(claims), among_exchanges=True)
        for role in ("active", "passive"):  # each side's CPU per exchange, weighted by its exchanges
            sides = [r["exchange_cpu"] for r in results if r["exchange_cpu"].get("role") == role]
            count = sum(side["exchanges"] for side in sides)
            out["answer"][f"{role}_cpu_seconds"] = (sum(side["seconds"] * side["exchanges"] for side in sides) / count
                                                    if count else 0.0)
    return out


def _step_cpu(results: list[dict], recipe: bool) -> dict[str, Any]:
    """The steps' CPU per frame in each phase over every learner (`lockstep_timing`'s `step_cpu`)."""
    out: dict[str, Any] = {"recipe": recipe}
    for phase in ("alone", "together", "exchanging"):
        steps = [s for r in results for s in r["step_cpu"][phase]]
        frames = sum(n for _, n in steps)
        if frames:
            out[f"{phase}_cpu_per_frame"] = sum(c for c, _ in steps) / frames
    alone = out.get("alone_cpu_per_frame")
    for phase in ("together", "exchanging"):
        if alone and f"{phase}_cpu_per_frame" in out:
            out[f"{phase}_slowdown"] = out[f"{phase}_cpu_per_frame"] / alone
    return out
