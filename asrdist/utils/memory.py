"""Training processes keep the memory they free, for the next minibatch.

Every training step allocates and frees the same large tensors (activations, gradients, a
natural-gradient layer's preconditioned rows). glibc's malloc serves a block above its mmap
threshold with fresh pages from the kernel and hands the free top of its heap back once it passes
the trim threshold, so the next step faults the pages in, and the kernel zeroes them, again. Both
thresholds also move with the program's history. Measured on this project's 2-core machine (1
learner, 1 thread): a 4 x 1024 DNN step took 1,600-2,800 page faults and 3-6 ms of system time out
of 65-75 ms, and with the thresholds fixed high that step ran 8-13% faster and FSDD's CTC recipe
4% (median of five runs; docs/benchmarks.md).

`keep_freed_memory()` fixes them: blocks up to 32 MiB (glibc's ceiling for the setting on 64-bit)
come from the heap, and the heap is trimmed only above 1 GiB of free top. The process then keeps
its peak heap instead of returning it between steps (peak RSS was 5-7% higher in the FSDD run).
Nothing is done where the C library has no mallopt (not glibc) or where the user set glibc's own
MALLOC_MMAP_THRESHOLD_ / MALLOC_TRIM_THRESHOLD_ variables: theirs win.
"""
from __future__ import annotations

import ctypes
import os
import sys

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Fix malloc's mmap and trim thresholds high (see the module docstring); whether it did."""
    if not sys.platform.startswith("linux") or any(os.environ.get(v) for v in USER_VARIABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
