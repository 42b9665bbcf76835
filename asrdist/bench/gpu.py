"""The measurements of `scripts/gpu_check.sh`, each written as one part of the check's JSON.

`phases` (one learner's compute phases on a device: what the simulator's device presets hold),
`train` (a short real training), `pair` (two learners sharing the device,
`asrdist.bench.gpu_pair`) and `merge` (the parts into one JSON). Commands and what each phase
times: docs/gpu.md#the-checks-measurements-asrdistbenchgpu."""
from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
import xml.etree.ElementTree as ET
from pathlib import Path
from typing import Any, Callable

import torch

from asrdist.checks import compute_device
from asrdist.errors import ConfigError
from asrdist.models.registry import ModelConfig, build_model
from asrdist.parallel.base import DEFAULT_TIMEOUT_SECONDS
from asrdist.parallel.onebit_kernel import (
    SWBD_SHAPES,
    Residual,
    as_columns,
    get_quantizer,
    packed_words,
)
from asrdist.run.summary import RunSummary
from asrdist.sim.cluster import MODELS
from asrdist.utils.leave import leave

SCHEMA = "asrdist-gpu-check/1"
LSTM_BATCHES = (80, 256)
"""Chunks per minibatch timed on the BLSTM: 80 per GPU (IBM ICASSP 2019's HYBRID) and the 256 the
IBM blog calls common; the preset's fixed cost is fitted at the first, checked at the second."""


# ------------------------------------------------------------------------------ helpers

