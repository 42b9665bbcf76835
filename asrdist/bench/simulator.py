"""`asrdist bench simulator`: the simulator against asrdist's own runs on this machine.

1. Measures this machine's figures in one process, on one learner's work (never on the runs
   being predicted), before and after the sweeps, each the median of max(5, `--repeats`)
   timings, and keeps the smaller of the two (other jobs only slow a timing): the step's CPU work
   besides the emulated compute (gradient copy and optimizer update of the bench model) on one
   thread and on all cores (how well memory-bound work uses threads), and per value on one
   thread: onebit's quantizer and dequantizer, a parameter average and sync's gradient mean
   (`machine_figures`); and the link between two learners on the sweeps' network, carrying the
   model (`measure_link`): its rate one way, the share of it each direction keeps in a pairwise
   exchange, and the learners' CPU per byte moved (the faster of the two measurements).
2. Runs `bench scaling`'s sweep (the real strategies through `Trainer.train_step`, compute
   emulation, swbd shapes, one learner per emulated host on the emulated network) at 1, 2 and 4
   learners, `--repeats` times, and keeps each figure's median. The one-learner runs (no
   communication) give the CPU seconds of a lone learner's step: the median over strategies and
   repeats, onebit's left out; a lone onebit learner still codes its gradient, and the excess of
   its step scales the microbenchmark's 1-bit costs to what the strategy itself spends
   (`onebit_coding_scale`).
3. Simulates every strategy and learner count with these figures: learners run their CPU work
   (the copies of every byte they move included) on their threads' cores, shared as the
   scheduler shares them when there are more learners than cores; the emulated compute (a
   sleep) is not shared; the link is the measured one. Reports measured, predicted and the
   relative error per case (`predictions`) and the largest (`max_relative_error`), with the load
   average before and after (`load_average`).
"""
from __future__ import annotations

import argparse
import os
import statistics
import time
from typing import Any

import torch

from asrdist.checks import cli_number
from asrdist.bench.machine import median_seconds
from asrdist.errors import ConfigError
from asrdist.sim.cluster import parameter_count

STRATEGIES = "sync,onebit,averaging,adpsgd"
TARGET = 0.15


def add_arguments(parser: argparse.ArgumentParser) -> None:
    from asrdist.bench import scaling

    scaling.add_arguments(parser)
    parser.set_defaults(strategies=STRATEGIES, learners=[1, 2, 4])
    parser.add_argument("--repeats", type=cli_number(int, at_least=1), default=3,
                        help="sweeps (default 3); each figure is the median: one disturbed run moves none")


def _with_threads(threads: int, fn):
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        return fn()
    finally:
        torch.set_num_threads(before)


def measure_machine(shapes: list[tuple[int, ...]], cores: int, repeats: int = 5) -> dict[str, float]:
    """One learner's CPU figures on this machine (see the module docstring), medians of
    `repeats` timings: `update_seconds_one_thread`, `update_seconds_all_cores`,
    `thread_speedup` (their ratio), `quantize_seconds_per_value`, `average_seconds_per_value`."""
    gen = torch.Generator().manual_seed(0)
    params = [torch.zeros(s, requires_grad=True) for s in shapes]
    synthetic = [torch.randn(s, generator=gen) * 1e-3 for s in shapes]
    grads = [torch.empty(s) for s in shapes]
    optimizer = torch.optim.SGD(params, lr=1e-3)

    def update():  # what the trainer does under compute emulation, besides the sleep
        for p, g, buf in zip(params, synthetic, grads):
            buf.copy_(g)
            p.grad = buf
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    one, full = [], []
    for _ in range(repeats):  # alternating, so machine noise hits both alike
        one.append(_with_threads(1, lambda: median_seconds(update, 1)))
        full.append(_with_threads(cores, lambda: median_seconds(update, 1)))
    values = parameter_count(shapes)
    flat, other, bucket = torch.zeros(values), torch.ones(values), torch.empty(values)

    def mean():  # sync's arithmetic around the allreduce: into the bucket, divide, back
        bucket.copy_(other)
        bucket.div_(2)
        flat.copy_(bucket)

    average = _with_threads(1, lambda: median_seconds(lambda: flat.add_(other).mul_(0.5), repeats))
    mean_s = _with_threads(1, lambda: median_seconds(mean, repeats))
    del params, synthetic, grads, optimizer, flat, other, bucket
    quantize, dequantize = _with_threads(1, lambda: _onebit_seconds(shapes, repeats))
    one_s, full_s = statistics.median(one), statistics.median(full)
    return {"update_seconds_one_thread": one_s, "update_seconds_all_cores": full_s,
            "thread_speedup": max(one_s / full_s, 1.0), "quantize_seconds_per_value": quantize / values,
            "dequantize_seconds_per_value": dequantize / values, "average_seconds_per_value": average / values,
            "mean_seconds_per_value": mean_s / values, "repeats": repeats, "threads_all_cores": cores}


