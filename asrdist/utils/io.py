"""Atomic file and directory writes: a reader sees the old content or the new, never half."""
from __future__ import annotations

import contextlib
import errno
import json
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Iterator


# errno values that mean "this output cannot be written", whatever the file
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM,
                  errno.ENOTDIR, errno.EISDIR, errno.EEXIST}  # the last three: a file where a directory goes, or back


@contextlib.contextmanager
def output_errors(path: str | os.PathLike) -> Iterator[None]:
    """While writing `path` (a file or an output directory), a full disk, a read-only file system
    or a missing permission becomes one OutputError line naming the file (or `path`) and the
    system's reason; other errors pass unchanged."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS:
            raise
        from asrdist.errors import OutputError

        raise OutputError(f"{exc.filename or path}: cannot write: {exc.strerror or exc}") from None


def fsync_path(path: str | os.PathLike) -> None:
    """Flush a file's data, or a directory's entries (a rename), to the disk."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside `path`; on success fsync it, rename it onto `path` and fsync
    the directory, so after a crash `path` holds the old content or the whole new one; else
    delete it. Unwritable output (disk full, ...) is one OutputError naming `path`."""
    path = Path(path)
    if path.is_dir():
        from asrdist.errors import OutputError

        raise OutputError(f"{path}: output file is an existing directory; give a file name")
    with output_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        os.close(fd)
        os.chmod(tmp, 0o666 & ~_umask())  # mkstemp makes 0600; the output is as readable as any file
    tmp = Path(tmp)
    try:
        with output_errors(path):
            yield tmp
            fsync_path(tmp)
            os.replace(tmp, path)
            fsync_path(path.parent)
    finally:
        if tmp.exists():
            tmp.unlink()


def write_text_atomic(path: str | os.PathLike, text: str) -> None:
    with atomic_path(path) as tmp:
        tmp.write_text(text, encoding="utf-8")


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json.dumps(obj, indent=2, sort_keys=False) + "\n")


def save_torch_atomic(path: str | os.PathLike, obj: Any) -> None:
    """`torch.save` through atomic_path. It writes into a Python file object: given a file name,
    torch reports a full disk as a RuntimeError from its C++ writer, without errno or file."""
    import torch

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as exc:  # closing its archive after a failed write hides the OSError
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise


_fork_mask: list[set] = []  # the forking thread's signal mask while `sigterm_as_exit`'s handler is on


def _block_before_fork() -> None:
    """SIGTERM waits while a fork is under way: in the child, a SIGTERM arriving before
    `_default_in_child` ran would meet the inherited Python handler, which the child then drops
    (a pool worker that missed `Pool.terminate()`'s SIGTERM hangs the pool's shutdown)."""
    if getattr(signal.getsignal(signal.SIGTERM), "asrdist_sigterm", False):
        _fork_mask.append(signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGTERM}))


def _unblock_in_parent() -> None:
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


def _default_in_child() -> None:
    """The default SIGTERM action in a child, then any SIGTERM that came meanwhile: it dies of it."""
    if getattr(signal.getsignal(signal.SIGTERM), "asrdist_sigterm", False):
        signal.signal(signal.SIGTERM, signal.SIG_DFL)
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


os.register_at_fork(before=_block_before_fork, after_in_parent=_unblock_in_parent,
                    after_in_child=_default_in_child)


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


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def check_output_dir(path: str | os.PathLike, overwrite: bool = False,
                     inputs: tuple[str | os.PathLike, ...] = ()) -> None:
    """One AsrdistError line when `path` cannot be a command's new output directory: it is a file,
    it is a non-empty directory and `overwrite` is off, or replacing it would delete one of the
    command's `inputs` (it is one of them or holds one)."""
    from asrdist.errors import AsrdistError

    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AsrdistError(f"{path}: output directory is an existing file")
    out = path.resolve()
    for source in inputs:
        source = Path(source).resolve()
        if source == out or out in source.parents:
            raise AsrdistError(f"{path}: output directory {'is' if source == out else 'holds'} the input "
                               f"{source}, which writing it would delete; choose another output directory")
    if path.exists() and not overwrite and any(path.iterdir()):
        raise AsrdistError(f"{path}: output directory exists and is not empty")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False,
               inputs: tuple[str | os.PathLike, ...] = ()) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it onto `path` only on success.

    If anything raises, the temporary directory is removed and `path` is untouched, so a failed
    command never leaves a half-written output behind; SIGTERM counts as raising. A full disk or
    an unwritable directory is one OutputError naming the file (or `path`). `path` is checked
    first (`check_output_dir`): it never replaces a file or a directory holding one of `inputs`.
    """
    path = Path(path)
    check_output_dir(path, overwrite, inputs)
    with output_errors(path):
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent))
    os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes 0700; a corpus should be as readable as any dir
    try:
        with sigterm_as_exit(), output_errors(path):  # a `kill` must not leave the temporary directory behind
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
