"""Training targets: monophone frame labels, tied triphone states, CTC token sequences, priors.

Tying rule of `TiedStates` (a frequency-based stand-in for the decision-tree "senones" of the
hybrid papers, deterministic and fit in one pass):

1. Every frame gets a triphone (left, center, right): center is the frame's phone, left/right are
   the phones of the neighbouring *segments* (runs of equal labels) in the alignment, or the
   utterance edge.
2. Classes 0..P-1 are the P monophones, always present, so every triphone can back off.
3. Triphones are ranked by training frames (most first, ties by (left, center, right)); triphones
   whose center is context-independent (e.g. silence) or that have fewer than `min_frames` frames
   are not eligible. The top K-P eligible ones get classes P..K-1 in rank order.
4. Every other triphone, and any unseen one at test time, maps to its center monophone's class.
"""
from __future__ import annotations

from dataclasses import dataclass, fields
from typing import Any, Iterable, Sequence

import numpy as np
import torch

from asrdist.data.bigram import PhoneBigram
from asrdist.errors import ConfigError, DataError

EDGE = -1
"""Context symbol of the utterance edge in `TiedStates.to_dict()` triphones."""


def _check_phone_ids(alignment: np.ndarray, num_phones: int, where: str) -> np.ndarray:
    a = np.asarray(alignment)
    if a.ndim != 1:
        raise DataError(f"{where or 'alignment'}: expected a 1-D label array, got shape {a.shape}")
    if a.size and (a.min() < 0 or a.max() >= num_phones):
        bad = int(a[(a < 0) | (a >= num_phones)][0])
        raise DataError(f"{where or 'alignment'}: phone id {bad} outside 0..{num_phones - 1}")
    return a.astype(np.int32, copy=False)


def monophone_labels(alignments: dict[str, np.ndarray], num_phones: int) -> dict[str, np.ndarray]:
    """Frame labels = the alignment's phone ids as they are (checked to lie in 0..P-1)."""
    return {u: _check_phone_ids(a, num_phones, f"utterance {u}") for u, a in alignments.items()}


def _frame_contexts(alignment: np.ndarray, edge: int) -> tuple[np.ndarray, np.ndarray]:
    """Per-frame left and right context phones, from the neighbouring segments."""
    a = np.asarray(alignment, dtype=np.int64)
    if a.size == 0:
        empty = np.zeros(0, dtype=np.int64)
        return empty, empty
    starts = np.concatenate([[0], np.flatnonzero(a[1:] != a[:-1]) + 1])
    lengths = np.diff(np.concatenate([starts, [a.size]]))
    seg = a[starts]
    left = np.concatenate([[edge], seg[:-1]])
    right = np.concatenate([seg[1:], [edge]])
    return np.repeat(left, lengths), np.repeat(right, lengths)


