"""The feature store: per-utterance float32 matrices in memory-mapped shards, for random access.

`SPLIT/feats/` holds `meta.json`, `index.tsv` (utterance, shard, offset, frames) and raw float32
shards. Readers open shards read-only and lazily; opening a store checks it without reading
features, reading an utterance checks its values, and a store is never rewritten under a reader
(`hold_for_reading`, `rewriting`). The layout and the checks:
docs/data.md#the-feature-store-featuresstorepy."""
from __future__ import annotations

import contextlib
import fcntl
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Iterator

import kaldiio
import numpy as np

from asrdist.errors import DataError
from asrdist.io.kaldi_dir import read_table

FORMAT_VERSION = 1
SHARD_BYTES = 256 << 20
FEATS_DIR = "feats"


def _feats_dir(path: str | Path) -> Path:
    path = Path(path)
    if (path / "meta.json").is_file():
        return path
    return path / FEATS_DIR


_READING: dict[str, int] = {}
"""Split directory -> the descriptor this process holds its shared lock on."""


def hold_for_reading(split_dir: str | Path) -> None:
    """Hold a shared lock on `split_dir` until this process ends, so that no other command rewrites
    its features meanwhile; waits (saying so) while another command writes them."""
    key = str(Path(split_dir).resolve())
    if key in _READING:
        return
    fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
    except BlockingIOError:
        print(f"[asrdist] {split_dir}: waiting for another asrdist command writing its features", file=sys.stderr,
              flush=True)
        fcntl.flock(fd, fcntl.LOCK_SH)
    _READING[key] = fd


