"""How much one learner's arithmetic slows down when every core of the machine computes at once: a
matrix product on one pinned thread, timed alone and beside pinned siblings (`corun_slowdown`), read
in two spells and the lower kept (`lower_spell`). Why pinned, why two spells:
docs/calibration.md#every-core-computing-calibratecorun."""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

import torch

from asrdist.errors import TrainingError
from asrdist.utils import environ

ROWS, COLS = 128, 1024
"""A minibatch's frames by a hidden layer's width: the default DNN's layer product."""
PRODUCTS = 20
"""Matrix products per timing."""

_SIBLING = f"""
import torch
torch.set_num_threads(1)
x, w = torch.randn({ROWS}, {COLS}), torch.randn({COLS}, {COLS})
torch.mm(x, w)
print("ready", flush=True)
while True:
    torch.mm(x, w)
"""


def _products(x: torch.Tensor, w: torch.Tensor) -> None:
    for _ in range(PRODUCTS):
        torch.mm(x, w)


def corun_slowdown(cores: int, repeats: int = 5) -> dict:
    """{alone_seconds, together_seconds, slowdown, ratios, siblings}: the products on one thread
    timed alone and with `cores - 1` siblings computing, in `repeats` adjacent pairs (the siblings
    stopped, SIGSTOP, for the one and running, SIGCONT, for the other, so that both timings of a
    pair fall in the same spell of this machine, whose speed moves over seconds); `slowdown` is the
    median of the pairs' ratios (1.0 with one core), the seconds are the medians of each side."""
    before, affinity = torch.get_num_threads(), os.sched_getaffinity(0)
    cpus = sorted(affinity)
    torch.set_num_threads(1)
    siblings: list[subprocess.Popen] = []
    try:
        x, w = torch.randn(ROWS, COLS), torch.randn(COLS, COLS)
        _products(x, w)  # first touch
        env = environ.child_environment(OMP_NUM_THREADS="1")
        for i in range(max(0, cores - 1)):
            siblings.append(subprocess.Popen([sys.executable, "-c", _SIBLING], stdin=subprocess.DEVNULL,
                                             stdout=subprocess.PIPE, env=env, text=True))
            if len(cpus) > 1:  # each on a core of its own
                os.sched_setaffinity(siblings[-1].pid, {cpus[(i + 1) % len(cpus)]})
        if siblings and len(cpus) > 1:
            os.sched_setaffinity(0, {cpus[0]})  # this thread: the timed products
        for sibling in siblings:  # each has started computing (it says so after its first product)
            if sibling.stdout.readline().strip() != "ready":
                raise TrainingError(f"co-run benchmark: a sibling process exited with {sibling.wait()}")
        alone, together = [], []
        for _ in range(repeats):
            _signal(siblings, signal.SIGSTOP)
            alone.append(_seconds(x, w))
            _signal(siblings, signal.SIGCONT)
            together.append(_seconds(x, w))
    finally:
        os.sched_setaffinity(0, affinity)
        for sibling in siblings:
            sibling.kill()
            sibling.wait()
            sibling.stdout.close()
        torch.set_num_threads(before)
    ratios = [t / a for a, t in zip(alone, together)] if siblings else [1.0] * repeats
    return {"alone_seconds": statistics.median(alone), "together_seconds": statistics.median(together),
            "slowdown": statistics.median(ratios), "ratios": ratios, "siblings": len(siblings)}


def lower_spell(first: dict, second: dict) -> dict:
    """Two `corun_slowdown` readings taken seconds apart: the lower one, with both slowdowns
    (`spells`)."""
    kept = min(first, second, key=lambda reading: reading["slowdown"])
    return {**kept, "spells": [first["slowdown"], second["slowdown"]]}


def _signal(processes: list[subprocess.Popen], signum: int) -> None:
    for process in processes:
        process.send_signal(signum)


def _seconds(x: torch.Tensor, w: torch.Tensor) -> float:
    start = time.perf_counter()
    _products(x, w)
    return time.perf_counter() - start
