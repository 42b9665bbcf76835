"""`asrdist bench ngsgd`, `bench trainer` and `bench scaling` end to end, on tiny settings: the JSON
keys the issues name are there and hold sane values (timing targets are the benchmarks' business,
not the tests')."""
from __future__ import annotations

import json

import pytest

from asrdist.cli import main

pytestmark = pytest.mark.slow  # end to end: whole benchmarks, some start learner processes


def test_bench_ngsgd_writes_its_contract(tmp_path):
    out = tmp_path / "ngsgd.json"
    # --swbd-batch 1: the 45M-parameter swbd step costs ~100 ms at any batch, and its checks hold at any;
    # --batch stays 64: the dnn floor_ratio check (abs 2e-4) needs a plain step of several ms against
    # the JSON's 3-decimal rounding of its milliseconds
    assert main(["bench", "ngsgd", "--json", str(out), "--blocks", "1", "--batch", "64", "--swbd-batch", "1",
                 "--swbd-blocks", "1", "--widths", "64", "--learners", "2", "--global-batch", "64",
                 "--average-every", "64"]) == 0
    result = json.loads(out.read_text())
    assert result["step_time_ratio"] > 0 and result["step_time_ratio_target"] == 1.10
    assert result["step_time_ratio_swbd"] > 0 and result["swbd"]["parameters"] == 45_122_648
    dnn = result["dnn"]
    assert dnn["hidden_dim"] == 512 and dnn["parameters"] > 1_000_000
    assert dnn["flop_ratio"] > 1.0  # preconditioning adds work, never removes it
    # the floor is the arithmetic plus the measured eigendecompositions, over the plain step's time
    assert dnn["floor_ratio"] == pytest.approx(
        dnn["flop_ratio"] + dnn["phases_ms"]["eigendecomposition"] / dnn["sgd_step_cpu_ms"], abs=2e-4)
    assert dnn["floor_ratio"] > dnn["flop_ratio"] and result["floor_ratio"] == dnn["floor_ratio"]
    assert set(result["floor_ratio_by_width"]) == {"512", "64"} and result["floor_ratio_swbd"] > 1.0
    assert set(result["step_time_ratio_by_width"]) == {"512", "64"}
    # A narrow layer pays relatively more for the same ranks.
    assert result["flop_ratio_by_width"]["64"] > result["flop_ratio_by_width"]["512"]
    # Averaging every 64 samples with 32 per learner per step averages every other step: one
    # parameter-sized allreduce per 2 steps against one gradient allreduce per step.
    # every width with a target has its verdict beside it: 512 -> 1.25, swbd (2048 wide) -> 1.10, 64 none
    assert result["step_time_ratio_targets"] == {"512": 1.25, "swbd": 1.10}
    assert result["targets_met"] == {"512": result["step_time_ratio"] <= 1.25,
                                     "swbd": result["step_time_ratio_swbd"] <= 1.10}
    # DESIGN.md §7's check, per width and swbd: the step within 0.06 of its floor
    over = {w: result["step_time_ratio_by_width"][w] - result["floor_ratio_by_width"][w] for w in ("512", "64")}
    over["swbd"] = result["step_time_ratio_swbd"] - result["floor_ratio_swbd"]
    assert result["over_floor"] == pytest.approx(over, abs=1e-4)
    assert result["within_floor_margin"] == {w: v <= 0.06 for w, v in result["over_floor"].items()}
    assert result["bytes"]["averages"] == 2
    assert 0.4 < result["bytes_per_sample_ratio"] < 0.6
    assert result["kernel"] == "native"  # `auto` where the compiler is: the compiled preconditioner


def test_bench_trainer_writes_its_contract(tmp_path):
    out = tmp_path / "trainer.json"
    assert main(["bench", "trainer", "--json", str(out), "--utterances", "6", "--rounds", "1"]) == 0
    result = json.loads(out.read_text())
    assert result["trainer_vs_bare"] > 0


def test_bench_scaling_writes_its_contract(tmp_path):
    out = tmp_path / "scaling.json"
    assert main(["bench", "scaling", "--json", str(out), "--network", "loopback", "--learners", "1,2",
                 "--compute-ms", "5", "--local-batch", "64", "--model", "dnn", "--hidden-dim", "32",
                 "--hidden-layers", "1", "--feature-dim", "8", "--num-classes", "5", "--steps", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["network"] == "loopback" and result["cores"] >= 1
    assert set(result["results"]) == {"sync", "onebit"}
    for strategy in ("sync", "onebit"):
        assert set(result["results"][strategy]) == {"1", "2"}
        assert all(fps > 0 for fps in result["results"][strategy].values())
        assert result["speedup"][strategy]["1"] == 1.0
        two = result["details"][strategy]["2"]
        assert two["steps"] == 2 and two["bytes_sent_per_step"] > 0  # two learners do communicate
        assert 0 < two["cpu_seconds_per_step"] < 60  # the process's CPU over the timed steps
    assert result["threads_per_learner"]["2"] >= 1
