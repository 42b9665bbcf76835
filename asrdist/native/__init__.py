"""asrdist's native code, built one way: `torch.utils.cpp_extension.load` (its compiler checks,
ninja build, lock against concurrent builds, and cache), from the C++ sources in this package.

`onebit_kernel.cpp` uses only the Python C API (no torch or pybind11 headers): its first build
takes seconds. `ngsgd_kernel.cpp` calls ATen (torch's tensor library) through pybind11: about 30 s
on 2 cores, once per machine (`python -m asrdist.native` builds both; `make test` runs it first).
Builds are cached under `TORCH_EXTENSIONS_DIR` (default `~/.cache/torch_extensions`, a
user directory that exists on a fresh machine and in CI), one directory per (source, Python,
torch, CPU, flags). `-march=native` is tried first and the plain flags after: vector width never
changes a result in these kernels. Without a C++ compiler (`CXX`, default `c++`) or ninja,
`load` raises `NativeBuildError` with a one-line reason, and callers fall back to torch.
"""
from __future__ import annotations

import hashlib
import platform
import shutil
import sys
import threading
import time
from pathlib import Path
from typing import Sequence

import torch

from asrdist.utils import environ

SOURCE_DIR = Path(__file__).parent
BASE_FLAGS = ("-O3", "-ffp-contract=off", "-fno-fast-math")
"""No FMA contraction and no fast-math: the kernels must round exactly like their torch references."""
ARCH_FLAGS = (("-march=native",), ())
STALE_LOCK_SECONDS = 600.0
"""A build lock older than this was left by a killed build (cpp_extension would wait on it forever)."""

_lock = threading.Lock()
_modules: dict[str, object] = {}
_errors: dict[str, str] = {}


class NativeBuildError(RuntimeError):
    """A native extension cannot be built or loaded here; the message is one line."""


def compiler() -> str:
    """The C++ compiler cpp_extension uses: `CXX`, else `c++`."""
    return environ.compiler()


def load(stem: str, flags: Sequence[str] = BASE_FLAGS):
    """The extension module built from `SOURCE_DIR/<stem>.cpp` (once per process; a failure is
    remembered too). Raises NativeBuildError."""
    with _lock:
        if stem not in _modules and stem not in _errors:
            try:
                _modules[stem] = _build(stem, tuple(flags))
            except NativeBuildError as e:
                _errors[stem] = str(e)
        if stem in _errors:
            raise NativeBuildError(_errors[stem])
        return _modules[stem]


def _cpu_identity() -> str:
    try:
        lines = Path("/proc/cpuinfo").read_text().splitlines()
        return "\n".join(sorted({ln for ln in lines if ln.startswith(("model name", "flags"))}))
    except OSError:
        return platform.processor()


def _ensure_ninja() -> None:
    """cpp_extension runs `ninja` from PATH: add the pinned `ninja` package's binary when the venv
    is not activated."""
    if shutil.which("ninja"):
        return
    try:
        import ninja  # optional until a kernel is built: installed below when missing
    except ImportError:
        raise NativeBuildError("ninja not found (pip install ninja, as pyproject.toml pins it)") from None
    environ.prepend_to_path(ninja.BIN_DIR)


def _one_line(error: BaseException) -> str:
    lines = [ln.strip() for ln in str(error).splitlines() if ln.strip()]
    errors = [ln for ln in lines if "error" in ln.lower() and not ln.lower().startswith("ninja: build stopped")]
    return (errors or lines or [type(error).__name__])[-1 if errors else 0][:300]


def _clear_stale_lock(lock: Path) -> None:
    """Remove a build lock left by a killed build. cpp_extension takes and releases this lock on every
    load, cached or not, so another process may remove it at any moment: a lock that is gone is no error."""
    try:
        age = time.time() - lock.stat().st_mtime
    except FileNotFoundError:
        return
    if age > STALE_LOCK_SECONDS:
        lock.unlink(missing_ok=True)


def _build(stem: str, flags: tuple[str, ...]):
    cxx = compiler()
    if shutil.which(cxx) is None:
        raise NativeBuildError(f"no C++ compiler: {cxx!r} not found (install g++ or set CXX)")
    _ensure_ninja()
    from torch.utils import cpp_extension  # only when a kernel is built (a cached one loads without it)

    source = SOURCE_DIR / f"{stem}.cpp"
    root = Path(environ.torch_extensions_dir() or cpp_extension.get_default_build_root())
    reasons = []
    for arch in ARCH_FLAGS:
        cflags = [*flags, *arch]
        key = hashlib.sha256("\0".join([source.read_text(), *cflags, sys.version, torch.__version__,
                                        platform.machine(), _cpu_identity()]).encode()).hexdigest()[:12]
        name = f"asrdist_{stem}_{key}"
        build_dir = root / name
        build_dir.mkdir(parents=True, exist_ok=True)
        _clear_stale_lock(build_dir / "lock")
        try:
            return cpp_extension.load(name, [str(source)], extra_cflags=cflags, build_directory=str(build_dir),
                                      verbose=False)
        except (RuntimeError, OSError, ImportError, ValueError) as e:
            reasons.append(_one_line(e))
    raise NativeBuildError(f"{stem} did not build with {cxx}: {reasons[-1]}")
