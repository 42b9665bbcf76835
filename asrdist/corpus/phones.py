"""Phone inventories: asrdist's default (silence plus the 39 ARPAbet phones, stress dropped), or
the data's own, from a Kaldi `phones.txt` or a lexicon's phones.

Silence is id 0 in every table (it doubles as the phone CTC blank). A source whose symbols all map
onto ARPAbet (stress digits, TIMIT / Kaldi aliases, silence and noise symbols) keeps the default
table, so a model trained on the espeak corpus can be tested on flite speech or an imported Kaldi
directory; any other source defines its own: silence plus its phones as written, sorted
(`inventory`). A Kaldi `phones.txt` (`<eps>` 0, position-dependent `a_B`/`a_E`/`a_I`/`a_S`,
disambiguation `#0`...) is read onto such a table with its ids mapped (`PhoneTable.kaldi_ids`).
"""
from __future__ import annotations

import re
from pathlib import Path
from typing import Iterable

import numpy as np

from asrdist.errors import DataError
from asrdist.io.atomic import write_text_atomic

SILENCE = "sil"
ARPABET = (
    "aa ae ah ao aw ay b ch d dh eh er ey f g hh ih iy jh k l m n ng "
    "ow oy p r s sh t th uh uw v w y z zh"
).split()
PHONES: tuple[str, ...] = (SILENCE, *ARPABET)
SILENCE_ALIASES = frozenset({"sil", "sp", "spn", "nsn", "<sil>", "h#", "pau", "epi"})
"""Silence and noise symbols of Kaldi and TIMIT (any case): `sil` in every table."""
PHONE_ALIASES = {
    "ax": "ah", "axh": "ah", "ax-h": "ah", "axr": "er", "ix": "ih", "ux": "uw", "dx": "t", "nx": "n",
    "hv": "hh", "el": "l", "em": "m", "en": "n", "eng": "ng", **{s: SILENCE for s in SILENCE_ALIASES},
}
"""Non-ARPAbet symbols -> asrdist phones (TIMIT's reduced vowels and flaps, Kaldi's silence/noise)."""
_KALDI_POSITION = re.compile(r"_[BEIS]$")
_KALDI_DROPPED = re.compile(r"^(<eps>|#\d+)$")


def arpabet_of(symbol: str) -> str | None:
    """The ARPAbet phone (or `sil`) a symbol maps onto, stress dropped; None when it maps onto none."""
    s = symbol.lower().rstrip("012")
    s = PHONE_ALIASES.get(s, s)
    return s if s in PHONES else None


def own_symbol(symbol: str) -> str:
    """A symbol of a data-defined inventory: as written, silence and noise symbols as `sil`."""
    return SILENCE if symbol.lower() in SILENCE_ALIASES else symbol


def inventory(symbols: Iterable[str]) -> "PhoneTable":
    """The phone table of a source's symbols: the default (ARPAbet) when every one maps onto it,
    else silence plus the symbols as written, sorted."""
    symbols = set(symbols)
    if all(arpabet_of(s) is not None for s in symbols):
        return PhoneTable()
    return PhoneTable((SILENCE, *sorted({own_symbol(s) for s in symbols} - {SILENCE})))


