"""Data augmentation for speaker generalisation, switched on in the recipe's `data` section.

1. Speed perturbation (Ko et al. 2015, Kaldi's `perturb_data_dir_speed.sh`): for each factor s in
   `data.speed_perturb` other than 1.0, a copy `sp{s}-UTT` of every training utterance whose audio is
   resampled to last 1/s as long (pitch and tempo change together); its speaker is `sp{s}-SPK`.
2. Additive noise (`data.noise_snr`): pink (1/f) Gaussian noise at the given SNR over the whole
   utterance, drawn per copy from the run's seed, on every copy of step 1 plus one copy `noise-UTT` at
   speed 1.0. Originals stay clean.
3. SpecAugment masks (Park et al. 2019; `data.time_masks`, `data.freq_masks`): zeroed (= the CMVN
   mean) bands of filterbank bins and runs of frames, drawn per training batch from the sampler's
   (seed, epoch, rank, batch) stream, so a resumed run sees the same masks. Spliced DNN frames get
   frequency masks only.
4. Edge cropping (`data.edge_crop` = p, CTC utterances only): with probability p an utterance loses
   a random part of its leading and of its trailing quiet frames (those before the first / after
   the last frame louder than halfway between its quietest and loudest, mean over bins), as if
   recorded with tighter end-pointing; drawn from the same stream. Models trained on recordings
   with long silences otherwise fail on tightly cut ones (FSDD's speaker nicolas).
5. Vocal tract length perturbation (Jaitly & Hinton 2013; `data.freq_warp` = w): each training
   utterance (chunk, spliced frame) is read from its filterbank as if every frequency f had been
   f / a, a drawn uniformly from [1 - w, 1 + w] (linear interpolation between the bins, the edge
   bins repeated beyond the band): a longer or shorter vocal tract than any training speaker's, at
   any factor, where speed perturbation gives three. Same stream.

Copies of steps 1-2 are made once, from the audio, with the corpus' own filterbank and CMVN settings
(per-copy-speaker statistics under speaker CMVN, the training split's under global), into
`train/augmented/KEY/` (a feature store, KEY = the settings), and are reused by later runs. Frame
labels of a copy are the original's stretched to its length; transcripts are the original's.
"""
from __future__ import annotations

import json
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Mapping, Sequence

import numpy as np

from asrdist.data.batch import Batch
from asrdist.errors import ConfigError, DataError

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
    from fractions import Fraction

    from scipy.signal import resample_poly

    if factor == 1.0:
        return np.asarray(samples)
    ratio = Fraction(factor).limit_denominator(100)
    out = resample_poly(np.asarray(samples, dtype=np.float64), ratio.denominator, ratio.numerator)
    return out


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
    from asrdist.features.store import FeatureStore, has_features

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
    import sys

    from tqdm import tqdm

    from asrdist.io.audio import read_wav
    from asrdist.io.kaldi_dir import read_data_dir
    from asrdist.features.cmvn import CmvnStats, Normalizer, load_global
    from asrdist.features.fbank import compute_fbank, fbank_options
    from asrdist.features.store import FeatureStore, FeatureStoreWriter, has_features
    from asrdist.io.atomic import atomic_dir

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
    from asrdist.features.store import FeatureStore, has_features

    base = FeatureStore(train_dir)
    path = augmented_store_path(train_dir, data_cfg, seed)
    if path is None:
        return base
    if not has_features(path):
        raise DataError(f"{path}: augmented copies missing (made when the run directory is prepared)")
    sources = json.loads((path / "sources.json").read_text(encoding="utf-8"))
    return AugmentedStore(base, FeatureStore(path), sources)


def warp_positions(num_bins: int, sample_rate: float, factor: float) -> np.ndarray:
    """Step 5: for each mel bin of a filterbank (centres as `asrdist.features.fbank` places them,
    from its low frequency to Nyquist), the fractional bin holding frequency centre / factor."""
    from asrdist.features.fbank import LOW_FREQ_HZ

    def mel(hz):
        return 1127.0 * np.log1p(np.asarray(hz) / 700.0)

    low, high = mel(LOW_FREQ_HZ), mel(sample_rate / 2.0)
    step = (high - low) / (num_bins + 1)
    centres = 700.0 * np.expm1((low + step * np.arange(1, num_bins + 1)) / 1127.0)
    source = np.clip(centres / factor, LOW_FREQ_HZ, sample_rate / 2.0)
    return np.clip((mel(source) - low) / step - 1.0, 0.0, num_bins - 1.0)


