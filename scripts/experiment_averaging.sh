#!/usr/bin/env bash
# Issue 5's experiment (DESIGN.md §5.4): the same learners, corpus and epochs with
#   sync             configs/default.yaml --strategy sync      (the baseline recipe)
#   averaging-ngsgd  configs/averaging.yaml                    (NG-SGD + max-change, Kaldi-style)
#   averaging-sgd    configs/averaging.yaml optim.natural_gradient=false  (max-change on in both arms)
# then `asrdist bench compare` of the three runs (table, and OUT_DIR/compare.json). A run whose
# summary.json exists is not redone.
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
run averaging-sgd configs/averaging.yaml optim.natural_gradient=false

echo "[experiment] $learners learners, $epochs epochs, corpus $corpus"
"$asrdist" bench compare "$out/sync" "$out/averaging-ngsgd" "$out/averaging-sgd" --json "$out/compare.json"
