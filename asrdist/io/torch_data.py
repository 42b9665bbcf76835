"""A run directory's torch files read as data, never as code.

Every model, checkpoint and targets file loads with `torch.load(weights_only=True)`: tensors and
plain values (dict, list, tuple, str, int, float, bool, None) only. Files of an asrdist from before
this rule also hold numpy arrays and phone bigrams; those few inert types are allowed while loading
(`_legacy_types`, the bigram named by the caller), and nothing else. A file that names any other class or function (a pickled object
planted in a copied run or a downloaded model would run its author's code) is refused with one line
naming the file, before anything in it runs.
"""
from __future__ import annotations

import pickle
import re
from pathlib import Path
from typing import Any, Sequence

from asrdist.errors import AsrdistError


def _legacy_types(allowed: Sequence = ()) -> list:
    """What older run files pickled besides tensors: numpy arrays (their reconstructor, the array
    and dtype classes, under numpy 1's module name too), and the caller's `allowed` (the targets'
    phone bigram: this layer knows no speech types)."""
    import numpy as np  # here, not at the top: io's light users never load torch or numpy
    try:
        from numpy._core.multiarray import _reconstruct, scalar  # numpy 2
    except ImportError:  # numpy 1
        from numpy.core.multiarray import _reconstruct, scalar

    dtypes = [type(np.dtype(code)) for code in "?bBhHiIlLqQefdgFDUS"]
    return [np.ndarray, np.dtype, *dtypes, _reconstruct, (_reconstruct, "numpy.core.multiarray._reconstruct"),
            scalar, (scalar, "numpy.core.multiarray.scalar"), *allowed]


def refusal(path: Path, found: str) -> str:
    return (f"{path}: holds objects other than tensors and plain data ({found}); not loaded, as loading "
            f"it could run code: take run directories and models only from people you trust")


def load_data(path: str | Path, error: type[AsrdistError], allowed: Sequence = ()) -> Any:
    """`torch.load` of `path` as data (on the CPU). A file that needs anything beyond tensors, plain
    values, `_legacy_types` and `allowed` is an `error` naming it; other failures (a truncated, garbage or
    missing file: nothing in it ran) are torch's own exceptions, for the caller to word."""
    import torch  # here, not at the top: io's light users never load torch

    with torch.serialization.safe_globals(_legacy_types(allowed)):
        try:
            return torch.load(path, map_location="cpu", weights_only=True)
        except pickle.UnpicklingError as exc:
            name = re.search(r"GLOBAL (\S+) was not an allowed global", str(exc))
            if name is None:  # garbage or an opcode it refuses: damage, for the caller to word
                raise
            raise error(refusal(Path(path), f"it names {name.group(1)}")) from None


def foreign_globals(path: str | Path, allowed: Sequence = ()) -> list[str]:
    """The classes and functions `path` (a torch.save archive) names beyond tensors, plain values
    `_legacy_types` and `allowed`, found by reading its pickle's opcodes without running any."""
    import torch  # as in load_data

    with torch.serialization.safe_globals(_legacy_types(allowed)):
        try:
            return sorted(torch.serialization.get_unsafe_globals_in_checkpoint(path))
        except Exception:  # not a torch archive, or a damaged one: `load_data` words that (nothing runs)
            return []
