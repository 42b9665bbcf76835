"""The learner side of `asrdist.cluster.launcher.run_learners`, and an allreduce timing on it.

`python -m asrdist.cluster.netem_launch --function MODULE:NAME --args JSON --result-dir DIR`,
under torch.distributed.run (or torchrun on a cluster), is one learner: it calls
`MODULE.NAME(env, args) -> dict` and writes DIR/result<RANK>.json, or `failed-rank-RANK.txt` when
the function raises. Run as a script (`--learners 4 --network 1gbit --floats 46000000`) it times an
allreduce. Details: docs/process-groups.md#one-launch-path; the torchrun command of a real
cluster: docs/clusters.md#how-asrdist-starts-learners."""
from __future__ import annotations

import argparse
import importlib
import json
import os
import sys
import time
from dataclasses import replace
from datetime import timedelta
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from asrdist.checks import cli_number
from asrdist.cluster.failures import record_failure
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import JobEnv, start_learner
from asrdist.cluster.supervisor import die_with_agent
from asrdist.errors import AsrdistError, ConfigError
from asrdist.io.atomic import write_json_atomic
from asrdist.utils.leave import leave


def _torchrun_learner(function: str, args_json: str, result_dir: str | None, network: str,
                      timeout_s: float) -> None:
    """One learner under torchrun: run MODULE:NAME and write result<rank>.json (or print it); a
    failure is this learner's one line (and its report in `result_dir`), exit code 1."""
    die_with_agent()
    try:
        spec = replace(JobEnv.from_environ(), network=network, timeout_s=timeout_s)
    except ConfigError as exc:  # not started by torchrun: no rank to name
        print(f"asrdist: error: {exc}", file=sys.stderr, flush=True)
        os._exit(exc.exit_code)
    try:
        fn_module, _, fn_name = function.partition(":")
        if not fn_name:
            raise ConfigError(f"--function '{function}': expected MODULE:NAME")
        args = json.loads(args_json)
        torch.set_num_threads(spec.num_threads)
        result = getattr(importlib.import_module(fn_module), fn_name)(spec, args)
        if dist.is_initialized():
            dist.destroy_process_group()
        if result_dir:
            write_json_atomic(Path(result_dir) / f"result{spec.rank}.json", result)
        else:
            print(json.dumps(result), flush=True)
    except Exception as exc:  # this learner's own failure, named by its rank, then exit non-zero
        message = record_failure(Path(result_dir) if result_dir else None, spec.rank, exc)
        print(f"asrdist: error: {message}", file=sys.stderr, flush=True)
        # leave at once: a communication thread still blocked in a gloo call would make the
        # interpreter's shutdown abort (SIGABRT) and hide this report behind a signal
        os._exit(1)


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
    p.add_argument("--function", help="under torchrun: run learner function MODULE:NAME(spec, args)")
    p.add_argument("--args", default="{}", help="under torchrun: the function's args as JSON")
    p.add_argument("--result-dir", help="under torchrun: write result<rank>.json (or failed-rank-<rank>.txt) here "
                                        "(else print)")
    p.add_argument("--label", default="cluster", help="under torchrun: the `network` the spec reports")
    p.add_argument("--learners", type=cli_number(int, at_least=1), default=4)
    p.add_argument("--nodes", type=cli_number(int, at_least=1), default=None,
                   help="emulated hosts (default: one per learner)")
    p.add_argument("--network", default="1gbit", help="loopback | 1gbit | 10gbit | any tc rate")
    p.add_argument("--delay", default="0.1ms", help="delay of every emulated link (default 0.1ms)")
    p.add_argument("--floats", type=cli_number(int, at_least=1), default=46_000_000)
    p.add_argument("--repeats", type=cli_number(int, at_least=1), default=3)
    p.add_argument("--timeout", type=cli_number(float, above=0), default=600.0)
    a = p.parse_args(argv)
    if a.function:
        _torchrun_learner(a.function, a.args, a.result_dir, a.label, a.timeout)
        return 0
    if a.learners < 2:
        p.error(f"--learners: an allreduce needs at least 2 learners, got {a.learners}")
    try:
        results = run_learners("asrdist.cluster.netem_launch", "allreduce_timing", a.learners, a.nodes, a.network,
                               {"floats": a.floats, "repeats": a.repeats}, a.timeout, a.delay)
    except AsrdistError as exc:  # bad input or a failed job: one line, as every asrdist command
        print(f"asrdist: error: {exc}", file=sys.stderr)
        return exc.exit_code
    r0 = results[0]
    print(json.dumps({"network": r0["network"], "learners": a.learners, "nodes": a.nodes or a.learners,
                      "megabytes": a.floats * 4 / 1e6, "seconds": r0["seconds"],
                      "threads_per_learner": r0["threads"], "cores": len(os.sched_getaffinity(0)),
                      "correct": all(r["value"] == r["expected"] for r in results)}))
    return 0


if __name__ == "__main__":
    leave(main())  # without the interpreter's teardown of torch: asrdist.utils.leave
