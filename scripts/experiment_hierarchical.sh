#!/usr/bin/env bash
# Issue 10's table: sync, adpsgd, hierarchical (H-ADPSGD) and hybrid at 2 emulated hosts x 2 learners
# (1 Gbit/s between hosts, loopback inside), the adpsgd recipe on the built-in corpus.
#   bash scripts/experiment_hierarchical.sh [OUT] [EPOCHS]
set -euo pipefail
OUT=${1:-runs/hierarchical-2x2}
EPOCHS=${2:-4}
ROOT=$(cd "$(dirname "$0")/.." && pwd)  # the checkout: its venv and recipes, from any directory
ASRDIST=${ASRDIST:-$ROOT/.venv/bin/asrdist}
mkdir -p "$OUT"
for strategy in sync adpsgd hierarchical hybrid; do
  [ -f "$OUT/$strategy/summary.json" ] && continue
  extra=()
  [ "$strategy" = hybrid ] && extra=(strategy.sync_epochs=1)
  "$ASRDIST" train "$ROOT"/configs/adpsgd.yaml --learners 4 --nodes 2 --network 1gbit --strategy "$strategy" \
    --epochs "$EPOCHS" --out "$OUT/$strategy" --no-progress "${extra[@]}"
done
"$ASRDIST" bench compare "$OUT"/sync "$OUT"/adpsgd "$OUT"/hierarchical "$OUT"/hybrid --json "$OUT/table.json"
