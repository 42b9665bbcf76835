"""Device presets measured by `scripts/gpu_check.sh`, beside the papers' calibrated ones.

`asrdist.sim.cluster.DEVICES` holds the K20X, P100 and V100 as the seeds' figures calibrate them.
A measured preset is a file `asrdist/sim/measured_presets/NAME.json`: the `sim_device` figures of one GPU
check (sustained FLOP/s of the Switchboard DNN, the BLSTM's fixed cost per minibatch, the 1-bit
and averaging costs per value) and what they were measured on. A slot has a file only once the
check has run on that GPU (`h100` and `h200` were measured on 2026-11-27: docs/gpu.md); `add`
writes one from the check's JSON:

    python -m asrdist.sim.measured add h100 gpu_check.json
    asrdist simulate --device h100 ...        # labelled "measured ..." in the preset list

`SLOTS` names the accelerators expected; `all_devices()` is what `asrdist simulate --device` takes.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from asrdist.errors import ConfigError, DataError
from asrdist.sim.cluster import DEVICES, Device

MEASURED_DIR = Path(__file__).with_name("measured_presets")
SLOTS = {"h100": "NVIDIA H100 (80 GB), the device machine nvidia-h100-x1",
         "h200": "NVIDIA H200 (141 GB), the device machine nvidia-h200"}
"""Presets the GPU check is expected to fill; a slot without a file is absent, not guessed."""
FIGURES = ("flops", "recurrent_step_cost", "backward_share", "quantize_cost", "dequantize_cost", "copy_cost")
SCHEMA = "asrdist-gpu-check/1"


@dataclass(frozen=True)
class MeasuredDevice:
    """A measured preset: the simulator's `Device` (its `source` says measured, on what, when) and
    the per-value costs a `SimSpec` takes besides it."""

    device: Device
    recurrent_step_cost: float
    """Seconds a BLSTM minibatch of 80 chunks takes beyond its frames at `flops`: recorded, not simulated
    (the simulator keeps no per-minibatch knob; `asrdist simulate --validate`)."""
    backward_share: float
    quantize_cost: float
    dequantize_cost: float
    copy_cost: float
    measured_on: str
    mode: str


def preset_from_check(check: dict[str, Any], where: str, *, allow_dry_run: bool = False) -> MeasuredDevice:
    """The preset a GPU check's JSON gives; a dry run's CPU figures only with `allow_dry_run`."""
    if not isinstance(check, dict) or check.get("schema") != SCHEMA:
        raise DataError(f"{where}: not a GPU check's JSON (schema {SCHEMA!r})")
    mode = check.get("mode")
    if mode != "cuda" and not allow_dry_run:
        raise DataError(f"{where}: measured in mode {mode!r}, not on a GPU: a CPU dry run gives no GPU preset")
    figures = check.get("sim_device")
    if not isinstance(figures, dict) or set(FIGURES) - set(figures):
        raise DataError(f"{where}: sim_device lacks {', '.join(sorted(set(FIGURES) - set(figures or {})))} "
                        f"(its phases step failed: {check.get('errors', {}).get('phases', 'see the check')})")
    for key in FIGURES:
        value = figures[key]
        if not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
            raise DataError(f"{where}: sim_device.{key} is {value!r}, not a finite figure >= 0")
    if not figures["flops"] > 0 or not 0 < figures["backward_share"] < 1:
        raise DataError(f"{where}: sim_device needs flops > 0 and 0 < backward_share < 1, got "
                        f"{figures['flops']!r} and {figures['backward_share']!r}")
    host = check.get("host") or {}
    on = f"{host.get('name', '?')} (torch {host.get('torch', '?')}, CUDA {host.get('cuda')})"
    label = "measured" if mode == "cuda" else "measured in a CPU dry run"
    source = (f"{label} by scripts/gpu_check.sh on {on}, {check.get('created', '?')}: sustained FLOP/s of the "
              f"Switchboard DNN's forward + backward at 1024 frames; fixed cost per BLSTM minibatch of 80 chunks "
              f"beyond its frames at that rate")
    return MeasuredDevice(Device(float(figures["flops"]), source), float(figures["recurrent_step_cost"]),
                          float(figures["backward_share"]), float(figures["quantize_cost"]),
                          float(figures["dequantize_cost"]), float(figures["copy_cost"]), on, str(mode))


def read_check(path: Path) -> dict[str, Any]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        raise DataError(f"{path}: no such file") from None
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise DataError(f"{path}: not readable JSON ({exc})") from None


def measured_devices(directory: Path | None = None) -> dict[str, MeasuredDevice]:
    """Every measured preset on file, by name (none until a GPU check was added)."""
    directory = MEASURED_DIR if directory is None else Path(directory)
    return {p.stem: preset_from_check(read_check(p), str(p), allow_dry_run=True)
            for p in sorted(directory.glob("*.json"))}


def all_devices() -> dict[str, Device]:
    """The papers' presets and the measured ones: what `asrdist simulate --device` takes."""
    return {**DEVICES, **{name: m.device for name, m in measured_devices().items()}}


def add(name: str, check_path: Path, directory: Path | None = None, *, allow_dry_run: bool = False) -> Path:
    """Write the preset NAME from a GPU check's JSON (atomically); returns its file."""
    if name in DEVICES:
        raise ConfigError(f"add: {name!r} is a calibrated preset of the papers' GPUs; name the measured one "
                          f"otherwise (slots: {', '.join(SLOTS)})")
    if not name.replace("-", "").replace("_", "").isalnum():
        raise ConfigError(f"add: a preset name is letters, digits, '-' and '_', got {name!r}")
    check = read_check(check_path)
    preset_from_check(check, str(check_path), allow_dry_run=allow_dry_run)  # refuses what it cannot load
    directory = MEASURED_DIR if directory is None else Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    keep = {k: check.get(k) for k in ("schema", "mode", "created", "host", "sim_device", "phases")}
    path = directory / f"{name}.json"
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(json.dumps(keep, indent=2) + "\n")
    os.replace(tmp, path)
    return path


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asrdist.sim.measured", description="measured device presets")
    sub = p.add_subparsers(dest="command", required=True)
    a = sub.add_parser("add", help="write preset NAME from scripts/gpu_check.sh's JSON")
    a.add_argument("name")
    a.add_argument("check", type=Path)
    a.add_argument("--dir", type=Path, default=None, help=f"default {MEASURED_DIR}")
    a.add_argument("--allow-dry-run", action="store_true", help="accept a CPU dry run's figures (tests)")
    s = sub.add_parser("show", help="list the measured presets and their slots")
    s.add_argument("--dir", type=Path, default=None)
    args = p.parse_args(argv)
    try:
        if args.command == "add":
            path = add(args.name, args.check, args.dir, allow_dry_run=args.allow_dry_run)
            print(f"asrdist: measured preset {args.name!r} written to {path}")
            return 0
        found = measured_devices(args.dir)
        for name in sorted(set(SLOTS) | set(found)):
            m = found.get(name)
            print(f"{name}: " + (f"{m.device.flops / 1e12:.2f} TFLOP/s sustained, "
                                 f"{m.recurrent_step_cost * 1e3:.3f} ms per BLSTM minibatch; {m.device.source}"
                                 if m else f"not measured yet ({SLOTS[name]}): run scripts/gpu_check.sh there"))
        return 0
    except (ConfigError, DataError) as exc:
        print(f"asrdist: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
