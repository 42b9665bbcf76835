#!/usr/bin/env bash
# Issue 9's experiment (DESIGN.md §5.5): sync and the three adpsgd variants on the same recipe
# (configs/adpsgd.yaml), learners, corpus and epochs, once with equal learners and once with
# learner 3 made 3x slower; one table line per run from its summary.json. A run whose
# summary.json exists is not redone.
#
#   [BATCHES="1024 2048 4096"] scripts/experiment_adpsgd.sh [OUT_DIR] [EPOCHS] [LEARNERS]
#   (defaults: runs/adpsgd-experiment, 4, 4; CORPUS=demo/corpus; ASRDIST=.venv/bin/asrdist;
#   BATCHES: also sweep the global batch of sync and adpsgd)
set -euo pipefail
cd "$(dirname "$0")/.."
out=${1:-runs/adpsgd-experiment}
epochs=${2:-4}
learners=${3:-4}
corpus=${CORPUS:-demo/corpus}
asrdist=${ASRDIST:-.venv/bin/asrdist}
slow=(train.straggler.ranks=[$((learners - 1))] train.straggler.slowdown=3.0)

run() {  # NAME [overrides...]
    local name=$1
    shift
    if [ -f "$out/$name/summary.json" ]; then
        echo "[experiment] $name: done already ($out/$name)"
        return
    fi
    rm -rf "$out/$name"  # an interrupted earlier attempt
    echo "[experiment] $name: $asrdist train configs/adpsgd.yaml $* --data $corpus --epochs $epochs --learners $learners"
    "$asrdist" train configs/adpsgd.yaml "$@" --data "$corpus" --epochs "$epochs" --learners "$learners" \
        --out "$out/$name" --no-progress
}

mkdir -p "$out"
names=()
for straggler in equal slow; do
    extra=()
    [ "$straggler" = slow ] && extra=("${slow[@]}")
    run "sync-$straggler" --strategy sync "${extra[@]}"
    run "adpsgd-fixed-$straggler" strategy.pattern=fixed "${extra[@]}"
    run "adpsgd-random-$straggler" strategy.pattern=random "${extra[@]}"
    run "adpsgd-delay-by-one-$straggler" strategy.delay_by_one=true "${extra[@]}"
    names+=("sync-$straggler" "adpsgd-fixed-$straggler" "adpsgd-random-$straggler" "adpsgd-delay-by-one-$straggler")
done

"$asrdist" bench compare "${names[@]/#/$out/}" --json "$out/compare.json"

# How large a global batch each tolerates (the IBM papers: ADPSGD about 3x sync's): the same
# recipe at larger global batches (lr scaled linearly with it), equal learners.
# A run that diverges (a one-line error, no summary) is a result here: it is listed, not fatal.
if [ -n "${BATCHES:-}" ]; then
    sweep=(sync-equal adpsgd-fixed-equal)
    for batch in $BATCHES; do
        for name in "sync-batch$batch" "adpsgd-batch$batch"; do
            strategy=(--strategy sync)
            [ "${name%%-*}" = adpsgd ] && strategy=(strategy.pattern=fixed)
            if run "$name" "${strategy[@]}" data.batch_size=$batch; then
                sweep+=("$name")
            else
                echo "[experiment] $name: failed (diverged?); see the line above"
            fi
        done
    done
    "$asrdist" bench compare "${sweep[@]/#/$out/}" --json "$out/batch-sweep.json"
fi
