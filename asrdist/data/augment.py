"""Data augmentation for speaker generalisation, switched on in the recipe's `data` section.

1. Speed perturbation (Ko et al. 2015; `data.speed_perturb`): resampled copies `sp{s}-UTT`.
2. Additive pink noise at `data.noise_snr` on every copy, plus a noisy copy at speed 1.0.
3. SpecAugment masks (Park et al. 2019; `data.time_masks`, `data.freq_masks`), per batch.
4. Edge cropping (`data.edge_crop`, CTC): part of the leading and trailing quiet frames cut off.
5. Vocal tract length perturbation (Jaitly & Hinton 2013; `data.freq_warp`), per utterance.
Copies of 1-2 are made once into `train/augmented/KEY/`; 3-5 are drawn from the sampler's
(seed, epoch, rank, batch) stream, so a resumed run sees the same. Each step in full:
docs/data.md#how-each-augmentation-is-made-dataaugmentpy."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from asrdist.data.batch import Batch
from asrdist.features.fbank import LOW_FREQ_HZ


def warp_positions(num_bins: int, sample_rate: float, factor: float) -> np.ndarray:
    """Step 5: for each mel bin of a filterbank (centres as `asrdist.features.fbank` places them,
    from its low frequency to Nyquist), the fractional bin holding frequency centre / factor."""
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
