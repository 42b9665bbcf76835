"""Launch learner processes on loopback or on an emulated cluster network (see netem.py).

`run_learners(module, name, world_size, nodes, network, args, timeout)` starts `world_size`
processes of `python -m asrdist.cluster.netem_launch --worker SPEC`, each calling
`module.name(spec: JobEnv, args: dict) -> dict` and returning that JSON-able dict through a
file. Ranks are grouped into `nodes` like torchrun does (rank = node * per_node + local_rank);
learners of one node share its namespace and loopback, like GPUs in one server. A learner joins
the job through the one process-group set-up, `start_learner(spec, ...)` (TCP rendezvous on node
0's address: `spec.init_method`), and gloo binds to the node's
NIC through GLOO_SOCKET_IFNAME. A learner that fails or hangs stops them all within `timeout`, and
a TrainingError names its rank and its last stderr line.

Run as a script it measures an allreduce, e.g. the 46M-parameter gradient on 4 learners:

    python -m asrdist.cluster.netem_launch --learners 4 --network 1gbit --floats 46000000

The same learner functions run under torchrun on a real cluster (one command per host, R = 0..A-1;
learners then read torchrun's RANK / WORLD_SIZE / LOCAL_RANK / MASTER_ADDR / MASTER_PORT):

    GLOO_SOCKET_IFNAME=<cluster NIC> torchrun --nnodes A --nproc-per-node B --node-rank R \
        --master-addr HOST0 --master-port 29500 -m asrdist.cluster.netem_launch \
        --function asrdist.cluster.netem_launch:allreduce_timing --args '{"floats": 46000000}'
"""
from __future__ import annotations

import argparse
import importlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import asdict, replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asrdist.checks import cli_number
from asrdist.cluster.netem import (
    COUNTER_NAMES,
    EmulatedNetwork,
    available,
    die_with_parent,
    parse_rate,
    payload_on_wire,
    stop_process,
)
from asrdist.cluster.process_group import JobEnv, start_learner
from asrdist.errors import ConfigError, TrainingError
from asrdist.io.atomic import write_json_atomic

_POLL_S = 0.05
# Rendezvous ports (in a fresh namespace, and on loopback): below Linux's ephemeral range
# (32768-60999), where gloo's own sockets and every connection's local port land.
_NAMESPACE_PORT_RANGE = (20000, 29999)


def _free_loopback_port() -> int:
    """A port free on 127.0.0.1 now, from below the ephemeral range: once the check's socket
    closes, no connection's local port can take it before rank 0 binds it (an OS-assigned port
    could be; CI once failed with EADDRINUSE that way)."""
    for _ in range(100):
        port = _namespace_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    low, high = _NAMESPACE_PORT_RANGE
    raise TrainingError(f"learners: no free port on 127.0.0.1 in {low}-{high} after 100 tries")


def _namespace_port() -> int:
    # SystemRandom: never consume (or depend on) the caller's seeded global random stream
    low, high = _NAMESPACE_PORT_RANGE
    return secrets.SystemRandom().randint(low, high)


def _check_layout(world_size: int, nodes: int | None, network: str) -> int:
    if world_size < 1:
        raise ConfigError(f"learners: world_size must be >= 1, got {world_size}")
    if network != "loopback":
        parse_rate(network)
    nodes = world_size if nodes is None else nodes
    if not 1 <= nodes <= world_size or world_size % nodes:
        raise ConfigError(f"learners: {world_size} learners cannot be split evenly into {nodes} nodes")
    return nodes


def run_learners(fn_module: str, fn_name: str, world_size: int, nodes: int | None = None,
                 network: str = "loopback", args: dict[str, Any] | None = None,
                 timeout: float = 120.0, delay: str = "0.1ms") -> list[dict[str, Any]]:
    """Run `fn_module.fn_name(spec, args)` in `world_size` processes; their results by rank.

    network: 'loopback' (all on 127.0.0.1, no namespaces) or a link rate such as '1gbit' /
    '10gbit' (an EmulatedNetwork of `nodes` hosts, default one per learner; needs root, see
    netem.available()). Raises TrainingError if any learner fails or the job outlives `timeout`.
    """
    nodes = _check_layout(world_size, nodes, network)
    if network != "loopback":
        ok, reason = available()
        if not ok:
            raise ConfigError(f"network '{network}': {reason} (use network 'loopback')")
    with tempfile.TemporaryDirectory(prefix="asrdist-learners-") as tmp:
        if network == "loopback":
            return _launch(None, fn_module, fn_name, world_size, nodes, args or {}, timeout, Path(tmp))
        with EmulatedNetwork(nodes, rate=network, delay=delay) as net:
            return _launch(net, fn_module, fn_name, world_size, nodes, args or {}, timeout, Path(tmp))


