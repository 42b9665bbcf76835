"""The GPU check's `trainer` part: `asrdist bench trainer` on the device (asrdist's trainer against
a bare PyTorch loop, target >= 0.95), and where the asrdist side's host time goes: the top Python
functions by their own time (cProfile) and the CUDA runtime calls that wait for the device (torch's
profiler), for one epoch of each loop. docs/gpu.md#the-checks-measurements-asrdistbenchgpu."""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import tempfile
from pathlib import Path
from typing import Any

import torch

from asrdist.bench import trainer as bench_trainer
from asrdist.data.samplers import FrameSampler

WAITS = ("cudaStreamSynchronize", "cudaDeviceSynchronize", "cudaMemcpyAsync", "cudaMemcpy", "cudaEventSynchronize")
"""Runtime calls that can hold the host until the device catches up."""


def trainer_check(device: torch.device, quick: bool, rounds: int) -> dict[str, Any]:
    utterances = 60 if quick else 300
    result = bench_trainer.run(argparse.Namespace(utterances=utterances, rounds=rounds, threads=1, device=device))
    with tempfile.TemporaryDirectory(prefix="asrdist-gpu-trainer-") as tmp:
        tmp = Path(tmp)
        store, labels = bench_trainer._store(tmp, utterances)

        def sampler():
            return FrameSampler(store, labels, batch_size=256, context=5, seed=0)

        learner = bench_trainer.asrdist_learner(sampler(), tmp / "profiled", device)
        result["python_profile"] = _python_profile(learner.trainer.fit)
        traced = bench_trainer.asrdist_learner(sampler(), tmp / "traced", device)
        result["runtime_calls"] = {
            "asrdist": _runtime_calls(device, traced.trainer.fit),
            "bare": _runtime_calls(device, lambda: bench_trainer._bare(bench_trainer._model(device), sampler(),
                                                                       device)),
        }
    return result


def _python_profile(fn, top: int = 25) -> list[str]:
    """The `top` functions by their own time over one call of `fn`, as pstats prints them."""
    profile = cProfile.Profile()
    profile.runcall(fn)
    out = io.StringIO()
    pstats.Stats(profile, stream=out).sort_stats("tottime").print_stats(top)
    return [line for line in out.getvalue().splitlines() if line.strip()][-top - 1:]


def _runtime_calls(device: torch.device, fn) -> dict[str, Any]:
    """Calls and total milliseconds of each CUDA runtime call of WAITS, and of the kernel launches,
    over one call of `fn`."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        fn()
    calls: dict[str, Any] = {}
    for event in prof.key_averages():
        if event.key in WAITS or event.key == "cudaLaunchKernel":
            calls[event.key] = {"count": event.count, "ms": event.cpu_time_total / 1000.0}
    return calls
