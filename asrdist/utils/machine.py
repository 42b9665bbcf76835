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


def machine_busy_seconds(stat: str = "/proc/stat") -> float | None:
    """CPU seconds every core of the machine has spent busy since boot (user, nice, system, irq,
    softirq, steal: all but idle and iowait), from `stat`'s first line; None where there is no
    such file (not Linux). Unlike a process's rusage, this counts the kernel's network work done
    outside any process (softirq), which a message between two learners costs too."""
    ticks = _cpu_ticks(stat)
    if ticks is None or len(ticks) < 4:
        return None
    busy = sum(ticks) - ticks[3] - (ticks[4] if len(ticks) > 4 else 0)
    return busy / os.sysconf("SC_CLK_TCK")


def _cpu_ticks(stat: str) -> list[int] | None:
    """The ticks of `stat`'s first line, every core's together (user nice system idle iowait irq
    softirq steal, as many as the kernel gives of these); None without such a line."""
    try:
        with open(stat, encoding="ascii") as f:
            fields = f.readline().split()
    except OSError:
        return None
    if not fields or fields[0] != "cpu":
        return None
    return [int(v) for v in fields[1:9]]


def machine_steal_ticks(stat: str = "/proc/stat") -> tuple[int, int] | None:
    """(steal ticks, all ticks) every core has counted since boot, from `stat`'s first line; None
    where there is no such file or no steal column. Steal is time a virtual machine's cores were
    ready to run but its host ran something else: a spell of it slows every process alike."""
    ticks = _cpu_ticks(stat)
    if ticks is None or len(ticks) < 8:
        return None
    return ticks[7], sum(ticks)


def steal_share(before: tuple[int, int] | None, after: tuple[int, int] | None) -> float | None:
    """The share of the machine's CPU time between two `machine_steal_ticks` readings that its
    host took (steal); None without both readings or with no time between them."""
    if before is None or after is None or after[1] <= before[1]:
        return None
    return (after[0] - before[0]) / (after[1] - before[1])


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
