"""Removes an emulated cluster's namespaces and cgroups when the process that made them dies, even
by SIGKILL, when no handler of its own can run.

The first time a process creates one (`watch`), it starts `python -m asrdist.cluster.reaper` in a
session of its own, outside every namespace and cgroup it makes, and tells it through a pipe what it
creates (`+ns NAME`, `+cg PATH`) and what it has removed itself (`-ns NAME`, `-cg PATH`). The
pipe's end (the creator gone, however it went) makes the reaper remove what is still listed: the
namespaces' processes killed and the namespaces deleted first, then each cgroup's remaining tasks
killed and its directory removed. A normal close has already removed everything: the reaper then
has nothing to do. It imports nothing heavy (no torch): it starts in tens of milliseconds.
"""
from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable

_lock = threading.Lock()
_pipe = None  # the write end, in the creator
_pipe_pid = -1  # the process that started the reaper (a fork must start its own)


def watch(kind: str, name: str) -> None:
    """Tell this process' reaper that `name` (kind 'ns' or 'cg') exists and is ours to remove."""
    _send(f"+{kind} {name}")


def release(kind: str, name: str) -> None:
    """Tell the reaper that `name` was removed by its creator."""
    _send(f"-{kind} {name}")


def _send(line: str) -> None:
    global _pipe, _pipe_pid
    with _lock:
        if _pipe is None or _pipe_pid != os.getpid():
            proc = subprocess.Popen([sys.executable, "-m", "asrdist.cluster.reaper"], stdin=subprocess.PIPE,
                                    stdout=subprocess.DEVNULL, start_new_session=True, text=True,
                                    close_fds=True)
            _pipe, _pipe_pid = proc.stdin, os.getpid()
        try:
            _pipe.write(line + "\n")
            _pipe.flush()
        except (BrokenPipeError, OSError):  # the reaper is gone: the creator's own cleanup still runs
            _pipe = None


def ip(argv: list[str]) -> str:
    """Run an `ip` command; its standard output ('' when it failed)."""
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30)
    except (OSError, subprocess.TimeoutExpired):
        return ""
    return done.stdout if done.returncode == 0 else ""


def remove_namespace(ns: str, run: Callable[[list[str]], str] = ip) -> None:
    """Kill the processes in network namespace `ns`, then delete it (missing: nothing to do).
    `run`: how `ip` commands run (their standard output)."""
    for sig in (signal.SIGTERM, signal.SIGKILL):
        pids = [int(p) for p in run(["ip", "netns", "pids", ns]).split()]
        if not pids:
            break
        _signal_all(pids, sig)
        _wait_gone(pids, 1.0)
    run(["ip", "netns", "delete", ns])


def remove_cgroup(path: str | Path, grace_s: float = 5.0) -> bool:
    """Kill the tasks left in cgroup directory `path` and remove it; False if it would not go."""
    path = Path(path)
    deadline = time.monotonic() + grace_s
    while path.exists():
        _signal_all(_cgroup_pids(path), signal.SIGKILL)
        try:
            path.rmdir()
            return True
        except FileNotFoundError:
            return True
        except OSError:  # EBUSY: a killed task has not left yet
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
    return True


def _cgroup_pids(path: Path) -> list[int]:
    try:
        return [int(p) for p in (path / "cgroup.procs").read_text().split()]
    except (OSError, ValueError):
        return []


def _signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def _wait_gone(pids: list[int], seconds: float) -> None:
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        if not any(Path(f"/proc/{p}").exists() for p in pids):
            return
        time.sleep(0.02)


def main() -> int:
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # a Ctrl-C reaches the creator; the pipe tells us
    live: dict[str, list[str]] = {"ns": [], "cg": []}
    for line in sys.stdin:
        op, kind, name = line[:1], line[1:3], line[4:].rstrip("\n")
        if kind not in live or not name:
            continue
        if op == "+":
            live[kind].append(name)
        elif op == "-" and name in live[kind]:
            live[kind].remove(name)
    for ns in reversed(live["ns"]):  # nodes before the switch, as the creator removes them
        remove_namespace(ns)
    for cg in reversed(live["cg"]):  # children before their parents
        remove_cgroup(cg)
    return 0


if __name__ == "__main__":
    sys.exit(main())
