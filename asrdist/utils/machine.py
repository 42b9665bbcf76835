"""What machine a figure came from: recorded in every benchmark JSON and run directory."""
from __future__ import annotations

import os
import platform
import statistics
import sys
import time
from typing import Callable

import torch


def median_seconds(fn: Callable[[], object], repeats: int,
                   clock: Callable[[], float] = time.perf_counter) -> float:
    """Median of `repeats` timings of `fn()` on `clock` (wall by default; `time.process_time` for
    this process's CPU time), after one untimed call (first touch of fresh buffers)."""
    fn()
    times = []
    for _ in range(repeats):
        start = clock()
        fn()
        times.append(clock() - start)
    return statistics.median(times)


def machine_info() -> dict:
    return {
        "hostname": platform.node(),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "cuda": torch.cuda.is_available(),
    }