def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def median_seconds(fn: Callable[[], Any], device: torch.device, repeats: int, warmup: int = 2) -> float:
    """Median wall seconds of `fn()` over `repeats` calls after `warmup`, the device synchronised
    before and after each (a CUDA call returns before its kernels have run)."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(max(1, repeats)):
        synchronize(device)
        t0 = time.perf_counter()
        fn()
        synchronize(device)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def reset_peak(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def peak_memory(device: torch.device) -> dict[str, int | None]:
    """Peak GPU memory torch allocated since `reset_peak` (None on a CPU), and this process's peak
    resident memory (the whole process' life: the kernel keeps no other)."""
    gpu = int(torch.cuda.max_memory_allocated(device)) if device.type == "cuda" else None
    return {"peak_gpu_memory_bytes": gpu,
            "peak_host_rss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def device_info(device: torch.device) -> dict[str, Any]:
    info: dict[str, Any] = {"device": str(device), "torch": torch.__version__, "cuda": torch.version.cuda,
                            "threads": torch.get_num_threads(), "cpu_count": os.cpu_count()}
    if device.type == "cuda":
        props = torch.cuda.get_device_properties(device)
        info.update(name=props.name, capability=f"{props.major}.{props.minor}",
                    memory_bytes=int(props.total_memory), multiprocessors=props.multi_processor_count)
        try:
            version = torch.cuda.nccl.version()
            info["nccl"] = ".".join(map(str, version)) if isinstance(version, tuple) else str(version)
        except Exception as exc:  # a build without NCCL
            info["nccl"] = f"none ({type(exc).__name__})"
    else:
        info.update(name="cpu", capability=None, memory_bytes=None, multiprocessors=None, nccl=None)
    return info


# ------------------------------------------------------------------------------- phases

def _frame_model(device: torch.device, quick: bool):
    m = MODELS["swbd"]
    cfg = ModelConfig(name="dnn", hidden_layers=2, hidden_dim=256) if quick else ModelConfig(**m["model"])
    torch.manual_seed(0)
    return build_model(cfg, m["feature_dim"], 500 if quick else m["num_classes"]).to(device)


def _lstm_model(device: torch.device, quick: bool):
    m = MODELS["ibm-lstm"]
    cfg = dict(m["model"])
    if quick:
        cfg.update(hidden_layers=1, hidden_dim=32)
    torch.manual_seed(0)
    return build_model(ModelConfig(**cfg), 40 if quick else m["feature_dim"],
                       100 if quick else m["num_classes"]).to(device), cfg["chunk"]


def _parameters(model: torch.nn.Module) -> int:
    return sum(p.numel() for p in model.parameters() if p.requires_grad)


def _forward_backward_seconds(model, inputs, targets, device, repeats: int, warmup: int = 2) -> tuple[float, float]:
    """Median (forward, backward) seconds of one minibatch with cross-entropy, each timed alone
    with the device synchronised around it (forward: the graph's construction included)."""
    forward, backward = [], []
    for i in range(warmup + max(1, repeats)):
        model.zero_grad(set_to_none=False)
        synchronize(device)
        t0 = time.perf_counter()
        out = model(inputs)
        loss = torch.nn.functional.cross_entropy(out.reshape(-1, out.shape[-1]), targets.reshape(-1))
        synchronize(device)
        t1 = time.perf_counter()
        loss.backward()
        synchronize(device)
        if i >= warmup:
            forward.append(t1 - t0)
            backward.append(time.perf_counter() - t1)
    return statistics.median(forward), statistics.median(backward)


def frame_phases(device: torch.device, quick: bool, repeats: int) -> dict[str, Any]:
    """The Switchboard DNN (Seide 2014) at a minibatch of 1024 frames: forward, backward and the
    SGD update, and the sustained FLOP/s they give at 6 FLOP per parameter and frame."""
    model = _frame_model(device, quick)
    batch = 256 if quick else 1024
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(batch, model.input_dim, generator=gen).to(device)
    y = torch.randint(0, model.num_classes, (batch,), generator=gen).to(device)
    reset_peak(device)
    forward, backward = _forward_backward_seconds(model, x, y, device, repeats)
    both = forward + backward
    opt = torch.optim.SGD(model.parameters(), lr=1e-3, momentum=0.9)
    update = median_seconds(opt.step, device, repeats)
    params = _parameters(model)
    return {"model": "dnn 2x256 (quick)" if quick else "swbd", "parameters": params, "frames": batch,
            "forward_seconds": forward, "backward_seconds": backward, "update_seconds": update,
            "seconds_per_frame": both / batch, "flops": 6.0 * params * batch / both,
            "backward_share": backward / both, **peak_memory(device)}


def recurrent_phases(device: torch.device, quick: bool, repeats: int, flops: float) -> dict[str, Any]:
    """IBM's BLSTM on 21-frame chunks at `LSTM_BATCHES` chunks: forward + backward per minibatch.
    The preset's fixed cost per minibatch is what the first batch takes beyond its frames at the
    DNN's sustained `flops` (the simulator's model: step = fixed + frames x 6 x params / flops);
    the second batch checks that model (`predicted_seconds` beside `seconds`)."""
    model, chunk = _lstm_model(device, quick)
    params = _parameters(model)
    batches = (8, 32) if quick else LSTM_BATCHES
    gen = torch.Generator().manual_seed(0)
    rows = []
    reset_peak(device)
    for b in batches:
        x = torch.randn(b, chunk, model.feature_dim, generator=gen).to(device)
        y = torch.randint(0, model.num_classes, (b, chunk), generator=gen).to(device)
        forward, backward = _forward_backward_seconds(model, x, y, device, repeats)
        rows.append({"chunks": b, "frames": b * chunk, "forward_seconds": forward, "backward_seconds": backward,
                     "seconds": forward + backward})
    per_frame = 6.0 * params / flops
    fixed = rows[0]["seconds"] - rows[0]["frames"] * per_frame
    for r in rows:
        r["predicted_seconds"] = fixed + r["frames"] * per_frame
    (f1, t1), (f2, t2) = [(r["frames"], r["seconds"]) for r in rows]
    slope = (t2 - t1) / (f2 - f1)
    return {"model": f"blstm {model.lstm.num_layers}x{model.lstm.hidden_size}" + (" (quick)" if quick else ""),
            "parameters": params, "chunk": chunk, "batches": rows, "recurrent_step_cost": fixed,
            "fit_seconds_per_frame": slope, "fit_intercept_seconds": t1 - slope * f1, **peak_memory(device)}


QUANTIZE_BYTES = 12.125
"""Bytes a value of quantize + error feedback + pack must move at least: the gradient and the
residual read, the residual written (4 bytes each), its bit written."""
AGGREGATE_BYTES = 8.125
"""Dequantize + aggregate: its bit read, the sum read and written."""


def onebit_phases(device: torch.device, quick: bool, repeats: int) -> dict[str, Any]:
    """`onebit_bucket` with the device's own kernels (`get_quantizer("auto")`); where they fail,
    with the reference, the failure named (`kernel_error`)."""
    try:
        return onebit_bucket(device, quick, repeats, get_quantizer("auto", device))
    except Exception as exc:  # a kernel that does not compile here: the figures of the reference instead
        return {**onebit_bucket(device, quick, repeats, get_quantizer("reference", device)),
                "kernel_error": one_line(exc)}


def onebit_bucket(device: torch.device, quick: bool, repeats: int, quantizer) -> dict[str, Any]:
    """1-bit quantize (with error feedback and packing) and dequantize of the Switchboard DNN's
    gradient as one bucket (one call for all its matrices, as the strategy makes it), in seconds
    per value, with the device's copy bandwidth and the fraction of the floor it gives; the
    average x <- (x + y) / 2 of its parameters; the result checked bit for bit against the
    pure-torch reference quantizer on the same input."""
    shapes = [(512, 256), (256,), (100, 512)] if quick else list(SWBD_SHAPES)
    reference = get_quantizer("reference", device)
    gen = torch.Generator().manual_seed(0)

    def bucket():
        items = []
        for shape in shapes:
            grad = as_columns(torch.randn(shape, generator=gen)).to(device)
            rows, cols = grad.shape
            items.append((grad, Residual(rows, cols, device), [0, cols],
                          [torch.empty(packed_words(rows) * cols, dtype=torch.int32, device=device)],
                          [torch.empty(2 * cols, device=device)]))
        return items

    items = bucket()
    gen.manual_seed(0)
    twins = bucket()  # the same gradients, for the reference
    outs = [torch.zeros_like(grad) for grad, *_ in items]
    deq = [(words, recon, grad.shape[0], bounds, out) for (grad, _, bounds, words, recon), out in zip(items, outs)]
    for _ in range(2):  # two steps: the second folds a non-zero residual in
        quantizer.quantize_bucket(items)
        reference.quantize_bucket(twins)
    synchronize(device)
    exact = all(torch.equal(a[3][0], b[3][0]) and torch.equal(a[4][0].view(torch.int32), b[4][0].view(torch.int32))
                and torch.equal(a[1].last.view(torch.int32), b[1].last.view(torch.int32))
                for a, b in zip(items, twins))
    values = sum(grad.numel() for grad, *_ in items)
    quantize = median_seconds(lambda: quantizer.quantize_bucket(items), device, repeats)
    dequantize = median_seconds(lambda: quantizer.dequantize_bucket(deq), device, repeats)
    aggregate = median_seconds(lambda: quantizer.dequantize_bucket(deq, accumulate=True), device, repeats)
    reference_quantize = median_seconds(lambda: reference.quantize_bucket(twins), device, max(1, repeats // 3), 1)
    x = torch.randn(values, generator=gen).to(device)
    y = torch.randn(values, generator=gen).to(device)
    average = median_seconds(lambda: x.add_(y).mul_(0.5), device, repeats)
    copy = median_seconds(lambda: y.copy_(x), device, repeats)
    bandwidth = 8 * values / copy
    return {"kernel": quantizer.name, "values": values, "matrices": len(items), "bit_exact": exact,
            "quantize_seconds": quantize, "dequantize_seconds": dequantize, "aggregate_seconds": aggregate,
            "reference_quantize_seconds": reference_quantize, "average_seconds": average,
            "copy_bandwidth_bytes_per_second": bandwidth,
            "quantize_floor_fraction": QUANTIZE_BYTES * values / bandwidth / quantize,
            "aggregate_floor_fraction": AGGREGATE_BYTES * values / bandwidth / aggregate,
            "quantize_cost": quantize / values, "dequantize_cost": dequantize / values,
            "copy_cost": average / values}


def phases(device: torch.device, quick: bool, repeats: int) -> dict[str, Any]:
    frame = frame_phases(device, quick, repeats)
    return {"dnn": frame, "lstm": recurrent_phases(device, quick, repeats, frame["flops"]),
            "onebit": onebit_phases(device, quick, repeats)}


def sim_device(part: dict[str, Any]) -> dict[str, float]:
    """The simulator's per-phase figures for a device, from a `phases` part."""
    dnn, lstm, onebit = part["dnn"], part["lstm"], part["onebit"]
    return {"flops": dnn["flops"], "recurrent_step_cost": lstm["recurrent_step_cost"],
            "backward_share": dnn["backward_share"], "quantize_cost": onebit["quantize_cost"],
            "dequantize_cost": onebit["dequantize_cost"], "copy_cost": onebit["copy_cost"]}


# ------------------------------------------------------------------------- real training

def train(device: torch.device, recipe: str, data: str, steps: int, overrides: list[str]) -> dict[str, Any]:
    """`asrdist train RECIPE` for `steps` minibatches, one learner in this process (on CUDA when
    there is one, as asrdist picks it), read back from its summary.json."""
    from asrdist.cli import main as asrdist_main  # here: this module has a main of its own

    with tempfile.TemporaryDirectory(prefix="asrdist-gpu-train-") as tmp:
        out = Path(tmp) / "run"
        reset_peak(device)
        t0 = time.perf_counter()
        code = asrdist_main(["train", recipe, "--data", data, "--out", str(out), "--no-progress",
                     f"train.max_steps={steps}", "train.learners=1", *overrides])
        wall = time.perf_counter() - t0
        if code != 0:
            raise RuntimeError(f"asrdist train {recipe} exited with {code}")
        summary = RunSummary.read(out)
    learner = summary.comm.per_learner[0]
    if learner.device != str(device) and not (device.type == "cuda" and learner.device.startswith("cuda")):
        raise RuntimeError(f"asrdist train {recipe} trained on {learner.device}, not {device}")
    done = int(summary.steps)
    loop = float(learner.stepping_seconds)
    return {"recipe": recipe, "overrides": overrides, "device": learner.device, "model": summary.model,
            "parameters": summary.parameters, "steps": done, "frames": summary.train_frames,
            "frames_per_second": summary.frames_per_second, "seconds_per_step": loop / max(done, 1),
            "compute_seconds_per_step": float(learner.compute_seconds) / max(done, 1),
            "loop_seconds": loop, "wall_seconds": wall, "final": summary.final.to_json(), **peak_memory(device)}


# ------------------------------------------------------------------------- tests, merging

def run_tests(pytest_args: list[str]) -> dict[str, Any]:
    """`pytest -m cuda` (and whatever else is asked) in a child process; its counts from JUnit XML."""
    with tempfile.TemporaryDirectory(prefix="asrdist-gpu-tests-") as tmp:
        xml = Path(tmp) / "junit.xml"
        cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", f"--junitxml={xml}", *pytest_args]
        proc = subprocess.run(cmd, stdin=subprocess.DEVNULL)
        counts = {"tests": 0, "failures": 0, "errors": 0, "skipped": 0}
        if xml.exists():
            for suite in ET.parse(xml).getroot().iter("testsuite"):
                for key in counts:
                    counts[key] += int(suite.get(key, 0))
    passed = counts["tests"] - counts["failures"] - counts["errors"] - counts["skipped"]
    return {"command": " ".join(["pytest", *pytest_args]), "exit_code": proc.returncode, "passed": passed,
            "failed": counts["failures"] + counts["errors"], "skipped": counts["skipped"]}


PARTS = ("tests", "phases", "trainer", "train_dnn", "train_dnn_bf16", "train_dnn_accumulate", "train_ctc_chars",
         "train_ctc_chars_bf16", "pair_gloo", "pair_gloo_ddp", "pair_nccl")
TRAININGS = {"dnn": "train_dnn", "dnn_bf16": "train_dnn_bf16", "dnn_accumulate": "train_dnn_accumulate",
             "ctc_chars": "train_ctc_chars", "ctc_chars_bf16": "train_ctc_chars_bf16"}
"""The check's `training` entries and the parts they come from: each recipe in fp32 and bf16
(`train.precision`), the DNN's also in 4 micro-batches a step (`train.accumulate`)."""
"""The parts of one check, in the order gpu_check.sh makes them; a missing one is an error entry."""


def merge(part_paths: list[Path], mode: str) -> dict[str, Any]:
    parts: dict[str, Any] = {}
    for path in part_paths:
        part = json.loads(Path(path).read_text())
        parts[part["part"]] = part
    for name in PARTS:
        parts.setdefault(name, {"part": name, "error": "no result (the step crashed or was not run; see the log)"})
    ph = parts["phases"].get("result")
    failed = [n for n in PARTS if "error" in parts[n]]
    tests = parts["tests"].get("result") or {}
    if tests.get("exit_code", 0) not in (0, 5) or tests.get("failed"):  # 5: pytest collected no test
        failed.append("tests")
    for name in ("pair_gloo", "pair_gloo_ddp", "pair_nccl"):
        if (parts[name].get("result") or {}).get("status") == "failed":
            failed.append(name)
    return {
        "schema": SCHEMA, "mode": mode,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "host": parts["phases"].get("host") or next((p["host"] for p in parts.values() if "host" in p), None),
        "tests": parts["tests"].get("result"),
        "phases": ph,
        "trainer": parts["trainer"].get("result"),
        "sim_device": sim_device(ph) if ph else None,
        "training": {key: parts[name].get("result") for key, name in TRAININGS.items()},
        "bf16_vs_fp32": {model: precision_ratio(parts[f"train_{model}"].get("result"),
                                                parts[f"train_{model}_bf16"].get("result"))
                         for model in ("dnn", "ctc_chars")},
        "two_learners": {"gloo": parts["pair_gloo"].get("result"), "gloo_ddp": parts["pair_gloo_ddp"].get("result"),
                         "nccl": parts["pair_nccl"].get("result")},
        "seconds": {n: parts[n].get("seconds") for n in PARTS},
        "errors": {n: parts[n]["error"] for n in PARTS if "error" in parts[n]},
        "failed": sorted(set(failed)),
    }


def precision_ratio(fp32: dict | None, bf16: dict | None) -> dict[str, Any] | None:
    """bf16's frames per second over fp32's and both runs' final figures, side by side (None
    when either run is missing)."""
    if not fp32 or not bf16:
        return None
    return {"speedup": bf16["frames_per_second"] / fp32["frames_per_second"],
            "frames_per_second": {"fp32": fp32["frames_per_second"], "bf16": bf16["frames_per_second"]},
            "final": {"fp32": fp32["final"], "bf16": bf16["final"]}}


def one_line(exc: BaseException) -> str:
    text = str(exc).strip()
    return f"{type(exc).__name__}: {text.splitlines()[0] if text else ''}".rstrip(": ")


def write_json(path: Path, value: Any) -> None:
    """Atomically: a reader never sees half a file."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(value, indent=2, sort_keys=False) + "\n")
    os.replace(tmp, path)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asrdist.bench.gpu", description=__doc__.splitlines()[0])
    p.add_argument("step", choices=["tests", "phases", "trainer", "train", "pair", "merge"])
    p.add_argument("--out", required=True, type=Path)
    p.add_argument("--device", default="cuda")
    p.add_argument("--quick", action="store_true", help="small models and tensors (the CPU dry run)")
    p.add_argument("--repeats", type=int, default=5)
    p.add_argument("--name", help="the part's name (train, pair)")
    p.add_argument("--recipe")
    p.add_argument("--data")
    p.add_argument("--steps", type=int, default=300)
    p.add_argument("--set", action="append", default=[], dest="overrides", help="a recipe override KEY=VALUE")
    p.add_argument("--backend", choices=["gloo", "nccl"])
    p.add_argument("--strategy", default="sync")
    p.add_argument("--timeout", type=float, default=DEFAULT_TIMEOUT_SECONDS,
                   help=f"pair: seconds before its learners are stopped (default {DEFAULT_TIMEOUT_SECONDS:g})")
    p.add_argument("--mode", default="cuda", choices=["cuda", "cpu-dry-run"])
    p.add_argument("rest", nargs="*", help="merge: part files; tests: pytest arguments (after --)")
    args = p.parse_args(argv)
    if args.step == "merge":
        result = merge(args.rest, args.mode)
        write_json(args.out, result)
        print(f"asrdist: gpu check: wrote {args.out}" + (f"; failed: {', '.join(result['failed'])}"
                                                          if result["failed"] else ""))
        return 1 if result["failed"] else 0
    name = args.name or args.step
    t0 = time.perf_counter()
    part: dict[str, Any] = {"part": name}
    try:
        device = compute_device(args.device, "--device")
        part["host"] = device_info(device)
        if args.step == "tests":
            part["result"] = run_tests(args.rest)
        elif args.step == "phases":
            part["result"] = phases(device, args.quick, args.repeats)
        elif args.step == "trainer":
            from asrdist.bench.gpu_trainer import trainer_check  # here: only this step profiles

            part["result"] = trainer_check(device, args.quick, args.repeats)
        elif args.step == "train":
            if not (args.recipe and args.data):
                raise ConfigError("train: --recipe and --data are required")
            part["result"] = train(device, args.recipe, args.data, args.steps, args.overrides)
        else:
            if not args.backend:
                raise ConfigError("pair: --backend is required")
            from asrdist.bench.gpu_pair import pair  # here, not at the top: gpu_pair imports this module

            part["result"] = pair(device, args.backend, args.strategy, args.quick, args.steps, args.timeout)
    except Exception as exc:  # recorded in the check's JSON; the script goes on to the next step
        part["error"] = one_line(exc)
        print(f"asrdist: error: gpu check {name}: {part['error']}", file=sys.stderr)
    part["seconds"] = time.perf_counter() - t0
    write_json(args.out, part)
    return 1 if "error" in part else 0


if __name__ == "__main__":
    leave(main())  # without the interpreter's teardown of torch: asrdist.utils.leave
