"""Kaldi-style data directories: the on-disk form of every asrdist corpus split.

A split directory holds `wav.scp`, `text`, `utt2spk`, `spk2utt`, `utt2dur` and optionally
`segments` and `alignment.scp` / `alignment.ark` (one int32 phone id per 10 ms frame, kaldiio).
asrdist writes every path in `wav.scp` and `alignment.scp` absolute, so Kaldi tools, kaldiio and
lhotse read the files from any working directory; relative paths (older corpora, hand-made
directories) are resolved against the directory itself. Files are sorted by utterance id, as
Kaldi requires.
"""
from __future__ import annotations

import re
from dataclasses import dataclass, field, replace
from pathlib import Path

import kaldiio
import numpy as np

from asrdist.errors import DataError, Stopped

FRAME_SHIFT_SECONDS = 0.010


@dataclass
class Segment:
    recording: str
    start: float
    end: float


@dataclass
class Utterance:
    utt_id: str
    speaker: str
    wav: str
    """Audio path (relative to the data directory or absolute)."""
    text: str
    duration: float = 0.0
    alignment: np.ndarray | None = None
    """int32 phone ids, one per 10 ms frame; None when the corpus has no alignment."""
    segment: Segment | None = None


@dataclass
class DataDir:
    path: Path
    utterances: dict[str, Utterance] = field(default_factory=dict)

    @property
    def utt_ids(self) -> list[str]:
        return sorted(self.utterances)

    @property
    def speakers(self) -> list[str]:
        return sorted({u.speaker for u in self.utterances.values()})

    def wav_path(self, utt: Utterance) -> Path:
        p = Path(utt.wav)
        return p if p.is_absolute() else self.path / p

    @property
    def has_alignments(self) -> bool:
        return bool(self.utterances) and all(u.alignment is not None for u in self.utterances.values())

    @property
    def hours(self) -> float:
        return sum(u.duration for u in self.utterances.values()) / 3600.0