def link_timing(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function (2 learners, one per emulated host): after a warm-up, `repeats` times a
    one-way message of `floats` float32 values from rank 0 to rank 1, then as many pairwise
    exchanges as ADPSGD's (a header, then both learners' messages at once, one each way). Returns
    this learner's wall seconds (the receiver's for one-way messages) and its process CPU seconds
    (all threads: gloo's and the kernel's copies) of every message."""
    import resource
    from datetime import timedelta

    import torch.distributed as dist

    from asrdist.cluster.process_group import start_learner

    def cpu() -> float:
        usage = resource.getrusage(resource.RUSAGE_SELF)
        return usage.ru_utime + usage.ru_stime

    start_learner(spec.job_env(), seed=0, timeout=timedelta(seconds=spec.timeout_s), init_method=spec.init_method,
                  backend="gloo")
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
    from asrdist.cluster.netem_launch import run_learners

    sender, receiver = run_learners("asrdist.bench.simulator", "link_timing", 2, network=network,
                                    args={"floats": values, "repeats": repeats}, timeout=timeout)
    size = 4 * values
    one_way = statistics.median(receiver["one_way"]["seconds"])
    exchange = statistics.median(sender["exchange"]["seconds"])
    cpu = statistics.median(a + b for a, b in zip(sender["one_way"]["cpu_seconds"],
                                                  receiver["one_way"]["cpu_seconds"]))
    return {"bytes_per_second": size / one_way, "duplex": min(one_way / exchange, 1.0),
            "cpu_seconds_per_byte": cpu / (2 * size), "one_way_seconds": one_way, "exchange_seconds": exchange,
            "bytes": size, "repeats": repeats}


def _onebit_seconds(shapes: list[tuple[int, ...]], repeats: int) -> tuple[float, float]:
    """Median seconds of 1-bit quantization (with error feedback and packing) and of
    dequantization of gradients of `shapes`, with onebit's own quantizer."""
    from asrdist.parallel.onebit_kernel import get_quantizer, quantization_buffers

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


def _onebit_scale(sweeps: list[dict], strategies: list[str], lone_step: float, figures: dict, values: int) -> float:
    """How the 1-bit coding costs of the microbenchmark compare with the lone onebit learner's
    (it quantizes, reduces and dequantizes its own gradient: 2 quantize and 2 dequantize passes
    more than the other lone learners' steps); 1 without a lone onebit run or a positive excess."""
    if "onebit" not in strategies:
        return 1.0
    excess = statistics.median(s["details"]["onebit"]["1"]["seconds_per_step"] for s in sweeps) - lone_step
    modeled = 2 * (figures["quantize_seconds_per_value"] + figures["dequantize_seconds_per_value"]) * values
    return excess / modeled if excess > 0 else 1.0


def predict(strategy: str, n: int, args, shapes, lone_cpu_seconds: float, link, figures: dict,
            cores: int) -> float:
    """Frames/s the simulator predicts for `strategy` on `n` learners of this machine, as `bench
    scaling` runs them: the emulated compute hands over every gradient at its end (nothing to
    overlap with), and each learner trains its own warmup + steps minibatches."""
    from asrdist.sim.cluster import LINKS, Cluster
    from asrdist.sim.engine import SimSpec, simulate
    from asrdist.sim.scenario import strategy_config

    cluster = Cluster(n, 1, LINKS["loopback"], link, shared_cores=cores, one_machine=True,
                      thread_speedup=figures["thread_speedup"])
    alone = n == 1 and strategy != "onebit"  # a lone onebit learner still codes its gradient
    spec = SimSpec("single" if alone else strategy, None if alone else strategy_config(strategy), shapes, cluster,
                   args.local_batch, lone_cpu_seconds / args.local_batch, step_overhead=args.compute_ms / 1000,
                   quantize_cost=figures["quantize_seconds_per_value"],
                   dequantize_cost=figures["dequantize_seconds_per_value"],
                   copy_cost=figures["average_seconds_per_value"], mean_cost=figures["mean_seconds_per_value"],
                   network_cost=figures["network_cpu_seconds_per_byte"],
                   steps=args.warmup + args.steps, backward_share=0.0, own_steps=True)
    return simulate(spec).frames_per_second


