"""`asrdist bench comm`: 1-bit vs fp32 gradient exchange on the 46M-parameter `swbd` shapes.

N learners on emulated hosts (`launcher.run_learners`) time one `sync` and one `onebit` exchange
per repeat through the strategies' own hooks on a stand-in model, alternating, and report
`bytes_ratio` (read on the wire), `exchange_speedup`, `quantize_vs_copy` and
`onebit_phases_seconds`. How each is measured:
docs/benchmarks.md#asrdist-bench-comm-1-bit-vs-fp32-gradient-exchange."""
from __future__ import annotations

import argparse
import os
import statistics
import time
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

from asrdist.checks import cli_number
from asrdist.cluster.cpushare import resolve_cpus_per_host
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.netem import interface_counters, payload_on_wire, resolve_network
from asrdist.cluster.process_group import start_learner
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.onebit_kernel import SWBD_SHAPES, measure_quantize_vs_copy
from asrdist.parallel.standin import StandIn
from asrdist.parallel.sync import SyncConfig, SyncStrategy
from asrdist.run.train_cli import add_cpus_per_host_option

DEFAULT_NETWORK = "1gbit"
TINY_SHAPES = ((64, 429), (64,), (64, 64), (64,), (93, 64), (93,))
"""A swbd-like net 32x smaller per layer: for quick checks of the benchmark itself."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--network", default=DEFAULT_NETWORK,
                        help="1gbit | 10gbit | loopback | any tc rate (default: 1gbit, emulated)")
    parser.add_argument("--learners", type=cli_number(int, at_least=2), default=4)
    parser.add_argument("--nodes", type=cli_number(int, at_least=1), default=None, help="emulated hosts (default: one per learner)")
    add_cpus_per_host_option(parser)
    parser.add_argument("--repeats", type=cli_number(int, at_least=1), default=5, help="timed exchanges per strategy")
    parser.add_argument("--kernel", default="auto", help="onebit quantizer: auto | fused | reference")
    parser.add_argument("--shapes", choices=("swbd", "tiny"), default="swbd",
                        help="gradient shapes: the 46M-parameter swbd DNN, or a tiny one for smoke tests")
    parser.add_argument("--chunks", type=cli_number(int, at_least=1), default=None,
                        help="onebit pipeline chunks (default: the strategy's; 1 = no pipelining)")
    parser.add_argument("--timeout", type=cli_number(float, above=0), default=900.0, help="seconds for the whole learner job")


def run(args) -> dict:
    shapes = SWBD_SHAPES if args.shapes == "swbd" else TINY_SHAPES
    network, _ = resolve_network(args.network)
    quant = measure_quantize_vs_copy(shapes, kind=args.kernel)
    cpus = resolve_cpus_per_host(args.cpus_per_host, args.nodes or args.learners, network)
    results = run_learners(__name__, "exchange_timing", args.learners, args.nodes, network,
                           {"shapes": [list(s) for s in shapes], "repeats": args.repeats,
                            "kernel": args.kernel, "chunks": args.chunks}, timeout=args.timeout,
                           cpus_per_host=cpus)
    r0 = results[0]
    sync_s, onebit_s = r0["sync_seconds"], r0["onebit_seconds"]
    sync_median, onebit_median = statistics.median(sync_s), statistics.median(onebit_s)
    return {
        "network": r0["network"],
        "requested_network": args.network,
        **_wire_figures(r0, args.learners, args.nodes or args.learners),
        "exchange_speedup": sync_median / onebit_median,
        "quantize_vs_copy": quant["quantize_vs_copy"],
        "sync_seconds": sync_s,
        "onebit_seconds": onebit_s,
        "sync_seconds_median": sync_median,
        "onebit_seconds_median": onebit_median,
        "sync_bytes_per_exchange": r0["sync_bytes"],
        "onebit_bytes_per_exchange": r0["onebit_bytes"],
        "quantize": quant,
        "onebit_phases_seconds": _phase_medians([r["onebit_phases"] for r in results]),
        "onebit_chunks": r0["onebit_chunks"],
        "onebit_identical_on_all_learners": len({r["onebit_checksum"] for r in results}) == 1,
        "sync_mean_correct": all(r["sync_mean_error"] < 1e-6 for r in results),
        "parameters": r0["parameters"],
        "model": "swbd (429 -> 7 x 2048 -> 9304)" if args.shapes == "swbd" else "tiny (429 -> 64 -> 64 -> 93)",
        "learners": args.learners,
        "nodes": args.nodes or args.learners,
        "repeats": args.repeats,
        "cores": len(os.sched_getaffinity(0)),
        "cores_shared_by": f"{args.learners} learners",
        "threads_per_learner": r0["threads"],
        "timing": "median over repeats of the slowest learner's exchange; sync and onebit alternate",
        "bytes": "per exchange, all hosts: wire = payload the emulated hosts' NICs sent (veth tx counters, "
                 "less TCP/IP/Ethernet headers per segment and the closing barrier's payload); counted = "
                 "the strategies' own count (ring allreduce 2S(n-1)/n, all-to-all splits)",
    }


WIRE_TOLERANCE = 0.05
"""Counted and wire payload may differ by this much (relative to the wire) before
`counted_matches_wire` is false: gloo's message framing, retransmissions, TCP options beyond
timestamps (SACK blocks on ACKs) are not in the header estimate."""


def _wire_figures(r0: dict, learners: int, nodes: int) -> dict[str, Any]:
    """`bytes_ratio` from the wire (emulated hosts), and the counted bytes beside it."""
    counted = {"sync": r0["sync_bytes"], "onebit": r0["onebit_bytes"]}
    out: dict[str, Any] = {"bytes_ratio_counted": counted["onebit"] / counted["sync"]}
    wire = r0.get("wire")
    if wire is None:
        out.update(bytes_ratio=None, wire=None, counted_matches_wire=None,
                   wire_note="loopback: no emulated NIC to read; bytes_ratio needs --network RATE (root)")
        return out
    barrier = wire["barrier"]["payload_bytes"]
    payload = {name: max(0.0, wire[name]["payload_bytes"] - barrier) for name in counted}
    out["bytes_ratio"] = payload["onebit"] / payload["sync"] if payload["sync"] > 0 else None
    out["wire"] = {name: {"payload_bytes_per_exchange": payload[name],
                          "frame_bytes_per_exchange": wire[name]["bytes"],
                          "segments_per_exchange": wire[name]["packets"],
                          "counted_bytes_per_exchange": counted[name],
                          "counted_vs_wire": counted[name] / payload[name] if payload[name] > 0 else None}
                   for name in counted}
    out["wire"]["barrier_payload_bytes"] = barrier
    if nodes == learners:
        out["counted_matches_wire"] = all(
            w["counted_vs_wire"] is not None and abs(w["counted_vs_wire"] - 1) <= WIRE_TOLERANCE
            for name, w in out["wire"].items() if name in counted)
    else:  # learners of one host talk over its loopback: counted, not on the wire
        out["counted_matches_wire"] = None
    return out


def exchange_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function (run by run_learners): time sync and onebit exchanges side by side."""

    ctx = start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    shapes = [torch.Size(s) for s in args["shapes"]]
    gen = torch.Generator().manual_seed(1000 + spec.rank)
    grads = [torch.randn(s, generator=gen) * 1e-3 for s in shapes]
    onebit = OneBitStrategy(OneBitConfig(kernel=args["kernel"]), chunks=args.get("chunks"))
    strategies = {"sync": SyncStrategy(SyncConfig()), "onebit": onebit}
    stand_ins = {name: StandIn(s, shapes, ctx) for name, s in strategies.items()}
    for stand_in in stand_ins.values():  # warm-up: connections opened, buffers paged in
        stand_in.set_gradients(grads)
        stand_in.after_backward()
    seconds: dict[str, list[float]] = {name: [] for name in strategies}
    sent = {name: 0 for name in strategies}
    # the wire: this host's NIC, read by one learner per emulated host (its node's first)
    reads_wire = spec.network != "loopback" and spec.local_rank == 0
    wire = {name: {"bytes": 0, "packets": 0, "payload_bytes": 0} for name in [*strategies, "barrier"]}
    last: dict[str, list] = {}
    names = list(strategies)
    phases: list[dict[str, float]] = []

    def on_wire(name: str, run) -> None:
        """Run `run()` between two barriers; the NIC's counters before it and after the second
        barrier (by then every learner's sends of it have arrived: none is queued in a link)."""
        dist.barrier()
        c0 = interface_counters() if reads_wire else None
        run()
        dist.barrier()
        if reads_wire:
            for key, value in payload_on_wire(c0, interface_counters()).items():
                wire[name][key] += value

    for r in range(int(args["repeats"])):
        on_wire("barrier", lambda: None)  # what the closing barrier alone puts on the wire
        for name in names if r % 2 == 0 else names[::-1]:
            strategy = strategies[name]
            before = strategy.counters.bytes_sent

            def timed(name=name) -> None:
                onebit.phase_seconds = {}
                t0 = time.perf_counter()
                last[name] = stand_ins[name].after_backward()
                seconds[name].append(time.perf_counter() - t0)

            stand_ins[name].set_gradients(grads)
            on_wire(name, timed)
            if name == "onebit":
                phases.append(dict(onebit.phase_seconds))
            sent[name] += strategy.counters.bytes_sent - before
    # the slowest learner of each repeat, and the bytes of all learners (hosts, for the wire)
    slowest = torch.tensor(seconds["sync"] + seconds["onebit"], dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    kinds = [*strategies, "barrier"]
    total_bytes = torch.tensor([sent["sync"], sent["onebit"]]
                               + [wire[n][k] for n in kinds for k in ("bytes", "packets", "payload_bytes")],
                               dtype=torch.float64)
    dist.all_reduce(total_bytes)
    repeats = int(args["repeats"])
    wire_totals = {n: {k: int(total_bytes[2 + 3 * i + j]) / repeats
                       for j, k in enumerate(("bytes", "packets", "payload_bytes"))} for i, n in enumerate(kinds)}
    k = len(seconds["sync"])
    return {
        "rank": spec.rank,
        "network": spec.network,
        "threads": spec.num_threads,
        "parameters": sum(s.numel() for s in shapes),
        "sync_seconds": slowest[:k].tolist(),
        "onebit_seconds": slowest[k:].tolist(),
        "sync_bytes": int(total_bytes[0]) / repeats,
        "onebit_bytes": int(total_bytes[1]) / repeats,
        "wire": wire_totals if spec.network != "loopback" else None,
        "onebit_phases": phases,
        "onebit_chunks": onebit.pipeline_chunks,
        "onebit_checksum": repr([float(t.double().sum()) for t in last["onebit"]]),
        "sync_mean_error": _sync_mean_error(last["sync"], shapes, spec.world_size),
    }


def _phase_medians(per_learner: list[list[dict[str, float]]]) -> dict[str, float]:
    """Per phase: the median over repeats of the mean over learners."""
    names = sorted({name for repeats in per_learner for phases in repeats for name in phases})
    out = {}
    for name in names:
        means = [statistics.fmean(repeats[r].get(name, 0.0) for repeats in per_learner)
                 for r in range(len(per_learner[0]))]
        out[name] = statistics.median(means)
    return out


def _sync_mean_error(out, shapes, world_size: int) -> float:
    """Largest deviation of sync's result from the true mean of every learner's gradient (the
    gradients are regenerated from their seeds; only the first tensor is checked, for time)."""
    expected = torch.zeros(shapes[0])
    for rank in range(world_size):
        gen = torch.Generator().manual_seed(1000 + rank)
        expected += torch.randn(shapes[0], generator=gen) * 1e-3
    expected /= world_size
    return float((out[0] - expected).abs().max())