def _write_lines(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def write_data_dir(path: str | Path, utterances: list[Utterance], final_dir: str | Path | None = None) -> None:
    """Write a split directory (the caller makes it atomic, e.g. with `atomic_dir`). `final_dir` is
    where `path` will live once renamed (default: `path`): relative audio paths are resolved
    against it and every path is written absolute."""
    path = Path(path)
    final_dir = Path(final_dir if final_dir is not None else path).resolve()
    path.mkdir(parents=True, exist_ok=True)
    utterances = [replace(u, wav=str(final_dir / u.wav)) if not Path(u.wav).is_absolute() else u
                  for u in utterances]
    utts = sorted(utterances, key=lambda u: u.utt_id)
    if len({u.utt_id for u in utts}) != len(utts):
        raise DataError(f"{path}: duplicate utterance ids")
    segmented = any(u.segment for u in utts)
    if segmented:
        recs = sorted({(u.segment.recording, u.wav) for u in utts if u.segment})
        _write_lines(path / "wav.scp", [f"{rec} {wav}" for rec, wav in recs])
        _write_lines(path / "segments",
                     [f"{u.utt_id} {u.segment.recording} {u.segment.start:.3f} {u.segment.end:.3f}"
                      for u in utts])
    else:
        _write_lines(path / "wav.scp", [f"{u.utt_id} {u.wav}" for u in utts])
    _write_lines(path / "text", [f"{u.utt_id} {u.text}".rstrip() for u in utts])
    _write_lines(path / "utt2spk", [f"{u.utt_id} {u.speaker}" for u in utts])
    spk2utt: dict[str, list[str]] = {}
    for u in utts:
        spk2utt.setdefault(u.speaker, []).append(u.utt_id)
    _write_lines(path / "spk2utt", [f"{s} {' '.join(ids)}" for s, ids in sorted(spk2utt.items())])
    _write_lines(path / "utt2dur", [f"{u.utt_id} {u.duration:.3f}" for u in utts])
    aligned = [u for u in utts if u.alignment is not None]
    if aligned:
        write_alignments(path, {u.utt_id: u.alignment for u in aligned}, final_dir)


def write_alignments(path: Path, alignments: dict[str, np.ndarray], final_dir: Path | None = None) -> None:
    """Write `alignment.ark` + `alignment.scp` (int32 vectors); the scp names the ark by its
    absolute path at `final_dir` (default: `path`), where the directory will live."""
    ark = path / "alignment.ark"
    final_ark = Path(final_dir if final_dir is not None else path).resolve() / "alignment.ark"
    offsets: dict[str, int] = {}
    with open(ark, "wb") as f:
        for utt_id in sorted(alignments):
            f.write(utt_id.encode() + b" ")
            offsets[utt_id] = f.tell()
            _write_int32_vector(f, np.asarray(alignments[utt_id], dtype=np.int32))
    _write_lines(path / "alignment.scp", [f"{u} {final_ark}:{offsets[u]}" for u in sorted(offsets)])


def _write_int32_vector(f, vec: np.ndarray) -> None:
    # Kaldi binary int32 vector: "\0B" then <4-byte size marker 4><int32 length>, then each
    # element as <size 4><int32>: the layout kaldiio.load_mat / Kaldi's copy-int-vector read.
    f.write(b"\0B")
    f.write(b"\4" + np.int32(len(vec)).tobytes())
    rec = np.empty(len(vec), dtype=[("size", "i1"), ("value", "<i4")])
    rec["size"] = 4
    rec["value"] = vec
    f.write(rec.tobytes())


def read_alignments(path: str | Path) -> dict[str, np.ndarray]:
    """Read `alignment.scp` of a split directory: utt_id -> int32 frame labels."""
    path = Path(path)
    scp = path / "alignment.scp"
    out: dict[str, np.ndarray] = {}
    for lineno, line in enumerate(scp.read_text(encoding="utf-8-sig").splitlines(), 1):
        if not line.strip():
            continue
        parts = line.split(maxsplit=1)
        if len(parts) != 2:
            raise DataError(f"{scp}:{lineno}: expected 'utt_id ark:offset'")
        utt_id, loc = parts
        file, _, offset = loc.rpartition(":")
        file_path = Path(file) if Path(file).is_absolute() else path / file
        try:
            vec = kaldiio.load_mat(f"{file_path}:{offset}")
        except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
            raise
        except Exception as exc:  # kaldiio raises several types for a broken ark
            raise DataError(f"{scp}: utterance {utt_id}: cannot read alignment "
                            f"({str(exc) or type(exc).__name__})") from None
        out[utt_id] = np.asarray(vec, dtype=np.int32)
    return out


def read_table(path: Path, required: bool = True) -> dict[str, str]:
    """`key value` lines of a Kaldi table (a missing file: an error, or {} when not `required`)."""
    if not path.is_file():
        if required:
            raise DataError(f"{path}: missing")
        return {}
    table: dict[str, str] = {}
    try:
        text = path.read_text(encoding="utf-8-sig")  # a byte order mark (Windows editors) is no key
    except UnicodeDecodeError as exc:
        raise DataError(f"{path}: not valid UTF-8 (byte {exc.start})") from None
    for lineno, line in enumerate(text.splitlines(), 1):
        if not line.strip():
            continue
        parts = line.strip().split(maxsplit=1)
        key, value = parts[0], (parts[1] if len(parts) > 1 else "")
        if key in table:
            raise DataError(f"{path}:{lineno}: duplicate key '{key}'")
        table[key] = value
    return table


COMMAND_PIPE, ARCHIVE_ENTRY = "command pipe", "archive entry"
_ARCHIVE_ENTRY = re.compile(r"^\S+\.ark:\d+$")


def wav_entry_kind(entry: str) -> str | None:
    """What a wav.scp entry is when it is not a file path: Kaldi's `CMD |` (COMMAND_PIPE) or a WAV
    inside a Kaldi archive, `wav.ark:OFFSET` (ARCHIVE_ENTRY); None for a file path."""
    if entry.rstrip().endswith("|"):
        return COMMAND_PIPE
    return ARCHIVE_ENTRY if _ARCHIVE_ENTRY.match(entry.strip()) else None


def read_data_dir(path: str | Path, require_text: bool = True) -> DataDir:
    """Read a split directory; every utterance must have audio, speaker and (by default) text."""
    path = Path(path)
    if not path.is_dir():
        raise DataError(f"{path}: data directory not found")
    wav_scp = read_table(path / "wav.scp")
    segments = read_table(path / "segments", required=False)
    utt2spk = read_table(path / "utt2spk")
    text = read_table(path / "text", required=require_text)
    utt2dur = read_table(path / "utt2dur", required=False)
    alignments = read_alignments(path) if (path / "alignment.scp").is_file() else {}
    data = DataDir(path)
    utt_ids = sorted(segments) if segments else sorted(wav_scp)
    for utt_id in utt_ids:
        seg = None
        if segments:
            fields = segments[utt_id].split()
            if len(fields) != 3:
                raise DataError(f"{path / 'segments'}: utterance {utt_id}: expected 'rec start end'")
            rec = fields[0]
            if rec not in wav_scp:
                raise DataError(f"{path / 'segments'}: utterance {utt_id}: recording '{rec}' not in wav.scp")
            seg = Segment(rec, float(fields[1]), float(fields[2]))
            wav = wav_scp[rec]
        else:
            wav = wav_scp[utt_id]
        kind = wav_entry_kind(wav)
        if kind is not None:
            what = "a command pipe" if kind == COMMAND_PIPE else "a Kaldi archive entry"
            raise DataError(f"{path / 'wav.scp'}: utterance {utt_id}: {what} ('{wav.rstrip()[:40]}"
                            f"{'...' if len(wav.rstrip()) > 40 else ''}'); import the directory with `asrdist "
                            f"corpus import-kaldi {path} OUT`, which reads such audio into OUT, and use OUT")
        if not utt2spk.get(utt_id):  # absent, or a line with the id alone
            raise DataError(f"{path / 'utt2spk'}: utterance {utt_id}: no speaker")
        if require_text and utt_id not in text:
            raise DataError(f"{path / 'text'}: utterance {utt_id}: missing transcript")
        data.utterances[utt_id] = Utterance(
            utt_id=utt_id, speaker=utt2spk[utt_id], wav=wav, text=text.get(utt_id, ""),
            duration=float(utt2dur.get(utt_id, 0.0)), alignment=alignments.get(utt_id), segment=seg)
    extra = set(alignments) - set(data.utterances)
    if extra:
        raise DataError(f"{path / 'alignment.scp'}: alignment for unknown utterance {sorted(extra)[0]}")
    return data
