"""Learners keep freed memory (`asrdist.utils.memory`): counted in page faults per training step,
not timed. Each case runs in its own process, since malloc's settings are per process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap

import pytest

from asrdist.utils import memory

STEPS = textwrap.dedent("""
    import json, resource, sys, tempfile
    from pathlib import Path
    import torch
    from asrdist.bench.ngsgd import build_learners
    from asrdist.models.registry import ModelConfig
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as run_dir:
        learner = build_learners(ModelConfig(name="dnn", hidden_dim=512), 40, 40, 256, Path(run_dir))["sgd"]
        step = lambda: learner.trainer.train_step(learner.task.batch)
        for _ in range(3):
            step()
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(10):
            step()
        print(json.dumps((resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / 10))
""")


def _faults_per_step(env: dict) -> float:
    out = subprocess.run([sys.executable, "-c", STEPS], env=env, capture_output=True, text=True, timeout=600)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


@pytest.mark.slow  # two processes, each building a learner and training it for 13 steps
@pytest.mark.skipif(not sys.platform.startswith("linux"), reason="glibc's malloc settings")
def test_learners_stop_refaulting_the_pages_they_free():
    env = {k: v for k, v in os.environ.items() if k not in memory.USER_VARIABLES}
    kept = _faults_per_step(env)
    # glibc's own variable set by the user wins: asrdist leaves malloc as the user asked
    returned = _faults_per_step({**env, "MALLOC_TRIM_THRESHOLD_": "131072"})
    assert kept <= returned / 4 + 5, (kept, returned)


def test_the_users_own_malloc_variables_win(monkeypatch):
    monkeypatch.setenv("MALLOC_MMAP_THRESHOLD_", "65536")
    assert memory.keep_freed_memory() is False
