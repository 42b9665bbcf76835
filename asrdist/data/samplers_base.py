"""What every sampler shares: sharding, the epoch cursor and its saved state, RNG streams, splicing.

A sampler is a cursor over an endless sequence of epochs. `state_dict()` names the next batch it
will produce (epoch, position); a finished epoch is saved as position 0 of the next one.
Everything random is drawn from `np.random.default_rng([seed, epoch, rank, purpose, index])`, so
any batch can be recomputed from (seed, epoch, rank) without replaying earlier ones.
"""
from __future__ import annotations

import heapq
from typing import Any, Iterator, Mapping, NamedTuple, Protocol, Sequence

import numpy as np

from asrdist.data.batch import Batch
from asrdist.errors import ConfigError, DataError

ALIGNMENT_TOLERANCE = 1
"""Feature and label frame counts may differ by this many (edge) frames; the shorter wins."""


class FrameStore(Protocol):
    """What samplers need from `asrdist.features.store.FeatureStore`."""

    utt_ids: list[str]
    dim: int

    def num_frames(self, utt_id: str) -> int: ...
    def __getitem__(self, utt_id: str) -> np.ndarray: ...
    def __contains__(self, utt_id: str) -> bool: ...


def _assign_shards(frames: Mapping[str, int], world_size: int) -> list[list[str]]:
    """Longest-first greedy: each utterance goes to the rank with the fewest frames so far.

    The input order does not matter (ties broken by utterance id, then by rank), so every
    learner computes the same assignment. Each shard is returned sorted by utterance id.
    """
    loads = [(0, r) for r in range(world_size)]
    shards: list[list[str]] = [[] for _ in range(world_size)]
    for utt in sorted(frames, key=lambda u: (-frames[u], u)):
        load, r = heapq.heappop(loads)
        shards[r].append(utt)
        heapq.heappush(loads, (load + frames[utt], r))
    return [sorted(s) for s in shards]


def shard_utterances(utt_ids: Sequence[str], frames_per_utt: Mapping[str, int] | Sequence[int],
                     rank: int, world_size: int) -> list[str]:
    """This rank's utterances: disjoint across ranks, covering all, balanced by frames."""
    _check_rank(rank, world_size)
    if not isinstance(frames_per_utt, Mapping):
        if len(frames_per_utt) != len(utt_ids):
            raise ConfigError(f"shard_utterances: {len(utt_ids)} utterances but {len(frames_per_utt)} lengths")
        frames_per_utt = dict(zip(utt_ids, frames_per_utt))
    if len(set(utt_ids)) != len(utt_ids):
        raise ConfigError("shard_utterances: duplicate utterance ids")
    return _assign_shards({u: int(frames_per_utt[u]) for u in utt_ids}, world_size)[rank]


def _check_rank(rank: int, world_size: int) -> None:
    if world_size < 1 or not 0 <= rank < world_size:
        raise ConfigError(f"sampler: rank {rank} is not in 0..{world_size - 1} (world size {world_size})")


def utterance_lengths(store: FrameStore, labels: Mapping[str, Any] | None,
                      utt_ids: Sequence[str] | None) -> dict[str, int]:
    """Usable frames per utterance: min(feature frames, label frames), checked against the tolerance.

    `labels` may be frame labels (lengths are compared) or token sequences (pass None and check
    presence separately).
    """
    ids = list(store.utt_ids if utt_ids is None else utt_ids)
    if len(set(ids)) != len(ids):
        raise ConfigError("sampler: duplicate utterance ids")
    lengths: dict[str, int] = {}
    for u in ids:
        if u not in store:
            raise DataError(f"utterance {u}: not in the feature store")
        n = store.num_frames(u)
        if labels is not None:
            if u not in labels:
                raise DataError(f"utterance {u}: no labels")
            n_labels = len(labels[u])
            if abs(n - n_labels) > ALIGNMENT_TOLERANCE:
                raise DataError(f"utterance {u}: {n} feature frames but {n_labels} label frames "
                                f"(tolerance {ALIGNMENT_TOLERANCE})")
            n = min(n, n_labels)
        if n <= 0:
            raise DataError(f"utterance {u}: no frames")
        lengths[u] = n
    if not lengths:
        raise DataError("sampler: no utterances")
    return lengths


def splice(features: np.ndarray, context: int) -> np.ndarray:
    """[T, dim] -> [T, (2C+1)*dim]: frames t-C..t+C side by side, edge frames repeated."""
    x = np.asarray(features, dtype=np.float32)
    if context == 0:
        return np.array(x, copy=True)
    padded = np.concatenate([np.repeat(x[:1], context, 0), x, np.repeat(x[-1:], context, 0)])
    rows = np.arange(len(x))[:, None] + np.arange(2 * context + 1)[None, :]
    return padded[rows.ravel()].reshape(len(x), -1)


class EvalUtterance(NamedTuple):
    utt_id: str
    features: np.ndarray
    """[T, (2C+1)*dim] float32 (spliced) or [T, dim] with context 0."""
    labels: np.ndarray | None


def iterate_utterances(store: FrameStore, utt_ids: Sequence[str] | None = None, context: int = 0,
                       labels: Mapping[str, np.ndarray] | None = None, rank: int = 0,
                       world_size: int = 1) -> Iterator[EvalUtterance]:
    """Utterance by utterance in id order (for decoding), optionally only this rank's shard."""
    lengths = utterance_lengths(store, labels, utt_ids)
    ids = sorted(lengths) if world_size == 1 else shard_utterances(sorted(lengths), lengths, rank, world_size)
    for u in ids:
        n = lengths[u]
        feats = splice(store[u][:n], context)
        yield EvalUtterance(u, feats, None if labels is None else np.asarray(labels[u][:n]))


