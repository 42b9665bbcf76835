"""Does a host's step take its 1-core time / quota? The check behind `asrdist.sim.dedicated`.

    python -m asrdist.calibrate.quota [--quotas 0.5,0.25] [--steps 40] [--frames 32] [--json OUT]

1. a child process on 1 thread times `--steps` SGD steps of the default recipe's model (the DNN of
   configs/default.yaml on random spliced frames, `--frames` a step), with no quota: the 1-core cost;
2. the same child in a cgroup of each quota (`cpushare.HostCpuShares`), its group's counters read;
3. for each quota: the measured step over (1-core step / quota), and the CPU the step used.
Needs cgroups it can write (as `--cpus-per-host` does); a loaded machine slows every figure.
"""
from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
from pathlib import Path

from asrdist.checks import cli_list, cli_number
from asrdist.cluster import cpushare
from asrdist.errors import ConfigError
from asrdist.utils.environ import child_environment

CHILD = r"""
import json, sys, time, torch
from asrdist.config import load_config
from asrdist.models.registry import build_model
from asrdist.train.synthetic import random_frames
torch.set_num_threads(1)
steps, frames, config = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
cfg = load_config(config, [])
mel, classes = cfg.data.num_mel_bins, 40  # the espeak corpus' phones
model = build_model(cfg.model, mel, classes)
opt = torch.optim.SGD(model.parameters(), lr=0.01, momentum=0.9)
batch = random_frames(frames, mel * (2 * cfg.model.context + 1), classes)  # spliced frames
def step():
    opt.zero_grad()
    torch.nn.functional.cross_entropy(model(batch.inputs), batch.targets).backward()
    opt.step()
for _ in range(3):
    step()
c0, t0 = time.process_time(), time.perf_counter()
for _ in range(steps):
    step()
print(json.dumps({"step_seconds": (time.perf_counter() - t0) / steps, "cpu_seconds": (time.process_time() - c0) / steps,
                  "parameters": sum(p.numel() for p in model.parameters())}))
"""
DEFAULT_CONFIG = Path(__file__).resolve().parents[2] / "configs" / "default.yaml"


def _child(steps: int, frames: int, config: Path, preexec=None) -> dict:
    env = child_environment(OMP_NUM_THREADS="1")
    done = subprocess.run([sys.executable, "-c", CHILD, str(steps), str(frames), str(config)], capture_output=True,
                          text=True, env=env, preexec_fn=preexec, timeout=1800)
    if done.returncode != 0:
        last = (done.stderr.strip().splitlines() or ["?"])[-1]
        raise ConfigError(f"calibrate quota: the timing child failed: {last}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def measure(quotas: list[float], steps: int, frames: int, config: Path = DEFAULT_CONFIG) -> dict:
    """Steps 1-3 of the module docstring."""
    ok, reason = cpushare.available()
    if not ok:
        raise ConfigError(f"calibrate quota: dedicated CPU shares: {reason}")
    load = {"before": list(os.getloadavg())}
    alone = _child(steps, frames, config)
    rows = []
    for quota in quotas:
        with cpushare.HostCpuShares([quota]) as shares:
            timed = _child(steps, frames, config, shares.preexec(0))
            usage = shares.usage(0)
        expected = alone["step_seconds"] / quota
        rows.append({"quota": quota, "step_seconds": timed["step_seconds"],
                     "cpu_seconds_per_step": timed["cpu_seconds"],
                     "predicted_step_seconds": expected, "measured_over_predicted": timed["step_seconds"] / expected,
                     "group_cpu_seconds": usage.cpu_seconds, "group_throttled_seconds": usage.throttled_seconds})
    load["after"] = list(os.getloadavg())
    return {"one_core": alone, "quotas": rows, "steps": steps, "frames": frames, "config": str(config),
            "load_average": load, "cores": len(os.sched_getaffinity(0))}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asrdist.calibrate.quota", description=__doc__.splitlines()[0])
    p.add_argument("--quotas", type=cli_list(float, above=0), default=[0.5, 0.25])
    p.add_argument("--steps", type=cli_number(int, at_least=1), default=40)
    p.add_argument("--frames", type=cli_number(int, at_least=1), default=32)
    p.add_argument("--json", type=Path, default=None)
    args = p.parse_args(argv)
    result = measure(args.quotas, args.steps, args.frames)
    for row in result["quotas"]:
        print(f"quota {row['quota']:g}: step {1e3 * row['step_seconds']:.1f} ms, 1-core / quota "
              f"{1e3 * row['predicted_step_seconds']:.1f} ms (x{row['measured_over_predicted']:.2f})")
    print(f"1 core: step {1e3 * result['one_core']['step_seconds']:.1f} ms; load {result['load_average']}")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
