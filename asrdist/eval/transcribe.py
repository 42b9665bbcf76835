"""`asrdist decode RUN WAV...`: transcribe audio files with a run's model.

The audio goes through the run's own front end: resampled to the training corpus' rate, fbank
with the recipe's bins, and the recipe's CMVN (global: the training split's statistics, which
`targets.pt` keeps; speaker: the file's own statistics, one file being one unknown speaker). Then
CTC models are searched greedily or by prefix beam (`eval.beam`), hybrid models by the phone-loop
Viterbi of `asrdist eval`. Output is Kaldi's `utt text` (utt = the file's name without .wav).
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrdist.errors import DataError


def feature_record(train_dir: Path) -> dict | None:
    """What decoding needs to rebuild the training features: rate, bins, CMVN mode and global
    statistics. None for imported features (their front end is not asrdist's)."""
    from asrdist.features.store import FeatureStore

    meta = FeatureStore(train_dir).meta
    if meta.get("num_mel_bins") is None:
        return None
    record = {"sample_rate": int(meta["sample_rate"]), "num_mel_bins": int(meta["num_mel_bins"]),
              "cmvn": meta.get("cmvn", "none")}
    cmvn_file = FeatureStore(train_dir).path / "cmvn.json"
    if record["cmvn"] == "global":
        body = json.loads(cmvn_file.read_text(encoding="utf-8"))
        record["mean"], record["std"] = body["mean"], body["std"]
    return record


def _front_end(run_dir: Path, cfg, targets: dict[str, Any]) -> dict:
    record = targets.get("features")
    if record is None and (Path(cfg.data.corpus) / "train").is_dir():  # a run from before targets kept it
        record = feature_record(Path(cfg.data.corpus) / "train")
    if record is None:
        raise DataError(f"{run_dir}: the run trained on imported features (or its corpus is gone); "
                        f"`asrdist decode` rebuilds only features asrdist extracted")
    return record


def features_of(path: Path, front: dict) -> np.ndarray:
    from asrdist.corpus.audio import read_wav, resample
    from asrdist.features.cmvn import CmvnStats
    from asrdist.features.fbank import compute_fbank

    samples, rate = read_wav(path)
    samples = resample(samples, rate, front["sample_rate"])
    feats = compute_fbank(samples, front["sample_rate"], front["num_mel_bins"])
    if front["cmvn"] == "global":
        return ((feats - np.asarray(front["mean"])) / np.asarray(front["std"])).astype(np.float32)
    if front["cmvn"] == "speaker":
        stats = CmvnStats(feats.shape[1])
        stats.accumulate(feats)
        return stats.apply(feats)
    return feats


@torch.no_grad()
def recognize(model: torch.nn.Module, feats: np.ndarray, targets: dict[str, Any], cfg, constrained=None) -> str:
    """The model's text for one utterance's features: characters, or phone symbols; `constrained`
    is the run's vocabulary search (`asrdist.eval.vocabulary`), if any."""
    from asrdist.eval.decode import viterbi_decode
    from asrdist.eval.evaluate import _frame_logits, ctc_hypothesis

    if model.kind == "ctc":
        log_probs, lengths = model(torch.from_numpy(feats)[None], torch.tensor([len(feats)]))
        lp = log_probs[0, : int(lengths[0])].double().numpy()
        tokens = ctc_hypothesis(lp, cfg, constrained)
        if targets["kind"] == "chars":
            return " ".join(targets["tokenizer"].decode(tokens).split())
        return " ".join(targets["phones"][t] for t in tokens)
    priors = np.asarray(targets["priors"], dtype=np.float64)
    with np.errstate(divide="ignore"):  # unseen classes are left out, as in `asrdist eval`
        log_priors = np.log(np.where(priors > 1e-6, priors, 0.0))
    log_post = torch.log_softmax(_frame_logits(model, feats, cfg.model.context), -1).double().numpy()
    phones = viterbi_decode(log_post, cfg.eval.prior_scale * log_priors, targets["class_to_phone"],
                            targets["bigram"], min_duration=cfg.eval.min_duration,
                            acoustic_scale=cfg.eval.acoustic_scale, silence_id=targets["silence_id"])
    return " ".join(targets["phones"][p] for p in phones)


def transcribe(run_dir: Path, wavs: list[Path], vocabulary: str | None = None) -> list[tuple[str, str]]:
    """[(utt, text)] for every file, in the order given; every file is checked before decoding.
    `vocabulary` replaces the run's `eval.vocabulary` (none | train | PATH)."""
    from asrdist.eval.run import load_run_model
    from asrdist.eval.vocabulary import vocabulary_search

    names = [Path(w).name[:-4] if Path(w).name.lower().endswith(".wav") else Path(w).name for w in wavs]
    for wav in wavs:
        if not Path(wav).is_file():
            raise DataError(f"{wav}: audio file not found")
    model, cfg, targets, input_dim = load_run_model(run_dir, vocabulary=vocabulary)
    front = _front_end(run_dir, cfg, targets)
    if front["num_mel_bins"] != input_dim:
        raise DataError(f"{run_dir}: the model expects {input_dim} inputs, its front end gives {front['num_mel_bins']}")
    constrained = vocabulary_search(cfg, targets) if model.kind == "ctc" else None
    return [(name, recognize(model, features_of(Path(wav), front), targets, cfg, constrained))
            for name, wav in zip(names, wavs)]


def decode_command(args) -> int:
    from asrdist.utils.io import write_text_atomic

    results = transcribe(args.run_dir, args.wavs, vocabulary=args.vocabulary)
    lines = "".join(f"{utt} {text}".rstrip() + "\n" for utt, text in results)
    if args.out is not None:
        write_text_atomic(args.out, lines)
    print(lines, end="")
    return 0
