"""Atomic outputs survive a `kill`: SIGTERM inside `atomic_dir` removes the temporary directory."""
from __future__ import annotations

import signal
import subprocess
import sys
import textwrap

import pytest

from asrdist.io.atomic import atomic_dir, sigterm_as_exit
from tests.support.paths import ROOT



@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_sigterm_inside_atomic_dir_leaves_nothing_behind(tmp_path, sig):
    """A `kill` or a closed terminal (SIGHUP left a synth's temporary directory behind)."""
    out = tmp_path / "corpus"
    script = textwrap.dedent(f"""
        import sys, time
        from asrdist.io.atomic import atomic_dir
        with atomic_dir({str(out)!r}) as tmp:
            (tmp / "part.txt").write_text("half")
            print("ready", flush=True)
            time.sleep(60)
    """)
    # the child starts with the signal's default action, as under a terminal: under `nohup` the suite
    # itself ignores SIGHUP, and a child that inherits that rightly keeps ignoring it (next test)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(sig, signal.SIG_DFL))
    assert proc.stdout.readline().strip() == "ready"
    assert any(p.name.startswith(".corpus.") for p in tmp_path.iterdir())  # the temporary dir exists
    proc.send_signal(sig)
    assert proc.wait(timeout=30) == 128 + sig
    assert list(tmp_path.iterdir()) == []  # neither the output nor the hidden temporary directory


def test_an_ignored_sighup_stays_ignored_inside_atomic_dir(tmp_path):
    """Under `nohup` SIGHUP is ignored on purpose: atomic_dir must not turn it into an exit."""
    out = tmp_path / "corpus"
    script = textwrap.dedent(f"""
        import signal, sys
        from asrdist.io.atomic import atomic_dir
        with atomic_dir({str(out)!r}) as tmp:
            (tmp / "part.txt").write_text("whole")
            print("ready", flush=True)
            signal.raise_signal(signal.SIGHUP)  # delivered synchronously, ignored
            print("alive", flush=True)
    """)
    proc = subprocess.Popen([sys.executable, "-c", script], cwd=ROOT, stdout=subprocess.PIPE, text=True,
                            preexec_fn=lambda: signal.signal(signal.SIGHUP, signal.SIG_IGN))
    assert proc.stdout.read().split() == ["ready", "alive"]
    assert proc.wait(timeout=30) == 0
    assert (out / "part.txt").read_text() == "whole"


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


def _report_handler_then_sleep(queue):
    import time
    queue.put(signal.getsignal(signal.SIGTERM) is signal.SIG_DFL)
    time.sleep(60)


def test_forked_children_still_die_of_sigterm():
    """Worker pools forked inside `atomic_dir` are ended by Pool.terminate() with SIGTERM: they must
    die of it at once (exit code -15), not raise SystemExit wherever they happen to be."""
    import multiprocessing

    with sigterm_as_exit():
        ctx = multiprocessing.get_context("fork")
        queue = ctx.Queue()
        child = ctx.Process(target=_report_handler_then_sleep, args=(queue,))
        child.start()
        assert queue.get(timeout=30) is True  # the child runs with the default SIGTERM action
        child.terminate()
        child.join(timeout=30)
    assert child.exitcode == -signal.SIGTERM


def _sleep_forever():
    import time
    while True:
        time.sleep(60)


def test_a_child_terminated_right_after_the_fork_dies_of_it():
    """A SIGTERM that reaches a child before it put the default action back (Pool.terminate() on a
    worker still starting) waits until it has, instead of meeting the inherited handler, which the
    child then dropped: a CI run's pool shutdown hung on such a worker."""
    import multiprocessing

    ctx = multiprocessing.get_context("fork")
    with sigterm_as_exit():
        codes = []
        for _ in range(100):  # the window is microseconds: before the fix, many of these hung
            child = ctx.Process(target=_sleep_forever)
            child.start()
            child.terminate()
            child.join(timeout=30)
            codes.append(child.exitcode)
            if child.exitcode is None:
                child.kill()
                child.join()
    assert codes == [-signal.SIGTERM] * 100


def test_a_worker_pool_inside_atomic_dir_shuts_down(tmp_path):
    import multiprocessing

    with atomic_dir(tmp_path / "out") as tmp:
        with multiprocessing.get_context("fork").Pool(2) as pool:
            assert pool.map(abs, range(-50, 0)) == list(range(50, 0, -1))
        (tmp / "done").write_text("1")
    assert (tmp_path / "out" / "done").is_file()


def test_atomic_files_and_dirs_follow_the_umask(tmp_path):
    import os
    import stat

    from asrdist.io.atomic import write_text_atomic

    old = os.umask(0o022)
    try:
        write_text_atomic(tmp_path / "summary.json", "{}\n")
        with atomic_dir(tmp_path / "corpus") as tmp:
            (tmp / "x").write_text("1")
    finally:
        os.umask(old)
    assert stat.S_IMODE((tmp_path / "summary.json").stat().st_mode) == 0o644
    assert stat.S_IMODE((tmp_path / "corpus").stat().st_mode) == 0o755


