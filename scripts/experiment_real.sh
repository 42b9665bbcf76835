#!/usr/bin/env bash
# The real-speech recipes end to end on one corpus (default: FSDD resampled to 16 kHz, held-out
# speaker = the last by name): phone CTC through the corpus lexicon, forced alignment with it, the
# hybrid DNN on those alignments, character CTC; each evaluated on the held-out test speakers; then
# sync vs onebit vs averaging with 2 learners on the hybrid recipe.
#   scripts/experiment_real.sh [OUT_DIR] [CORPUS] [section.key=value ...]
set -euo pipefail
OUT=${1:-runs/real}
CORPUS=${2:-$OUT/corpus}
shift 2 || shift $# || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)  # the checkout: its venv and recipes, from any directory
ASRDIST=${ASRDIST:-$ROOT/.venv/bin/asrdist}
mkdir -p "$OUT"
[ -d "$CORPUS" ] || $ASRDIST corpus fsdd "$CORPUS" --sample-rate 16000 > /dev/null
run() {  # run NAME CONFIG: train (unless finished) and evaluate on the test split
  local name=$1 config=$2
  if [ ! -f "$OUT/$name/summary.json" ]; then
    rm -rf "$OUT/$name"
    $ASRDIST train "$config" --data "$CORPUS" --out "$OUT/$name" --no-progress "${@:3}"
  fi
  $ASRDIST eval "$OUT/$name" --data "$CORPUS" > /dev/null
  echo "$name: $(python3 -c "import json,sys; e=json.load(open('$OUT/$name/eval.json')); s=json.load(open('$OUT/$name/summary.json'))
print(', '.join(f'{k} {e[k]:.4f}' for k in ('per','cer','wer','sentence_accuracy','frame_accuracy') if k in e), f'train {s[\"wall_seconds\"]:.0f} s')")"
}
run phones "$ROOT"/configs/real_phones.yaml "$@"
$ASRDIST align "$OUT/phones" --data "$CORPUS" --no-progress > "$OUT/align.json"
run hybrid "$ROOT"/configs/real_hybrid.yaml "$@"
[ -d "$OUT/compare" ] || $ASRDIST bench compare --train "$ROOT"/configs/real_hybrid.yaml --data "$CORPUS" --learners 2 \
    --strategies sync,onebit,averaging --out "$OUT/compare" "$@"
$ASRDIST bench compare "$OUT"/compare/* --json "$OUT/compare.json"
run chars "$ROOT"/configs/real_chars.yaml "$@"
