"""A reader that stops reading (`asrdist decode ... | head`) ends the command quietly: no traceback,
the shell's status for SIGPIPE. The pipe's read end is closed before the command starts, so its
first line meets a broken pipe every time (no timing involved)."""
from __future__ import annotations

import os
import subprocess
import sys


def test_a_closed_stdout_ends_the_command_without_a_traceback():
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run([sys.executable, "-m", "asrdist.cli", "topology", "--learners", "8", "--pattern", "fixed"],
                              stdout=write_end, stderr=subprocess.PIPE, text=True, timeout=300)
    finally:
        os.close(write_end)
    assert done.returncode == 141, done.stderr
    assert "Traceback" not in done.stderr and "BrokenPipeError" not in done.stderr


def test_a_full_disk_no_command_caught_is_one_line(monkeypatch, capsys):
    import argparse
    import errno

    from asrdist.cli import main

    def full(args):
        raise OSError(errno.ENOSPC, "No space left on device", "/data/out/x.bin")

    monkeypatch.setattr(argparse.ArgumentParser, "parse_known_args",
                        lambda self, argv=None: (argparse.Namespace(func=full), []))
    assert main(["anything"]) == 1
    assert capsys.readouterr().err == "asrdist: error: /data/out/x.bin: No space left on device\n"