def _launch(net: EmulatedNetwork | None, fn_module: str, fn_name: str, world_size: int, nodes: int,
            args: dict[str, Any], timeout: float, tmp: Path) -> list[dict[str, Any]]:
    per_node = world_size // nodes
    cores = len(os.sched_getaffinity(0))
    # Every learner runs on this one machine, whatever node it emulates: they share its cores.
    threads = max(1, cores // world_size)
    if net is None:
        master_addr, master_port, ifname, label = "127.0.0.1", _free_loopback_port(), "lo", "loopback"
    else:
        master_addr, master_port = net.node_address(0), _namespace_port()
        ifname, label = net.interface, net.label
    procs, logs = [], []
    try:
        for rank in range(world_size):
            spec = JobEnv(rank=rank, world_size=world_size, local_rank=rank % per_node,
                          local_world_size=per_node, node_rank=rank // per_node, num_nodes=nodes,
                          master_addr=master_addr, master_port=master_port, network=label,
                          num_threads=threads, timeout_s=timeout,
                          init_method=f"tcp://{master_addr}:{master_port}")
            spec_path = tmp / f"spec{rank}.json"
            write_json_atomic(spec_path, {"spec": asdict(spec), "module": fn_module, "function": fn_name,
                                          "args": args, "result": str(tmp / f"result{rank}.json")})
            env = dict(os.environ, OMP_NUM_THREADS=str(threads), GLOO_SOCKET_IFNAME=ifname, **spec.as_environ())
            argv = [sys.executable, "-m", "asrdist.cluster.netem_launch", "--worker", str(spec_path)]
            # stdout is inherited, as under torchrun; stderr is kept to name a failure's cause
            log = open(tmp / f"stderr{rank}.log", "wb")
            logs.append(log)
            if net is None:
                procs.append(subprocess.Popen(argv, env=env, stderr=log, start_new_session=True,
                                              preexec_fn=die_with_parent))
            else:
                procs.append(net.popen(spec.node_rank, argv, env=env, stderr=log))
        _supervise(procs, tmp, timeout, label)
    finally:
        for proc in procs:
            stop_process(proc)
        for log in logs:
            log.close()
    results = []
    for rank in range(world_size):
        path = tmp / f"result{rank}.json"
        if not path.exists():
            raise TrainingError(f"learner rank {rank} exited without writing its result")
        results.append(json.loads(path.read_text()))
    return results


def record_wire(net: EmulatedNetwork, run_dir: Path) -> None:
    """Add to a finished run's summary.json (`asrdist train --nodes`) what its emulated hosts' NICs
    carried over the whole job, beside the strategy's counted `comm.bytes_sent`: every host's
    eth0 was created with the job, so its counters are the job's traffic (rendezvous, start-up
    broadcast, validation and the final gathering included: more than the training exchanges;
    after a resume, the last start's only)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return  # the job failed or stopped early: nothing to add to
    summary = json.loads(path.read_text())
    zero = dict.fromkeys(COUNTER_NAMES, 0)
    hosts = [{"node": i, **payload_on_wire(zero, net.link_counters(i))} for i in range(net.num_nodes)]
    summary["wire"] = {
        "payload_bytes": sum(h["payload_bytes"] for h in hosts),
        "frame_bytes": sum(h["bytes"] for h in hosts),
        "segments": sum(h["packets"] for h in hosts),
        "hosts": hosts,
        "what": "bytes the emulated hosts' NICs sent over the whole job (veth tx counters); payload = "
                "frames less one Ethernet + IPv4 + TCP header per segment",
    }
    write_json_atomic(path, summary)


def _last_line(path: Path) -> str:
    lines = [ln.strip() for ln in path.read_text(errors="replace").splitlines() if ln.strip()]
    return lines[-1] if lines else "(no stderr)"


def _supervise(procs: list, tmp: Path, timeout: float, label: str) -> None:
    """Wait for all learners; on the first failure or at the deadline, raise (caller kills all)."""
    deadline = time.monotonic() + timeout
    while True:
        codes = [p.poll() for p in procs]
        failed = [r for r, c in enumerate(codes) if c not in (None, 0)]
        if failed:
            rank = failed[0]
            raise TrainingError(f"learner rank {rank} failed (exit code {codes[rank]}, network {label}): "
                                f"{_last_line(tmp / f'stderr{rank}.log')}")
        if all(c == 0 for c in codes):
            return
        if time.monotonic() > deadline:
            hung = [r for r, c in enumerate(codes) if c is None]
            raise TrainingError(f"learner rank {hung[0]} did not finish within {timeout:g} s (network "
                                f"{label}; unfinished ranks: {', '.join(map(str, hung))}): "
                                f"{_last_line(tmp / f'stderr{hung[0]}.log')}")
        time.sleep(_POLL_S)


def _call_learner(spec: JobEnv, fn_module: str, fn_name: str, args: dict[str, Any]) -> dict[str, Any]:
    torch.set_num_threads(spec.num_threads)
    result = getattr(importlib.import_module(fn_module), fn_name)(spec, args)
    if dist.is_initialized():
        dist.destroy_process_group()
    return result


def _worker(spec_path: str) -> None:
    job = json.loads(Path(spec_path).read_text())
    result = _call_learner(JobEnv(**job["spec"]), job["module"], job["function"], job["args"])
    write_json_atomic(job["result"], result)


def _torchrun_learner(function: str, args_json: str, result_dir: str | None, network: str,
                      timeout_s: float) -> None:
    """One learner under torchrun: run MODULE:NAME and write result<rank>.json (or print it)."""
    fn_module, _, fn_name = function.partition(":")
    if not fn_name:
        raise ConfigError(f"--function '{function}': expected MODULE:NAME")
    spec = replace(JobEnv.from_environ(), network=network, timeout_s=timeout_s)
    result = _call_learner(spec, fn_module, fn_name, json.loads(args_json))
    if result_dir:
        write_json_atomic(Path(result_dir) / f"result{spec.rank}.json", result)
    else:
        print(json.dumps(result), flush=True)


def allreduce_timing(spec: JobEnv, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function: time `repeats` gloo allreduces of `floats` float32 values (after a warm-up).

    Returns seconds per allreduce (the slowest learner's, agreed through an allreduce of the max)
    and a checksum: element 0 after the last allreduce, which must equal the sum of the ranks+1."""
    start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    tensor = torch.empty(int(args["floats"]), dtype=torch.float32)
    tensor.fill_(spec.rank + 1)
    dist.all_reduce(tensor[: min(len(tensor), 1 << 16)])  # warm-up: connections established
    times = []
    for _ in range(int(args.get("repeats", 1))):
        tensor.fill_(spec.rank + 1)
        dist.barrier()
        t0 = time.perf_counter()
        dist.all_reduce(tensor)
        times.append(time.perf_counter() - t0)
    slowest = torch.tensor(times, dtype=torch.float64)
    dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
    return {"rank": spec.rank, "seconds": slowest.tolist(), "value": float(tensor[0]),
            "expected": float(spec.world_size * (spec.world_size + 1) / 2), "network": spec.network,
            "threads": spec.num_threads}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asrdist.cluster.netem_launch",
                                description="Time a gloo allreduce over loopback or an emulated network.")
    p.add_argument("--worker", help=argparse.SUPPRESS)
    p.add_argument("--function", help="under torchrun: run learner function MODULE:NAME(spec, args)")
    p.add_argument("--args", default="{}", help="under torchrun: the function's args as JSON")
    p.add_argument("--result-dir", help="under torchrun: write result<rank>.json here (else print)")
    p.add_argument("--label", default="cluster", help="under torchrun: the `network` the spec reports")
    p.add_argument("--learners", type=cli_number(int, at_least=1), default=4)
    p.add_argument("--nodes", type=cli_number(int, at_least=1), default=None, help="emulated hosts (default: one per learner)")
    p.add_argument("--network", default="1gbit", help="loopback | 1gbit | 10gbit | any tc rate")
    p.add_argument("--floats", type=cli_number(int, at_least=1), default=46_000_000)
    p.add_argument("--repeats", type=cli_number(int, at_least=1), default=3)
    p.add_argument("--timeout", type=cli_number(float, above=0), default=600.0)
    a = p.parse_args(argv)
    if a.worker:
        _worker(a.worker)
        return 0
    if a.function:
        _torchrun_learner(a.function, a.args, a.result_dir, a.label, a.timeout)
        return 0
    if a.learners < 2:
        p.error(f"--learners: an allreduce needs at least 2 learners, got {a.learners}")
    results = run_learners(__name__ if __name__ != "__main__" else "asrdist.cluster.netem_launch",
                           "allreduce_timing", a.learners, a.nodes, a.network,
                           {"floats": a.floats, "repeats": a.repeats}, a.timeout)
    r0 = results[0]
    print(json.dumps({"network": r0["network"], "learners": a.learners, "nodes": a.nodes or a.learners,
                      "megabytes": a.floats * 4 / 1e6, "seconds": r0["seconds"],
                      "threads_per_learner": r0["threads"], "cores": len(os.sched_getaffinity(0)),
                      "correct": all(r["value"] == r["expected"] for r in results)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
