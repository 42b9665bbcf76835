"""Adding a strategy touches one module and one registry line: a copy of the package with the toy
strategy (tests/support/toy_strategy.py) as asrdist/parallel/toy.py and one line in `parallel.STRATEGIES`,
and nothing else, trains (`asrdist train`), is compared (`asrdist compare`) and is simulated
(`asrdist simulate`). The commands run as processes on the copy (PYTHONPATH), so the learners they
start import the copy too."""
from __future__ import annotations

import difflib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from tests.support.paths import ROOT, SUPPORT

pytestmark = pytest.mark.slow

CONFIG = ROOT / "configs" / "default.yaml"
REGISTRY_LINE = '    "toy": "asrdist.parallel.toy:TOY",\n'
TINY = ["train.threads=1", "data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.timeout_seconds=60"]


@pytest.fixture(scope="module")
def package_with_toy(tmp_path_factory) -> Path:
    """A copy of the package with the toy strategy added: its module and one registry line."""
    src = tmp_path_factory.mktemp("toy") / "src"
    shutil.copytree(ROOT / "asrdist", src / "asrdist", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(SUPPORT / "toy_strategy.py", src / "asrdist" / "parallel" / "toy.py")
    registry = src / "asrdist" / "parallel" / "__init__.py"
    lines = registry.read_text().splitlines(keepends=True)
    end = lines.index("})\n", next(i for i, line in enumerate(lines) if line.startswith("STRATEGIES")))
    registry.write_text("".join(lines[:end] + [REGISTRY_LINE] + lines[end:]))
    return src


def _changes(src: Path) -> tuple[list[str], list[str]]:
    """(files of the copy that the package lacks, lines changed in files both have)."""
    ours = {p.relative_to(ROOT) for p in (ROOT / "asrdist").rglob("*") if p.is_file() and "__pycache__" not in p.parts}
    theirs = {p.relative_to(src) for p in (src / "asrdist").rglob("*") if p.is_file()}
    changed = []
    for path in sorted(ours & theirs):
        a, b = (ROOT / path).read_bytes(), (src / path).read_bytes()
        if a != b:
            changed += [line for line in difflib.unified_diff(a.decode().splitlines(), b.decode().splitlines(),
                                                               lineterm="", n=0)
                        if line[:1] in "+-" and not line.startswith(("+++", "---"))]
    return sorted(str(p) for p in theirs - ours), changed


def _asrdist(src: Path, *args: str, cwd: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(src)}
    done = subprocess.run([sys.executable, "-m", "asrdist", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, stdin=subprocess.DEVNULL, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return done


def test_the_toy_strategy_is_one_file_and_one_registry_line(package_with_toy):
    assert _changes(package_with_toy) == (["asrdist/parallel/toy.py"], ["+" + REGISTRY_LINE.rstrip("\n")])


@pytest.fixture(scope="module")
def toy_run(package_with_toy, tone_corpus, tmp_path_factory) -> Path:
    """`asrdist train` of the toy strategy (2 learners, 1 epoch) where `asrdist compare` of the same
    recipe keeps its toy run (OUT/toy): the comparison finds it finished and does not train it
    again, so one training serves both tests (compare trains through the same `asrdist train`)."""
    run = tmp_path_factory.mktemp("toy-runs") / "compare" / "toy"
    _asrdist(package_with_toy, "train", str(CONFIG), *TINY, "--data", str(tone_corpus), "--learners", "2",
             "--strategy", "toy", "--epochs", "1", "--out", str(run), "--no-progress", cwd=run.parent.parent)
    return run


def test_the_toy_strategy_trains(toy_run):
    summary = json.loads((toy_run / "summary.json").read_text())
    assert (summary["strategy"], summary["learners"]) == ("toy", 2)
    assert all(p["bytes_sent"] > 0 and p["exchanges"] == summary["steps"] > 0 for p in summary["comm"]["per_learner"])


@pytest.mark.timeout(900)  # calibration, training and scoring as processes: past 300 s on a loaded machine
def test_the_toy_strategy_is_compared(package_with_toy, tone_corpus, toy_run, tmp_path):
    out = toy_run.parent
    done = _asrdist(package_with_toy, "compare", str(CONFIG), *TINY, "train.epochs=1", "--strategies", "toy",
                    "--learners", "2", "--out", str(out), "--data", str(tone_corpus), cwd=tmp_path)
    assert f"toy: finished run {toy_run}, not trained again" in done.stdout, done.stdout[-3000:]  # same recipe
    (compared,) = json.loads((out / "summary.json").read_text())["runs"]
    assert compared["strategy"] == "toy" and compared["mb_sent"] > 0 and compared["frames_per_second"] > 0


def test_the_toy_strategy_is_simulated(package_with_toy, tmp_path):
    _asrdist(package_with_toy, "simulate", "--strategy", "toy", "--cluster", "2x2",
             "--json", str(tmp_path / "sim.json"), cwd=tmp_path)
    prediction = json.loads((tmp_path / "sim.json").read_text())["prediction"]
    assert prediction["name"] == "toy" and prediction["bytes_per_step"] > 0 and prediction["speedup"] > 0
