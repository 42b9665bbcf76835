"""Pronunciation lexicons: Kaldi `lexicon.txt` / `lexiconp.txt` and CMU dictionary files, with their
phones mapped onto the corpus' phone table (`asrdist.corpus.phones`).

Accepted lines: `word p1 p2 ...` (Kaldi, CMU), `word 1.0 p1 p2 ...` (Kaldi lexiconp: a probability
after the word), CMU variants `word(2) ...`, comments `;;;` / `#`. Words are matched lowercased.
Read onto the default (ARPAbet) table, phones lose their stress digits and are lowercased; symbols
outside ARPAbet that Kaldi and TIMIT lexicons use map to their nearest ARPAbet phone
(`PHONE_ALIASES`), silence and noise symbols to `sil`. A lexicon with other phones, read without a
table, defines its own (`phones.inventory`): its phones as written. A word's first pronunciation is
its CTC target; alignment may use any of them. A corpus keeps its lexicon as `CORPUS/lexicon.txt`
in the symbols of `CORPUS/phones.txt`.
"""
from __future__ import annotations

import re
import sys
from pathlib import Path
from typing import Iterable, Mapping, Sequence

from asrdist.corpus.phones import PhoneTable, inventory
from asrdist.errors import DataError
from asrdist.io.atomic import write_text_atomic
from asrdist.io.kaldi_dir import read_data_dir

LEXICON_NAME = "lexicon.txt"
_VARIANT = re.compile(r"^(.+)\(\d+\)$")
_CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f]")
"""Characters no text lexicon holds (all but tab and line ends): their presence means a binary file."""
SHOWN_MISSING = 5


def normalize_word(word: str) -> str:
    return word.lower()


def map_phone(symbol: str, table: PhoneTable, where: str) -> int:
    """One lexicon phone symbol -> phone id of `table` (`PhoneTable.lookup`)."""
    return table.lookup(symbol, where)


def _read_text(path: Path) -> str:
    """A lexicon file's text: UTF-8 (a leading byte order mark dropped), or Latin-1 where it is not
    UTF-8 but still plain text (the CMU dictionary's older releases). A binary file is one error
    naming the byte and line where it stops being text; its bytes are never echoed."""
    data = path.read_bytes()
    try:
        text, encoding = data.decode("utf-8-sig"), "utf-8"
    except UnicodeDecodeError:
        text, encoding = data.decode("latin-1"), "latin-1"
    control = _CONTROL.search(text)
    if control is not None:
        offset = len(data) - len(text[control.start():].encode(encoding))
        line = text.count("\n", 0, control.start()) + 1
        raise DataError(f"{path}: not a UTF-8 text file (byte {offset}, line {line})")
    return text


