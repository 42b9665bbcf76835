"""The mixing ADPSGD's patterns really have (docs/strategies.md#the-mixing-that-happened): train
with N learners, fixed and random rings, all learners equally fast and one active 3x slower, and
print each run's summary.json `gossip` (the spectral gap rebuilt from the exchanges it recorded,
the lock-step schedule's over as many rounds, the pattern's exact figure) as one JSON line.

  python scripts/gossip_mixing.py CORPUS OUT_DIR [N ...]      (default N: 8 16)

CORPUS: an asrdist corpus with features. Compute is emulated (`train.emulate_compute_ms`, the
straggler's `slowdown` times longer), so N learners on a few cores keep their declared speeds."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

RECIPE = ["model.hidden_dim=32", "model.hidden_layers=1", "data.batch_size=128", "train.log_every=1000",
          "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.emulate_compute_ms=20"]
SLOW = 3.0


def run(corpus: str, out: Path, learners: int, pattern: str, straggler: bool) -> dict:
    name = f"n{learners}-{pattern}-{'slow' if straggler else 'even'}"
    extra = [f"train.straggler.ranks=[{learners - 2}]", f"train.straggler.slowdown={SLOW}"] if straggler else []
    subprocess.run([sys.executable, "-m", "asrdist.cli", "train", "configs/default.yaml", *RECIPE, *extra,
                    f"strategy.pattern={pattern}", "--strategy", "adpsgd", "--data", corpus, "--learners",
                    str(learners), "--epochs", "1", "--out", str(out / name), "--no-progress"],
                   check=True, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL)
    summary = json.loads((out / name / "summary.json").read_text())
    steps = {p["rank"]: p["steps"] for p in summary["comm"]["per_learner"]}
    return {"run": name, "learners": learners, "pattern": pattern,
            "slow_active": learners - 2 if straggler else None, "steps_min_max": [min(steps.values()), max(steps.values())],
            **{k: summary["gossip"][k] for k in ("exchanges", "rounds", "exchanges_per_active", "spectral_gap",
                                                   "spectral_gap_lockstep", "spectral_gap_expected")}}


def main(argv: list[str]) -> int:
    if len(argv) < 2:
        print(__doc__, file=sys.stderr)
        return 2
    corpus, out = argv[0], Path(argv[1])
    for learners in [int(n) for n in argv[2:]] or [8, 16]:
        for straggler in (False, True):
            for pattern in ("fixed", "random"):
                print(json.dumps(run(corpus, out, learners, pattern, straggler)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
