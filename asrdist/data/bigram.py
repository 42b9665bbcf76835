"""The phone bigram a hybrid model's Viterbi search uses, estimated from the training alignments
and saved with the targets (`asrdist.data.targets`); decoding reads it (`asrdist.eval.decode`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from asrdist.errors import DataError

NEG_INF = -np.inf
LEGACY_NAME = "asrdist.eval.decode.PhoneBigram"
"""Where an older asrdist's `targets.pt` says the class lives (it was pickled whole there)."""


@dataclass
class PhoneBigram:
    """Log-probabilities of a phone bigram with sentence start and end (add-`smoothing` estimates)."""

    log_start: np.ndarray
    """[P] log P(first phone = p)."""
    log_trans: np.ndarray
    """[P, P] log P(next = q | current = p), row p."""
    log_end: np.ndarray
    """[P] log P(sentence ends | last phone = p), the end event competing with the P next phones."""

    @property
    def num_phones(self) -> int:
        return int(self.log_start.shape[0])

    @classmethod
    def fit(cls, phone_sequences: Sequence[Sequence[int]], num_phones: int, smoothing: float = 1.0) -> "PhoneBigram":
        """Count starts, transitions and ends in `phone_sequences` (ids in [0, num_phones)) and add
        `smoothing` to every count (> 0 keeps every path possible)."""
        if num_phones < 1:
            raise DataError(f"phone bigram: num_phones must be >= 1, got {num_phones}")
        if smoothing < 0:
            raise DataError(f"phone bigram: smoothing must be >= 0, got {smoothing}")
        start = np.full(num_phones, float(smoothing))
        trans = np.full((num_phones, num_phones + 1), float(smoothing))  # last column: sentence end
        for index, seq in enumerate(phone_sequences):
            ids = np.asarray(seq, dtype=np.int64)
            if ids.size == 0:
                continue
            if ids.min() < 0 or ids.max() >= num_phones:
                raise DataError(f"phone bigram: sequence {index} has a phone id outside [0, {num_phones})")
            start[ids[0]] += 1
            np.add.at(trans, (ids[:-1], ids[1:]), 1.0)
            trans[ids[-1], num_phones] += 1
        with np.errstate(divide="ignore", invalid="ignore"):
            log_start = np.log(start / start.sum()) if start.sum() > 0 else np.full(num_phones, NEG_INF)
            rows = trans.sum(axis=1, keepdims=True)
            log_rows = np.where(rows > 0, np.log(trans) - np.log(np.where(rows > 0, rows, 1.0)), NEG_INF)
        return cls(log_start=log_start, log_trans=log_rows[:, :num_phones], log_end=log_rows[:, num_phones])

    def to_dict(self) -> dict:
        return {"log_start": self.log_start.tolist(), "log_trans": self.log_trans.tolist(),
                "log_end": self.log_end.tolist()}

    @classmethod
    def from_dict(cls, d: dict) -> "PhoneBigram":
        return cls(**{k: np.asarray(d[k], dtype=np.float64) for k in ("log_start", "log_trans", "log_end")})
