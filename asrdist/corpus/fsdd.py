"""The Free Spoken Digit Dataset (FSDD) as an asrdist corpus: real speech, one digit per file.

Recordings `{digit}_{speaker}_{take}` (8 kHz mono, any audio format asrdist reads) become a corpus
of the synthetic corpus' layout with its own copy of the audio and the digits' lexicon. Splits:
`speaker` (default: one whole speaker is the test set) or `official` (takes 0-4 of everyone).
Details: docs/data.md#fsdd-as-a-corpus-corpusfsddpy."""
from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from asrdist.corpus.lexicon import LEXICON_NAME
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import ConfigError, DataError
from asrdist.io.atomic import atomic_dir, check_output_dir, write_json_atomic
from asrdist.io.audio import AUDIO_SUFFIXES, num_frames, read_wav, resample, write_wav
from asrdist.io.kaldi_dir import Utterance, write_data_dir

DIGIT_WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")
DIGIT_LEXICON = """zero z ih r ow
zero z iy r ow
one w ah n
two t uw
three th r iy
four f ao r
five f ay v
six s ih k s
seven s eh v ah n
eight ey t
nine n ay n
"""
"""The digits' CMU dictionary pronunciations (stress dropped), stored as the corpus' lexicon.txt."""
VALID_TAKES = range(5, 10)
OFFICIAL_TEST_TAKES = range(0, 5)
SPLITS = ("train", "valid", "test")
_NAME = re.compile(r"^(\d)_([^_/]+)_(\d+)(" + "|".join(re.escape(s) for s in AUDIO_SUFFIXES) + ")$",
                   re.IGNORECASE)


@dataclass(frozen=True)
class Recording:
    path: Path
    digit: int
    speaker: str
    take: int

    @property
    def utt_id(self) -> str:
        # Speaker first, so Kaldi's sort order groups utterances by speaker.
        return f"{self.speaker}-{self.digit}-{self.take:03d}"


def _candidate_sources() -> list[Path]:
    project_root = Path(__file__).resolve().parents[2]
    cwd = Path.cwd()
    return [project_root.parent / "shared/data/fsdd", cwd.parent / "shared/data/fsdd",
            cwd / "shared/data/fsdd"]


def resolve_source(source: str | Path | None) -> Path:
    """The recordings directory of an FSDD checkout (the checkout or its `recordings/`)."""
    if source is None:
        for candidate in _candidate_sources():
            if candidate.is_dir():
                source = candidate
                break
        else:
            tried = ", ".join(str(c) for c in _candidate_sources())
            raise DataError(f"FSDD not found (tried {tried}); pass --source DIR")
    source = Path(source)
    if not source.is_dir():
        raise DataError(f"{source}: FSDD source directory not found")
    return source / "recordings" if (source / "recordings").is_dir() else source


def find_recordings(recordings_dir: Path) -> list[Recording]:
    """Every `{digit}_{speaker}_{take}` audio file, sorted by utterance id. Other audio files are
    named in one note on stderr and left out; two files of one digit, speaker and take (x.wav and
    x.flac) are an error naming both."""
    found: dict[str, Recording] = {}
    other = []
    for entry in sorted(os.listdir(recordings_dir)):
        match = _NAME.match(entry)
        if match:
            rec = Recording(recordings_dir / entry, int(match[1]), match[2], int(match[3]))
            if rec.utt_id in found:
                raise DataError(f"{recordings_dir}: {found[rec.utt_id].path.name} and {entry} are both digit "
                                f"{rec.digit}, speaker {rec.speaker}, take {rec.take}; keep one")
            found[rec.utt_id] = rec
        elif entry.lower().endswith(AUDIO_SUFFIXES):
            other.append(entry)
    if other:
        shown = ", ".join(other[:5]) + (f" (+{len(other) - 5} more)" if len(other) > 5 else "")
        print(f"[asrdist] note: {recordings_dir}: {len(other)} audio file(s) not named "
              f"{{digit}}_{{speaker}}_{{take}}, left out: {shown}", file=sys.stderr, flush=True)
    return [found[u] for u in sorted(found)]


def assign_split(rec: Recording, mode: str, test_speaker: str) -> str:
    if mode == "speaker":
        if rec.speaker == test_speaker:
            return "test"
        return "valid" if rec.take in VALID_TAKES else "train"
    if mode == "official":
        if rec.take in OFFICIAL_TEST_TAKES:
            return "test"
        return "valid" if rec.take in VALID_TAKES else "train"
    raise ConfigError(f"--split: unknown split '{mode}' (speaker, official)")


