"""scripts/gpu_check.sh: its dry run on the CPU end to end (the JSON the GPU run writes, same
keys), its bad usage, and the merging of its parts."""
from __future__ import annotations

import json
import math
import os
import subprocess
import sys

import pytest

from asrdist.bench import gpu, gpu_pair
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.paths import ROOT

SCRIPT = ROOT / "scripts" / "gpu_check.sh"
SIM_KEYS = {"flops", "recurrent_step_cost", "backward_share", "quantize_cost", "dequantize_cost", "copy_cost"}


def _run(args, env=None, timeout=2300):
    return subprocess.run(["bash", str(SCRIPT), *args], cwd=ROOT, stdin=subprocess.DEVNULL, capture_output=True,
                          text=True, timeout=timeout, env={**os.environ, **(env or {})})


@pytest.mark.parametrize("args,env,what", [
    (["--fast"], {}, "unknown option --fast"),
    ([], {"ASRDIST_GPU_CHECK_DEVICE": "tpu"}, "must be cpu or cuda"),
])
def test_bad_usage_is_one_line_and_exit_2(tmp_path, args, env, what):
    out = tmp_path / "check.json"
    proc = _run([*args, str(out)], env)
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [proc.stderr.strip()] and proc.stderr.startswith("asrdist: error:")
    assert what in proc.stderr and not out.exists()


def _part(tmp_path, name, **fields):
    path = tmp_path / f"{name}.json"
    path.write_text(json.dumps({"part": name, "seconds": 1.0, **fields}))
    return path


def test_merge_names_every_missing_or_failed_part(tmp_path):
    parts = [_part(tmp_path, "tests", result={"exit_code": 1, "passed": 3, "failed": 1, "skipped": 0}),
             _part(tmp_path, "pair_gloo", result={"status": "failed", "reason": "boom"}),
             _part(tmp_path, "pair_nccl", result={"status": "refused", "reason": "Duplicate GPU detected"}),
             _part(tmp_path, "train_dnn", error="RuntimeError: asrdist train exited with 1")]
    merged = gpu.merge(parts, "cuda")
    missing = {"pair_gloo_ddp", "phases", "train_ctc_chars", "train_ctc_chars_bf16", "train_dnn",
               "train_dnn_accumulate", "train_dnn_bf16", "trainer"}
    assert merged["failed"] == sorted({"pair_gloo", "tests", *missing})
    assert set(merged["errors"]) == missing
    assert merged["bf16_vs_fp32"] == {"dnn": None, "ctc_chars": None}
    assert merged["sim_device"] is None and merged["phases"] is None
    assert merged["two_learners"]["nccl"]["status"] == "refused"  # reported, not a failure


def test_merge_from_the_command_line_writes_one_json(tmp_path):
    parts = [_part(tmp_path, name, result={"status": "ok"}) for name in ("pair_gloo", "pair_nccl")]
    out = tmp_path / "out" / "check.json"
    assert gpu.main(["--mode", "cpu-dry-run", "--out", str(out), "merge", *map(str, parts)]) == 1  # parts missing
    merged = json.loads(out.read_text())
    assert merged["mode"] == "cpu-dry-run" and merged["two_learners"]["gloo"] == {"status": "ok"}
    assert "tests" in merged["failed"] and "pair_gloo" not in merged["failed"]


@pytest.mark.parametrize("reason,status", [
    ("DistBackendError: NCCL error: invalid usage, Duplicate GPU detected : rank 1 and rank 0 both on CUDA device",
     "refused"),
    ("CommError: rank 0: broadcast failed: Connection closed by peer", "failed"),
])
def test_a_backend_that_refuses_one_device_is_reported_not_failed(reason, status):
    assert gpu_pair.pair_status("nccl", reason) == status
    assert gpu_pair.pair_status("gloo", reason) == "failed"


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    base = tmp_path_factory.mktemp("gpu-check")
    corpus = make_tone_corpus(base / "corpus", utterances_per_speaker=10, speakers=4)
    out = base / "out" / "gpu_check.json"
    proc = _run([str(out)], {"ASRDIST_GPU_CHECK_DEVICE": "cpu", "ASRDIST_GPU_CHECK_CORPUS": str(corpus),
                             "ASRDIST_GPU_CHECK_PYTHON": sys.executable})
    return proc, out


