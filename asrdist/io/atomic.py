"""Atomic file and directory writes: a reader sees the old content or the new, never half."""
from __future__ import annotations

import contextlib
import errno
import json
import math
import os
import shutil
import signal
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable, Iterator

from asrdist.errors import AsrdistError, OutputError

# errno values that mean "this output cannot be written", whatever the file
_OUTPUT_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EROFS, errno.EFBIG, errno.EACCES, errno.EPERM,
                  errno.ENOTDIR, errno.EISDIR, errno.EEXIST}  # the last three: a file where a directory goes, or back


@contextlib.contextmanager
def output_errors(path: str | os.PathLike, creating: bool = False) -> Iterator[None]:
    """While writing `path` (a file or an output directory), a full disk, a read-only file system
    or a missing permission becomes one OutputError line naming the file (or `path`) and the
    system's reason; other errors pass unchanged. `creating`: only creating the output happens
    inside, so a missing entry (ENOENT: a place such as /proc where nothing can be created) is
    one too."""
    try:
        yield
    except OSError as exc:
        if exc.errno not in _OUTPUT_ERRNOS and not (creating and exc.errno == errno.ENOENT):
            raise

        where = exc.filename or path
        if creating or _inside_temporary_of(path, where):  # not the temporary name beside it
            where = path
        raise OutputError(f"{where}: cannot write: {exc.strerror or exc}") from None


def _inside_temporary_of(path: str | os.PathLike, filename: str | os.PathLike) -> bool:
    """Whether `filename` is (inside) one of the hidden temporaries asrdist writes beside `path`
    (`.NAME.something`) before moving them into place."""
    prefix = f".{Path(path).name}."
    return any(part.startswith(prefix) for part in Path(filename).parts)


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
        raise OutputError(f"{path}: output file is an existing directory; give a file name")
    with output_errors(path, creating=True):
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


def json_text(obj: Any) -> str:
    """`obj` as strict JSON (a diverged run's NaN or inf is null: json.dumps would write the bare
    NaN that JSON readers other than Python's refuse), indented, with a final newline."""
    return json.dumps(finite_or_null(obj), indent=2, sort_keys=False, allow_nan=False) + "\n"