def warp_bins(x: np.ndarray, positions: np.ndarray) -> np.ndarray:
    """x [..., num_bins] read at fractional bins `positions` (linear interpolation)."""
    below = np.minimum(np.floor(positions).astype(np.int64), x.shape[-1] - 2)
    frac = (positions - below).astype(x.dtype)
    return x[..., below] * (1 - frac) + x[..., below + 1] * frac


@dataclass
class SpecAugment:
    """Batch transform of steps 3-5; `__call__(batch, rng)` changes the batch's inputs in place."""

    time_masks: int = 0
    time_mask_frames: int = 10
    freq_masks: int = 0
    freq_mask_bins: int = 8
    num_bins: int = 40
    edge_crop: float = 0.0
    freq_warp: float = 0.0
    sample_rate: float = 16000.0

    @classmethod
    def from_config(cls, data_cfg, num_bins: int, sample_rate: float = 16000.0) -> "SpecAugment | None":
        if not (data_cfg.time_masks or data_cfg.freq_masks or data_cfg.edge_crop or data_cfg.freq_warp):
            return None
        return cls(data_cfg.time_masks, data_cfg.time_mask_frames, data_cfg.freq_masks,
                   min(data_cfg.freq_mask_bins, num_bins), num_bins, data_cfg.edge_crop, data_cfg.freq_warp,
                   float(sample_rate))

    def _warp(self, x: np.ndarray, rng: np.random.Generator) -> None:
        """Step 5 on x [..., num_bins], in place: one factor for all of x."""
        if self.freq_warp:
            factor = float(rng.uniform(1.0 - self.freq_warp, 1.0 + self.freq_warp))
            x[...] = warp_bins(x, warp_positions(self.num_bins, self.sample_rate, factor))

    def _freq(self, x: np.ndarray, rng: np.random.Generator) -> None:
        """x [..., num_bins]: the same bands masked in every frame of x."""
        for _ in range(self.freq_masks):
            width = int(rng.integers(0, self.freq_mask_bins + 1))
            start = int(rng.integers(0, self.num_bins - width + 1))
            x[..., start:start + width] = 0.0

    def _time(self, x: np.ndarray, length: int, rng: np.random.Generator) -> None:
        limit = min(self.time_mask_frames, length // 5)
        for _ in range(self.time_masks):
            width = int(rng.integers(0, limit + 1))
            start = int(rng.integers(0, length - width + 1))
            x[start:start + width] = 0.0

    def _crop(self, row: np.ndarray, length: int, min_length: int, rng: np.random.Generator) -> int:
        """Step 4 on one padded utterance, in place; returns its new length."""
        if rng.random() >= self.edge_crop or length < 3:
            return length
        energy = row[:length].mean(axis=1)
        loud = np.flatnonzero(energy > (energy.min() + energy.max()) / 2)
        if loud.size == 0:  # every frame as loud as the others (a silent recording): no quiet edge
            return length
        lead = int(rng.integers(0, loud[0] + 1))
        trail = int(rng.integers(0, length - loud[-1]))
        if length - lead - trail < min_length:
            return length
        row[:length - lead - trail] = row[lead:length - trail].copy()
        row[length - lead - trail:] = 0.0
        return length - lead - trail

    def __call__(self, batch: Batch, rng: np.random.Generator) -> Batch:
        x = batch.inputs.numpy()
        if x.ndim == 2:  # spliced frames [B, (2C+1) * bins]
            rows = x.reshape(x.shape[0], -1, self.num_bins)
            for row in rows:
                self._warp(row, rng)
                self._freq(row, rng)
            return batch
        lengths = batch.input_lengths.numpy() if batch.input_lengths is not None else [x.shape[1]] * len(x)
        # Only utterances (CTC: lengths and target lengths) are cropped; chunks keep frame labels.
        crop = self.edge_crop > 0 and batch.input_lengths is not None and batch.target_lengths is not None
        for index, row in enumerate(x):
            length = int(lengths[index])
            if crop:  # at least 4 frames per target token, so CTC stays feasible after subsampling
                length = self._crop(row, length, 4 * int(batch.target_lengths[index]), rng)
                lengths[index] = length
            self._warp(row[:length], rng)
            self._freq(row[:length], rng)
            self._time(row, length, rng)
        if crop:
            batch.num_frames = int(lengths.sum())
        return batch