class TiedStates:
    """Triphones tied to `num_classes` classes by the frequency rule in the module docstring."""

    def __init__(self, num_phones: int, triphones: np.ndarray, context_independent: Sequence[int] = (),
                 min_frames: int = 1):
        self.num_phones = int(num_phones)
        self.context_independent = sorted(int(p) for p in context_independent)
        self.min_frames = int(min_frames)
        tri = np.asarray(triphones, dtype=np.int64).reshape(-1, 3)
        self.triphones = tri
        """[K-P, 3] (left, center, right) of classes P..K-1; the edge context is stored as P."""
        keys = self._keys(tri[:, 0], tri[:, 1], tri[:, 2])
        if len(np.unique(keys)) != len(keys):
            raise DataError("tied states: duplicate triphone")
        order = np.argsort(keys)
        self._sorted_keys = keys[order]
        self._sorted_classes = (order + self.num_phones).astype(np.int32)
        self.class_to_phone = np.concatenate([np.arange(self.num_phones), tri[:, 1]]).astype(np.int32)
        """Center phone of every class (decoding maps class posteriors back to phones)."""

    @property
    def num_classes(self) -> int:
        return self.num_phones + len(self.triphones)

    def _keys(self, left: np.ndarray, center: np.ndarray, right: np.ndarray) -> np.ndarray:
        base = self.num_phones + 1  # phones plus the edge symbol
        return (left * base + center) * base + right

    def _frame_keys(self, alignment: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        center = np.asarray(alignment, dtype=np.int64)
        left, right = _frame_contexts(center, self.num_phones)
        return self._keys(left, center, right), center

    @classmethod
    def fit(cls, alignments: dict[str, np.ndarray], num_phones: int, num_states: int,
            context_independent: Iterable[int] = (), min_frames: int = 1) -> "TiedStates":
        """Count triphone frames over `alignments` and keep the top num_states - num_phones."""
        if num_states < num_phones:
            raise ConfigError(f"tied states: {num_states} classes, need at least one per phone ({num_phones})")
        ci = sorted(set(int(p) for p in context_independent))
        probe = cls(num_phones, np.zeros((0, 3)), ci, min_frames)
        keys = [probe._frame_keys(_check_phone_ids(a, num_phones, f"utterance {u}"))[0]
                for u, a in sorted(alignments.items())]
        all_keys = np.concatenate(keys) if keys else np.zeros(0, dtype=np.int64)
        uniq, counts = np.unique(all_keys, return_counts=True)
        base = num_phones + 1
        center = (uniq // base) % base
        eligible = (counts >= min_frames) & ~np.isin(center, ci)
        uniq, counts = uniq[eligible], counts[eligible]
        # np.unique sorted the keys, and a stable sort on -count keeps that order among ties.
        rank = np.argsort(-counts, kind="stable")[: num_states - num_phones]
        chosen = uniq[rank]
        tri = np.stack([chosen // (base * base), (chosen // base) % base, chosen % base], axis=1)
        return cls(num_phones, tri, ci, min_frames)

    def map(self, alignment: np.ndarray, where: str = "") -> np.ndarray:
        """Frame labels (int32 class ids) for one alignment; unseen triphones back off."""
        a = _check_phone_ids(alignment, self.num_phones, where)
        keys, center = self._frame_keys(a)
        labels = center.astype(np.int32)
        if len(self._sorted_keys) and keys.size:
            pos = np.minimum(np.searchsorted(self._sorted_keys, keys), len(self._sorted_keys) - 1)
            hit = self._sorted_keys[pos] == keys
            labels[hit] = self._sorted_classes[pos[hit]]
        return labels

    def map_all(self, alignments: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        return {u: self.map(a, f"utterance {u}") for u, a in alignments.items()}

    def to_dict(self) -> dict:
        edge = self.num_phones
        tri = [[EDGE if x == edge else int(x) for x in row] for row in self.triphones]
        return {"num_phones": self.num_phones, "context_independent": self.context_independent,
                "min_frames": self.min_frames, "triphones": tri}

    @classmethod
    def from_dict(cls, d: dict) -> "TiedStates":
        try:
            num_phones = int(d["num_phones"])
            tri = np.asarray(d["triphones"], dtype=np.int64).reshape(-1, 3)
        except (KeyError, TypeError, ValueError) as exc:
            raise DataError(f"tied states: malformed saved mapping ({exc})") from None
        tri = np.where(tri == EDGE, num_phones, tri)
        if tri.size and (tri.min() < 0 or tri.max() > num_phones or tri[:, 1].max() >= num_phones):
            raise DataError("tied states: triphone phone id out of range in saved mapping")
        return cls(num_phones, tri, d.get("context_independent", ()), d.get("min_frames", 1))


def phone_tokens(alignment: np.ndarray, silence_id: int) -> list[int]:
    """CTC phone targets: collapse runs of equal frame labels, then drop silence.

    Token id = phone id; silence never appears, so its id can serve as the CTC blank.
    """
    a = np.asarray(alignment)
    if a.size == 0:
        return []
    runs = a[np.concatenate([[True], a[1:] != a[:-1]])]
    return [int(p) for p in runs if p != silence_id]


class CharTokenizer:
    """Characters of the training transcripts -> ids 1..V; id 0 is the CTC blank.

    Text is normalized the same way on fit, encode and decode: lowercased (if `lowercase`),
    whitespace runs collapsed to one space, ends stripped. The space is a token.
    """

    blank_id = 0

    def __init__(self, symbols: Sequence[str], lowercase: bool = True):
        if len(set(symbols)) != len(symbols) or any(len(s) != 1 for s in symbols):
            raise DataError("char tokenizer: symbols must be distinct single characters")
        self.symbols = list(symbols)
        self.lowercase = lowercase
        self._ids = {s: i + 1 for i, s in enumerate(self.symbols)}

    @property
    def vocab_size(self) -> int:
        """Output classes of a CTC model: the characters plus the blank."""
        return len(self.symbols) + 1

    def normalize(self, text: str) -> str:
        text = " ".join(text.split())
        return text.lower() if self.lowercase else text

    @classmethod
    def fit(cls, texts: Iterable[str], lowercase: bool = True) -> "CharTokenizer":
        probe = cls([], lowercase)
        chars = set()
        for t in texts:
            chars.update(probe.normalize(t))
        if not chars:
            raise DataError("char tokenizer: no characters in the training transcripts")
        return cls(sorted(chars), lowercase)

    def unseen(self, text: str) -> set[str]:
        """The characters of `text` (normalized) outside the alphabet."""
        return set(self.normalize(text)) - set(self._ids)

    def encode(self, text: str, where: str = "") -> list[int]:
        ids = []
        for ch in self.normalize(text):
            i = self._ids.get(ch)
            if i is None:
                raise DataError(f"{where or 'text'}: character {ch!r} not in the tokenizer's alphabet")
            ids.append(i)
        return ids

    def decode(self, ids: Iterable[int]) -> str:
        """Ids -> text; blanks are skipped (CTC collapsing is the decoder's job)."""
        out = []
        for i in ids:
            i = int(i)
            if i == self.blank_id:
                continue
            if not 0 < i <= len(self.symbols):
                raise DataError(f"char tokenizer: id {i} outside 0..{len(self.symbols)}")
            out.append(self.symbols[i - 1])
        return "".join(out)

    def to_dict(self) -> dict:
        return {"symbols": self.symbols, "lowercase": self.lowercase}

    @classmethod
    def from_dict(cls, d: dict) -> "CharTokenizer":
        try:
            return cls(list(d["symbols"]), bool(d.get("lowercase", True)))
        except (KeyError, TypeError) as exc:
            raise DataError(f"char tokenizer: malformed saved tokenizer ({exc})") from None


def label_priors(label_arrays: Iterable[np.ndarray], num_classes: int, floor: float = 1e-8) -> np.ndarray:
    """Class priors p(c) = frames of c / all frames, floored at `floor` and renormalized.

    The floor keeps log p finite for classes never seen in training (hybrid decoding divides
    posteriors by priors).
    """
    counts = np.zeros(num_classes, dtype=np.int64)
    for labels in label_arrays:
        a = np.asarray(labels)
        if a.size == 0:
            continue
        if a.min() < 0 or a.max() >= num_classes:
            raise DataError(f"label priors: label outside 0..{num_classes - 1}")
        counts += np.bincount(a.astype(np.int64), minlength=num_classes)
    total = counts.sum()
    if total == 0:
        raise DataError("label priors: no labelled frames")
    priors = np.maximum(counts / total, floor)
    return priors / priors.sum()


@dataclass
class Targets:
    """The label side of a run, fitted on its training split (`targets.pt` in the run directory).

    Frame targets (`kind` monophone or tied) carry `class_to_phone`, `priors` (the hybrid decoder's
    divisor) and `bigram` (the phone bigram its Viterbi search uses); tied ones add `tied`. CTC
    targets are phone ids (`kind` phones: id 0, silence, doubles as the blank) or characters (`kind`
    chars: `tokenizer`)."""

    kind: str
    """monophone, tied, phones or chars (the recipe's `data.targets`)."""
    phones: list[str]
    """The corpus' phone symbols, by id (empty for character targets without a phone table)."""
    silence_id: int
    num_classes: int
    """Outputs of the model."""
    features: dict | None = None
    """The training features' front end (`asrdist.features.frontend.feature_record`), for decoding."""
    tied: TiedStates | None = None
    class_to_phone: np.ndarray | None = None
    priors: np.ndarray | None = None
    bigram: Any = None
    """An `asrdist.eval.decode.PhoneBigram` (a dict of tensors in `targets.pt`)."""
    tokenizer: CharTokenizer | None = None
    features_recorded: bool = True
    """False for the targets of a run from before they kept `features` (its corpus tells)."""

    def to_blob(self) -> dict[str, Any]:
        """The dict `targets.pt` holds: the fields that are set; tied states, tokenizer and bigram as
        dicts, arrays as tensors (tensors and plain values only: it loads as data)."""
        blob = {f.name: getattr(self, f.name) for f in fields(self)
                if getattr(self, f.name) is not None and f.name != "features_recorded"}
        if self.features_recorded:
            blob["features"] = self.features  # None (imported features) is recorded as such
        if self.tied is not None:
            blob["tied"] = self.tied.to_dict()
        if self.tokenizer is not None:
            blob["tokenizer"] = self.tokenizer.to_dict()
        for key in ("class_to_phone", "priors"):
            if key in blob:
                blob[key] = torch.from_numpy(np.array(blob[key]))
        if self.bigram is not None:
            blob["bigram"] = {key: torch.from_numpy(np.array(getattr(self.bigram, key)))
                              for key in ("log_start", "log_trans", "log_end")}
        return blob

    @classmethod
    def from_blob(cls, blob: dict[str, Any], where: str) -> "Targets":
        """The targets of a `targets.pt` dict (of this asrdist or an older one); `where` names the file."""
        missing = [key for key in ("kind", "phones", "silence_id", "num_classes") if key not in blob]
        if missing:
            raise DataError(f"{where}: not an asrdist targets file (no {', '.join(missing)})")
        known = {f.name for f in fields(cls)}
        values = {key: value for key, value in blob.items() if key in known - {"features_recorded"}}
        values["features_recorded"] = "features" in blob
        if isinstance(values.get("tied"), dict):
            values["tied"] = TiedStates.from_dict(values["tied"])
        if isinstance(values.get("tokenizer"), dict):
            values["tokenizer"] = CharTokenizer.from_dict(values["tokenizer"])
        for key in ("class_to_phone", "priors"):  # tensors; numpy arrays in an older asrdist's file
            if values.get(key) is not None:
                values[key] = np.asarray(values[key])
        if isinstance(values.get("bigram"), dict):  # tensors; an older asrdist's file holds the PhoneBigram itself
            values["bigram"] = PhoneBigram.from_dict(values["bigram"])
        return cls(**values)