def finite_or_null(obj: Any) -> Any:
    """`obj` with every NaN or infinity (in nested dicts, lists and tuples too) as None."""
    if isinstance(obj, float):
        return obj if math.isfinite(obj) else None
    if isinstance(obj, dict):
        return {k: finite_or_null(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [finite_or_null(v) for v in obj]
    return obj


def write_json_atomic(path: str | os.PathLike, obj: Any) -> None:
    write_text_atomic(path, json_text(obj))


def save_torch_atomic(path: str | os.PathLike, obj: Any) -> None:
    """`torch.save` through atomic_path. It writes into a Python file object: given a file name,
    torch reports a full disk as a RuntimeError from its C++ writer, without errno or file."""
    import torch  # only here: `asrdist COMMAND --help` checks its outputs with this module

    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        try:
            torch.save(obj, f)
        except RuntimeError as exc:  # closing its archive after a failed write hides the OSError
            if isinstance(exc.__context__, OSError):
                raise exc.__context__ from None
            raise


_fork_mask: list[set] = []  # the forking thread's signal mask while a `signals_raise` handler is on
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGHUP)
"""The signals `signals_raise` may take over; a child gets their default action back."""


def _marked() -> set[int]:
    """The stop signals whose handler is one of `signals_raise`'s."""
    return {s for s in _STOP_SIGNALS if getattr(signal.getsignal(s), "asrdist_sigterm", False)}


def _block_before_fork() -> None:
    """Those signals wait while a fork is under way: in the child, one arriving before
    `_default_in_child` ran would meet the inherited Python handler, which the child then drops
    (a pool worker that missed `Pool.terminate()`'s SIGTERM hangs the pool's shutdown)."""
    marked = _marked()
    if marked:
        _fork_mask.append(signal.pthread_sigmask(signal.SIG_BLOCK, marked))


def _unblock_in_parent() -> None:
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


def _default_in_child() -> None:
    """The default action in a child, then any such signal that came meanwhile: it dies of it."""
    for s in _marked():
        signal.signal(s, signal.SIG_DFL)
    if _fork_mask:
        signal.pthread_sigmask(signal.SIG_SETMASK, _fork_mask.pop())


os.register_at_fork(before=_block_before_fork, after_in_parent=_unblock_in_parent,
                    after_in_child=_default_in_child)


@contextlib.contextmanager
def signals_raise(make_error: Callable[[int], BaseException],
                  signals: tuple[int, ...] = (signal.SIGTERM,)) -> Iterator[None]:
    """While inside, each of `signals` (SIGTERM, SIGHUP) that nobody else handles raises
    `make_error(signum)` in the main thread, so `finally` blocks and context managers clean up as
    they do on Ctrl-C; Python's default would end the process without running them. Processes
    forked meanwhile (worker pools) get the default back right after the fork: `Pool.terminate()`
    ends its workers with SIGTERM, and a worker raising mid-task instead could hang the pool's
    shutdown."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def _raise(signum, frame):
        raise make_error(signum)

    _raise.asrdist_sigterm = True  # type: ignore[attr-defined]  (marks it for _default_in_child)

    previous = {s: signal.signal(s, _raise) for s in signals if signal.getsignal(s) is signal.SIG_DFL}
    try:
        yield
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)


@contextlib.contextmanager
def interrupts_left_to_parent() -> Iterator[None]:
    """Worker processes started inside ignore SIGINT. Ctrl-C reaches the whole process group, and
    only this process should act on it (it stops its pool and cleans up): a worker raising
    KeyboardInterrupt mid-task printed a traceback, and one that raised between tasks hung the
    pool's shutdown. An ignored SIGINT survives spawn's exec, and Python leaves it ignored."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return
    previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def sigterm_as_exit() -> contextlib.AbstractContextManager:
    """`signals_raise` for SIGTERM and SIGHUP (a `kill`, a closed terminal) as SystemExit(143 or
    129), the exit status their default would give."""
    return signals_raise(lambda signum: SystemExit(128 + signum), _STOP_SIGNALS)


def _umask() -> int:
    umask = os.umask(0)
    os.umask(umask)
    return umask


def file_above(path: str | os.PathLike) -> Path | None:
    """The nearest existing ancestor of `path` when it is a file (so `path` can never be made)."""
    above = next((p for p in Path(path).absolute().parents if p.exists()), None)
    return above if above is not None and not above.is_dir() else None


def check_output_dir(path: str | os.PathLike, overwrite: bool = False,
                     inputs: tuple[str | os.PathLike | None, ...] = ()) -> None:
    """One AsrdistError line when `path` cannot be a command's new output directory: it is a file
    or lies under one, it is a non-empty directory and `overwrite` is off, or replacing it would
    delete one of the command's `inputs` (it is one of them or holds one; None entries: inputs not
    given), or it exists inside one of them (replacing it would delete part of that input).
    Commands call it before any long work, so a wrong output fails at once."""
    path = Path(path)
    if path.exists() and not path.is_dir():
        raise AsrdistError(f"{path}: output directory is an existing file")
    above = file_above(path)
    if above is not None:
        raise OutputError(f"{path}: cannot be an output directory: {above} is a file")
    out = path.resolve()
    for source in inputs:
        if source is None:
            continue
        source = Path(source).resolve()
        if source == out or out in source.parents:
            raise AsrdistError(f"{path}: output directory {'is' if source == out else 'holds'} the input "
                               f"{source}, which writing it would delete; choose another output directory")
        if source in out.parents and path.exists():
            raise AsrdistError(f"{path}: output directory lies inside the input {source}, so replacing it would "
                               f"delete part of the input; choose another output directory")
    if path.exists() and not overwrite and any(path.iterdir()):
        raise AsrdistError(f"{path}: output directory exists and is not empty")


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, overwrite: bool = False,
               inputs: tuple[str | os.PathLike | None, ...] = ()) -> Iterator[Path]:
    """Build a directory under a temporary name and rename it onto `path` only on success.

    If anything raises, the temporary directory is removed and `path` is untouched, so a failed
    command never leaves a half-written output behind; SIGTERM counts as raising. A full disk or
    an unwritable directory is one OutputError naming the file (or `path`). `path` is checked
    first (`check_output_dir`): it never replaces a file or a directory holding one of `inputs`.
    """
    path = Path(path)
    check_output_dir(path, overwrite, inputs)
    with output_errors(path, creating=True):
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


def check_output_file(path: Path, inputs: tuple[Path, ...] = ()) -> None:
    """One OutputError line when `path` cannot become the command's output file, said before the
    (long) work rather than as a traceback after it. Outputs are replaced atomically (a new file
    renamed onto `path`), so `path` must be a regular file or nothing: renaming onto /dev/null
    would replace the device. `inputs` are files the command reads, which it must not replace, and
    directories it reads, in which it must not replace a file."""
    path = Path(path)
    if path.is_dir():
        raise OutputError(f"{path}: output file is an existing directory; give a file name")
    if path.exists() and not path.is_file():
        # the audio module (numpy, soundfile) only on this error: `asrdist COMMAND --help` checks outputs with this module
        from asrdist.io.audio import file_kind

        raise OutputError(f"{path}: output file exists and is {file_kind(path)}, not a regular file; give a file name")
    for source in inputs:
        if Path(source).resolve() == path.resolve():
            raise OutputError(f"{path}: output file is the input {source}, which writing it would destroy")
        if (path.exists() and Path(source).is_dir() and Path(source).resolve() in path.resolve().parents
                and not path.name.endswith((".json", "hyp.txt"))):  # an earlier eval's output is no input
            raise OutputError(f"{path}: output file exists inside the input {source}, which writing it would "
                              f"change; give another file name")
    _probe_directory(path)


def _probe_directory(path: Path) -> None:
    """Create and delete a file where `path` will be made (its nearest existing directory): the
    only sure test of writability (a read-only or virtual file system such as /proc, permissions)."""
    above = file_above(path)
    if above is not None:
        raise OutputError(f"{path}: cannot write: {above} is a file, not a directory")
    parent = next(p for p in path.absolute().parents if p.exists())
    try:
        fd, probe = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".probe", dir=parent)
    except OSError as exc:
        raise OutputError(f"{path}: cannot write in {parent}: {exc.strerror or exc}") from None
    os.close(fd)
    os.unlink(probe)
