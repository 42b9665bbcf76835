"""Ending a process that has torch loaded without the interpreter's teardown.

With torch imported, Python's own shutdown (every module's objects freed, libtorch's static
destructors) costs about 0.8 s of CPU: `python -c "import torch"` took 2.0-2.3 s of CPU against
1.1-1.6 s when it ended through `leave` (2026-11-29, idle 2 cores, torch 2.13 CPU). Every job pays it
in its launcher agent and in the `asrdist` command itself, and a test suite of a few hundred jobs
paid it a few hundred times. `leave(code)` keeps everything a normal exit does that anything after
it can see: non-daemon threads are joined, atexit handlers run (logging's flush among them) and
stdout / stderr are flushed; then the process ends with `code`.

Only for a process's own entry point, once its work is done: an exception on the way there still
takes the interpreter's ordinary path (traceback, exit 1).
"""
from __future__ import annotations

import atexit
import os
import sys
import threading
from typing import NoReturn


def leave(code: int | None) -> NoReturn:
    """End this process with exit status `code` (None: 0), as `sys.exit(code)` would, minus the
    interpreter's teardown (see the module docstring)."""
    for thread in threading.enumerate():
        if thread is not threading.current_thread() and not thread.daemon:
            thread.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):  # a reader that went away, a stream already closed
            pass
    os._exit(int(code or 0))
