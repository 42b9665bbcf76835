"""`asrdist --help` and `asrdist COMMAND --help` answer from the command table and the command's
argument module alone: no torch, none of the command's working modules (start-up time)."""
from __future__ import annotations

import subprocess
import sys

import pytest

from asrdist.commands import COMMANDS


def _imports(*words: str) -> set[str]:
    """The modules `python -m asrdist WORDS --help` imports (from -X importtime)."""
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "asrdist", *words, "--help"],
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=120)
    assert done.returncode == 0, done.stderr[-2000:]
    assert "usage: asrdist" in done.stdout
    return {line.split("|")[-1].strip() for line in done.stderr.splitlines() if line.startswith("import time:")}


def test_asrdist_help_imports_the_command_table_alone():
    ours = {m for m in _imports() if m.split(".")[0] == "asrdist"}
    assert ours - {"asrdist.__main__"} == {"asrdist", "asrdist.cli", "asrdist.commands", "asrdist.errors"}, ours


@pytest.mark.parametrize("words", [[name] for name in COMMANDS] + [["corpus", "synth"]],
                         ids=lambda words: " ".join(words))
def test_command_help_imports_no_torch(words):
    modules = _imports(*words)
    assert not {m for m in modules if m.split(".")[0] in ("torch", "numpy", "matplotlib", "simpy", "lhotse")}, \
        sorted(m for m in modules if m.split(".")[0] in ("torch", "numpy", "matplotlib", "simpy", "lhotse"))[:5]
    # (`asrdist bench NAME --help` imports that benchmark's module, which defines its arguments)
    working = {m for m in modules if m.startswith("asrdist.")
               and not m.endswith(("cli", ".commands", ".errors", ".checks")) and m.count(".") > 1}
    allowed = {"asrdist.io.atomic"}  # output-file checks used as argument types
    allowed |= {"asrdist.sim.cluster"} if words[0] == "simulate" else set()  # its tables of models, devices, links
    assert working <= allowed, sorted(working - allowed)