@pytest.mark.slow
@pytest.mark.timeout(2400)  # the dry run's steps, each under its own limit (scripts/gpu_check.sh); a hang ends here
def test_the_dry_run_on_the_cpu_writes_the_checks_json(dry_run):
    proc, out = dry_run
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    result = json.loads(out.read_text())
    assert result["schema"] == gpu.SCHEMA and result["mode"] == "cpu-dry-run"
    assert result["failed"] == [] and result["errors"] == {}
    assert result["host"]["device"] == "cpu" and result["host"]["torch"]
    tests = result["tests"]  # every test marked cuda was collected and skipped here
    assert tests["exit_code"] == 0 and tests["failed"] == 0 and tests["skipped"] >= 5 and tests["passed"] == 0
    assert set(result["sim_device"]) == SIM_KEYS
    assert all(math.isfinite(v) for v in result["sim_device"].values())
    assert result["sim_device"]["flops"] > 0 and 0 < result["sim_device"]["backward_share"] < 1
    assert result["sim_device"]["quantize_cost"] > 0 and result["sim_device"]["copy_cost"] > 0
    onebit = result["phases"]["onebit"]  # the bucket, checked against the reference, and its floors
    assert onebit["bit_exact"] is True and onebit["matrices"] == 3 and "kernel_error" not in onebit
    assert 0 < onebit["quantize_floor_fraction"] and 0 < onebit["aggregate_floor_fraction"]
    assert onebit["reference_quantize_seconds"] > 0 and onebit["copy_bandwidth_bytes_per_second"] > 0
    trainer = result["trainer"]  # bench trainer on the device, with where the asrdist side's time goes
    assert trainer["device"] == "cpu" and trainer["trainer_vs_bare"] > 0 and len(trainer["rounds"]["asrdist"]) == 1
    assert "tottime" in trainer["python_profile"][0] and len(trainer["python_profile"]) > 5  # pstats' rows
    assert set(trainer["runtime_calls"]) == {"asrdist", "bare"}
    for name, steps in (("dnn", 20), ("dnn_bf16", 20), ("dnn_accumulate", 20), ("ctc_chars", 4),
                        ("ctc_chars_bf16", 4)):
        run = result["training"][name]
        assert run["steps"] == steps and run["frames_per_second"] > 0 and run["device"] == "cpu"
        assert run["seconds_per_step"] > 0 and "peak_gpu_memory_bytes" in run
    assert result["training"]["dnn_bf16"]["overrides"][-1] == "train.precision=bf16"
    assert result["training"]["dnn_accumulate"]["overrides"][-1] == "train.accumulate=4"
    for model in ("dnn", "ctc_chars"):
        ratio = result["bf16_vs_fp32"][model]
        assert ratio["speedup"] > 0 and set(ratio["final"]) == {"fp32", "bf16"}
    gloo, nccl = result["two_learners"]["gloo"], result["two_learners"]["nccl"]
    for pair in (gloo, result["two_learners"]["gloo_ddp"]):
        assert pair["status"] == "ok" and pair["consensus"] and pair["frames_per_second"] > 0
        assert [r["device"] for r in pair["learners"]] == ["cpu", "cpu"]
    assert result["two_learners"]["gloo_ddp"]["strategy"] == "ddp"
    assert nccl["status"] == "unavailable"
    assert set(result["seconds"]) == set(gpu.PARTS)


# ----------------------------------------------------- the simulator's measured device presets

def _check(**sim):
    figures = {"flops": 3e13, "recurrent_step_cost": 0.004, "backward_share": 0.66, "quantize_cost": 1e-11,
               "dequantize_cost": 1e-11, "copy_cost": 2e-12, **sim}
    return {"schema": gpu.SCHEMA, "mode": "cuda", "created": "2026-11-27T08:00:00Z",
            "host": {"name": "NVIDIA H100 80GB HBM3", "torch": "2.11.0+cu130", "cuda": "13.0"}, "sim_device": figures}


@pytest.mark.parametrize("check,what", [
    ({"schema": "other"}, "not a GPU check's JSON"),
    ({**_check(), "mode": "cpu-dry-run"}, "a CPU dry run gives no GPU preset"),
    ({**_check(), "sim_device": None, "errors": {"phases": "RuntimeError: CUDA out of memory"}}, "CUDA out of memory"),
    (_check(recurrent_step_cost=-0.001), "sim_device.recurrent_step_cost is -0.001"),
    (_check(flops=float("nan")), "sim_device.flops is nan"),
    (_check(backward_share=1.5), "0 < backward_share < 1"),
])
def test_a_check_that_gives_no_preset_is_refused_naming_why(tmp_path, capsys, check, what):
    from asrdist.sim import measured

    path = tmp_path / "check.json"
    path.write_text(json.dumps(check))
    assert measured.main(["add", "h100", str(path), "--dir", str(tmp_path / "presets")]) == 2
    err = capsys.readouterr().err
    assert err.startswith("asrdist: error: ") and what in err and len(err.strip().splitlines()) == 1
    assert not (tmp_path / "presets" / "h100.json").exists()


