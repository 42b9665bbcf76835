"""asrdist installs into an environment that already holds other versions of its dependencies
within pyproject.toml's ranges, and keeps them: a venv with numpy 1.26.4 (constraints.txt pins
2.4.6) and torch as it lies on local disk gets asrdist by a plain `pip install` (no constraints
file), after which numpy is still 1.26.4, `asrdist --help` runs and asrdist imports and computes.

The torch wheel on this machine's disk is 2.13.0 (the pinned one) only; another torch comes from
the package index as a CUDA build of several GB, too much for a test: that check was made by hand
(torch 2.6.0, README "Installing beside other tools"). This test varies numpy instead."""
from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.support.paths import ROOT

pytestmark = [pytest.mark.slow, pytest.mark.install]  # `make test` leaves it out; .ci/run runs it after

OTHER_NUMPY = "1.26.4"
CHECK = """
import numpy, torch
from asrdist.corpus.phones import inventory
from asrdist.models.objectives import ctc_objective
table = inventory(["a", "ɲ", "tʃ"])
assert table.symbols == ("sil", "a", "tʃ", "ɲ"), table.symbols
log_probs = torch.from_numpy(numpy.log(numpy.full((1, 6, 4), 0.25, dtype=numpy.float32)))
loss, count = ctc_objective(log_probs, torch.tensor([[1, 3]]), [6], [2])
assert count == 6 and 0 < float(loss) < 10, float(loss)
print(numpy.__version__, torch.__version__.split("+")[0])
"""


def _run(args, cwd: Path, timeout: int = 1500) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV")}
    done = subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(map(str, args))}\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done


@pytest.mark.timeout(1800)  # two pip installs of torch and asrdist's dependencies: 13 min at load 20 on 2 cores
def test_asrdist_installs_beside_other_versions_and_keeps_them(tmp_path: Path):
    venv = tmp_path / "venv"
    _run([sys.executable, "-m", "venv", str(venv)], tmp_path)
    pip, python = venv / "bin" / "pip", venv / "bin" / "python"
    # the environment as another tool left it: its numpy, and torch (the CPU build on local disk)
    _run([pip, "install", "-q", f"numpy=={OTHER_NUMPY}", "torch==2.13.0"], tmp_path)
    _run([pip, "install", "-q", str(ROOT)], tmp_path)  # no constraints file: pyproject's ranges alone
    versions = _run([python, "-c", "import numpy, torch; print(numpy.__version__, torch.__version__)"], tmp_path)
    assert versions.stdout.split()[0] == OTHER_NUMPY  # kept, not upgraded to the pinned 2.4.6
    assert "usage: asrdist" in _run([venv / "bin" / "asrdist", "--help"], tmp_path).stdout
    out = _run([python, "-c", CHECK], tmp_path).stdout.split()  # from tmp_path: the installed asrdist, not ROOT's
    assert out[0] == OTHER_NUMPY and out[1] == "2.13.0"
    where = _run([python, "-c", "import asrdist; print(asrdist.__file__)"], tmp_path).stdout.strip()
    assert Path(where).is_relative_to(venv)
