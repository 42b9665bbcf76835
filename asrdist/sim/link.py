"""The link between two learners on this machine, measured: one-way rate, duplex share and CPU per
byte of the model's message, on loopback or the emulated cluster network. The simulator's network
figures come from here (`asrdist bench simulator`, `compare`'s step cost)."""
from __future__ import annotations

import resource
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import start_learner


def link_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function (2 learners, one per emulated host): after a warm-up, `repeats` times a
    one-way message of `floats` float32 values from rank 0 to rank 1, then as many pairwise
    exchanges as ADPSGD's (a header, then both learners' messages at once, one each way). Returns
    this learner's wall seconds (the receiver's for one-way messages) and its process CPU seconds
    (all threads: gloo's and the kernel's copies) of every message."""

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

    out: dict[str, Any] = {"rank": spec.rank}
    for name, fn in (("one_way", one_way), ("exchange", exchange)):
        fn()  # warm-up: the connection's windows open
        seconds, cpu_seconds = [], []
        for _ in range(int(args["repeats"])):
            dist.barrier()
            t0, c0 = time.perf_counter(), cpu()
            fn()
            seconds.append(time.perf_counter() - t0)
            cpu_seconds.append(cpu() - c0)
        out[name] = {"seconds": seconds, "cpu_seconds": cpu_seconds}
    dist.barrier()
    return out


def measure_link(network: str, values: int, repeats: int, timeout: float) -> dict[str, float]:
    """The link between two learners on this machine's `network` (emulated hosts, or loopback)
    carrying the model's `values` float32: `bytes_per_second` of one message one way (what a
    learner's collectives see), `duplex` (the share of that rate each direction keeps while an
    exchange sends both ways at once: 1 on a full-duplex link), and `cpu_seconds_per_byte` (both
    learners' process CPU per byte one sends and the other receives, halved: a learner's CPU per
    byte it sends or receives). Medians of `repeats`."""
    sender, receiver = run_learners("asrdist.sim.link", "link_timing", 2, network=network,
                                    args={"floats": values, "repeats": repeats}, timeout=timeout)
    size = 4 * values
    one_way = statistics.median(receiver["one_way"]["seconds"])
    exchange = statistics.median(sender["exchange"]["seconds"])
    cpu = statistics.median(a + b for a, b in zip(sender["one_way"]["cpu_seconds"],
                                                  receiver["one_way"]["cpu_seconds"]))
    return {"bytes_per_second": size / one_way, "duplex": min(one_way / exchange, 1.0),
            "cpu_seconds_per_byte": cpu / (2 * size), "one_way_seconds": one_way, "exchange_seconds": exchange,
            "bytes": size, "repeats": repeats}
