#!/usr/bin/env bash
# Issue 63 item 3 (docs/training.md#the-asynchronous-strategies-accuracy-against-sync-issue-63-item-3-2026-12-03):
# adpsgd, hierarchical and hybrid (groups of 2) each with compare's recipe (configs/recipes/<strategy>.yaml)
# and sync, LEARNERS (default 4) sharing this machine's cores, configs/default.yaml,
# 4 epochs, seeds 0-2, on the built-in corpus of UTTERANCES (default 600) synthesized with CORPUS_SEED
# (default 0; made when missing; the 800-utterance figures used seed 1).
#   scripts/experiment_async_accuracy.sh [OUT_DIR [LEARNERS [UTTERANCES [CORPUS_SEED]]]]
# OUT_DIR defaults to runs/async_accuracy; about 100 s a run at 4 learners and 600 utterances, 4-5 min
# at 8 and 800
set -euo pipefail
cd "$(dirname "$0")/.."
OUT=${1:-runs/async_accuracy}
N=${2:-4}
U=${3:-600}
CS=${4:-0}
A=.venv/bin/asrdist
mkdir -p "$OUT"
[ -d "$OUT/c$U/train" ] || $A corpus synth "$OUT/c$U" --utterances "$U" --seed "$CS" >/dev/null
recipe() { .venv/bin/python -c "import sys; from asrdist.compare.recipes import recipe_overrides; print(' '.join(recipe_overrides(sys.argv[1])))" "$1"; }
ADP=$(recipe adpsgd); HIER=$(recipe hierarchical); HYB=$(recipe hybrid)
run() {
    local n=$1; shift
    $A train configs/default.yaml --data "$OUT/c$U" --out "$OUT/$n" --learners "$N" "$@" --no-progress >"$OUT/$n.log" 2>&1
    .venv/bin/python -c "import json,sys; f=json.load(open(sys.argv[1]))['final']; print(sys.argv[2], round(f['per'], 4), round(f['valid_loss'], 4))" "$OUT/$n/summary.json" "$n"
}
for s in 0 1 2; do
    run "sync${N}_s$s" --strategy sync "seed=$s"
    run "adp${N}_s$s" --strategy adpsgd "seed=$s" $ADP
    run "hier${N}_s$s" --strategy hierarchical "seed=$s" train.group_size=2 $HIER
    run "hyb${N}_s$s" --strategy hybrid "seed=$s" train.group_size=2 $HYB
done
