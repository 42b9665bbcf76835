"""The phone inventory every asrdist corpus shares: silence plus the 39 ARPAbet phones.

Every synthesizer and importer maps its own symbols onto this table, so a model trained on the
espeak corpus can be tested on flite speech or an imported Kaldi directory. Stress is dropped.
"""
from __future__ import annotations

from pathlib import Path

from asrdist.errors import DataError
from asrdist.io.atomic import write_text_atomic

SILENCE = "sil"
ARPABET = (
    "aa ae ah ao aw ay b ch d dh eh er ey f g hh ih iy jh k l m n ng "
    "ow oy p r s sh t th uh uw v w y z zh"
).split()
PHONES: tuple[str, ...] = (SILENCE, *ARPABET)


class PhoneTable:
    """Bidirectional symbol <-> integer id map, stored as Kaldi-style `phones.txt` ("sym id")."""

    def __init__(self, symbols: tuple[str, ...] | list[str] = PHONES):
        if len(set(symbols)) != len(symbols):
            raise DataError("phone table: duplicate symbols")
        self.symbols: tuple[str, ...] = tuple(symbols)
        self._ids = {s: i for i, s in enumerate(self.symbols)}

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
        return cls([s for _, s in entries])
