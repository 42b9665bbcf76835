"""The quick loop's guard (conftest.py, quick_loop_guard.py): a test not marked slow that starts a
learner process, a browser or a network namespace fails naming it, whether it starts it itself, in
a fixture, or through a child process that swallows the error; a slow test may."""
from __future__ import annotations

import os
import subprocess
import sys
import xml.etree.ElementTree as ET

import pytest

from tests.support.quick_loop_guard import GUARD_ENV, SITE_DIR, refusal
from tests.support.paths import TESTS

PY = sys.executable


@pytest.mark.parametrize("argv, what", [
    ([PY, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "2", "-m", "asrdist.run.worker", "r"],
     "learner processes"),
    ([PY, "-m", "asrdist.cluster.agent", "--standalone", "--nproc-per-node", "2", "-m", "asrdist.run.worker", "r"],
     "learner processes"),
    (["torchrun", "--nproc-per-node", "2", "train.py"], "learner processes"),
    ([PY, "-m", "asrdist.run.worker", "RUN"], "learner processes"),
    ([PY, "-m", "asrdist.bench.scaling_worker", "x"], "learner processes"),
    ([PY, "-m", "asrdist.cluster.netem_launch", "--function", "m:f", "--result-dir", "d"], "learner processes"),
    ([PY, "-m", "asrdist.cluster.netem_launch", "--learners", "2", "--network", "loopback"], "learner processes"),
    ([PY, "-m", "asrdist.cli", "train", "configs/default.yaml", "--learners", "2"], "an asrdist command that trains"),
    ([PY, "-m", "asrdist", "compare", "configs/default.yaml"], "an asrdist command that trains"),
    (["/venv/bin/asrdist", "bench", "comm", "--json", "x"], "an asrdist command that trains"),
    ("asrdist demo --out d", "an asrdist command that trains"),
    (["/usr/bin/chromium", "--headless", "--dump-dom", "file:///r.html"], "a browser"),
    (["ip", "netns", "add", "asrdist-1-n0"], "a network namespace"),
    (["unshare", "-n", "true"], "a network namespace"),
    ([PY, "-m", "asrdist.cli", "train", "--help"], None),
    ([PY, "-m", "torch.distributed.run", "--help"], None),
    ([PY, "-m", "asrdist.cli", "topology", "--learners", "8"], None),
    (["asrdist", "eval", "RUN", "--split", "test"], None),
    ([PY, "-c", "print('train')"], None),
    (["ip", "link", "show"], None),
    (["bash", "scripts/gpu_check.sh"], None),
])
def test_refusal_names_learners_browsers_namespaces_and_commands_that_train(argv, what):
    why = refusal(argv)
    assert (why if why is None else why.split(" (")[0]) == what, why


INNER = '''
import subprocess, sys
import pytest
import torch.multiprocessing as mp

BROWSER = {browser!r}


def test_learners_here():
    subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "-m", "x"])


def test_spawn_here():
    mp.spawn(print, nprocs=2)


def test_a_child_that_swallows_the_refusal():
    code = ("import subprocess, sys\\n"
            "try:\\n"
            "    subprocess.run([sys.executable, '-m', 'torch.distributed.run', '-m', 'x'])\\n"
            "except BaseException:\\n"
            "    pass\\n")
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


@pytest.fixture(scope="module")
def rendered():
    return subprocess.run([BROWSER, "--headless"], check=True)


def test_browser_in_a_module_fixture(rendered):
    pass


def test_a_quick_child_is_fine():
    assert subprocess.run([sys.executable, "-c", "pass"]).returncode == 0


@pytest.mark.slow
def test_slow_may_start_a_browser():
    subprocess.run([BROWSER, "--headless"], check=True)
'''


def test_guard_fails_unmarked_tests_that_start_learners_or_browsers_and_lets_slow_ones(tmp_path):
    browser = tmp_path / "bin" / "chromium"  # a stand-in: the guard goes by the program's name
    browser.parent.mkdir()
    browser.write_text("#!/bin/sh\nexit 0\n")
    browser.chmod(0o755)
    (tmp_path / "test_inner.py").write_text(INNER.format(browser=str(browser)))
    (tmp_path / "pytest.ini").write_text("[pytest]\nmarkers =\n    slow: slow\naddopts = --strict-markers\n")
    # the inner session is a test run of its own: not inside this test's guard
    env = {k: v for k, v in os.environ.items() if k != GUARD_ENV}
    env["PYTHONPATH"] = os.pathsep.join(p for p in [str(TESTS), str(TESTS.parent), env.get("PYTHONPATH", "")]
                                        if p and p != SITE_DIR and SITE_DIR not in p.split(os.pathsep))
    report = tmp_path / "report.xml"
    done = subprocess.run([PY, "-m", "pytest", "-p", "conftest", "-p", "no:cacheprovider", "-p", "no:xdist",
                           "-c", str(tmp_path / "pytest.ini"), "--rootdir", str(tmp_path), f"--junitxml={report}",
                           "-q", str(tmp_path / "test_inner.py")],
                          cwd=tmp_path, env=env, stdin=subprocess.DEVNULL, capture_output=True, text=True, timeout=240)
    assert report.exists(), done.stdout + done.stderr
    outcome = {}
    for case in ET.parse(report).getroot().iter("testcase"):
        problem = case.find("failure")
        problem = case.find("error") if problem is None else problem
        outcome[case.get("name")] = None if problem is None else problem.get("message", "") + (problem.text or "")
    assert outcome.keys() == {"test_learners_here", "test_spawn_here", "test_a_child_that_swallows_the_refusal",
                              "test_browser_in_a_module_fixture", "test_a_quick_child_is_fine",
                              "test_slow_may_start_a_browser"}, done.stdout
    for name, what in [("test_learners_here", "learner processes ("),
                       ("test_spawn_here", "learner processes (torch.multiprocessing.spawn)"),
                       ("test_a_child_that_swallows_the_refusal", "learner processes ("),
                       ("test_browser_in_a_module_fixture", "a browser (")]:
        assert outcome[name] is not None and "not marked @pytest.mark.slow started " + what in outcome[name], \
            (name, outcome[name])
    assert "[in process" in outcome["test_a_child_that_swallows_the_refusal"]  # reported by the child itself
    assert outcome["test_a_quick_child_is_fine"] is None and outcome["test_slow_may_start_a_browser"] is None, outcome
    assert done.returncode == 1