class Lexicon:
    """word -> pronunciations (tuples of asrdist phone ids), in file order."""

    source: Path | None = None
    """The file it was read from (messages name it), None when built in memory."""

    def __init__(self, entries: Mapping[str, list[tuple[int, ...]]], table: PhoneTable | None = None):
        self.table = table or PhoneTable()
        self.entries = {w: list(prons) for w, prons in entries.items()}

    def __len__(self) -> int:
        return len(self.entries)

    def __contains__(self, word: str) -> bool:
        return normalize_word(word) in self.entries

    def pronunciations(self, word: str) -> list[tuple[int, ...]]:
        return self.entries[normalize_word(word)]

    @classmethod
    def read(cls, path: str | Path, table: PhoneTable | None = None) -> "Lexicon":
        """The lexicon at `path` in `table`'s phones; without a table, in the table its own phones
        make (`phones.inventory`: ARPAbet's where they all map onto it)."""
        path = Path(path)
        if path.is_dir():
            raise DataError(f"{path}: is a directory, not a lexicon file")
        if not path.is_file():
            raise DataError(f"{path}: lexicon not found")
        text = _read_text(path)
        lines: list[tuple[str, str, list[str]]] = []  # (where, word, phone symbols)
        for lineno, line in enumerate(text.splitlines(), 1):
            fields = line.split()
            if not fields or fields[0].startswith((";;;", "#")):
                continue
            where = f"{path}:{lineno}"
            word, phones = fields[0], fields[1:]
            variant = _VARIANT.match(word)
            word = normalize_word(variant.group(1) if variant else word)
            if phones and _is_probability(phones[0]):
                phones = phones[1:]
            if "#" in phones:  # CMU dict 0.7b+ inline comments
                phones = phones[:phones.index("#")]
            if not phones:
                raise DataError(f"{where}: word '{fields[0]}' has no phones")
            lines.append((where, word, phones))
        if not lines:
            raise DataError(f"{path}: no lexicon entries")
        table = table or inventory(p for _, _, phones in lines for p in phones)
        entries: dict[str, list[tuple[int, ...]]] = {}
        for where, word, phones in lines:
            pron = tuple(table.lookup(p, where) for p in phones)
            prons = entries.setdefault(word, [])
            if pron not in prons:
                prons.append(pron)
        lexicon = cls(entries, table)
        lexicon.source = path
        return lexicon

    def to_text(self) -> str:
        return "".join(f"{w} {' '.join(self.table.symbol(p) for p in pron)}\n"
                       for w in sorted(self.entries) for pron in self.entries[w])

    def write(self, path: str | Path) -> None:
        write_text_atomic(path, self.to_text())

    def restricted_to(self, words: Iterable[str]) -> "Lexicon":
        """Only the entries of `words` (a corpus keeps what its transcripts use, not all of CMU)."""
        wanted = {normalize_word(w) for w in words}
        return Lexicon({w: p for w, p in self.entries.items() if w in wanted}, self.table)

    def missing_words(self, texts: Iterable[str]) -> list[str]:
        return sorted({normalize_word(w) for t in texts for w in t.split()} - set(self.entries))

    def phone_targets(self, texts: Mapping[str, str]) -> tuple[dict[str, list[int]], list[str], int]:
        """(utt -> phone ids by each word's first pronunciation, words missing, utterances skipped).

        Silence is not a target (it is the CTC blank); an utterance with a missing word is skipped.
        """
        tokens: dict[str, list[int]] = {}
        missing: set[str] = set()
        skipped = 0
        for utt, text in texts.items():
            words = [normalize_word(w) for w in text.split()]
            absent = [w for w in words if w not in self.entries]
            if absent:
                missing.update(absent)
                skipped += 1
                continue
            tokens[utt] = [p for w in words for p in self.entries[w][0] if p != self.table.silence_id]
        return tokens, sorted(missing), skipped


def _is_probability(field: str) -> bool:
    try:
        return 0.0 <= float(field) <= 1.0
    except ValueError:
        return False


def report_missing(missing: list[str], skipped: int, where: str, shown: int = 20) -> str | None:
    """The one-line message for words not in the lexicon (printed to stderr), or None."""
    if not missing:
        return None
    listed = " ".join(missing[:shown]) + (f" ... (+{len(missing) - shown} more)" if len(missing) > shown else "")
    line = (f"asrdist: {where}: {len(missing)} word(s) not in the lexicon: {listed}; "
            f"skipped {skipped} utterance(s)")
    print(line, file=sys.stderr)
    return line


def corpus_lexicon(corpus: Path) -> Lexicon | None:
    """The lexicon stored with a corpus (`CORPUS/lexicon.txt`, in `CORPUS/phones.txt`), or None."""
    path = Path(corpus) / LEXICON_NAME
    return Lexicon.read(path, corpus_table(corpus)) if path.is_file() else None


def corpus_table(corpus: Path) -> PhoneTable:
    """A corpus' phone table (`CORPUS/phones.txt`); the default where it has none."""
    path = Path(corpus) / "phones.txt"
    return PhoneTable.read(path) if path.is_file() else PhoneTable()


