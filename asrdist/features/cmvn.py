"""Cepstral mean and variance normalization: per feature dimension, x -> (x - mean) / std.

Modes: `global` (one set of statistics, from the training split, applied to every split),
`speaker` (each speaker normalized by its own statistics, as Kaldi's per-speaker CMVN; needs no
training data, so unseen test speakers are fine), `none`. Statistics are float64 sums, so
accumulation order barely matters; the applied statistics are saved as `feats/cmvn.json`.
"""
from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from asrdist.errors import ConfigError, DataError

MODES = ("global", "speaker", "none")
VARIANCE_FLOOR = 1e-8


@dataclass
class CmvnStats:
    """Running sums of one group of frames (a corpus split or one speaker)."""

    dim: int
    count: int = 0
    sum: np.ndarray = field(default=None)
    sum_sq: np.ndarray = field(default=None)

    def __post_init__(self):
        if self.sum is None:
            self.sum = np.zeros(self.dim, dtype=np.float64)
        if self.sum_sq is None:
            self.sum_sq = np.zeros(self.dim, dtype=np.float64)

    def accumulate(self, feats: np.ndarray) -> None:
        x = np.asarray(feats, dtype=np.float64)
        self.count += x.shape[0]
        self.sum += x.sum(axis=0)
        self.sum_sq += np.square(x).sum(axis=0)

    def merge(self, other: "CmvnStats") -> None:
        self.count += other.count
        self.sum += other.sum
        self.sum_sq += other.sum_sq

    @property
    def mean(self) -> np.ndarray:
        if self.count == 0:
            raise DataError("CMVN: no frames to compute statistics from")
        return self.sum / self.count

    @property
    def std(self) -> np.ndarray:
        var = self.sum_sq / self.count - np.square(self.mean)
        return np.sqrt(np.maximum(var, VARIANCE_FLOOR))

    def apply(self, feats: np.ndarray) -> np.ndarray:
        return ((feats - self.mean) / self.std).astype(np.float32)

    def to_json(self) -> dict:
        return {"count": self.count, "mean": self.mean.tolist(), "std": self.std.tolist()}


class Normalizer:
    """Applies one CMVN mode: `global` uses `stats[None]`, `speaker` uses `stats[speaker]`."""

    def __init__(self, mode: str, stats: dict[str | None, CmvnStats] | None = None):
        if mode not in MODES:
            raise ConfigError(f"cmvn: unknown mode '{mode}' (expected {', '.join(MODES)})")
        self.mode = mode
        self.stats = stats or {}

    def __call__(self, feats: np.ndarray, speaker: str) -> np.ndarray:
        if self.mode == "none":
            return feats
        key = None if self.mode == "global" else speaker
        if key not in self.stats:
            raise DataError(f"CMVN: no statistics for speaker '{speaker}'")
        return self.stats[key].apply(feats)

    def save(self, path: str | Path, source: str) -> None:
        """Write the statistics as JSON; `source` says where they were computed (a split)."""
        body = {"mode": self.mode, "source": source}
        if self.mode == "global":
            body.update(self.stats[None].to_json())
        elif self.mode == "speaker":
            body["speakers"] = {spk: s.to_json() for spk, s in sorted(self.stats.items())}
        Path(path).write_text(json.dumps(body) + "\n", encoding="utf-8")


def load_global(path: str | Path) -> tuple[np.ndarray, np.ndarray]:
    """(mean, std) of a saved global `cmvn.json`, e.g. to normalize new audio at decoding time."""
    body = json.loads(Path(path).read_text(encoding="utf-8"))
    if body.get("mode") != "global":
        raise DataError(f"{path}: CMVN mode '{body.get('mode')}', expected global")
    return np.asarray(body["mean"]), np.asarray(body["std"])