def run(args) -> dict[str, Any]:
    from asrdist.bench import scaling
    from asrdist.sim.cluster import LINKS, Link, model_shapes

    if args.nodes is not None or args.per_node is not None or args.configs is not None:
        raise ConfigError("bench simulator: --nodes/--per-node/--configs are not supported (one learner per "
                          "emulated host)")
    model = {"name": args.model, "hidden_layers": args.hidden_layers, "hidden_dim": args.hidden_dim}
    shapes = model_shapes({k: v for k, v in model.items() if v is not None}, args.feature_dim, args.num_classes)
    cores = len(os.sched_getaffinity(0))
    values = parameter_count(shapes)
    repeats = max(5, args.repeats)
    load_before = os.getloadavg()
    before = measure_machine(shapes, cores, repeats=repeats)
    link_before = measure_link(args.network, values, repeats, args.timeout)
    sweeps = [scaling.run(args) for _ in range(args.repeats)]
    load_after = os.getloadavg()
    after = measure_machine(shapes, cores, repeats=repeats)
    link_after = measure_link(args.network, values, repeats, args.timeout)
    # the less disturbed measurement of the link: the faster one
    link_figures = max(link_before, link_after, key=lambda f: f["bytes_per_second"])
    # other jobs only ever slow a timing down: the less disturbed of the two medians
    figures = {k: min(v, after[k]) if k.endswith("per_value") or k.startswith("update_") else v
               for k, v in before.items()}
    figures["thread_speedup"] = max(figures["update_seconds_one_thread"] / figures["update_seconds_all_cores"], 1.0)
    figures["network_cpu_seconds_per_byte"] = link_figures["cpu_seconds_per_byte"]
    network = sweeps[0]["network"]
    strategies = list(sweeps[0]["results"])
    # the measured rate and duplex share; tc's 0.1 ms delay only where the kernel has netem (the
    # label says "nodelay" otherwise), loopback's latency as the preset's
    delay = LINKS["loopback"].latency if network == "loopback" else 20e-6 if "nodelay" in network else 0.1e-3
    link = Link(link_figures["bytes_per_second"], delay, f"{network}, measured", duplex=link_figures["duplex"])

    def median(strategy: str, n: int, key: str) -> float:
        if key == "frames_per_second":
            return statistics.median(s["results"][strategy][str(n)] for s in sweeps)
        return statistics.median(s["details"][strategy][str(n)][key] for s in sweeps)

    # a lone learner's step besides the emulated compute: the same work in every one-learner run
    # but onebit's, which still codes its gradient (the simulator adds that)
    lone_steps = [s["details"][name]["1"]["seconds_per_step"] for s in sweeps for name in strategies
                  if name != "onebit"] or [s["details"][name]["1"]["seconds_per_step"] for s in sweeps
                                           for name in strategies]
    lone_cpu = max(statistics.median(lone_steps) - args.compute_ms / 1000, 1e-6)
    figures["onebit_coding_scale"] = _onebit_scale(sweeps, strategies, statistics.median(lone_steps), figures,
                                                   values)
    for key in ("quantize_seconds_per_value", "dequantize_seconds_per_value"):
        figures[key] *= figures["onebit_coding_scale"]
    predictions: dict[str, dict[str, dict[str, float]]] = {}
    worst = 0.0
    for strategy in strategies:
        predictions[strategy] = {}
        for n in sorted(int(k) for k in sweeps[0]["results"][strategy]):
            measured = median(strategy, n, "frames_per_second")
            predicted = predict(strategy, n, args, shapes, lone_cpu, link, figures, cores)
            error = (predicted - measured) / measured
            worst = max(worst, abs(error))
            predictions[strategy][str(n)] = {"measured": measured, "predicted": predicted, "relative_error": error}
    return {
        "predictions": predictions,
        "max_relative_error": worst,
        "target": TARGET,
        "network": network,
        "machine_figures": {**figures, "measured_before_sweeps": before, "measured_after_sweeps": after,
                            "compute_ms": args.compute_ms, "cpu_seconds_per_step_one_learner": lone_cpu,
                            "one_learner_step_seconds": lone_steps, "link_bytes_per_second": link.bandwidth,
                            "link_latency_seconds": link.latency, "link_duplex": link.duplex,
                            "link_measured_before_sweeps": link_before, "link_measured_after_sweeps": link_after},
        "load_average": {"before": list(load_before), "after": list(load_after),
                         "note": "1, 5 and 15 minute load averages of this machine when the bench started and "
                                 "after its sweeps; above the core count, other jobs shared the cores"},
        "repeats": args.repeats,
        "cores": cores,
        "learners_share_cores": f"all learners run on this machine's {cores} cores (threads per learner = "
                                f"max(1, {cores} // learners))",
        "parameters": parameter_count(shapes),
        "sweeps": sweeps,
    }
