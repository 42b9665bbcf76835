"""Run preparation, done once before learners start: features, targets, priors, phone bigram.

Everything here is a deterministic function of the corpus and the config, saved to
RUN_DIR/targets.pt so every learner (and `asrdist eval`) reads the same label mapping.
"""
from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrdist.config import RunConfig
from asrdist.corpus.kaldi_dir import read_alignments, read_data_dir
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import ConfigError, DataError
from asrdist.utils.io import atomic_path

SPLITS = ("train", "valid", "test")
CTC_TARGETS = ("phones", "chars")


def ensure_features(corpus: Path, cfg: RunConfig, progress: bool = True) -> None:
    from asrdist.features.extract import extract_features
    from asrdist.features.store import has_features

    if not (corpus / "train").is_dir():
        raise DataError(f"{corpus}: not a corpus directory (no train/ inside); build one with `asrdist corpus ...`")
    splits = [corpus / s for s in SPLITS if (corpus / s).is_dir()]
    if all(has_features(s) for s in splits):
        for split in splits:
            check_feature_settings(split, cfg)
        return
    extract_features(corpus, num_mel_bins=cfg.data.num_mel_bins, cmvn=cfg.data.cmvn, progress=progress)


def check_feature_settings(split: Path, cfg: RunConfig) -> None:
    """Features already in `split` must be the ones the recipe asks for: training or decoding on
    another CMVN or filterbank size would run without complaint and quietly mean something else.
    Imported Kaldi features (no `num_mel_bins` recorded) are taken as they are."""
    from asrdist.features.store import FeatureStore

    meta = FeatureStore(split).meta
    if meta.get("num_mel_bins") is None:
        return
    have = (meta["num_mel_bins"], meta.get("cmvn"))
    want = (cfg.data.num_mel_bins, cfg.data.cmvn)
    if have != want:
        raise DataError(f"{split}: features were extracted with num_mel_bins={have[0]}, cmvn={have[1]}, the "
                        f"recipe asks num_mel_bins={want[0]}, cmvn={want[1]}; re-extract with `asrdist features "
                        f"{split.parent} --num-mel-bins {want[0]} --cmvn {want[1]} --overwrite`")


def split_alignments(split_dir: Path) -> dict[str, np.ndarray]:
    if not (split_dir / "alignment.scp").is_file():
        raise DataError(f"{split_dir}: no alignment.scp; frame-level targets need alignments "
                        f"(use a CTC model, data.targets=phones|chars, for unaligned corpora)")
    return read_alignments(split_dir)


def frame_labels(split_dir: Path, targets: dict[str, Any],
                 alignments: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per-utterance frame labels (monophones, or tied states) for a split with alignments."""
    if alignments is None:
        alignments = split_alignments(split_dir)
    tied = targets.get("tied")
    if tied is None:
        return alignments
    return {u: tied.map(a) for u, a in alignments.items()}


def phone_sequences(alignments: dict[str, np.ndarray], silence_id: int) -> dict[str, list[int]]:
    from asrdist.data.targets import phone_tokens

    return {u: phone_tokens(a, silence_id) for u, a in alignments.items()}


def ctc_tokens(split_dir: Path, targets: dict[str, Any]) -> dict[str, list[int]]:
    """Per-utterance token ids (blank = 0 is never a target)."""
    if targets["kind"] == "phones":
        if not (split_dir / "alignment.scp").is_file():
            raise DataError(f"{split_dir}: phone CTC targets need alignment.scp; use data.targets=chars")
        return phone_sequences(read_alignments(split_dir), targets["silence_id"])
    data = read_data_dir(split_dir)
    tok = targets["tokenizer"]
    return {u: tok.encode(data.utterances[u].text) for u in data.utt_ids}


def build_targets(corpus: Path, cfg: RunConfig, model_kind: str) -> dict[str, Any]:
    """Fit the label side of the run on the training split."""
    from asrdist.data.targets import CharTokenizer, TiedStates, label_priors
    from asrdist.eval.decode import PhoneBigram

    phones = PhoneTable.read(corpus / "phones.txt")
    kind = cfg.data.targets
    if (model_kind == "ctc") != (kind in CTC_TARGETS):
        raise ConfigError(f"data.targets: '{kind}' does not fit model '{cfg.model.name}' "
                          f"({'phones or chars' if model_kind == 'ctc' else 'monophone or tied'} expected)")
    out: dict[str, Any] = {"kind": kind, "phones": list(phones.symbols), "silence_id": phones.silence_id}
    train = corpus / "train"
    if kind in ("monophone", "tied"):
        alignments = split_alignments(train)
        if kind == "tied":
            out["tied"] = TiedStates.fit(alignments, len(phones), cfg.data.tied_states,
                                         context_independent=[phones.silence_id])
            out["num_classes"] = out["tied"].num_classes
            out["class_to_phone"] = np.asarray(out["tied"].class_to_phone)
        else:
            out["num_classes"] = len(phones)
            out["class_to_phone"] = np.arange(len(phones))
        labels = frame_labels(train, out, alignments)
        out["priors"] = label_priors(list(labels.values()), out["num_classes"])
        seqs = list(phone_sequences(alignments, phones.silence_id).values())
        out["bigram"] = PhoneBigram.fit(seqs, len(phones), smoothing=cfg.eval.bigram_smoothing)
    elif kind == "phones":
        out["num_classes"] = len(phones)  # token id = phone id; id 0 (sil) doubles as the CTC blank
    else:
        data = read_data_dir(train)
        out["tokenizer"] = CharTokenizer.fit([u.text for u in data.utterances.values()])
        out["num_classes"] = out["tokenizer"].vocab_size
    return out


def save_targets(run_dir: Path, targets: dict[str, Any]) -> None:
    blob = dict(targets)
    if "tied" in blob:
        blob["tied"] = blob["tied"].to_dict()
    if "tokenizer" in blob:
        blob["tokenizer"] = blob["tokenizer"].to_dict()
    with atomic_path(run_dir / "targets.pt") as tmp:
        torch.save(blob, tmp)


def load_targets(run_dir: Path) -> dict[str, Any]:
    from asrdist.data.targets import CharTokenizer, TiedStates

    path = run_dir / "targets.pt"
    if not path.is_file():
        raise DataError(f"{path}: missing; is {run_dir} an asrdist run directory?")
    blob = torch.load(path, map_location="cpu", weights_only=False)
    if isinstance(blob.get("tied"), dict):
        blob["tied"] = TiedStates.from_dict(blob["tied"])
    if isinstance(blob.get("tokenizer"), dict):
        blob["tokenizer"] = CharTokenizer.from_dict(blob["tokenizer"])
    return blob
