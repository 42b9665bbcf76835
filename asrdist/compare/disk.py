"""A full disk during `asrdist compare` is the machine's fault, not a strategy's.

1. Each step of a comparison (a strategy's calibration and training, then the report) is watched
   (`Step`): what it adds to OUT, and the files it replaces, are noted before it starts.
2. A step that fails for a full disk (ENOSPC or EDQUOT, raised here or named in a learner's error
   line: `is_disk_full`) is undone: its files go, the ones it replaced are put back, its run keeps
   only a checkpoint the step published (progress a re-run resumes from).
3. The comparison stops with one line naming the disk (`DiskFull`); no report row blames the
   strategy: where a report is written, its run reads `not run: disk full` (`NOT_RUN`).
Details: docs/reliability.md#a-full-disk-during-asrdist-compare.
"""
from __future__ import annotations

import contextlib
import errno
import os
import shutil
from pathlib import Path

from asrdist.errors import OutputError
from asrdist.run import rundir
from asrdist.train import checkpoint as ckpt

NOT_RUN = "not run: disk full"
"""What the report says of a run a full disk stopped (never `training failed`)."""
_ERRNOS = (errno.ENOSPC, errno.EDQUOT)


class DiskFull(OutputError):
    """The comparison stopped on a full disk; `strategy` is the run whose step it stopped."""

    def __init__(self, message: str, strategy: str | None = None):
        super().__init__(message)
        self.strategy = strategy


def is_disk_full(problem: BaseException | str) -> bool:
    """Whether an exception (or a line that reports one, e.g. a learner's) is a full disk."""
    if isinstance(problem, OSError) and problem.errno in _ERRNOS:
        return True
    text = str(problem)
    return any(os.strerror(e) in text for e in _ERRNOS)


def mount_point(path: Path) -> Path:
    """The mount point of the file system holding `path` (or its nearest existing parent)."""
    path = Path(os.path.abspath(path))
    while not path.exists():
        path = path.parent
    while not os.path.ismount(path):
        path = path.parent
    return path


def disk_full_line(out: Path, strategy: str | None, problem: BaseException | str, kept: str = "") -> str:
    """The comparison's one line: the disk, how much is free now, what failed, what to do."""
    mount = mount_point(out)
    try:
        free = f", {shutil.disk_usage(mount).free / 2 ** 20:,.0f} MiB free now"
    except OSError:
        free = ""
    detail = str(problem).strip().splitlines()[0] if str(problem).strip() else os.strerror(errno.ENOSPC)
    step = f"{strategy}'s run" if strategy else "the report"
    return (f"{out}: the disk is full (the file system mounted at {mount}{free}): {step} stopped: {detail}; "
            f"compare removed what that step wrote{kept} and trained nothing more: free space there and run the "
            f"same command again (finished runs are kept)")


def _as_it_is(path: Path) -> bytes | None:
    try:
        return path.read_bytes() if path.is_file() else None
    except OSError:
        return None


class Step:
    """What one step may write under OUT: the run directory `run_dir` (None for the report), the
    files it may replace or add (`files`), and OUT itself, noted before it starts; `undo` puts them
    back as they were."""

    def __init__(self, out: Path, run_dir: Path | None, files: list[Path]):
        self.out, self.run_dir, self.files = Path(out), run_dir, list(files)
        self.out_existed = self.out.is_dir()
        self.kept = {path: _as_it_is(path) for path in self.files}
        self.parents = {path.parent: path.parent.is_dir() for path in self.files}
        self.run_existed = run_dir is not None and run_dir.is_dir()
        self.run_entries = set(run_dir.iterdir()) if self.run_existed else set()
        self.latest = self._latest()

    def _latest(self) -> str | None:
        if self.run_dir is None:
            return None
        pointer = self.run_dir / ckpt.CHECKPOINTS_DIR / ckpt.LATEST_NAME
        return _as_it_is(pointer) and pointer.read_text(errors="replace").strip()

    def undo(self) -> str:
        """Put OUT back as the step found it; returns what was kept on purpose (for the line):
        '' or ` (sync keeps checkpoint epoch-0002: the next run resumes it)`."""
        kept = ""
        for path, content in self.kept.items():
            with contextlib.suppress(OSError):
                if content is None:
                    path.unlink(missing_ok=True)
                elif _as_it_is(path) != content:
                    path.write_bytes(content)  # the old one's blocks were freed when it was replaced
        for parent, existed in self.parents.items():
            if not existed:
                with contextlib.suppress(OSError):
                    parent.rmdir()  # only when empty
        if self.run_dir is not None and self.run_dir.is_dir():
            latest = self._latest()
            moved = latest is not None and latest != self.latest
            for path in set(self.run_dir.iterdir()) - self.run_entries:
                if moved and not rundir.is_report(path):
                    continue  # the checkpoint this step published is progress: a re-run resumes it
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if moved:
                kept = f" but its checkpoint {latest} ({self.run_dir}: the next comparison resumes it)"
            elif not self.run_existed:
                with contextlib.suppress(OSError):
                    self.run_dir.rmdir()
        if not self.out_existed:
            with contextlib.suppress(OSError):
                self.out.rmdir()
        return kept
