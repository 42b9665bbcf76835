"""Kaldi data directory tables as `asrdist.corpus.import_kaldi` reads them: `key value` lines,
`.scp` matrices, speakers (utt2spk / spk2utt) and alignments. A line that cannot be read marks
its utterance bad (in `bad`, utterance -> reason) instead of failing the import."""
from __future__ import annotations

import codecs
from pathlib import Path

import kaldiio
import numpy as np

from asrdist.errors import DataError, Stopped

UNMATCHED = "\0unmatched"
"""The key in `bad` of a line whose own key is unreadable (it can match no utterance)."""


def read_table(path: Path, bad: dict[str, str], required: bool = True,
               value: str | None = None) -> dict[str, str]:
    """`key value` lines; a line that is not UTF-8 marks its utterance bad instead of failing, and
    so does a key without the `value` the table must give (e.g. utt2spk's speaker), naming the
    line. A leading UTF-8 byte order mark (editors on Windows write one) is not part of the key."""
    if not path.is_file():
        if required:
            raise DataError(f"{path}: missing")
        return {}
    table: dict[str, str] = {}
    data = path.read_bytes()
    if data.startswith(codecs.BOM_UTF8):
        data = data[len(codecs.BOM_UTF8):]
    for lineno, raw in enumerate(data.splitlines(), 1):
        if not raw.strip():
            continue
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            # A readable key names the utterance to skip; an unreadable one is reported under
            # its lossy spelling (it can match no other file's entry anyway).
            key = raw.split(maxsplit=1)[0].decode("utf-8", "replace")
            bad.setdefault(key, f"{path}:{lineno}: utterance {key}: not valid UTF-8 (byte {exc.start})")
            if "\ufffd" in key:
                bad.setdefault(UNMATCHED, bad[key])
            continue
        parts = line.strip().split(maxsplit=1)
        if parts[0] in table:
            raise DataError(f"{path}:{lineno}: duplicate key '{parts[0]}'")
        if value is not None and len(parts) < 2:
            bad.setdefault(parts[0], f"{path}:{lineno}: utterance {parts[0]}: no {value}")
            continue
        table[parts[0]] = parts[1] if len(parts) > 1 else ""
    return table


def resolve_path(base: Path, name: str) -> Path:
    """`name` of a table in `base`: absolute, relative to `base`, else to the current directory."""
    path = Path(name)
    if path.is_absolute() or not (base / path).exists() and path.exists():
        return path.resolve()
    return (base / path).resolve()


def load_scp(scp: Path, bad: dict[str, str], what: str) -> dict[str, np.ndarray]:
    out = {}
    for key, loc in read_table(scp, bad).items():
        file, sep, offset = loc.rpartition(":")
        if sep and offset.isdigit():
            target = f"{resolve_path(scp.parent, file)}:{offset}"
        else:
            target = str(resolve_path(scp.parent, loc))
        try:
            out[key] = np.asarray(kaldiio.load_mat(target))
        except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
            raise
        except Exception as exc:  # kaldiio raises many types for a broken or missing ark
            bad.setdefault(key, f"{scp}: utterance {key}: cannot read {what} ({exc})")
    return out


def read_speakers(src: Path, bad: dict[str, str]) -> dict[str, str]:
    """utt2spk, checked against spk2utt where both exist; from spk2utt alone where utt2spk is
    missing (as Kaldi's spk2utt_to_utt2spk.pl makes it)."""
    utt2spk_path, spk2utt_path = src / "utt2spk", src / "spk2utt"
    if not spk2utt_path.is_file():
        return read_table(utt2spk_path, bad, value="speaker")
    listed: dict[str, str] = {}
    for speaker, utts in read_table(spk2utt_path, bad, value="utterance").items():
        for utt in utts.split():
            if utt in listed:
                raise DataError(f"{spk2utt_path}: utterance {utt} listed under speakers {listed[utt]} and {speaker}")
            listed[utt] = speaker
    if not utt2spk_path.is_file():
        return listed
    utt2spk = read_table(utt2spk_path, bad, value="speaker")
    remake = "make spk2utt from utt2spk (utils/utt2spk_to_spk2utt.pl) or delete it"
    for utt, speaker in utt2spk.items():
        if utt not in listed:
            raise DataError(f"{spk2utt_path}: utterance {utt} (speaker {speaker} in utt2spk) is not listed; {remake}")
        if listed[utt] != speaker:
            raise DataError(f"{spk2utt_path}: utterance {utt} listed under speaker {listed[utt]}, utt2spk says "
                            f"{speaker}; {remake}")
    extra = next((u for u in listed if u not in utt2spk), None)
    if extra is not None:
        raise DataError(f"{spk2utt_path}: utterance {extra} (speaker {listed[extra]}) is not in utt2spk; {remake}")
    return utt2spk


def read_alignment_file(path: Path, bad: dict[str, str]) -> dict[str, np.ndarray]:
    """utt -> int vector from a Kaldi `.scp`, a binary `.ark`, or text `utt id id ...` lines."""
    if not path.is_file():
        raise DataError(f"{path}: alignment file not found")
    if path.suffix == ".scp":
        return load_scp(path, bad, "alignment")
    head = path.read_bytes()[:4096]
    if b" \0B" in head.split(b"\n", 1)[0]:
        try:
            return {k: np.asarray(v) for k, v in kaldiio.load_ark(str(path))}
        except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
            raise
        except Exception as exc:
            raise DataError(f"{path}: cannot read alignment ark ({exc})") from None
    out = {}
    for key, value in read_table(path, bad).items():
        try:
            out[key] = np.array([int(x) for x in value.split()], dtype=np.int64)
        except ValueError:
            bad.setdefault(key, f"{path}: utterance {key}: alignment is not a list of integers")
    return out
