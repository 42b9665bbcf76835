"""`asrdist align RUN --data CORPUS [--lexicon FILE]`: frame-level phone alignments of every split of
CORPUS, by Viterbi through the lexicon (`asrdist.eval.align_graph`) on a trained model's frame scores,
written as `SPLIT/alignment.scp/.ark` (one phone id per 10 ms frame) so hybrid recipes can train.

Frame scores over phones, [T, P]:
- hybrid model: log p(c|x) - prior_scale * log p(c) per class c; a phone scores its best class;
- phone CTC model: log p(phone|x), with silence scored by the blank (a phone CTC model's blank is
  the silence id); outputs of a subsampling model are repeated to the 10 ms frame rate.
A character CTC model cannot align phones. Utterances with words missing from the lexicon are
skipped (listed in one line); the other splits' files are only replaced once every split is done.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from asrdist.corpus.lexicon import LEXICON_NAME, Lexicon, normalize_word, report_missing
from asrdist.corpus.phones import PhoneTable
from asrdist.data.targets import Targets
from asrdist.errors import ConfigError, DataError
from asrdist.eval.align_graph import build_graph, viterbi_align
from asrdist.eval.evaluate import on_model_device, utterance_log_posteriors
from asrdist.features.extract import find_splits
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_data_dir, write_alignments
from asrdist.run.evaluate import load_run_model, trained_sample_rate
from asrdist.run.prepare import ensure_features

SCORE_FLOOR = -30.0
"""Log scores below this are clipped, so one frame the model finds impossible cannot veto a path."""
SPLITS = ("train", "valid", "test")


def frame_scores(model: torch.nn.Module, feats: np.ndarray, targets: Targets, cfg) -> np.ndarray:
    """[T, P] log scores over phones for one utterance's features [T, dim], on the CPU (the model
    computes where it is)."""
    num_phones = len(targets.phones)
    T = len(feats)
    if model.kind == "ctc":
        x = on_model_device(model, torch.from_numpy(np.array(feats))[None])
        log_probs, out_lengths = model(x, torch.tensor([T]))
        lp = log_probs[0, : int(out_lengths[0])].cpu().double().numpy()
        lp = np.repeat(lp, model.subsample, axis=0)[:T]
        return np.maximum(lp[:, :num_phones], SCORE_FLOOR)

    log_post = utterance_log_posteriors(model, feats, cfg.model.context)
    priors = np.asarray(targets.priors, dtype=np.float64)
    scaled = log_post - cfg.eval.prior_scale * np.log(np.maximum(priors, 1e-10))
    class_to_phone = np.asarray(targets.class_to_phone)
    out = np.full((T, num_phones), -np.inf)
    for p in range(num_phones):
        cols = np.flatnonzero(class_to_phone == p)
        if cols.size:
            out[:, p] = scaled[:, cols].max(axis=1)
    return np.maximum(out, SCORE_FLOOR)


def align_utterance(scores: np.ndarray, words: list[str], lexicon: Lexicon, min_duration: int) -> np.ndarray:
    """Phone id per frame; a phone lasts >= min_duration frames unless the utterance is too short."""
    prons = [lexicon.pronunciations(w) for w in words]
    silence = lexicon.table.silence_id
    for duration in sorted({min_duration, 1}, reverse=True):
        try:
            return viterbi_align(scores, build_graph(prons, silence, duration))[0]
        except DataError:
            if duration == 1:
                raise
    raise AssertionError("unreachable")


def _check_model(targets: Targets, run_dir: Path) -> None:
    if targets.kind == "chars":
        raise ConfigError(f"{run_dir}: a character CTC model cannot align phones; use a phone CTC run "
                          f"(data.targets=phones) or a hybrid run (monophone or tied)")


def align_split(model, split: Path, targets: Targets, cfg, lexicon: Lexicon, progress: bool) -> tuple[dict, dict]:
    """(utt -> alignment, summary) for one split with features in place."""

    data = read_data_dir(split)
    store = FeatureStore(split)
    texts = {u: data.utterances[u].text for u in data.utt_ids}
    missing = lexicon.missing_words(texts.values())
    absent = set(missing)
    alignments, failed = {}, []
    skipped = 0
    for utt in tqdm(data.utt_ids, desc=f"align {split.name}", unit="utt", disable=None if progress else True,
                    file=sys.stderr):
        words = [normalize_word(w) for w in texts[utt].split()]
        if any(w in absent for w in words):
            skipped += 1
            continue
        if utt not in store:
            raise DataError(f"{split}: utterance {utt}: no features")
        with torch.no_grad():
            scores = frame_scores(model, store[utt], targets, cfg)
        try:
            alignments[utt] = align_utterance(scores, words, lexicon, cfg.eval.min_duration)
        except DataError as exc:
            failed.append(f"{utt}: {exc}")
    report_missing(missing, skipped, str(split))
    for line in failed:
        print(f"asrdist: skipped: {split}: utterance {line}", file=sys.stderr)
    if not alignments:
        raise DataError(f"{split}: no utterance could be aligned")
    phones = np.concatenate(list(alignments.values()))
    speech = phones[phones != lexicon.table.silence_id]
    return alignments, {"utterances": len(alignments), "skipped_missing_words": skipped,
                        "missing_words": missing, "failed": len(failed),
                        "frames": int(len(phones)), "silence_fraction": round(1 - len(speech) / len(phones), 4)}


def _replace_alignments(split: Path, alignments: dict) -> None:
    """Write the new alignment.ark/.scp beside the old ones, then move them into place."""
    tmp = split / ".alignment.tmp"
    tmp.mkdir(exist_ok=True)
    write_alignments(tmp, alignments, split)  # the scp names the ark where it will live
    os.replace(tmp / "alignment.ark", split / "alignment.ark")
    os.replace(tmp / "alignment.scp", split / "alignment.scp")
    tmp.rmdir()


def align_corpus(run_dir: Path, data: Path, lexicon_path: Path | None = None, progress: bool = True,
                 device: str | torch.device | None = None) -> dict:
    """Align every split of `data` (module docstring), the model computing on `device`
    (`load_run_model`: None is the GPU where there is one); the summary `asrdist align` prints."""
    run_dir, data = Path(run_dir), Path(data)
    model, cfg, targets, input_dim = load_run_model(run_dir, device=device)
    _check_model(targets, run_dir)
    if not data.is_dir():
        raise DataError(f"{data}: corpus or data directory not found")
    corpus_lexicon = data / LEXICON_NAME
    # a split directory of a corpus (CORPUS/test) reads its corpus' lexicon
    stored = corpus_lexicon if corpus_lexicon.is_file() or not (data / "wav.scp").is_file() else \
        data.parent / LEXICON_NAME
    if lexicon_path is None and not stored.is_file():
        raise ConfigError(f"{data}: no {LEXICON_NAME} in the corpus; pass --lexicon FILE")
    lexicon = Lexicon.read(lexicon_path or stored, PhoneTable(targets.phones))
    splits = find_splits(data)
    # the model's filterbank, CMVN and sample rate, from the split as it is now
    ensure_features(data, cfg, progress=progress, check=False, sample_rate=trained_sample_rate(cfg, targets))
    started = time.perf_counter()
    results, summary = {}, {"run": str(run_dir), "data": str(data), "model": cfg.model.name,
                            "targets": targets.kind, "splits": {}}
    for name, split in splits.items():
        dim = FeatureStore(split).dim
        if dim != input_dim:
            raise DataError(f"{split}: features have dimension {dim}, the model expects {input_dim}")
        results[name], summary["splits"][name] = align_split(model, split, targets, cfg, lexicon, progress)
    for name, split in splits.items():
        _replace_alignments(split, results[name])
    if lexicon_path is not None and splits and (data / "train").is_dir():
        texts = [u.text for s in splits.values() for u in read_data_dir(s).utterances.values()]
        lexicon.restricted_to(w for t in texts for w in t.split()).write(corpus_lexicon)
    summary["seconds"] = round(time.perf_counter() - started, 2)
    return summary


def align_command(args) -> int:
    summary = align_corpus(args.run_dir, args.data, args.lexicon, progress=not args.no_progress, device=args.device)
    print(json.dumps(summary, indent=2))
    return 0
