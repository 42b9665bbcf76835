"""How much one learner's arithmetic slows down when every core of the machine computes at once.

A learner's step is timed alone (`asrdist.calibrate.stepcost`): one learner on its share of the
threads while the machine's other cores idle. In a run, its peers compute on those other cores at
the same time, and cores that share caches, memory bandwidth or a physical core (vCPUs of a virtual
machine may be hyperthreads of one core) slow each other down. This measures that on a stand-in
for the step's arithmetic, a float32 matrix product of a hidden layer's size on one thread: timed
alone, then while `cores - 1` sibling processes run the same product, each on one thread, in
adjacent pairs. The ratio (`slowdown`) is a property of the machine, measured before any run trains.

The timed thread and each sibling are pinned to a core of their own (sched_setaffinity), as a run's
learners spread over the cores: what is measured is cores computing side by side. Unpinned, the
scheduler sometimes kept the timed thread and its sibling on one core for a whole measurement, and
the figure read 1.8-2.2 instead of about 1.0: in 4 of the 56 calibrations with siblings of
2026-11-28's benches and comparisons (each then predicted its run up to 2x slow), and in 2 of 40
readings in a row. 25 pinned readings in a row gave 0.98-1.08.

Pinned readings still read 1.68-1.91 in 4 of the 29 calibrations of 2026-11-29's benches and
comparison (every pair of the five, or the last three, about 2x: both cores running at half speed
for a second or more, as when the host runs the machine's two vCPUs on one physical core), while
the runs they predicted trained at the machine's usual speed, so each such prediction came out
40-45% slow; an unpinned busy loop beside the measurement did not move it (1.02). A calibration
therefore reads the co-run in two spells some seconds apart and keeps the lower (`lower_spell`): a
slow spell shorter than that is not one a run's tens of seconds of training see throughout.
"""
from __future__ import annotations

import os
import signal
import statistics
import subprocess
import sys
import time

import torch

from asrdist.errors import TrainingError

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
        env = {**os.environ, "OMP_NUM_THREADS": "1"}
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
