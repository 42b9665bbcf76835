"""The quick loop's rule made enforceable: a test not marked `slow` starts no learner process, no
browser and no network namespace (`pytest -m "not slow"` must stay a few minutes on 2 cores).

`refusal(argv)` says why a command line is one of those (None when it is not); `install(patch,
report)` makes every such process start of this interpreter raise `QuickLoopViolation` after
calling `report(message)`: through `subprocess.Popen` (so `subprocess.run` too), which every
launcher of asrdist's uses (torch.distributed.run, the survivable launcher, the emulated hosts'
`ip netns`), and through torch's `spawn` / `start_processes` (the benches' and tests' gloo
learners), which start processes without Popen. A test may still call a launcher with fakes
beneath it (no process started): the rule is about processes, not functions. conftest.py installs it around each test not
marked slow, and exports `GUARD_ENV` + `PYTHONPATH` so that the Python processes such a test starts
(and theirs) install it too (`quick_loop_site/sitecustomize.py`) and write what they refused into
the file `GUARD_ENV` names, which conftest.py reads back: a child that swallowed the error still
fails the test.

This module is imported by every guarded child Python process at start-up, so it imports nothing
heavier than the standard library's process module (no pytest, no torch).
"""
from __future__ import annotations

import os
import re
import shlex
import subprocess
from typing import Callable, Sequence

GUARD_ENV = "ASRDIST_QUICK_LOOP_GUARD"
"""Set (to the file that collects refusals) in the environment of a test not marked slow."""
SITE_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "quick_loop_site")
"""Holds the sitecustomize.py that installs the guard in child Python processes."""

# Learners: torch's launcher (what torchrun runs, and `asrdist train` through asrdist.cluster.agent)
# and asrdist's learner entry points (`python -m asrdist.<package>.worker`, the scaling bench's
# worker, the learner side of learner functions, `asrdist.cluster.netem_launch`, which starts
# learners as a script too).
_LEARNER_MODULE = re.compile(r"^(torch\.distributed\.run|asrdist\.cluster\.agent|asrdist(\.\w+)*\.\w*worker|asrdist\.cluster\.netem_launch)$")
_LAUNCHERS = {"torchrun"}
_BROWSERS = {"chromium", "chromium-browser", "chrome", "google-chrome", "google-chrome-stable", "headless_shell",
             "firefox"}
_NAMESPACES = {"unshare", "nsenter"}
# asrdist commands that train or start learners as their work (`--help` of any of them is fine)
_TRAINING_COMMANDS = {"train", "compare", "bench", "demo"}
_ASRDIST_MODULES = {"asrdist", "asrdist.cli"}
_HELP = {"-h", "--help"}


class QuickLoopViolation(BaseException):
    """A test not marked slow started what only slow tests may. A BaseException, as pytest's own
    failures are, so that no `except Exception` in the code under test can turn it into an ordinary
    error the test might even expect."""


def refusal(argv: str | bytes | os.PathLike | Sequence) -> str | None:
    """Why starting `argv` is not for the quick loop, or None when it is fine."""
    if isinstance(argv, (str, bytes, os.PathLike)):
        text = os.fsdecode(argv)
        try:
            words = shlex.split(text)
        except ValueError:
            words = text.split()
    else:
        words = [os.fsdecode(w) for w in argv]
    if not words:
        return None
    shown = " ".join(words)[:200]
    program = os.path.basename(words[0])
    if program in _BROWSERS:
        return f"a browser ({shown})"
    if program in _NAMESPACES or program == "ip" and "netns" in words:
        return f"a network namespace ({shown})"
    if program in _LAUNCHERS:
        return f"learner processes ({shown})"
    if _HELP & set(words):
        return None
    for i, word in enumerate(words):
        module = words[i + 1] if word == "-m" and i + 1 < len(words) else None
        if module is not None and _LEARNER_MODULE.match(module):
            return f"learner processes ({shown})"
        is_cli = module in _ASRDIST_MODULES or (i == 0 and program == "asrdist")
        after = i + 2 if module is not None else i + 1
        if is_cli and after < len(words) and words[after] in _TRAINING_COMMANDS:
            return f"an asrdist command that trains ({shown})"
    return None


def install(patch, report: Callable[[str], None], torch_too: bool = True) -> None:
    """Guard this interpreter: `patch` is a pytest MonkeyPatch (or anything with its `setattr`);
    `report(message)` is called before each refusal is raised. `torch_too`: also guard
    torch.multiprocessing (imports torch; child processes skip it: a child that starts learners
    is an asrdist command, refused by its command line, or a launcher, refused at its Popen, and
    must not pay torch's import for nothing)."""

    def refuse(what: str):
        message = (f"quick-loop guard: a test not marked @pytest.mark.slow started {what}; mark it slow, "
                   f"or test the same logic in-process")
        report(message)
        raise QuickLoopViolation(message)

    execute_child = subprocess.Popen._execute_child

    def guarded_execute_child(self, args, *rest, **kwargs):
        why = refusal(args)
        if why is not None:
            refuse(why)
        return execute_child(self, args, *rest, **kwargs)

    patch.setattr(subprocess.Popen, "_execute_child", guarded_execute_child)
    if not torch_too:
        return
    import torch.multiprocessing

    def refusing(what: str):
        def start(*args, **kwargs):
            refuse(what)
        return start

    patch.setattr(torch.multiprocessing, "spawn", refusing("learner processes (torch.multiprocessing.spawn)"))
    patch.setattr(torch.multiprocessing, "start_processes",
                  refusing("learner processes (torch.multiprocessing.start_processes)"))
