"""Atomic outputs survive a `kill`: SIGTERM inside `atomic_dir` removes the temporary directory."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap
from pathlib import Path

from asrdist.utils.io import atomic_dir, sigterm_as_exit

ROOT = Path(__file__).resolve().parents[1]


def test_sigterm_inside_atomic_dir_leaves_nothing_behind(tmp_path):
    out = tmp_path / "corpus"
    script = textwrap.dedent(f"""
        import sys, time
        from asrdist.utils.io import atomic_dir
        with atomic_dir({str(out)!r}) as tmp:
            (tmp / "part.txt").write_text("half")
            print("ready", flush=True)
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    assert any(p.name.startswith(".corpus.") for p in tmp_path.iterdir())  # the temporary dir exists
    proc.send_signal(signal.SIGTERM)
    assert proc.wait(timeout=30) == 128 + signal.SIGTERM
    assert list(tmp_path.iterdir()) == []  # neither the output nor the hidden temporary directory


def test_sigterm_handler_is_restored_and_others_are_kept(tmp_path):
    with atomic_dir(tmp_path / "out") as tmp:
        assert signal.getsignal(signal.SIGTERM) is not signal.SIG_DFL
        (tmp / "x").write_text("x")
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL
    assert (tmp_path / "out" / "x").read_text() == "x"

    def mine(signum, frame):
        pass

    previous = signal.signal(signal.SIGTERM, mine)
    try:
        with sigterm_as_exit():
            assert signal.getsignal(signal.SIGTERM) is mine  # someone else's handler is left alone
    finally:
        signal.signal(signal.SIGTERM, previous)
