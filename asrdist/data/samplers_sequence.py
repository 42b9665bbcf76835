"""Sequence samplers: fixed-length chunks for LSTMs, length-bucketed utterance batches for CTC."""
from __future__ import annotations

from typing import Iterator, Mapping, Sequence

import numpy as np
import torch

from asrdist.data.batch import IGNORE_INDEX, Batch
from asrdist.data.samplers_base import FrameStore, ShardedSampler, utterance_lengths
from asrdist.errors import ConfigError, DataError


class ChunkSampler(ShardedSampler):
    """Batches of `batch_size` chunks of `chunk` frames: inputs [B, chunk, dim], targets [B, chunk].

    Each epoch an utterance of n >= chunk frames is cut into n // chunk chunks starting at a
    random offset in 0..n mod chunk (the leftover frames move each epoch); a shorter utterance is
    one chunk, zero-padded, with IGNORE_INDEX targets and its length in `input_lengths`. All
    chunks of the shard are shuffled together: the store is memory-mapped, so random access costs
    no more memory than the batch.
    """

    kind = "chunks"

    def __init__(self, store: FrameStore, labels: Mapping[str, np.ndarray], utt_ids: Sequence[str] | None = None,
                 rank: int = 0, world_size: int = 1, batch_size: int = 64, chunk: int = 21, seed: int = 0):
        if batch_size < 1 or chunk < 1:
            raise ConfigError(f"ChunkSampler: need batch_size >= 1 and chunk >= 1 (got {batch_size}, {chunk})")
        super().__init__(utterance_lengths(store, labels, utt_ids), rank, world_size, seed)
        self.store, self.labels = store, labels
        self.batch_size, self.chunk = batch_size, chunk
        self._shard_lengths = np.array([self.lengths[u] for u in self.shard], dtype=np.int64)
        len(self)

    def _chunks_per_utt(self, lengths: np.ndarray) -> np.ndarray:
        return np.maximum(lengths // self.chunk, 1)

    def _config(self) -> dict:
        return {"batch_size": self.batch_size, "chunk": self.chunk}

    def _num_batches(self, shard: list[str]) -> int:
        lengths = np.array([self.lengths[u] for u in shard], dtype=np.int64)
        return int(self._chunks_per_utt(lengths).sum()) // self.batch_size

    def _generate(self, epoch: int, start: int) -> Iterator[Batch]:
        rng = self._rng(epoch, 0)
        lengths = self._shard_lengths
        counts = self._chunks_per_utt(lengths)
        slack = np.maximum(lengths - counts * self.chunk, 0)
        offsets = rng.integers(0, slack + 1)
        utt_of_chunk = np.repeat(np.arange(len(lengths)), counts)
        index_in_utt = np.arange(len(utt_of_chunk)) - np.repeat(np.cumsum(counts) - counts, counts)
        chunk_start = offsets[utt_of_chunk] + index_in_utt * self.chunk
        order = rng.permutation(len(utt_of_chunk))
        dim, b, t = self.store.dim, self.batch_size, self.chunk
        for k in range(start, len(self)):
            picked = order[k * b:(k + 1) * b]
            inputs = np.zeros((b, t, dim), dtype=np.float32)
            targets = np.full((b, t), IGNORE_INDEX, dtype=np.int64)
            input_lengths = np.empty(b, dtype=np.int64)
            for row, c in enumerate(picked):
                utt, s = self.shard[utt_of_chunk[c]], int(chunk_start[c])
                n = min(t, int(lengths[utt_of_chunk[c]]) - s)
                inputs[row, :n] = self.store[utt][s:s + n]
                targets[row, :n] = self.labels[utt][s:s + n]
                input_lengths[row] = n
            yield Batch(inputs=torch.from_numpy(inputs), targets=torch.from_numpy(targets),
                        num_frames=int(input_lengths.sum()), input_lengths=torch.from_numpy(input_lengths))


def length_buckets(sorted_lengths: Sequence[int], max_frames: int, max_utterances: int | None = None) -> list[int]:
    """Batch sizes for utterances in ascending length order: each batch is a run of consecutive
    utterances, grown while (utterances x longest) <= max_frames. A single utterance longer than
    max_frames forms a batch alone."""
    sizes: list[int] = []
    count = 0
    for n in sorted_lengths:
        full = max_utterances is not None and count >= max_utterances
        if count and (full or (count + 1) * int(n) > max_frames):
            sizes.append(count)
            count = 0
        count += 1
    if count:
        sizes.append(count)
    return sizes


class UtteranceBatchSampler(ShardedSampler):
    """Whole utterances bucketed by length, for CTC: padded inputs [B, Tmax, dim] and targets
    [B, Lmax] with their lengths; utterances in a batch are sorted longest first (ready for
    `pack_padded_sequence`).

    Buckets are runs of the shard sorted by length, so padding is bounded by the length spread
    inside a run. Each epoch, utterances of equal length are reordered randomly (the bucket sizes,
    hence len(self), never change) and the batches are shuffled.
    """

    kind = "utterances"

    def __init__(self, store: FrameStore, tokens: Mapping[str, Sequence[int]], utt_ids: Sequence[str] | None = None,
                 rank: int = 0, world_size: int = 1, max_frames: int = 4000, seed: int = 0,
                 max_utterances: int | None = None):
        if max_frames < 1 or (max_utterances is not None and max_utterances < 1):
            raise ConfigError(f"UtteranceBatchSampler: need max_frames >= 1 and max_utterances >= 1 "
                              f"(got {max_frames}, {max_utterances})")
        lengths = utterance_lengths(store, None, utt_ids)
        missing = [u for u in lengths if u not in tokens]
        if missing:
            raise DataError(f"utterance {missing[0]}: no token sequence")
        super().__init__(lengths, rank, world_size, seed)
        self.store, self.tokens = store, tokens
        self.max_frames, self.max_utterances = max_frames, max_utterances
        self._shard_lengths = np.array([self.lengths[u] for u in self.shard], dtype=np.int64)
        self._bucket_sizes = length_buckets(np.sort(self._shard_lengths), max_frames, max_utterances)
        len(self)

    def _config(self) -> dict:
        return {"max_frames": self.max_frames, "max_utterances": self.max_utterances}

    def _num_batches(self, shard: list[str]) -> int:
        return len(length_buckets(sorted(self.lengths[u] for u in shard), self.max_frames, self.max_utterances))

    def _generate(self, epoch: int, start: int) -> Iterator[Batch]:
        rng = self._rng(epoch, 0)
        lengths = self._shard_lengths
        by_length = np.lexsort((rng.random(len(lengths)), lengths))
        buckets = np.split(by_length, np.cumsum(self._bucket_sizes)[:-1])
        order = rng.permutation(len(buckets))
        for k in range(start, len(self)):
            members = buckets[order[k]][::-1]  # longest first
            yield self._collate([self.shard[i] for i in members])

    def _collate(self, utts: list[str]) -> Batch:
        n_in = np.array([self.lengths[u] for u in utts], dtype=np.int64)
        n_out = np.array([len(self.tokens[u]) for u in utts], dtype=np.int64)
        inputs = np.zeros((len(utts), int(n_in.max()), self.store.dim), dtype=np.float32)
        targets = np.zeros((len(utts), int(n_out.max(initial=0))), dtype=np.int64)
        for row, u in enumerate(utts):
            inputs[row, :n_in[row]] = self.store[u][:n_in[row]]
            targets[row, :n_out[row]] = self.tokens[u]
        return Batch(inputs=torch.from_numpy(inputs), targets=torch.from_numpy(targets),
                     num_frames=int(n_in.sum()), input_lengths=torch.from_numpy(n_in),
                     target_lengths=torch.from_numpy(n_out))