def test_no_preset_is_measured_until_the_check_ran_on_the_gpu(tmp_path, capsys):
    from asrdist.sim import measured

    assert measured.main(["show", "--dir", str(tmp_path)]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert [line.split(":")[0] for line in lines] == sorted(measured.SLOTS)
    assert all("not measured yet" in line for line in lines)
    assert measured.main(["add", "v100", str(tmp_path / "x.json"), "--dir", str(tmp_path)]) == 2
    assert "calibrated preset" in capsys.readouterr().err


def test_a_measured_preset_is_labelled_and_simulated(tmp_path, monkeypatch, capsys):
    from asrdist.cli import main
    from asrdist.sim import measured

    (tmp_path / "check.json").write_text(json.dumps(_check()))
    assert measured.main(["add", "h100", str(tmp_path / "check.json"), "--dir", str(tmp_path / "p")]) == 0
    preset = measured.measured_devices(tmp_path / "p")["h100"]
    assert preset.device.flops == 3e13 and preset.recurrent_step_cost == 0.004
    assert preset.device.source.startswith("measured by scripts/gpu_check.sh on NVIDIA H100 80GB HBM3")
    monkeypatch.setattr(measured, "MEASURED_DIR", tmp_path / "p")
    capsys.readouterr()
    assert main(["simulate", "--device", "h100", "--strategy", "sync", "--cluster", "2", "--model", "ibm-lstm",
                 "--json", str(tmp_path / "sim.json")]) == 0
    faster = json.loads((tmp_path / "sim.json").read_text())
    assert main(["simulate", "--device", "v100", "--strategy", "sync", "--cluster", "2", "--model", "ibm-lstm",
                 "--json", str(tmp_path / "v100.json")]) == 0
    v100 = json.loads((tmp_path / "v100.json").read_text())
    assert json.dumps(faster) != json.dumps(v100)  # the preset reached the simulation


@pytest.mark.slow
@pytest.mark.timeout(2400)
def test_the_loader_reads_the_dry_runs_json(dry_run, tmp_path, capsys):
    from asrdist.sim import measured

    _, out = dry_run
    assert measured.main(["add", "h100", str(out), "--dir", str(tmp_path)]) == 2  # not a GPU's figures
    assert "CPU dry run" in capsys.readouterr().err
    check = json.loads(out.read_text())
    if check["sim_device"]["recurrent_step_cost"] < 0:  # a loaded CPU's noise can give one: refused, named
        assert measured.main(["add", "cpu-dry", str(out), "--dir", str(tmp_path), "--allow-dry-run"]) == 2
        assert "sim_device.recurrent_step_cost" in capsys.readouterr().err
        return
    assert measured.main(["add", "cpu-dry", str(out), "--dir", str(tmp_path), "--allow-dry-run"]) == 0
    preset = measured.measured_devices(tmp_path)["cpu-dry"]
    assert preset.device.flops == check["sim_device"]["flops"] and preset.mode == "cpu-dry-run"
    assert preset.device.source.startswith("measured in a CPU dry run by scripts/gpu_check.sh on cpu")


@pytest.mark.parametrize("name,gpu", [("h100", "NVIDIA H100"), ("h200", "NVIDIA H200")])
def test_a_shipped_preset_is_the_gpu_checks_measurement(name, gpu):
    """Each shipped preset is what the check measured on that GPU (docs/measured/gpu_check_NAME.json,
    every step passed), labelled measured, and `asrdist simulate --device NAME` takes it."""
    from asrdist.sim import measured

    preset = measured.measured_devices()[name]
    check = json.loads((ROOT / "docs" / "measured" / f"gpu_check_{name}.json").read_text())
    assert check["mode"] == "cuda" and check["host"]["name"].startswith(gpu) and not check["failed"]
    assert preset.mode == "cuda" and preset.device.source.startswith(f"measured by scripts/gpu_check.sh on {gpu}")
    assert preset.device.flops == check["sim_device"]["flops"]
    assert measured.all_devices()[name] == preset.device
