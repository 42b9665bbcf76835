#!/usr/bin/env bash
# Issue 63 item 3 (docs/training.md#the-asynchronous-strategies-accuracy-against-sync-issue-63-item-3-2026-12-03):
# adpsgd (compare's recipe, configs/recipes/adpsgd.yaml), hierarchical and hybrid (2 groups of 2, the
# default recipe) and sync, 4 learners sharing this machine's cores, configs/default.yaml, 4 epochs,
# seeds 0-2, on the built-in corpus of 600 utterances (made when missing).
#   scripts/experiment_async_accuracy.sh [OUT_DIR]     # default runs/async_accuracy; about 100 s a run
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/async_accuracy}
A=.venv/bin/asrdist
mkdir -p "$OUT"
[ -d "$OUT/c600/train" ] || $A corpus synth "$OUT/c600" --utterances 600 --seed 0 >/dev/null
REC=$(.venv/bin/python -c "from asrdist.compare.recipes import recipe_overrides; print(' '.join(recipe_overrides('adpsgd')))")
run() {
    local n=$1; shift
    $A train configs/default.yaml --data "$OUT/c600" --out "$OUT/$n" --learners 4 "$@" --no-progress >"$OUT/$n.log" 2>&1
    .venv/bin/python -c "import json,sys; f=json.load(open(sys.argv[1]))['final']; print(sys.argv[2], round(f['per'], 4), round(f['valid_loss'], 4))" "$OUT/$n/summary.json" "$n"
}
for s in 0 1 2; do
    run "sync4_s$s" --strategy sync "seed=$s"
    run "adp4_s$s" --strategy adpsgd "seed=$s" $REC
    run "hier4_s$s" --strategy hierarchical "seed=$s" train.group_size=2
    run "hyb4_s$s" --strategy hybrid "seed=$s" train.group_size=2
done