def build_fsdd(out: str | Path, source: str | Path | None = None, test_speaker: str | None = None,
               split: str = "speaker", sample_rate: int = 8000, skip_bad: bool = False,
               overwrite: bool = False, progress: bool = True, channel: int | None = None) -> dict:
    """Build the FSDD corpus in `out` (atomically) and return its summary; `channel` picks the
    channel of multi-channel recordings (an error without it)."""

    if sample_rate not in (8000, 16000):
        raise ConfigError(f"--sample-rate: {sample_rate} Hz, expected 8000 or 16000")
    recordings_dir = resolve_source(source)
    inputs = (recordings_dir,) if source is None else (Path(source), recordings_dir)
    check_output_dir(out, overwrite, inputs)  # before reading any audio; --overwrite must not delete the source
    recordings = find_recordings(recordings_dir)
    if not recordings:
        raise DataError(f"{recordings_dir}: no FSDD recordings ({{digit}}_{{speaker}}_{{take}}.wav)")
    speakers = sorted({r.speaker for r in recordings})
    if split == "speaker":
        if len(speakers) < 2:
            raise DataError(f"{recordings_dir}: a speaker split needs 2 speakers, found {speakers}")
        test_speaker = test_speaker or speakers[-1]
        if test_speaker not in speakers:
            raise ConfigError(f"--test-speaker: '{test_speaker}' not in {recordings_dir} "
                              f"(speakers: {', '.join(speakers)})")
    elif test_speaker is not None and split == "official":
        raise ConfigError("--test-speaker only applies to --split speaker")

    split_utts: dict[str, list[Utterance]] = {name: [] for name in SPLITS}
    skipped: list[str] = []
    with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
        bar = tqdm(recordings, desc="fsdd", unit="file", disable=None if progress else True, file=sys.stderr)
        for rec in bar:
            name = assign_split(rec, split, test_speaker)
            try:
                samples, rate = read_wav(rec.path, where=f"{rec.path}", channel=channel)
                samples = resample(samples, rate, sample_rate)
                if num_frames(len(samples), sample_rate) == 0:
                    raise DataError(f"{rec.path}: audio too short ({len(samples)} samples)")
            except DataError as exc:
                if not skip_bad:
                    raise
                skipped.append(str(exc))
                print(f"asrdist: skipped: {exc}", file=sys.stderr)
                continue
            wav_rel = f"wav/{rec.utt_id}.wav"
            (tmp / name / "wav").mkdir(parents=True, exist_ok=True)
            write_wav(tmp / name / wav_rel, samples, sample_rate)
            split_utts[name].append(Utterance(
                utt_id=rec.utt_id, speaker=rec.speaker, wav=wav_rel, text=DIGIT_WORDS[rec.digit],
                duration=len(samples) / sample_rate))
        for name, utts in split_utts.items():
            if not utts:
                why = {"valid": f"no take {VALID_TAKES.start}-{VALID_TAKES.stop - 1} of a training speaker: FSDD "
                                f"validates on those takes; record more takes, or use `corpus import-kaldi`, "
                                f"which carves a valid set by speaker",
                       "train": "every take of the training speakers went to valid",
                       "test": f"no take {OFFICIAL_TEST_TAKES.start}-{OFFICIAL_TEST_TAKES.stop - 1}"}[name]
                raise DataError(f"{recordings_dir}: split '{name}' would be empty (--split {split}: {why})")
            write_data_dir(tmp / name, utts, Path(out) / name)
        PhoneTable().write(tmp / "phones.txt")
        (tmp / LEXICON_NAME).write_text(DIGIT_LEXICON, encoding="utf-8")
        summary = _summary(recordings_dir, sample_rate, split, test_speaker, split_utts, skipped)
        write_json_atomic(tmp / "summary.json", summary)
    return summary


def _summary(source: Path, sample_rate: int, split: str, test_speaker: str | None,
             split_utts: dict[str, list[Utterance]], skipped: list[str]) -> dict:
    def stats(utts: list[Utterance]) -> dict:
        return {"utterances": len(utts), "speakers": len({u.speaker for u in utts}),
                "hours": round(sum(u.duration for u in utts) / 3600.0, 6)}

    everything = [u for utts in split_utts.values() for u in utts]
    return {
        "source": str(source.resolve()),
        "corpus": "fsdd",
        "sample_rate": sample_rate,
        "split": split,
        "test_speaker": test_speaker,
        **stats(everything),
        "skipped": len(skipped),
        "skipped_reasons": skipped,
        "splits": {name: stats(utts) for name, utts in split_utts.items()},
    }


def fsdd_command(args) -> int:
    summary = build_fsdd(args.out, source=args.source, test_speaker=args.test_speaker,
                         split=args.split, sample_rate=args.sample_rate, skip_bad=args.skip_bad,
                         overwrite=args.overwrite, channel=args.channel)
    print(json.dumps(summary, indent=2))
    return 0