class PhoneTable:
    """Bidirectional symbol <-> integer id map, stored as Kaldi-style `phones.txt` ("sym id"),
    silence first."""

    source: Path | None = None
    """The file it was read from; None for the default table and tables built in memory."""
    kaldi_ids: np.ndarray | None = None
    """Read from a Kaldi phones.txt: Kaldi phone id -> id here (-1: `<eps>`, disambiguation)."""

    def __init__(self, symbols: tuple[str, ...] | list[str] = PHONES):
        if len(set(symbols)) != len(symbols):
            raise DataError("phone table: duplicate symbols")
        if any(not s or any(c.isspace() for c in s) for s in symbols):
            raise DataError("phone table: a symbol is empty or holds white space")
        self.symbols: tuple[str, ...] = tuple(symbols)
        self._ids = {s: i for i, s in enumerate(self.symbols)}

    @property
    def is_default(self) -> bool:
        """asrdist's ARPAbet table (whose sources map their symbols onto it by `arpabet_of`)."""
        return self.symbols == PHONES

    def lookup(self, symbol: str, where: str) -> int:
        """A source's phone symbol -> id: by `arpabet_of` in the default table, else as written
        (`own_symbol`); DataError naming `where` for a phone the table lacks."""
        if self.is_default:
            if arpabet_of(symbol) is None:
                raise DataError(f"{where}: phone '{symbol}' is not an ARPAbet phone asrdist knows")
            return self._ids[arpabet_of(symbol)]
        s = own_symbol(symbol)
        if s not in self._ids:
            raise DataError(f"{where}: phone '{symbol}' is not in the phone table "
                            f"({self.source or 'phones.txt'}, {len(self)} phones)")
        return self._ids[s]

    def map_ids(self, ids: np.ndarray, where: str) -> np.ndarray:
        """A source's phone ids (Kaldi's, for a table read from Kaldi's phones.txt) -> ids here;
        DataError naming `where` for an id outside the table."""
        ids = np.asarray(ids)
        size = len(self) if self.kaldi_ids is None else len(self.kaldi_ids)
        bad = ids[(ids < 0) | (ids >= size)]
        if bad.size == 0 and self.kaldi_ids is not None:
            mapped = self.kaldi_ids[ids]
            bad = ids[mapped < 0]
            ids = mapped
        if bad.size:
            raise DataError(f"{where}: unknown phone id {int(bad[0])} (phone table has {size} phones"
                            f"{', of which <eps> and #N are none' if self.kaldi_ids is not None else ''})")
        return ids

    def __len__(self) -> int:
        return len(self.symbols)

    def __contains__(self, symbol: str) -> bool:
        return symbol in self._ids

    def id(self, symbol: str, where: str = "") -> int:
        try:
            return self._ids[symbol]
        except KeyError:
            raise DataError(f"{where + ': ' if where else ''}unknown phone '{symbol}'") from None

    def symbol(self, index: int) -> str:
        return self.symbols[index]

    @property
    def silence_id(self) -> int:
        return self._ids[SILENCE]

    def to_text(self) -> str:
        return "".join(f"{s} {i}\n" for i, s in enumerate(self.symbols))

    def write(self, path: str | Path) -> None:
        write_text_atomic(path, self.to_text())

    @classmethod
    def read(cls, path: str | Path) -> "PhoneTable":
        path = Path(path)
        if not path.is_file():
            raise DataError(f"{path}: phone table not found")
        entries: list[tuple[int, str]] = []
        for lineno, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.strip():
                continue
            parts = line.split()
            if len(parts) != 2 or not parts[1].isdigit():
                raise DataError(f"{path}:{lineno}: expected 'symbol id', got '{line.strip()}'")
            entries.append((int(parts[1]), parts[0]))
        entries.sort()
        if [i for i, _ in entries] != list(range(len(entries))):
            raise DataError(f"{path}: phone ids must be 0..N-1 without gaps")
        symbols = [s for _, s in entries]
        if symbols and symbols[0] == SILENCE and not any(_KALDI_DROPPED.match(s) for s in symbols):
            table = cls(symbols)  # asrdist's own form
        else:
            table = _from_kaldi(symbols, path)
        table.source = path
        return table


def _from_kaldi(symbols: list[str], path: Path) -> PhoneTable:
    """A table from Kaldi's phones.txt symbols (by id), with `kaldi_ids` mapping their ids."""
    base = [None if _KALDI_DROPPED.match(s) else _KALDI_POSITION.sub("", s) for s in symbols]
    kept = [b for b in base if b is not None]
    if not kept:
        raise DataError(f"{path}: no phones (only <eps> and disambiguation symbols)")
    table = inventory(kept)
    table.kaldi_ids = np.asarray([-1 if b is None else table.lookup(b, str(path)) for b in base], dtype=np.int64)
    return table
