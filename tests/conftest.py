"""Fixtures shared by test modules, and the quick loop's guard (support/quick_loop_guard.py): a test not
marked slow that starts a learner process, a browser or a network namespace fails, naming what."""
from __future__ import annotations

import contextlib
import json
import os
import shutil
import tempfile
from collections import Counter
from pathlib import Path

import pytest

# Before torch loads here, and for every process a test starts (they inherit it): OpenMP threads
# that wait passively. libgomp's default spins each of a process' 2 threads after every parallel
# region; with the suite's test processes sharing the machine's 2 cores, that spinning takes the
# cores the others need (measured under load: a 3-epoch tiny in-process `asrdist train`, 35 s CPU
# and 48 s with spinning, 7 s and 8 s passive, same losses). Setdefault: a caller's choice stands.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from tests.support import quick_loop_guard  # noqa: E402  (after the environment above: it leads to torch)
from asrdist.cli import main  # noqa: E402
from tests.support.corpus_fixture import make_tone_corpus  # noqa: E402


@pytest.fixture(scope="session")
def tone_corpus(tmp_path_factory):
    """The tone corpus with features (60 utterances x 4 speakers): the end-to-end training tests'
    small corpus, built once per test session. Tests must not write into it."""
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus", utterances_per_speaker=60, speakers=4)
    assert main(["features", str(path)]) == 0
    return path


@pytest.fixture
def emulated_network_available():
    """Skips a test where this machine cannot build the emulated network (root, iproute2, tc). The
    probe builds a throwaway namespace, so it runs when a test that needs it is set up (only tests
    marked slow do), never while modules are collected for the quick loop."""
    from asrdist.cluster.netem import available

    ok, why = available()
    if not ok:
        pytest.skip(f"emulated network unavailable: {why}")


def pytest_configure(config):
    config.quick_loop_dir = tempfile.mkdtemp(prefix="asrdist-quick-loop-")


def pytest_unconfigure(config):
    shutil.rmtree(getattr(config, "quick_loop_dir", ""), ignore_errors=True)


FILE_SECONDS = Path(__file__).with_name("file_seconds.json")
"""Seconds each test file took in one `make test` (its tests' set-up, call and tear-down), to order
the files by; `ASRDIST_RECORD_FILE_SECONDS=1 make test` writes it again."""


def pytest_collection_modifyitems(session, config, items):
    """The longest files first (FILE_SECONDS; a file not in it counts 10 s per slow test), each
    file's tests in their own order: `make test` hands whole files to its pytest processes in this
    order (--dist loadfile --no-loadscope-reorder; xdist's own order is most tests first), so the
    long files start early and the short ones fill the end, rather than a long file running alone
    at the end while the other processes have finished (2026-11-29, in collection order: one
    process ended 47 s after the others)."""
    seconds = json.loads(FILE_SECONDS.read_text()) if FILE_SECONDS.is_file() else {}
    slow = Counter(item.path for item in items if item.get_closest_marker("slow") is not None)
    weight = {path: seconds.get(path.name, 10.0 * slow[path]) for path in dict.fromkeys(item.path for item in items)}
    rank = {path: k for k, path in enumerate(sorted(weight, key=lambda path: -weight[path]))}  # stable sort
    items.sort(key=lambda item: rank[item.path])


_file_seconds: dict[str, float] = {}


def pytest_runtest_logreport(report):
    if os.environ.get("ASRDIST_RECORD_FILE_SECONDS"):
        name = Path(report.nodeid.split("::")[0]).name
        _file_seconds[name] = _file_seconds.get(name, 0.0) + report.duration


def pytest_sessionfinish(session, exitstatus):
    """With ASRDIST_RECORD_FILE_SECONDS set, the controlling pytest process (which receives every
    test's report) writes FILE_SECONDS after a whole run that passed."""
    if _file_seconds and exitstatus == 0 and not hasattr(session.config, "workerinput"):
        ordered = dict(sorted(((k, round(v, 1)) for k, v in _file_seconds.items()), key=lambda kv: -kv[1]))
        FILE_SECONDS.write_text(json.dumps(ordered, indent=1) + "\n")


@contextlib.contextmanager
def _quick_loop_guard(item: pytest.Item, phase: str):
    """Around one phase of a test not marked slow (its set-up too, so that a module or session
    fixture it is the first to need is guarded as well): refuse learners, browsers, namespaces here
    and in every Python process started meanwhile; fail the test when any was refused."""
    if item.get_closest_marker("slow") is not None:
        yield
        return
    refused: list[str] = []
    children = Path(item.config.quick_loop_dir) / f"{os.getpid()}-{phase}.txt"
    children.unlink(missing_ok=True)
    patch = pytest.MonkeyPatch()
    try:
        patch.setenv(quick_loop_guard.GUARD_ENV, str(children))
        patch.setenv("PYTHONPATH", quick_loop_guard.SITE_DIR, prepend=os.pathsep)
        quick_loop_guard.install(patch, refused.append)
        yield
    finally:
        patch.undo()
        if children.exists():
            refused += children.read_text().splitlines()
            children.unlink()
        if refused:  # replaces whatever the refusal became inside the code under test
            pytest.fail("\n".join(dict.fromkeys(refused)), pytrace=False)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item):
    with _quick_loop_guard(item, "setup"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item):
    with _quick_loop_guard(item, "call"):
        return (yield)


@pytest.hookimpl(wrapper=True)
def pytest_runtest_teardown(item, nextitem):
    with _quick_loop_guard(item, "teardown"):
        return (yield)
