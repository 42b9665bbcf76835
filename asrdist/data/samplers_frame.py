"""Frame-level randomized minibatches with spliced context, for DNN acoustic models.

CNTK's block randomizer in its simplest form:
1. shuffle this learner's shard of utterances (RNG of seed, epoch, rank);
2. cut the shuffled list into windows of `window_utterances` utterances;
3. load one window (edge frames padded C times) and shuffle its frames (RNG of ..., window);
4. batch k is frames [kB, (k+1)B) of the windows' frames in turn, spliced by one gather.
One window is in memory at a time; every frame appears once per epoch but the stream's tail
(docs/data.md#frame-minibatches-for-dnns-datasamplers_framepy)."""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np
import torch

from asrdist.data.batch import Batch
from asrdist.data.samplers_base import FrameStore, ShardedSampler, utterance_lengths
from asrdist.errors import ConfigError


class _Window:
    """One loaded window: padded feature matrix, and per stream frame its matrix row and label."""

    __slots__ = ("epoch", "first", "rows", "labels", "matrix")

    def __init__(self, epoch: int, first: int, matrix: np.ndarray, rows: np.ndarray, labels: np.ndarray):
        self.epoch, self.first, self.matrix, self.rows, self.labels = epoch, first, matrix, rows, labels


class FrameSampler(ShardedSampler):
    """Batches of `batch_size` frames: inputs [B, (2C+1)*dim] float32, targets [B] int64.

    `shared_stream=True` makes every rank walk the same global stream (no sharding) and take its
    slice of each global batch of world_size * batch_size frames: n learners x B then see exactly
    what one learner x nB sees (the sync-SGD invariant test), at n times the reading cost.
    """

    kind = "frames"

    def __init__(self, store: FrameStore, labels: Mapping[str, np.ndarray], utt_ids: Sequence[str] | None = None,
                 rank: int = 0, world_size: int = 1, batch_size: int = 256, context: int = 5, seed: int = 0,
                 window_utterances: int = 64, shared_stream: bool = False):
        if batch_size < 1 or context < 0 or window_utterances < 1:
            raise ConfigError(f"FrameSampler: need batch_size >= 1, context >= 0, window_utterances >= 1 "
                              f"(got {batch_size}, {context}, {window_utterances})")
        super().__init__(utterance_lengths(store, labels, utt_ids), rank, world_size, seed, shared_stream)
        self.store, self.labels = store, labels
        self.batch_size, self.context, self.window_utterances = batch_size, context, window_utterances
        self.shared_stream = shared_stream
        self._stream_batch = batch_size * world_size if shared_stream else batch_size
        self._slice_offset = rank * batch_size if shared_stream else 0
        self._shard_lengths = np.array([self.lengths[u] for u in self.shard], dtype=np.int64)
        self._offsets = np.arange(-context, context + 1, dtype=np.int64)
        self._window: _Window | None = None
        """The last loaded window, kept for `batch_at`'s random access (a pure cache)."""
        len(self)  # fail now, not at the first epoch, if a shard is too small

    @property
    def input_dim(self) -> int:
        return (2 * self.context + 1) * self.store.dim

    def _config(self) -> dict:
        return {"batch_size": self.batch_size, "context": self.context,
                "window_utterances": self.window_utterances, "shared_stream": self.shared_stream}

    def _num_batches(self, shard: list[str]) -> int:
        return sum(self.lengths[u] for u in shard) // self._stream_batch

    def _generate(self, epoch: int, start: int) -> Iterator[Batch]:
        order = self._rng(epoch, 0).permutation(len(self.shard))
        windows = [order[i:i + self.window_utterances] for i in range(0, len(order), self.window_utterances)]
        window_starts = np.cumsum([0] + [int(self._shard_lengths[w].sum()) for w in windows])
        current = self._window if self._window is not None and self._window.epoch == epoch else None
        for k in range(start, len(self)):
            lo = k * self._stream_batch + self._slice_offset
            hi = lo + self.batch_size
            inputs, targets = [], []
            while lo < hi:
                if current is None or not current.first <= lo < current.first + len(current.rows):
                    w = int(np.searchsorted(window_starts, lo, side="right")) - 1
                    current = self._window = self._load_window(epoch, w, windows[w], int(window_starts[w]))
                take = min(hi, current.first + len(current.rows)) - lo
                sel = slice(lo - current.first, lo - current.first + take)
                inputs.append(self._gather(current.matrix, current.rows[sel]))
                targets.append(current.labels[sel])
                lo += take
            x = inputs[0] if len(inputs) == 1 else np.concatenate(inputs)
            y = targets[0] if len(targets) == 1 else np.concatenate(targets)
            yield Batch(inputs=torch.from_numpy(x), targets=torch.from_numpy(y), num_frames=self.batch_size)

    def _gather(self, matrix: np.ndarray, rows: np.ndarray) -> np.ndarray:
        index = (rows[:, None] + self._offsets[None, :]).ravel()
        return np.take(matrix, index, axis=0).reshape(len(rows), -1)

    def _load_window(self, epoch: int, index: int, members: np.ndarray, first: int) -> _Window:
        c = self.context
        lengths = self._shard_lengths[members]
        matrix = np.empty((int(lengths.sum()) + 2 * c * len(members), self.store.dim), dtype=np.float32)
        labels = np.empty(int(lengths.sum()), dtype=np.int64)
        row, pos = 0, 0
        for i, n in zip(members, lengths):
            utt, n = self.shard[i], int(n)
            feats = self.store[utt]
            matrix[row:row + c] = feats[0]
            matrix[row + c:row + c + n] = feats[:n]
            matrix[row + c + n:row + 2 * c + n] = feats[n - 1]
            labels[pos:pos + n] = self.labels[utt][:n]
            row, pos = row + n + 2 * c, pos + n
        # Frame j of the i-th member sits at matrix row (frames before it) + 2C*i + C.
        rows = np.arange(pos, dtype=np.int64) + np.repeat(2 * c * np.arange(len(members)) + c, lengths)
        perm = self._rng(epoch, 1, index).permutation(pos)
        return _Window(epoch, first, matrix, rows[perm], labels[perm])