class ShardedSampler:
    """Base: shard by frames, epoch cursor, resumable state. Subclasses implement
    `_num_batches(shard)` (batches one shard yields per epoch) and `_generate(epoch, start)`
    (exactly len(self) - start batches)."""

    kind = "base"

    def __init__(self, lengths: Mapping[str, int], rank: int, world_size: int, seed: int,
                 shared_stream: bool = False):
        _check_rank(rank, world_size)
        if seed < 0:
            raise ConfigError(f"sampler: seed must be >= 0, got {seed}")
        self.rank, self.world_size, self.seed = rank, world_size, int(seed)
        self.lengths = dict(lengths)
        if shared_stream:  # every rank reads everything and takes its slice of each batch
            self.shards = [sorted(self.lengths)] * world_size
        else:
            self.shards = _assign_shards(self.lengths, world_size)
        self._rng_rank = 0 if shared_stream else rank
        empty = [r for r, s in enumerate(self.shards) if not s]
        if empty:
            n = len(self.lengths)
            raise ConfigError(f"sampler: {n} utterance{'s' if n != 1 else ''} cannot fill {world_size} learners' "
                              f"shards (rank {empty[0]} gets none): use fewer learners or more training data")
        self.shard = self.shards[rank]
        self._epoch, self._position = 0, 0
        self._len: int | None = None
        self.batch_transform = None
        """Optional `(batch, rng) -> batch` applied to every batch (SpecAugment, asrdist.data.augment)."""

    # -- subclass hooks ---------------------------------------------------------------------
    def _num_batches(self, shard: list[str]) -> int:
        raise NotImplementedError

    def _generate(self, epoch: int, start: int) -> Iterator[Batch]:
        raise NotImplementedError

    def _config(self) -> dict:
        """Settings a saved state is only valid for."""
        return {}

    # -- public interface -------------------------------------------------------------------
    def __len__(self) -> int:
        """Batches per epoch: the minimum over all ranks' shards, so every learner takes the
        same number of steps; ranks with more data drop the tail of their epoch order."""
        if self._len is None:
            self._len = min(self._num_batches(s) for s in self.shards)
            if self._len == 0:
                raise ConfigError(f"{type(self).__name__}: some rank's shard is too small for one batch "
                                  f"({len(self.lengths)} utterances, world size {self.world_size}); "
                                  f"lower the batch size")
        return self._len

    @property
    def epoch(self) -> int:
        return self._epoch

    @property
    def shard_frames(self) -> int:
        return sum(self.lengths[u] for u in self.shard)

    def set_epoch(self, epoch: int) -> None:
        """Go to the start of `epoch`; a no-op if already in it (keeps a resumed position)."""
        if epoch < 0:
            raise ConfigError(f"{type(self).__name__}: epoch must be >= 0, got {epoch}")
        if epoch != self._epoch:
            self._epoch, self._position = int(epoch), 0

    def __iter__(self) -> Iterator[Batch]:
        """The rest of the current epoch. One active iterator at a time: it moves the cursor."""
        n = len(self)
        epoch, start = self._epoch, self._position
        produced = start
        for batch in self._batches(epoch, start):
            produced += 1
            if produced >= n:
                self._epoch, self._position = epoch + 1, 0
            else:
                self._position = produced
            yield batch
            if produced >= n:
                return

    def batch_at(self, epoch: int, index: int) -> Batch:
        """Batch `index` of `epoch`, without moving the cursor (job-wide epochs claim batches out
        of order)."""
        if not 0 <= index < len(self):
            raise IndexError(f"{type(self).__name__}: batch {index} outside 0..{len(self) - 1}")
        return next(iter(self._batches(epoch, index)))

    def _batches(self, epoch: int, start: int) -> Iterator[Batch]:
        """`_generate`'s batches through `batch_transform`, with an RNG of (seed, epoch, rank, batch)."""
        for k, batch in enumerate(self._generate(epoch, start), start):
            yield batch if self.batch_transform is None else self.batch_transform(batch, self._rng(epoch, 2, k))

    def state_dict(self) -> dict:
        return {"kind": self.kind, "epoch": self._epoch, "position": self._position, "config": self._full_config()}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind:
            raise ConfigError(f"{type(self).__name__}: saved state is for a '{state.get('kind')}' sampler")
        saved, mine = state.get("config", {}), self._full_config()
        for key in sorted(set(saved) | set(mine)):
            if saved.get(key) != mine.get(key):
                raise ConfigError(f"{type(self).__name__}: saved state has {key}={saved.get(key)!r}, "
                                  f"this sampler {key}={mine.get(key)!r}; cannot resume")
        position = int(state["position"])
        if not 0 <= position < len(self):
            raise ConfigError(f"{type(self).__name__}: saved position {position} outside 0..{len(self) - 1}")
        self._epoch, self._position = int(state["epoch"]), position

    # -- helpers ------------------------------------------------------------------------------
    def _full_config(self) -> dict:
        return {"rank": self.rank, "world_size": self.world_size, "seed": self.seed,
                "utterances": len(self.lengths), "frames": sum(self.lengths.values()), **self._config()}

    def _rng(self, epoch: int, purpose: int, index: int = 0) -> np.random.Generator:
        return np.random.default_rng([self.seed, epoch, self._rng_rank, purpose, index])
