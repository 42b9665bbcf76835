"""Training processes keep the memory they free, for the next minibatch.

`keep_freed_memory()` fixes glibc's mmap threshold at 32 MiB and its trim threshold at 1 GiB, so a
step's large tensors come from a heap that stays mapped instead of fresh pages the kernel must
fault in and zero every step (8-13% faster steps measured, at a 5-7% higher peak RSS). Nothing is
done without glibc's mallopt or where the user set glibc's own MALLOC_*_THRESHOLD_ variables. Why,
and the measurements: docs/benchmarks.md#memory-kept-between-steps."""
from __future__ import annotations

import ctypes
import sys

from asrdist.utils import environ

M_TRIM_THRESHOLD, M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
MMAP_THRESHOLD = 32 << 20
TRIM_THRESHOLD = 1 << 30
USER_VARIABLES = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Fix malloc's mmap and trim thresholds high (see the module docstring); whether it did."""
    if not sys.platform.startswith("linux") or environ.any_set(USER_VARIABLES):
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt  # the C library this process runs on
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD) == 1 and mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD) == 1
