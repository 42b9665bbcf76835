#!/usr/bin/env bash
# Issue 5's experiment (DESIGN.md §5.4): the same learners, corpus and epochs with
#   sync             configs/default.yaml --strategy sync      (the baseline recipe)
#   averaging-ngsgd  configs/averaging.yaml                    (NG-SGD + max-change, Kaldi-style)
#   averaging-sgd    configs/averaging.yaml optim.natural_gradient=false optim.max_change=false
# then one table line per run from its summary.json. A run whose summary.json exists is not redone.
#
#   scripts/experiment_averaging.sh [OUT_DIR] [EPOCHS] [LEARNERS]
#   (defaults: runs/averaging-experiment, 4, 4; CORPUS=demo/corpus; ASRDIST=.venv/bin/asrdist)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/averaging-experiment}
epochs=${2:-4}
learners=${3:-4}
corpus=${CORPUS:-demo/corpus}
asrdist=${ASRDIST:-.venv/bin/asrdist}
python=${PYTHON:-.venv/bin/python}

run() {  # NAME RECIPE [overrides...]
    local name=$1
    shift
    if [ -f "$out/$name/summary.json" ]; then
        echo "[experiment] $name: done already ($out/$name)"
        return
    fi
    rm -rf "$out/$name"  # an interrupted earlier attempt
    echo "[experiment] $name: $asrdist train $* --data $corpus --epochs $epochs --learners $learners"
    "$asrdist" train "$@" --data "$corpus" --epochs "$epochs" --learners "$learners" --out "$out/$name" --no-progress
}

mkdir -p "$out"
run sync configs/default.yaml --strategy sync
run averaging-ngsgd configs/averaging.yaml
run averaging-sgd configs/averaging.yaml optim.natural_gradient=false optim.max_change=false

"$python" - "$out" sync averaging-ngsgd averaging-sgd <<'EOF'
import json
import sys
from pathlib import Path

out, names = Path(sys.argv[1]), sys.argv[2:]
print(f"{'run':16} {'learners':>8} {'cores':>5} {'epochs':>6} {'PER':>7} {'frame acc':>9} {'frames/s':>9} {'MB sent':>9}")
for name in names:
    s = json.loads((out / name / "summary.json").read_text())
    f = s["final"]
    print(f"{name:16} {s['learners']:>8} {s['cores']:>5} {s['epochs']:>6} {100 * f['per']:>6.2f}% "
          f"{100 * f['frame_accuracy']:>8.2f}% {s['frames_per_second']:>9,.0f} {s['comm']['bytes_sent'] / 1e6:>9.1f}")
EOF
