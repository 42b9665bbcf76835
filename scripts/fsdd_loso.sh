#!/usr/bin/env bash
# FSDD leave-one-speaker-out: for each speaker in turn, build the corpus with that speaker as the
# test set, train configs/fsdd.yaml (one learner) and evaluate on the held-out speaker; prints one
# line per speaker and the mean and worst digit error rate (1 - sentence accuracy), with the
# recipe's decoding (eval.vocabulary) and without a vocabulary (free character decoding).
#   scripts/fsdd_loso.sh [OUT_DIR] [section.key=value ...]      e.g. train.threads=1
set -euo pipefail
OUT=${1:-runs/fsdd-loso}
shift || true
ROOT=$(cd "$(dirname "$0")/.." && pwd)  # the checkout: its venv and recipes, from any directory
ASRDIST=${ASRDIST:-$ROOT/.venv/bin/asrdist}
PY=${PY:-$ROOT/.venv/bin/python}
mkdir -p "$OUT"
SPEAKERS=$($PY -c "from asrdist.corpus.fsdd import find_recordings, resolve_source
print(' '.join(sorted({r.speaker for r in find_recordings(resolve_source(None))})))")
for spk in $SPEAKERS; do
  [ -d "$OUT/corpus-$spk" ] || $ASRDIST corpus fsdd "$OUT/corpus-$spk" --test-speaker "$spk" > /dev/null
  if [ ! -f "$OUT/run-$spk/summary.json" ]; then
    rm -rf "$OUT/run-$spk"
    $ASRDIST train "$ROOT"/configs/fsdd.yaml --data "$OUT/corpus-$spk" --out "$OUT/run-$spk" --no-progress "$@"
  fi
  $ASRDIST eval "$OUT/run-$spk" --data "$OUT/corpus-$spk" > /dev/null
  $ASRDIST eval "$OUT/run-$spk" --data "$OUT/corpus-$spk" --vocabulary none --adapt-word-balance 0 \
      --out "$OUT/run-$spk/eval-free.json" > /dev/null
done
$PY - "$OUT" $SPEAKERS <<'PY'
import json, os, sys
out, speakers = sys.argv[1], sys.argv[2:]
errors, free = {}, {}
for spk in speakers:
    ev = json.load(open(f"{out}/run-{spk}/eval.json"))
    ev_free = json.load(open(f"{out}/run-{spk}/eval-free.json"))
    summary = json.load(open(f"{out}/run-{spk}/summary.json"))
    errors[spk], free[spk] = 1 - ev["sentence_accuracy"], 1 - ev_free["sentence_accuracy"]
    top = ", ".join(f"{c['ref'] or '-'}->{c['hyp'] or '-'} {c['count']}" for c in ev.get("confusions", [])[:3])
    print(f"{spk:10s} digit error {errors[spk]:.4f} (vocabulary {ev['vocabulary']}; free decoding {free[spk]:.4f}, "
          f"cer {ev_free['cer']:.4f})  train {summary['wall_seconds']:.0f} s  most frequent errors: {top or 'none'}")
mean = sum(errors.values()) / len(errors)
worst = max(errors, key=errors.get)
free_mean = sum(free.values()) / len(free)
print(f"mean digit error {mean:.4f}, worst {errors[worst]:.4f} ({worst}); free decoding: mean {free_mean:.4f}, "
      f"worst {max(free.values()):.4f}; 1 learner per fold, {os.cpu_count()} cores on this machine")
json.dump({"digit_error": errors, "mean": mean, "worst": errors[worst], "worst_speaker": worst,
           "free_decoding": {"digit_error": free, "mean": free_mean, "worst": max(free.values())}},
          open(f"{out}/loso.json", "w"), indent=2)
PY
