"""Offline augmentation stores: speed-perturbed and noisy copies of the training split's audio,
made once with the corpus' own filterbank and CMVN (steps 1-2 of `asrdist.data.augment`, which
describes every augmentation) into `train/augmented/KEY/`, and reused by later runs."""
from __future__ import annotations

import json
import sys
import zlib
from fractions import Fraction
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np
from tqdm import tqdm

from asrdist.errors import ConfigError, DataError
from asrdist.features.cmvn import CmvnStats, Normalizer, load_global
from asrdist.features.fbank import compute_fbank, fbank_options
from asrdist.features.store import FeatureStore, FeatureStoreWriter, has_features
from asrdist.io.atomic import atomic_dir
from asrdist.io.audio import read_wav, resample
from asrdist.io.kaldi_dir import read_data_dir

AUGMENTED_DIR = "augmented"


NOISE_PREFIX = "noise"


def copy_plan(speed_perturb: Sequence[float], noise_snr: float | None) -> list[tuple[str, float]]:
    """[(utterance id prefix, speed factor)] of the copies the settings ask for."""
    plan = [(f"sp{s:g}", float(s)) for s in sorted(set(speed_perturb)) if s != 1.0]
    if noise_snr is not None:
        plan.append((NOISE_PREFIX, 1.0))
    return plan


def speed_perturb(samples: np.ndarray, factor: float) -> np.ndarray:
    """Audio played `factor` times faster (sox `speed`): polyphase resampling by 1/factor."""
    if factor == 1.0:
        return np.asarray(samples)
    ratio = Fraction(factor).limit_denominator(100)  # played at numerator/denominator: that many times fewer samples
    return resample(np.asarray(samples, dtype=np.float64), ratio.numerator, ratio.denominator)


def add_noise(samples: np.ndarray, snr_db: float, rng: np.random.Generator) -> np.ndarray:
    """`samples` plus pink Gaussian noise whose power is the signal's / 10^(snr/10)."""
    x = np.asarray(samples, dtype=np.float64)
    spectrum = np.fft.rfft(rng.standard_normal(len(x)))
    spectrum /= np.sqrt(np.maximum(np.arange(len(spectrum)), 1.0))  # 1/f power
    noise = np.fft.irfft(spectrum, n=len(x))
    signal_power = float(np.mean(np.square(x)))
    noise_power = float(np.mean(np.square(noise)))
    if signal_power == 0.0 or noise_power == 0.0:
        return x
    return x + noise * np.sqrt(signal_power / (noise_power * 10.0 ** (snr_db / 10.0)))


def stretch_labels(labels: np.ndarray, frames: int) -> np.ndarray:
    """Frame labels resampled to `frames` frames (nearest frame centre)."""
    labels = np.asarray(labels)
    idx = np.minimum((np.arange(frames) + 0.5) * len(labels) / max(frames, 1), len(labels) - 1).astype(np.int64)
    return labels[idx]


def store_key(data_cfg, seed: int) -> str:
    speeds = ",".join(f"{s:g}" for s in sorted(set(data_cfg.speed_perturb)) if s != 1.0) or "1"
    snr = "none" if data_cfg.noise_snr is None else f"{data_cfg.noise_snr:g}"
    return f"sp{speeds}-snr{snr}-mel{data_cfg.num_mel_bins}-{data_cfg.cmvn}-seed{seed}"


def augmented_store_path(train_dir: Path, data_cfg, seed: int) -> Path | None:
    if not copy_plan(data_cfg.speed_perturb, data_cfg.noise_snr):
        return None
    return Path(train_dir) / AUGMENTED_DIR / store_key(data_cfg, seed)


def check_front_end(train_dir: Path, data_cfg) -> None:
    """Copies made from the audio (speed, noise) and the frequency warp (which reads the bins as a
    mel filterbank) need asrdist's own features: imported Kaldi features (MFCCs, say) cannot be
    matched. ConfigError before anything is made."""
    if not has_features(train_dir) or FeatureStore(train_dir).meta.get("num_mel_bins") is not None:
        return
    used = [f"data.{key}" for key, on in (("speed_perturb", bool(copy_plan(data_cfg.speed_perturb, None))),
                                          ("noise_snr", data_cfg.noise_snr is not None),
                                          ("freq_warp", bool(data_cfg.freq_warp))) if on]
    if used:
        raise ConfigError(f"{', '.join(used)}: {train_dir} trains on features imported from Kaldi, which asrdist "
                          f"cannot remake for augmented copies or warp; turn augmentation off (data.speed_perturb=[1.0] "
                          f"data.noise_snr=null data.freq_warp=0) or use asrdist's features "
                          f"(`asrdist features {train_dir.parent} --overwrite`)")