@contextlib.contextmanager
def rewriting(split_dir: str | Path, hint: str = "") -> Iterator[None]:
    """Hold `split_dir` exclusively while its features are written; another command reading or
    writing them is one DataError line (`hint` says what to do instead)."""
    key = str(Path(split_dir).resolve())
    fd, own = _READING.get(key), key not in _READING
    if own:
        fd = os.open(key, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            if not own:
                fcntl.flock(fd, fcntl.LOCK_SH)  # a failed conversion may have dropped this process' own hold
            raise DataError(f"{split_dir}: its features are in use by another asrdist command (training, decoding "
                            f"or extracting on them), and writing them now would change them under it; "
                            f"{hint or 'run this again when that command has ended'}") from None
        yield
    finally:
        if own:
            os.close(fd)
        else:
            fcntl.flock(fd, fcntl.LOCK_SH)


def has_features(split_dir: str | Path) -> bool:
    feats = _feats_dir(split_dir)
    return (feats / "meta.json").is_file() and (feats / "index.tsv").is_file()


def damaged_store(split_dir: str | Path) -> str | None:
    """Why `split_dir`'s feature store directory exists but is no complete store, or None."""
    feats = _feats_dir(split_dir)
    if not feats.is_dir() or has_features(feats) or not any(feats.iterdir()):
        return None
    missing = "meta.json" if not (feats / "meta.json").is_file() else "index.tsv"
    return f"{feats / missing}: missing, the feature store in {feats} is incomplete"


class FeatureStore:
    """Read-only view of a split's features: `store[utt_id]` is a float32 [frames, dim] memmap view."""

    def __init__(self, path: str | Path):
        self.path = _feats_dir(path)
        if not has_features(self.path):
            damaged = damaged_store(path)
            if damaged:
                raise DataError(f"{damaged}; rebuild it with `asrdist features ... --overwrite`")
            raise DataError(f"{Path(path)}: no feature store (run `asrdist features` first)")
        meta_path = self.path / "meta.json"
        try:
            self.meta: dict = json.loads(meta_path.read_text(encoding="utf-8"))
        except (json.JSONDecodeError, UnicodeDecodeError) as exc:
            raise DataError(f"{meta_path}: unreadable ({exc})") from None
        if not isinstance(self.meta, dict) or self.meta.get("version") != FORMAT_VERSION:
            version = self.meta.get("version") if isinstance(self.meta, dict) else None
            raise DataError(f"{meta_path}: format version {version}, expected {FORMAT_VERSION}")
        dim = self.meta.get("dim")
        if isinstance(dim, bool) or not isinstance(dim, int) or dim < 1:
            raise DataError(f"{meta_path}: 'dim' is {dim!r}, expected a positive integer")
        self.dim: int = dim
        self._index: dict[str, tuple[int, int, int]] = {}
        self._read_index()
        self.utt_ids: list[str] = sorted(self._index)
        self.total_frames: int = sum(frames for _, _, frames in self._index.values())
        for key, have in (("num_utterances", len(self._index)), ("total_frames", self.total_frames)):
            if key in self.meta and self.meta[key] != have:
                raise DataError(f"{self.path / 'index.tsv'}: {have} {key.replace('_', ' ').removeprefix('num ')} "
                                f"indexed, {meta_path.name} says {self.meta[key]} (a damaged or edited index)")
        self._shards: dict[int, np.ndarray] = {}
        self._finite: set[str] = set()

    def _read_index(self) -> None:
        index = self.path / "index.tsv"
        rows_of: dict[int, list[tuple[int, int, str]]] = {}
        for lineno, line in enumerate(index.read_text(encoding="utf-8").splitlines(), 1):
            parts = line.split("\t")
            try:
                utt_id, shard, offset, frames = parts[0], int(parts[1]), int(parts[2]), int(parts[3])
            except (IndexError, ValueError):
                raise DataError(f"{index}:{lineno}: expected 'utt_id shard offset frames'") from None
            if len(parts) != 4 or not utt_id or any(c.isspace() for c in utt_id):
                raise DataError(f"{index}:{lineno}: expected 'utt_id shard offset frames' (ids without spaces)")
            if utt_id in self._index:
                raise DataError(f"{index}:{lineno}: utterance {utt_id} indexed twice")
            if shard < 0 or offset < 0 or frames <= 0:
                raise DataError(f"{index}:{lineno}: utterance {utt_id}: shard {shard}, rows {offset}+{frames}")
            rows_of.setdefault(shard, []).append((offset, frames, utt_id))
            self._index[utt_id] = (shard, offset, frames)
        for shard, rows in rows_of.items():
            self._check_shard(index, shard, sorted(rows))

    def _check_shard(self, index: Path, shard: int, rows: list[tuple[int, int, str]]) -> None:
        """The index's rows of `shard` must tile the whole shard file, one utterance after the other."""
        shard_file = self._shard_path(shard)
        if not shard_file.is_file():
            raise DataError(f"{index}: utterance {rows[0][2]}: shard {shard_file.name} missing")
        size, row_bytes = shard_file.stat().st_size, 4 * self.dim
        if size % row_bytes:
            raise DataError(f"{shard_file}: {size} bytes is no whole number of {self.dim}-value rows (truncated?)")
        end, previous = 0, None
        for offset, frames, utt_id in rows:
            if offset < end:
                raise DataError(f"{index}: utterance {utt_id}: rows {offset}..{offset + frames} of "
                                f"{shard_file.name} overlap utterance {previous}'s (a damaged or edited index)")
            if offset > end:
                raise DataError(f"{index}: utterance {utt_id}: rows {end}..{offset} of {shard_file.name} "
                                f"before it belong to no utterance (a damaged or edited index)")
            end, previous = offset + frames, utt_id
        if end != size // row_bytes:
            what = "past the end of" if end > size // row_bytes else "short of the end of"
            raise DataError(f"{index}: utterance {previous}: its rows end at {end}, {what} {shard_file.name} "
                            f"({size // row_bytes} rows; truncated store or edited index?)")

    def check_frames(self, lengths: dict[str, int], source: str | Path, tolerance: int = 1) -> None:
        """Every utterance of `lengths` (e.g. alignment lengths from `source`) that has features has
        that many frames, within `tolerance` edge frames; else a DataError naming it."""
        for utt_id in sorted(lengths):
            entry = self._index.get(utt_id)
            if entry is not None and abs(entry[2] - lengths[utt_id]) > tolerance:
                raise DataError(f"{source}: utterance {utt_id}: {lengths[utt_id]} frames, its features in "
                                f"{self.path} have {entry[2]} (tolerance {tolerance}): features of other "
                                f"audio? re-extract with `asrdist features ... --overwrite`")

    def _shard_path(self, shard: int) -> Path:
        return self.path / f"shard-{shard:05d}.f32"

    def _shard(self, shard: int) -> np.ndarray:
        mm = self._shards.get(shard)
        if mm is None:
            mm = np.memmap(self._shard_path(shard), dtype="<f4", mode="r").reshape(-1, self.dim)
            self._shards[shard] = mm
        return mm

    def __getitem__(self, utt_id: str) -> np.ndarray:
        try:
            shard, offset, frames = self._index[utt_id]
        except KeyError:
            raise KeyError(f"{self.path}: no features for utterance {utt_id}") from None
        feats = self._shard(shard)[offset:offset + frames]
        if utt_id not in self._finite:
            self._check_finite(utt_id, shard, offset, feats)
        return feats

    def _check_finite(self, utt_id: str, shard: int, offset: int, feats: np.ndarray) -> None:
        """A shard overwritten or damaged on disk passes the structural checks of opening; its
        NaN or infinite values would be scored or trained on silently. Checked once per utterance."""
        bad = ~np.isfinite(feats)
        if bad.any():
            frame = int(np.flatnonzero(bad.any(axis=1))[0])
            raise DataError(f"{self._shard_path(shard)}: utterance {utt_id}: non-finite feature values "
                            f"(NaN or infinity) from frame {frame} (row {offset + frame}); a damaged store: "
                            f"re-extract with `asrdist features ... --overwrite`")
        self._finite.add(utt_id)

    def num_frames(self, utt_id: str) -> int:
        return self._index[utt_id][2]

    def __len__(self) -> int:
        return len(self._index)

    def __contains__(self, utt_id: object) -> bool:
        return utt_id in self._index

    def __getstate__(self) -> dict:
        # Pickling (e.g. to spawned workers) must not copy the mapped shards: reopen lazily.
        state = self.__dict__.copy()
        state["_shards"] = {}
        return state


def _digest(parts) -> str:
    h = hashlib.sha256()
    for part in parts:
        h.update(part if isinstance(part, bytes) else str(part).encode("utf-8", "replace"))
        h.update(b"\0")
    return h.hexdigest()[:16]


def _source(split: Path) -> tuple[dict, list[str]]:
    """(`source_record`, the utterance ids it lists: of `segments` if any, else of `wav.scp`),
    each table read once."""
    wav_scp, segments = read_table(split / "wav.scp", required=False), read_table(split / "segments", required=False)
    ids = sorted(segments or wav_scp)
    tables = [(split / name).read_bytes() if (split / name).is_file() else b"-"
              for name in ("wav.scp", "segments", "utt2spk")]
    stats = []
    for wav in sorted(set(wav_scp.values())):
        path = Path(wav) if Path(wav).is_absolute() else split / wav
        try:
            st = path.stat()
            stats.append(f"{wav}\t{st.st_size}\t{st.st_mtime_ns}")
        except OSError:
            stats.append(f"{wav}\tmissing")
    record = {"utterances": len(ids), "utterance_ids": _digest(ids), "tables": _digest(tables),
              "audio": _digest(stats)}
    return record, ids


def source_record(split_dir: str | Path) -> dict:
    """What a split's features are computed from, kept in `meta.json` as `source` at extraction:
    the utterance ids, the tables that pick audio and speakers (wav.scp, segments, utt2spk: speaker
    CMVN depends on them), and each audio file's size and modification time. Cheap (no audio is
    read), so every train / eval / align can tell a store that no longer fits its split."""
    return _source(Path(split_dir))[0]


def source_change(split_dir: str | Path, store: FeatureStore) -> str | None:
    """Why `store` no longer fits split `split_dir` (utterances added or removed, audio or tables
    edited since extraction), or None. A store without a recorded `source` (written before it
    was kept) is compared by utterance ids only, its skipped utterances allowed for."""
    recorded = store.meta.get("source")
    now, listed = _source(Path(split_dir))
    if not isinstance(recorded, dict):
        return _ids_change(listed, store, allowed_missing=int(store.meta.get("skipped") or 0))
    if now["utterance_ids"] != recorded.get("utterance_ids"):
        have = set(store.utt_ids)
        new = next((u for u in listed if u not in have), None)
        return (f"it lists {now['utterances']} utterances, {recorded.get('utterances')} when its features "
                f"were extracted" + (f" ({new} has none)" if new else ""))
    if now["tables"] != recorded.get("tables"):
        return "wav.scp, segments or utt2spk changed since its features were extracted"
    if now["audio"] != recorded.get("audio"):
        return "audio files changed (size or modification time) since its features were extracted"
    return None


def _ids_change(listed: list[str], store: FeatureStore, allowed_missing: int) -> str | None:
    """Features of utterances no longer listed, or more than `allowed_missing` listed utterances
    without features: the store is of another utterance set."""
    have = set(store.utt_ids)
    gone = sorted(have.difference(listed))
    if gone:
        return f"its features include {len(gone)} utterance(s) wav.scp no longer lists (e.g. {gone[0]})"
    new = [u for u in listed if u not in have]
    if len(new) > allowed_missing:
        return f"{len(new)} utterance(s) of wav.scp have no features (e.g. {new[0]})"
    return None


class FeatureStoreWriter:
    """Append utterances in any order; `close()` writes the sorted index and `meta.json`.

    Writes into `path` directly: the caller builds the store in a temporary directory and
    renames it (`asrdist.io.atomic.atomic_dir`).
    """

    def __init__(self, path: str | Path, dim: int, shard_bytes: int = SHARD_BYTES):
        self.path = Path(path)
        self.path.mkdir(parents=True, exist_ok=True)
        self.dim = dim
        self.shard_bytes = shard_bytes
        self._entries: dict[str, tuple[int, int, int]] = {}
        self._shard = -1
        self._rows = 0
        self._file = None
        self._next_shard()

    def _next_shard(self) -> None:
        if self._file is not None:
            self._file.close()
        self._shard += 1
        self._rows = 0
        self._file = open(self.path / f"shard-{self._shard:05d}.f32", "wb")

    def __len__(self) -> int:
        return len(self._entries)

    def add(self, utt_id: str, feats: np.ndarray) -> None:
        feats = np.ascontiguousarray(feats, dtype="<f4")
        if feats.ndim != 2 or feats.shape[1] != self.dim or feats.shape[0] == 0:
            raise DataError(f"utterance {utt_id}: features of shape {feats.shape}, "
                            f"expected [frames>0, {self.dim}]")
        if utt_id in self._entries:
            raise DataError(f"utterance {utt_id}: features written twice")
        if self._rows and (self._rows + len(feats)) * 4 * self.dim > self.shard_bytes:
            self._next_shard()
        self._file.write(feats.tobytes())
        self._entries[utt_id] = (self._shard, self._rows, len(feats))
        self._rows += len(feats)

    def close(self, meta: dict) -> dict:
        """Finish the store; `meta` adds fields (num_mel_bins, cmvn, ...). Returns the full meta."""
        self._file.close()
        lines = [f"{u}\t{s}\t{o}\t{n}\n" for u, (s, o, n) in sorted(self._entries.items())]
        (self.path / "index.tsv").write_text("".join(lines), encoding="utf-8")
        full = {"version": FORMAT_VERSION, "dim": self.dim, **meta,
                "num_utterances": len(self._entries),
                "total_frames": sum(n for _, _, n in self._entries.values()),
                "num_shards": self._shard + 1}
        (self.path / "meta.json").write_text(json.dumps(full, indent=2) + "\n", encoding="utf-8")
        return full

    def normalize(self, transform) -> None:
        """Rewrite every utterance in place as `transform(utt_id, feats)` (before `close`)."""
        self._file.flush()
        maps: dict[int, np.ndarray] = {}
        for utt_id, (shard, offset, frames) in self._entries.items():
            if shard not in maps:
                maps[shard] = np.memmap(self.path / f"shard-{shard:05d}.f32", dtype="<f4",
                                        mode="r+").reshape(-1, self.dim)
            view = maps[shard][offset:offset + frames]
            view[:] = transform(utt_id, np.array(view))
        for mm in maps.values():
            mm.flush()


def export_kaldi(store: FeatureStore, out_dir: str | Path, final_dir: str | Path | None = None) -> None:
    """Write `feats.ark` + `feats.scp` (kaldiio) into `out_dir`.

    `final_dir` is where `out_dir` will live once renamed: the scp names that absolute path,
    since Kaldi tools resolve scp paths against their working directory, not the scp's.
    """
    out_dir = Path(out_dir)
    final = Path(final_dir or out_dir).resolve() / "feats.ark"
    ark = out_dir / "feats.ark"
    tmp_scp = out_dir / ".feats.scp.tmp"
    with kaldiio.WriteHelper(f"ark,scp:{ark},{tmp_scp}") as writer:
        for utt_id in store.utt_ids:
            writer(utt_id, np.asarray(store[utt_id]))
    lines = []
    for line in tmp_scp.read_text(encoding="utf-8").splitlines():
        utt_id, loc = line.split(maxsplit=1)
        lines.append(f"{utt_id} {final}:{loc.rpartition(':')[2]}\n")
    (out_dir / "feats.scp").write_text("".join(lines), encoding="utf-8")
    tmp_scp.unlink()