def corpus_phones(table: PhoneTable, lexicon: Lexicon | None, aligned: bool,
                  where: str | Path) -> tuple[PhoneTable, Lexicon | None]:
    """An import's phone table and its lexicon in that table: a phones.txt the source came with
    (`table.source`) defines the phones, and the lexicon's must be among them; without one the
    lexicon's own phones do (`Lexicon.read` without a table), unless alignments hold ids of the
    default table."""
    if lexicon is None or lexicon.table.symbols == table.symbols:
        return table, lexicon
    if table.source is not None:
        return table, Lexicon.read(lexicon.source, table)
    if aligned:
        raise DataError(f"{lexicon.source}: its phones are not ARPAbet, and the alignments of {where} hold ids of "
                        f"asrdist's ARPAbet table; put the phones.txt whose ids they are beside them")
    return lexicon.table, lexicon


def check_coverage(lexicon: Lexicon, words: set[str], where: str | Path) -> None:
    """A lexicon that holds none of the transcripts' words is the wrong file (another language,
    another corpus): one error now, not an empty `lexicon.txt` and a training run that fails later."""
    if words and not words & set(lexicon.entries):
        shown = " ".join(sorted(words)[:SHOWN_MISSING]) + (" ..." if len(words) > SHOWN_MISSING else "")
        raise DataError(f"{lexicon.source or 'the lexicon'}: no transcript word of {where} is in this lexicon "
                        f"({len(words)} words missing, e.g. {shown})")


def store_lexicon(lexicon: "str | Path | Lexicon", corpus: Path, texts: Iterable[str] | None = None,
                  where: str | Path | None = None) -> dict:
    """Write the entries the corpus' transcripts use (`texts`, default: every split's) into
    `corpus/lexicon.txt`; report and count words it lacks; DataError when it has none of them.
    Messages name `where` (default: `corpus`; an import writes into a temporary directory)."""
    if not isinstance(lexicon, Lexicon):
        lexicon = Lexicon.read(lexicon)
    where = str(where if where is not None else corpus)
    if texts is None:
        splits = [Path(corpus)] if (Path(corpus) / "text").is_file() else \
            [d for d in sorted(Path(corpus).iterdir()) if (d / "text").is_file()]
        texts = [u.text for d in splits for u in read_data_dir(d).utterances.values()]
    texts = list(texts)
    check_coverage(lexicon, {normalize_word(w) for t in texts for w in t.split()}, where)
    missing = lexicon.missing_words(texts)
    absent = set(missing)
    skipped = sum(1 for t in texts if any(normalize_word(w) in absent for w in t.split()))
    report_missing(missing, skipped, where)
    lexicon.restricted_to(w for t in texts for w in t.split()).write(Path(corpus) / LEXICON_NAME)
    return {"lexicon_words": len(lexicon), "missing_words": missing, "utterances_without_lexicon": skipped}


_reported: set[str] = set()


def split_lexicon(split_dir: Path) -> Path | None:
    """The lexicon a split's words are pronounced by: `SPLIT/lexicon.txt` (a split imported alone
    with `--lexicon`: a held-out set), else its corpus' `CORPUS/lexicon.txt`; None without either."""
    for where in (Path(split_dir), Path(split_dir).parent):
        if (where / LEXICON_NAME).is_file():
            return where / LEXICON_NAME
    return None


def lexicon_phone_tokens(split_dir: Path, data=None, phones: Sequence[str] | None = None) -> dict[str, list[int]] | None:
    """Phone targets of an unaligned split from its lexicon (`split_lexicon`; None without one);
    words missing from the lexicon are reported once per split and process, their utterances left
    out. `data`: the split's `DataDir`, when the caller has read it already. `phones`: the phone
    symbols the ids index (a model's); default: the lexicon directory's phones.txt, else asrdist's."""
    path = split_lexicon(split_dir)
    if path is None:
        return None
    table = PhoneTable(tuple(phones)) if phones is not None else corpus_table(path.parent)
    lexicon = Lexicon.read(path, table)
    data = data if data is not None else read_data_dir(split_dir)
    tokens, missing, skipped = lexicon.phone_targets({u: data.utterances[u].text for u in data.utt_ids})
    if str(split_dir) not in _reported:
        _reported.add(str(split_dir))
        report_missing(missing, skipped, str(split_dir))
    if not tokens:
        raise DataError(f"{split_dir}: no utterance has all its words in {path}")
    return tokens
