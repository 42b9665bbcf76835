"""The link between two learners on this machine, measured: one-way rate, duplex share and CPU per
byte of the model's message, on loopback or the emulated cluster network. The simulator's network
figures come from here (`asrdist bench simulator`, `compare`'s step cost)."""
from __future__ import annotations

import math
import resource
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import start_learner
from asrdist.utils.machine import machine_busy_seconds

MACHINE_SECONDS = 1.0
"""Seconds of back-to-back one-way messages over which the machine's CPU is counted (and as long a
pause after them, for its busy rate without messages)."""
MAX_MACHINE_MESSAGES = 1000
ROUND_TRIPS = 10
"""Round trips of a one-value message per timing of the link's latency."""


def link_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function (2 learners, one per emulated host): after a warm-up, `repeats` times a
    one-way message of `floats` float32 values from rank 0 to rank 1, then as many pairwise
    exchanges as ADPSGD's (a header, then both learners' messages at once, one each way), then as
    many timings of ROUND_TRIPS round trips of a one-value message (the latency). Returns
    this learner's wall seconds (the receiver's for one-way messages) and its process CPU seconds
    (all threads: gloo's and the kernel's copies) of every message; then (`machine`, rank 0) the
    whole machine's busy CPU seconds over about MACHINE_SECONDS of back-to-back one-way messages
    and over as long a pause, which also count the kernel's network work outside the processes
    (softirq: the emulated links' queues, the receiving side)."""

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    mine, theirs = torch.ones(int(args["floats"])), torch.empty(int(args["floats"]))
    header = torch.zeros(2, dtype=torch.int64)

    def one_way() -> None:
        if spec.rank == 0:
            dist.send(mine, 1)
        else:
            dist.recv(theirs, 0)

    def exchange() -> None:  # as adpsgd's active and passive do it
        if spec.rank == 0:
            sends = [dist.isend(header, 1, tag=1), dist.isend(mine, 1, tag=2)]
            dist.irecv(theirs, 1, tag=3).wait()
            for work in sends:
                work.wait()
        else:
            dist.recv(header, 0, tag=1)
            receive, send = dist.irecv(theirs, 0, tag=2), dist.isend(mine, 0, tag=3)
            receive.wait()
            send.wait()

    tiny = torch.zeros(1)

    def round_trip() -> None:  # a one-value message there and back: the latency of one message
        if spec.rank == 0:
            dist.send(tiny, 1)
            dist.recv(tiny, 1)
        else:
            dist.recv(tiny, 0)
            dist.send(tiny, 0)

    def round_trips() -> None:
        for _ in range(ROUND_TRIPS):
            round_trip()

    out: dict[str, Any] = {"rank": spec.rank}
    for name, fn in (("one_way", one_way), ("exchange", exchange), ("round_trips", round_trips)):
        fn()  # warm-up: the connection's windows open
        seconds, cpu_seconds = [], []
        for _ in range(int(args["repeats"])):
            dist.barrier()
            t0, c0 = time.perf_counter(), cpu()
            fn()
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(cpu() - c0)
        out[name] = {"seconds": seconds, "cpu_seconds": cpu_seconds}
    out["machine"] = _machine_cpu(spec.rank, one_way, out["one_way"]["seconds"])
    dist.barrier()
    return out


def _machine_cpu(rank: int, one_way, seconds: list[float]) -> dict[str, float] | None:
    """Rank 0's reading of the machine's busy CPU seconds over `messages` back-to-back one-way
    messages and over a pause as long (rank 1 waiting in a barrier); None without /proc/stat."""
    count = torch.tensor([min(MAX_MACHINE_MESSAGES, max(1, math.ceil(MACHINE_SECONDS / max(min(seconds), 1e-6))))])
    dist.broadcast(count, 0)  # the sender's timing decides; both must send / receive as many
    dist.barrier()
    b0, t0 = machine_busy_seconds(), time.perf_counter()
    for _ in range(int(count)):
        one_way()
    dist.barrier()
    b1, t1 = machine_busy_seconds(), time.perf_counter()
    if rank == 0:
        time.sleep(t1 - t0)
    dist.barrier()
    b2, t2 = machine_busy_seconds(), time.perf_counter()
    if rank != 0 or None in (b0, b1, b2):
        return None
    return {"messages": int(count), "busy_seconds": b1 - b0, "seconds": t1 - t0,
            "pause_busy_seconds": b2 - b1, "pause_seconds": t2 - t1}


def measure_link(network: str, values: int, repeats: int, timeout: float) -> dict[str, float]:
    """The link between two learners on this machine's `network` (emulated hosts, or loopback)
    carrying the model's `values` float32: `bytes_per_second` of one message one way (what a
    learner's collectives see), `duplex` (the share of that rate each direction keeps while an
    exchange sends both ways at once: 1 on a full-duplex link), and `cpu_seconds_per_byte` (the
    CPU one message costs, per byte one learner sends and the other receives, halved: a learner's
    CPU per byte it sends or receives), and `latency_seconds` (half a one-value message's round trip:
    what gloo, the kernel and the scheduler add to every message). That CPU is the machine's (`machine_cpu_seconds_per_byte`:
    its busy CPU over back-to-back messages less its busy rate in a pause as long, so the kernel's
    network work outside the two processes counts too), or where the machine's cannot be read, the
    two processes' (`process_cpu_seconds_per_byte`, their rusage: gloo's threads and the kernel
    work done on their behalf). `cpu_source` says which. Medians of `repeats`."""
    sender, receiver = run_learners("asrdist.calibrate.link", "link_timing", 2, network=network,
                                    args={"floats": values, "repeats": repeats}, timeout=timeout)
    size = 4 * values
    one_way = statistics.median(receiver["one_way"]["seconds"])
    exchange = statistics.median(sender["exchange"]["seconds"])
    process = statistics.median(a + b for a, b in zip(sender["one_way"]["cpu_seconds"],
                                                      receiver["one_way"]["cpu_seconds"])) / (2 * size)
    machine = machine_cpu_seconds_per_byte(sender.get("machine"), size)
    # the machine's reading where it stands out of the background; on a machine busy with other work
    # the pause can be as busy as the messages, and then the two processes' own CPU is the figure
    latency = statistics.median(sender["round_trips"]["seconds"]) / (2 * ROUND_TRIPS)
    return {"bytes_per_second": size / one_way, "duplex": min(one_way / exchange, 1.0), "latency_seconds": latency,
            "cpu_seconds_per_byte": machine if machine is not None else process,
            "cpu_source": "machine" if machine is not None else "processes",
            "machine_cpu_seconds_per_byte": machine, "process_cpu_seconds_per_byte": process,
            "machine_reading": sender.get("machine"),
            "one_way_seconds": one_way, "exchange_seconds": exchange, "bytes": size, "repeats": repeats}


def machine_cpu_seconds_per_byte(reading: dict[str, float] | None, size: int) -> float | None:
    """From `_machine_cpu`'s reading of messages of `size` bytes: the machine's busy CPU over the
    messages less its pause's busy rate over as long, per message, per byte sent and received
    (halved); None without a reading, or where the messages were no busier than the pause's
    background (other work on the machine drowned them: no figure, rather than a 0)."""
    if not reading or reading["messages"] < 1 or reading["pause_seconds"] <= 0:
        return None
    background = reading["pause_busy_seconds"] * reading["seconds"] / reading["pause_seconds"]
    busy = reading["busy_seconds"] - background
    return busy / reading["messages"] / (2 * size) if busy > 0 else None
