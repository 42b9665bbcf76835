"""A real one-learner run beside busy processes is flagged contended in its summary.json: its
learner received far less CPU than its cores' worth (issue 58, item 3). The run trains in this
process (`asrdist train` of `single`); the busy processes are `yes`, two per core."""
from __future__ import annotations

import os
import subprocess

import pytest

from asrdist.cli import main
from asrdist.run.summary import RunSummary
from tests.support.corpus_fixture import RECIPE, TINY, tone_corpus_with_features

pytestmark = pytest.mark.slow  # trains end to end beside busy processes: tens of seconds


def test_a_run_beside_busy_processes_is_flagged(tmp_path):
    corpus = tone_corpus_with_features(tmp_path / "corpus")
    busy = [subprocess.Popen(["yes"], stdout=subprocess.DEVNULL) for _ in range(2 * len(os.sched_getaffinity(0)))]
    try:
        assert main(["train", RECIPE, *TINY, "train.threads=0", "--data", str(corpus), "--out",
                     str(tmp_path / "run")]) == 0
    finally:
        for process in busy:
            process.kill()
            process.wait()
    summary = RunSummary.read(tmp_path / "run")
    assert summary.contended is True and summary.cpu_share < 0.8, summary.cpu_received
    assert summary.load["start"] is not None and summary.load["cores"] == len(os.sched_getaffinity(0))
    (learner,) = summary.comm.per_learner
    assert learner.cpu_seconds > 0 and learner.cpu_wait_seconds > 0
