"""Choose a hybrid run's phone-loop search (eval.prior_scale, eval.acoustic_scale, eval.min_duration)
on validation speakers, and say how well the choice carries to speakers it was not chosen on.

The split's speakers are dealt into two folds (sorted names, alternately). Every setting of the grid
decodes every utterance once; the setting best on one fold is scored on the other, both ways, so
the figure printed last is a PER of speakers scored with a setting chosen without them. The frame posteriors are
computed once; each setting is the same search `asrdist eval` runs.

    .venv/bin/python scripts/tune_phone_loop.py RUN SPLIT [OUT.json]

Take the setting best on the whole split into the recipe (`eval.prior_scale` ...), or try one with
`asrdist eval RUN --data SPLIT --prior-scale S --acoustic-scale A --min-duration F`.
"""
from __future__ import annotations

import itertools
import json
import sys
from pathlib import Path

import torch

from asrdist.data.labels import frame_labels, phone_sequences, split_alignments
from asrdist.errors import AsrdistError
from asrdist.eval.decode import viterbi_decode
from asrdist.eval.evaluate import decoding_log_priors, utterance_log_posteriors
from asrdist.eval.scoring import error_rate
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.run.evaluate import load_run_model

PRIOR_SCALES = (0.3, 0.5, 0.7, 1.0)
ACOUSTIC_SCALES = (0.3, 0.5, 0.7, 1.0, 1.5)
MIN_DURATIONS = (3, 5, 7)


def _score(refs: dict, hyps: dict, group: list[str]) -> dict:
    return error_rate([refs[u] for u in group], [hyps[u] for u in group])


def main(argv: list[str]) -> int:
    if len(argv) not in (2, 3):
        print(__doc__, file=sys.stderr)
        return 2
    run, split = Path(argv[0]), Path(argv[1])
    torch.set_num_threads(1)
    model, cfg, targets, _ = load_run_model(run)
    if model.kind == "ctc":
        print(f"{run}: a CTC model has no phone loop to tune", file=sys.stderr)
        return 2
    store = FeatureStore(split)
    alignments = split_alignments(split, len(targets.phones))
    refs = phone_sequences(alignments, targets.silence_id)
    labelled = frame_labels(split, targets, alignments)
    utts = [u for u in store.utt_ids if u in labelled]
    speaker = {u: d.speaker for u, d in read_data_dir(split, require_text=False).utterances.items()}
    speakers = sorted({speaker[u] for u in utts})
    folds = [[u for u in utts if speakers.index(speaker[u]) % 2 == k] for k in (0, 1)]
    log_priors = decoding_log_priors(targets)  # as eval's search: unseen classes left out
    posts = {u: utterance_log_posteriors(model, store[u], cfg.model.context) for u in utts}

    rows = []
    for prior, acoustic, duration in itertools.product(PRIOR_SCALES, ACOUSTIC_SCALES, MIN_DURATIONS):
        hyps = {u: viterbi_decode(posts[u], prior * log_priors, targets.class_to_phone, targets.bigram,
                                  min_duration=duration, acoustic_scale=acoustic, silence_id=targets.silence_id)
                for u in utts}

        fold_scores = [_score(refs, hyps, folds[0]), _score(refs, hyps, folds[1])]
        rows.append({"prior_scale": prior, "acoustic_scale": acoustic, "min_duration": duration,
                     "per": _score(refs, hyps, utts)["rate"], "per_fold": [f["rate"] for f in fold_scores],
                     "errors_fold": [f["errors"] for f in fold_scores],
                     "phones_fold": [f["ref_length"] for f in fold_scores]})
        print(json.dumps(rows[-1]), flush=True)

    best = min(rows, key=lambda r: r["per"])
    crossed = []
    for k in (0, 1):  # chosen on fold k, scored on the other
        chosen = min(rows, key=lambda r: r["per_fold"][k])
        crossed.append({"chosen_on": [s for i, s in enumerate(speakers) if i % 2 == k],
                        "setting": {key: chosen[key] for key in ("prior_scale", "acoustic_scale", "min_duration")},
                        "per_on_the_other_fold": chosen["per_fold"][1 - k]})
        crossed[-1]["errors"] = chosen["errors_fold"][1 - k]
    result = {"run": str(run), "split": str(split), "utterances": len(utts), "best_on_the_split": best,
              "two_fold": crossed,
              "two_fold_per": sum(c["errors"] for c in crossed) / sum(best["phones_fold"]), "grid": rows}
    if len(argv) == 3:
        Path(argv[2]).write_text(json.dumps(result, indent=2) + "\n")
    print(f"best on the whole split: PER {best['per']:.4f} at prior_scale {best['prior_scale']}, acoustic_scale "
          f"{best['acoustic_scale']}, min_duration {best['min_duration']}")
    for c in crossed:
        print(f"chosen on {', '.join(c['chosen_on'])}: {c['setting']} -> PER {c['per_on_the_other_fold']:.4f} "
              f"on the other speakers")
    print(f"two-fold PER (each fold scored with the setting chosen on the other; all errors over all phones): "
          f"{result['two_fold_per']:.4f}")
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main(sys.argv[1:]))
    except AsrdistError as exc:  # a missing run or split, a split without alignments: one line
        print(f"tune_phone_loop: error: {exc}", file=sys.stderr)
        sys.exit(exc.exit_code)
