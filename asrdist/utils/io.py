"""Atomic file and directory writes: a reader sees the old content or the new, never half."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success rename it onto `path`, else delete it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp)
    try:
        yield tmp
        os.replace(tmp, path)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        with open(tmp, "w", encoding="utf-8") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def _default_in_child() -> None:
    if getattr(signal.getsignal(signal.SIGTERM), "asrdist_sigterm", False):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


os.register_at_fork(after_in_child=_default_in_child)


@contextlib.contextmanager
def sigterm_as_exit() -> Iterator[None]:
    """While inside, SIGTERM raises SystemExit(143) in the main thread (when nobody else handles
    it), so `finally` blocks and context managers clean up as they do on Ctrl-C; Python's default
    would end the process without running them. Processes forked meanwhile (worker pools) get the
    default back right after the fork: `Pool.terminate()` ends its workers with SIGTERM, and a
    worker raising SystemExit mid-task instead could hang the pool's shutdown."""
    if threading.current_thread() is not threading.main_thread() or \
            signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL:
        yield
        return

    def _exit(signum, frame):
        raise SystemExit(128 + signum)

    _exit.asrdist_sigterm = True  # type: ignore[attr-defined]  (marks it for _default_in_child)

    signal.signal(signal.SIGTERM, _exit)
    try:
        yield
    finally:
        signal.signal(signal.SIGTERM, signal.SIG_DFL)


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it onto `path` only on success.

    If anything raises, the temporary directory is removed and `path` is untouched, so a failed
    command never leaves a half-written output behind; SIGTERM counts as raising.
    """
    path = Path(path)
    if path.exists() and not overwrite and any(path.iterdir()):
        from asrdist.errors import AsrdistError

        raise AsrdistError(f"{path}: output directory exists and is not empty")
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    umask = os.umask(0)
    os.umask(umask)
    os.chmod(tmp, 0o777 & ~umask)  # mkdtemp makes 0700; a corpus should be as readable as any dir
    try:
        with sigterm_as_exit():  # a `kill` must not leave the hidden temporary directory behind
            yield tmp
        if path.exists():
            old = path.with_name(f".{path.name}.old")
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    finally:
        if tmp.exists():
            shutil.rmtree(tmp, ignore_errors=True)