def build_augmented_store(train_dir: Path, data_cfg, seed: int, progress: bool = True) -> Path | None:
    """Make the copies of steps 1-2 for `train_dir` unless they exist; returns the store path."""

    out = augmented_store_path(train_dir, data_cfg, seed)
    if out is None or has_features(out):
        return out
    plan = copy_plan(data_cfg.speed_perturb, data_cfg.noise_snr)
    base = FeatureStore(train_dir)
    rate, cmvn = int(base.meta["sample_rate"]), base.meta.get("cmvn", data_cfg.cmvn)
    channel = base.meta.get("channel")  # multi-channel audio: the one its features were made of
    data = read_data_dir(train_dir, require_text=False)
    opts = fbank_options(rate, data_cfg.num_mel_bins)
    sources: dict[str, list] = {}
    speakers: dict[str, str] = {}
    stats: dict[str, CmvnStats] = {}
    utts = [u for u in data.utt_ids if u in base]
    with atomic_dir(out) as tmp:
        writer = FeatureStoreWriter(tmp, data_cfg.num_mel_bins)
        audio_cache: tuple[Path, np.ndarray] | None = None
        for utt in tqdm(utts, desc="augment", unit="utt", disable=None if progress else True, file=sys.stderr):
            u = data.utterances[utt]
            path = data.wav_path(u)
            if audio_cache is None or audio_cache[0] != path:
                audio_cache = (path, read_wav(path, expected_rate=rate, where=f"{train_dir}: utterance {utt}",
                                                channel=channel)[0])
            samples = audio_cache[1]
            if u.segment is not None:
                samples = samples[int(round(u.segment.start * rate)):int(round(u.segment.end * rate))]
            for index, (prefix, factor) in enumerate(plan):
                copy = speed_perturb(samples, factor)
                if data_cfg.noise_snr is not None:
                    rng = np.random.default_rng([seed, index, zlib.crc32(utt.encode())])
                    copy = add_noise(copy, data_cfg.noise_snr, rng)
                copy = np.clip(np.round(copy), -32768, 32767)
                copy_id, speaker = f"{prefix}-{utt}", f"{prefix}-{u.speaker}"
                try:
                    feats = compute_fbank(copy, rate, data_cfg.num_mel_bins, opts)
                except DataError:  # a copy too short for one frame: leave it out
                    continue
                writer.add(copy_id, feats)
                stats.setdefault(speaker, CmvnStats(data_cfg.num_mel_bins)).accumulate(feats)
                sources[copy_id] = [utt, factor]
                speakers[copy_id] = speaker
        if cmvn == "global":
            mean, std = load_global(base.path / "cmvn.json")
            writer.normalize(lambda utt, x: ((x - mean) / std).astype(np.float32))
        elif cmvn == "speaker":
            normalizer = Normalizer("speaker", stats)
            writer.normalize(lambda utt, x: normalizer(x, speakers[utt]))
        writer.close({"num_mel_bins": data_cfg.num_mel_bins, "cmvn": cmvn, "sample_rate": rate,
                      "frame_shift": 0.01, "augmentation": store_key(data_cfg, seed), "skipped": 0,
                      "skipped_utterances": []})
        (tmp / "sources.json").write_text(json.dumps(sources, sort_keys=True) + "\n", encoding="utf-8")
    return out


class AugmentedStore:
    """The training store plus its augmented copies, behind one `FrameStore` interface."""

    def __init__(self, base, copies, sources: Mapping[str, Sequence]):
        if copies.dim != base.dim:
            raise DataError(f"{copies.path}: dimension {copies.dim}, the training store has {base.dim}")
        self.base, self.copies = base, copies
        self.sources = {u: (str(s[0]), float(s[1])) for u, s in sources.items()}
        """copy id -> (original utterance, speed factor)."""
        self.dim = base.dim
        self.utt_ids = sorted(base.utt_ids + [u for u in copies.utt_ids if self.sources.get(u, ("",))[0] in base])
        self.meta = base.meta

    def _store(self, utt_id: str):
        return self.copies if utt_id in self.sources else self.base

    def num_frames(self, utt_id: str) -> int:
        return self._store(utt_id).num_frames(utt_id)

    def __getitem__(self, utt_id: str) -> np.ndarray:
        return self._store(utt_id)[utt_id]

    def __contains__(self, utt_id: object) -> bool:
        return utt_id in self.base or utt_id in self.copies

    def __len__(self) -> int:
        return len(self.utt_ids)

    def expand_tokens(self, tokens: Mapping[str, Sequence[int]]) -> dict:
        """Token sequences for the copies too (a copy says what its original says)."""
        out = dict(tokens)
        out.update({u: tokens[src] for u, (src, _) in self.sources.items() if src in tokens and u in self.copies})
        return out

    def expand_labels(self, labels: Mapping[str, np.ndarray]) -> dict:
        """Frame labels for the copies: the original's stretched to the copy's frame count."""
        out = dict(labels)
        for u, (src, _) in self.sources.items():
            if src in labels and u in self.copies:
                out[u] = stretch_labels(labels[src], self.copies.num_frames(u))
        return out


def training_store(train_dir: Path, data_cfg, seed: int):
    """The store a learner trains on: the split's own, plus the augmented copies when configured
    (built beforehand by `build_augmented_store`)."""
    base = FeatureStore(train_dir)
    path = augmented_store_path(train_dir, data_cfg, seed)
    if path is None:
        return base
    if not has_features(path):
        raise DataError(f"{path}: augmented copies missing (made when the run directory is prepared)")
    sources = json.loads((path / "sources.json").read_text(encoding="utf-8"))
    return AugmentedStore(base, FeatureStore(path), sources)