def test_an_output_directory_never_replaces_a_file_or_its_own_input(tmp_path):
    import pytest

    from asrdist.errors import AsrdistError

    source = tmp_path / "data" / "train"
    source.mkdir(parents=True)
    (source / "wav.scp").write_text("u1 u1.wav\n")
    for out, words in ((source, "is the input"), (tmp_path / "data", "holds the input")):
        with pytest.raises(AsrdistError, match=words):
            with atomic_dir(out, overwrite=True, inputs=(source,)):
                raise AssertionError("must not start")
    assert (source / "wav.scp").read_text() == "u1 u1.wav\n"
    afile = tmp_path / "afile"
    afile.write_text("keep")
    with pytest.raises(AsrdistError, match="is an existing file"):
        with atomic_dir(afile, overwrite=True):
            raise AssertionError("must not start")
    assert afile.read_text() == "keep"
    with atomic_dir(tmp_path / "elsewhere", inputs=(source,)) as tmp:  # beside the input: fine
        (tmp / "ok").write_text("1")
    assert (tmp_path / "elsewhere" / "ok").exists()


def test_an_output_where_nothing_can_be_created_is_one_error_naming_it():
    """/proc refuses new entries with ENOENT: the error names the output, not the temporary name."""
    import pytest

    from asrdist.errors import OutputError
    from asrdist.io.atomic import atomic_path

    for make in (atomic_dir, atomic_path):
        with pytest.raises(OutputError, match=r"^/proc/asrdist-out: cannot write: No such file or directory$"):
            with make("/proc/asrdist-out"):
                pass


def test_an_output_directory_inside_an_input_is_not_replaced(tmp_path):
    """`import-kaldi SRC SRC/train --overwrite` would replace SRC's own train directory."""
    import pytest

    from asrdist.errors import AsrdistError
    from asrdist.io.atomic import check_output_dir

    (tmp_path / "src" / "train").mkdir(parents=True)
    (tmp_path / "src" / "train" / "wav.scp").write_text("u1 /a.wav\n")
    with pytest.raises(AsrdistError, match="lies inside the input"):
        check_output_dir(tmp_path / "src" / "train", overwrite=True, inputs=(tmp_path / "src",))
    assert (tmp_path / "src" / "train" / "wav.scp").is_file()
    check_output_dir(tmp_path / "src" / "new", overwrite=True, inputs=(tmp_path / "src",))  # nothing to delete


def test_json_files_are_strict_json_even_after_a_divergence(tmp_path):
    import json

    from asrdist.io.atomic import write_json_atomic

    write_json_atomic(tmp_path / "s.json", {"loss": float("nan"), "curve": [1.0, float("inf")], "ok": 2})
    text = (tmp_path / "s.json").read_text()
    assert "NaN" not in text and "Infinity" not in text
    assert json.loads(text) == {"loss": None, "curve": [1.0, None], "ok": 2}


def _sigint_disposition() -> str:
    return {signal.SIG_IGN: "ignored", signal.SIG_DFL: "default"}.get(signal.getsignal(signal.SIGINT), "handled")


def test_pool_workers_started_inside_leave_ctrl_c_to_the_parent():
    # Ctrl-C reaches the whole process group: a worker raising KeyboardInterrupt printed a traceback,
    # and one raising between tasks hung the pool's shutdown (asrdist features, 1 Ctrl-C in 8)
    from multiprocessing import get_context

    from asrdist.io.atomic import interrupts_left_to_parent

    handler = signal.getsignal(signal.SIGINT)
    with interrupts_left_to_parent():
        pool = get_context("spawn").Pool(1)
    with pool:
        assert pool.apply(_sigint_disposition) == "ignored"
    assert signal.getsignal(signal.SIGINT) is handler  # the parent's own Ctrl-C is back


def test_ctrl_c_while_the_parser_imports_is_one_line(monkeypatch, capsys):
    from asrdist import cli

    def interrupted(*args):
        raise KeyboardInterrupt

    monkeypatch.setattr(cli, "build_parser", interrupted)
    assert cli.main(["features", "x"]) == 130
    assert capsys.readouterr().err.splitlines() == ["asrdist: interrupted"]


def test_an_output_error_inside_a_temporary_beside_out_names_out(tmp_path):
    # import-kaldi decodes audio into `.OUT.audio.XXXX` beside OUT: a full disk there named that
    import errno

    from asrdist.errors import OutputError
    from asrdist.io.atomic import output_errors

    out = tmp_path / "c"
    with pytest.raises(OutputError) as said, output_errors(out):
        raise OSError(errno.ENOSPC, "No space left on device", str(tmp_path / ".c.audio._8m1l2zr" / "a.wav"))
    assert str(said.value) == f"{out}: cannot write: No space left on device"
    with pytest.raises(OutputError) as said, output_errors(out):  # a file that is not OUT's temporary keeps its name
        raise OSError(errno.EROFS, "Read-only file system", str(tmp_path / ".cc.tmp"))
    assert str(said.value) == f"{tmp_path / '.cc.tmp'}: cannot write: Read-only file system"
