"""A full disk for one test (run/test_bad_input.py, run/test_run_state.py)."""
from __future__ import annotations

import builtins
import errno
import io
import os
from pathlib import Path


def fill_disk(monkeypatch, under: Path, only: str = "") -> None:
    """Every file opened for writing below `under` (whose path contains `only`) fails to write with
    ENOSPC, as on a full disk: the files a command writes, whichever module writes them."""
    real_open = builtins.open

    class FullFile:
        def __init__(self, f):
            self._f = f

        def write(self, data):
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

        def __getattr__(self, name):
            return getattr(self._f, name)

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            self._f.close()

    def full_open(file, mode="r", *args, **kwargs):
        f = real_open(file, mode, *args, **kwargs)
        if isinstance(file, (str, os.PathLike)) and any(c in mode for c in "wax+") \
                and str(Path(file).absolute()).startswith(str(under)) and only in str(file):
            return FullFile(f)
        return f

    monkeypatch.setattr(builtins, "open", full_open)
    monkeypatch.setattr(io, "open", full_open)
