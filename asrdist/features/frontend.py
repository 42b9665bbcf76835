"""The decode-time front end: a run's own features for new audio files. Resampled to the training
corpus' rate (from a higher one, with a note; a lower one lacks the model's top band: refused),
fbank with the recipe's bins, and the recipe's CMVN (global: the training split's statistics kept
in `targets.pt`; speaker: the statistics of the file's speaker, topped up to a second's worth by
the training speakers' prior, `cmvn.SpeakerPrior`)."""
from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from asrdist.errors import DataError
from asrdist.features.cmvn import CmvnStats, SpeakerPrior
from asrdist.features.fbank import compute_fbank
from asrdist.features.store import FeatureStore
from asrdist.io.audio import read_wav, resample


def feature_record(train_dir: Path) -> dict | None:
    """What decoding needs to rebuild the training features: rate, bins, CMVN mode and global
    statistics. None for imported features (their front end is not asrdist's)."""
    meta = FeatureStore(train_dir).meta
    if meta.get("num_mel_bins") is None:
        return None
    record = {"sample_rate": int(meta["sample_rate"]), "num_mel_bins": int(meta["num_mel_bins"]),
              "cmvn": meta.get("cmvn", "none")}
    if record["cmvn"] not in ("global", "speaker"):
        return record

    cmvn_file = FeatureStore(train_dir).path / "cmvn.json"
    try:
        body = json.loads(cmvn_file.read_text(encoding="utf-8"))
        if record["cmvn"] == "global":
            record["mean"], record["std"] = list(body["mean"]), list(body["std"])
        else:
            record["speaker_prior"] = SpeakerPrior.of_cmvn_file(body).to_json()
    except (OSError, ValueError, KeyError, TypeError, AttributeError) as exc:
        raise DataError(f"{cmvn_file}: not a readable {record['cmvn']} CMVN statistics file "
                        f"({type(exc).__name__}: {exc}); re-extract with `asrdist features --overwrite`") from None
    return record


def front_end(run_dir: Path, cfg, record: dict | None) -> dict:
    """The front end of the run in `run_dir` (`record`: the one its targets keep, None for a run
    that kept none): what `features_of` and `raw_features` need."""
    if record is None and (Path(cfg.data.corpus) / "train").is_dir():  # a run from before targets kept it
        record = feature_record(Path(cfg.data.corpus) / "train")
    if record is None:
        raise DataError(f"{run_dir}: the run trained on imported features (or its corpus is gone); "
                        f"`asrdist decode` rebuilds only features asrdist extracted")
    if record["cmvn"] == "speaker" and "speaker_prior" not in record:  # a run from before the prior
        record = {**record, **_corpus_prior(Path(cfg.data.corpus) / "train", record)}
    return record


def _corpus_prior(train: Path, record: dict) -> dict:
    """{"speaker_prior": ...} from the run's corpus when its training features are still the
    run's (rate, bins, CMVN); {} otherwise: files then keep their own statistics, as before."""
    try:
        current = feature_record(train) if (train / "feats" / "cmvn.json").is_file() else None
    except DataError:
        return {}
    if current is None or any(current[k] != record[k] for k in ("sample_rate", "num_mel_bins", "cmvn")):
        return {}
    return {"speaker_prior": current["speaker_prior"]}


def raw_features(path: Path, front: dict, channel: int | None = None, noted: set[int] | None = None) -> np.ndarray:
    """The file's filterbank features through the run's front end, before CMVN (`channel`: the one
    to read of a multi-channel file). Audio at a higher rate than the model's is resampled to it
    with the resampler the corpus' own resampling uses, and a note says so once per rate (`noted`:
    the rates noted so far; None: no note). Audio at a lower rate is refused: the model's top mel
    filters read up to its Nyquist frequency, a band this audio does not hold and resampling cannot
    add (an 8 kHz file on a 16 kHz model decoded to 4 of its 12 phones)."""
    samples, rate = read_wav(path, channel=channel)
    model_rate = front["sample_rate"]
    if rate < model_rate:
        raise DataError(f"{path}: sample rate {rate} Hz, below the model's {model_rate} Hz: its filterbank reads up to "
                        f"{model_rate // 2} Hz, this audio holds nothing above {rate // 2} Hz, which resampling cannot "
                        f"add; decode it with a model trained at {rate} Hz or lower")
    if rate != model_rate and noted is not None and rate not in noted:
        noted.add(rate)
        print(f"[asrdist] note: {path}: resampled from {rate} Hz to the model's {model_rate} Hz, the rate its "
              f"features were trained at (noted once per rate)", file=sys.stderr, flush=True)
    try:  # the front end's reasons (audio too short for a frame) name no file
        samples = resample(samples, rate, model_rate)
        return compute_fbank(samples, front["sample_rate"], front["num_mel_bins"])
    except DataError as exc:
        raise DataError(f"{path}: {exc}") from None


def normalize(feats: Sequence[np.ndarray], front: dict) -> list[np.ndarray]:
    """One speaker's utterances through the run's CMVN (speaker CMVN: statistics over all of them)."""
    if front["cmvn"] == "global":
        mean, std = np.asarray(front["mean"]), np.asarray(front["std"])
        return [((f - mean) / std).astype(np.float32) for f in feats]
    if front["cmvn"] == "speaker":
        stats = CmvnStats(feats[0].shape[1])
        for f in feats:
            stats.accumulate(f)
        if "speaker_prior" in front:  # a speaker under a second, as `asrdist features` treats one
            stats = SpeakerPrior.from_json(front["speaker_prior"]).fill(stats)
        return [stats.apply(f) for f in feats]
    return list(feats)


def features_of(path: Path, front: dict, channel: int | None = None, noted: set[int] | None = None) -> np.ndarray:
    """One file's features, the file its own speaker (`noted`: as `raw_features`)."""
    return normalize([raw_features(path, front, channel, noted)], front)[0]
