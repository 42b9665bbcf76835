"""Assemble an asrdist corpus (train / valid / test) from a user's data in one step.

Sources name their splits as Kaldi recipes do (`train`, `dev`, `test`, `train_si284`,
`test_clean`, ...); `SPLIT_ALIASES` maps those names onto asrdist's three splits, and
`--split SPLIT=NAME` chooses where the names are ambiguous. When no valid set is given, one is
carved off the training speakers (`carve_valid`: whole speakers, chosen by a hash of their names,
so the choice is the same on every machine and does not move when other speakers are added).
Everything training needs (train and valid) is checked before anything is written.
"""
from __future__ import annotations

import hashlib
import shutil
import sys
from pathlib import Path

from asrdist.corpus.import_kaldi import (
    decoded_audio,
    import_split,
    move_decoded,
    write_split,
)
from asrdist.corpus.lexicon import Lexicon, corpus_phones, store_lexicon
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import ConfigError, DataError
from asrdist.io.atomic import atomic_dir, check_output_dir, write_json_atomic
from asrdist.io.kaldi_dir import Utterance

SPLITS = ("train", "valid", "test")
SPLIT_ALIASES = {"train": ("train",), "valid": ("valid", "dev", "validation", "val", "cv"),
                 "test": ("test", "eval")}
VALID_FRACTION = 0.1
"""Share of the training speakers carved off as the valid set when none is given."""


def parse_split_options(values: list[str]) -> tuple[str | None, dict[str, str]]:
    """`--split` values: one bare SPLIT (SRC is a single source), or SPLIT=NAME pairs."""
    single, mapping = None, {}
    for value in values:
        split, sep, name = value.partition("=")
        if split not in SPLITS:
            raise ConfigError(f"--split: unknown split '{split}' (expected {', '.join(SPLITS)})")
        if sep:
            if not name or split in mapping:
                raise ConfigError(f"--split: '{value}': give one non-empty SPLIT=NAME per split")
            mapping[split] = name
        elif single is not None:
            raise ConfigError("--split: give one SPLIT for a single source, or SPLIT=NAME pairs")
        else:
            single = split
    if single is not None and mapping:
        raise ConfigError("--split: give one SPLIT for a single source, or SPLIT=NAME pairs, not both")
    return single, mapping


def _matches(name: str, alias: str) -> bool:
    return name == alias or (name.startswith(alias) and name[len(alias)] in "_-.0123456789")


def match_splits(names: list[str], chosen: dict[str, str], where: Path) -> dict[str, str]:
    """asrdist split -> source name, from Kaldi-style names; `chosen` (from --split) wins.
    An exact alias (`dev`) wins over a prefixed one (`dev_clean`); two candidates are an error."""
    unknown = sorted(set(chosen.values()) - set(names))
    if unknown:
        raise DataError(f"{where}: no '{unknown[0]}' here (found: {', '.join(sorted(names)) or 'nothing'})")
    out = dict(chosen)
    taken = set(chosen.values())
    for split, aliases in SPLIT_ALIASES.items():
        if split in out:
            continue
        free = [n for n in names if n not in taken]
        exact = [n for n in free if n in aliases]
        found = exact or [n for n in free if any(_matches(n, a) for a in aliases)]
        if len(found) > 1:
            raise DataError(f"{where}: {' and '.join(sorted(found))} could each be the {split} split; "
                            f"choose with --split {split}=NAME")
        if found:
            out[split] = found[0]
            taken.add(found[0])
    left = [n for n in sorted(names) if n not in taken]
    if left:  # an outside corpus may name a split its own way: say what was not read
        print(f"asrdist: note: {where}: {', '.join(left)} not imported (no split took it; choose with "
              f"--split SPLIT=NAME, SPLIT one of {', '.join(SPLITS)})", file=sys.stderr)
    return out


def speaker_rank(speaker: str) -> str:
    return hashlib.sha256(speaker.encode("utf-8")).hexdigest()


def default_valid_speakers(num_speakers: int) -> int:
    return max(1, round(VALID_FRACTION * num_speakers))


def carve_valid(utts: list[Utterance], valid_speakers: int | None,
                where: Path) -> tuple[list[Utterance], list[Utterance], list[str]]:
    """(train, valid, valid speaker names): `valid_speakers` whole speakers (default 10%, at
    least one) with the smallest name hashes move from train to valid."""
    speakers = sorted({u.speaker for u in utts}, key=speaker_rank)
    n = default_valid_speakers(len(speakers)) if valid_speakers is None else valid_speakers
    if len(speakers) < 2 or n >= len(speakers):
        raise DataError(f"{where}: cannot carve a valid set of {n} speaker(s) off a training set of "
                        f"{len(speakers)} speaker(s) (training keeps at least one); give a dev set "
                        f"(--split valid=NAME) or a smaller --valid-speakers")
    chosen = set(speakers[:n])
    return ([u for u in utts if u.speaker not in chosen], [u for u in utts if u.speaker in chosen],
            sorted(chosen))


def check_valid_speakers(valid_speakers: int | None, has_valid: bool) -> None:
    if valid_speakers is None:
        return
    if valid_speakers < 1:
        raise ConfigError(f"--valid-speakers: {valid_speakers}, expected >= 1")
    if has_valid:
        raise ConfigError("--valid-speakers: the source already has a valid split; "
                          "leave it out or choose the splits with --split")


def require_train(found: dict, where: Path, names: list[str]) -> None:
    if "train" not in found:
        raise DataError(f"{where}: no training split (found: {', '.join(sorted(names)) or 'nothing'}); "
                        f"training needs one named train* or chosen with --split train=NAME")


def empty_transcripts(utts: list[Utterance]) -> int:
    """Utterances whose transcript is empty: legitimate (silence recordings), but counted in the
    summary so a corpus whose transcripts went missing does not pass unseen."""
    return sum(1 for u in utts if not u.text.strip())


def overlap_notes(utts: dict[str, list[Utterance]]) -> list[str]:
    """What the valid and test splits share with train: the same utterances (ids or audio) or
    speakers, which makes their figures those of seen data. Splits are meant to be by speaker."""
    def heard(u: Utterance) -> tuple:
        return str(Path(u.wav).resolve()), (u.segment.start, u.segment.end) if u.segment else None

    train = utts.get("train", [])
    ids, speakers, audio = {u.utt_id for u in train}, {u.speaker for u in train}, {heard(u) for u in train}
    notes = []
    for name in ("valid", "test"):
        same = sum(1 for u in utts.get(name, []) if u.utt_id in ids or heard(u) in audio)
        shared = sorted({u.speaker for u in utts.get(name, [])} & speakers)
        if same:
            notes.append(f"{same} {name} utterance(s) are training utterances (the same id or audio): "
                         f"their figures are on training data")
        elif shared:
            notes.append(f"{len(shared)} {name} speaker(s) also speak in train ({', '.join(shared[:5])}"
                         f"{', ...' if len(shared) > 5 else ''}): its figures are on seen speakers")
    return notes


def write_corpus(out: Path, splits: dict, source: Path, valid_speakers: int | None, overwrite: bool,
                 kind: str, extra_dirs: dict[str, Path] | None = None, inputs: tuple = (),
                 lexicon=None) -> dict:
    """Write imported splits (`ImportedSplit` by asrdist split name, `train` required) as a corpus:
    OUT/{train,valid,test}, OUT/phones.txt, OUT/summary.json. Carves valid off train when absent.
    `extra_dirs` (name -> directory) are moved into OUT under their names (decoded audio). A
    `lexicon` (`Lexicon`) is stored as OUT/lexicon.txt in the same step, so one that covers no
    transcript word fails the import with nothing written. OUT never replaces one of `inputs`."""
    train = splits["train"]
    rates = {name: s.sample_rate for name, s in splits.items()}
    if len(set(rates.values())) > 1:
        raise DataError(f"{source}: splits have different sample rates "
                        f"({', '.join(f'{n} {r} Hz' for n, r in rates.items())}); give --sample-rate HZ to "
                        f"resample every recording to one rate")
    # the tables that say something: of alignments, or read from a phones.txt (others take train's)
    telling = [s.phones for s in splits.values() if s.alignments or s.phones.source is not None]
    if len({t.symbols for t in telling}) > 1:
        raise DataError(f"{source}: splits have different phones.txt tables")
    phones = telling[0] if telling else train.phones
    utts = {name: s.utterances for name, s in splits.items()}
    carved: list[str] = []
    if "valid" not in splits:
        utts["train"], utts["valid"], carved = carve_valid(train.utterances, valid_speakers, source)
    out = Path(out)
    with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
        stats = {}
        for name in SPLITS:
            if name in utts:
                stats[name] = write_split(tmp / name, out / name, splits.get(name, train), utts[name])
                stats[name]["source"] = str(splits.get(name, train).source)
        if carved:
            stats["valid"]["carved_from"] = "train"
            stats["valid"]["speaker_list"] = carved
        for name, path in (extra_dirs or {}).items():
            shutil.move(str(path), str(tmp / name))
        table, lexicon = corpus_phones(phones, lexicon, any(s.alignments for s in splits.values()), source)
        table.write(tmp / "phones.txt")
        everything = [u for group in utts.values() for u in group]
        skipped = [reason for s in splits.values() for reason in s.skipped]
        summary = {
            "source": str(Path(source).resolve()), "imported_from": kind, "sample_rate": train.sample_rate,
            "utterances": len(everything), "speakers": len({u.speaker for u in everything}),
            "hours": round(sum(u.duration for u in everything) / 3600.0, 6),
            "alignments": {name: splits.get(name, train).alignments for name in stats},
            "features": bool(train.features), "empty_transcripts": empty_transcripts(everything),
            "skipped": len(skipped), "skipped_reasons": skipped, "splits": stats,
        }
        if lexicon is not None:
            summary["lexicon"] = store_lexicon(lexicon, tmp, [u.text for u in everything], where=out)
        write_json_atomic(tmp / "summary.json", summary)
    for line in overlap_notes(utts):
        print(f"asrdist: note: {out}: {line}", file=sys.stderr)
    if "test" not in stats:
        print(f"asrdist: note: {out} has no test split; `asrdist eval` then needs --data on another corpus "
              f"or split", file=sys.stderr)
    return summary


def import_kaldi_corpus(src: str | Path, out: str | Path, single_split: str | None = None,
                        split_dirs: dict[str, str] | None = None, valid_speakers: int | None = None,
                        alignments: str | Path | None = None, skip_bad: bool = False,
                        overwrite: bool = False, progress: bool = True, channel: int | None = None,
                        lexicon: str | Path | None = None, sample_rate: int | None = None) -> dict:
    """A corpus from Kaldi data directories: SRC is one of them (with `single_split`) or holds
    several (train / dev / test by Kaldi's names, or `split_dirs` {split: subdirectory}).
    `alignments` (a file for any utterances) must cover the training split. `lexicon` (a file) is
    read before the audio and stored as OUT/lexicon.txt. The phone table: each data directory's
    phones.txt, else SRC/phones.txt or SRC/lang/phones.txt, else the lexicon's phones
    (`lexicon.corpus_phones`), else the default."""
    src = Path(src)
    inputs = (src, alignments, lexicon)
    check_output_dir(out, overwrite, inputs)  # before any audio is read
    if not src.is_dir():
        raise DataError(f"{src}: directory not found")
    # a phone table beside the data directories (Kaldi's data/lang/phones.txt) serves those without their own
    shared = next((PhoneTable.read(p) for p in (src / "phones.txt", src / "lang" / "phones.txt") if p.is_file()), None)
    # a bad lexicon fails before any output
    lexicon = Lexicon.read(lexicon, shared) if lexicon is not None else None
    single = (src / "wav.scp").is_file()
    if single:
        if split_dirs:
            raise ConfigError(f"--split: {src} is one Kaldi data directory; give --split train, not SPLIT=NAME")
        if single_split != "train":
            raise ConfigError(f"--split: a corpus built from one Kaldi data directory is its train split "
                              f"(--split train); import a {single_split} set alone without --split")
        names, found = [src.name], {"train": None}
    else:
        if single_split is not None:
            raise ConfigError(f"--split: {src} holds no wav.scp; for a directory of data directories "
                              f"give SPLIT=NAME pairs")
        names = sorted(p.name for p in src.iterdir() if (p / "wav.scp").is_file())
        # a directory with Kaldi's tables but no wav.scp is a data directory that lost its audio list
        broken = sorted(p.name for p in src.iterdir() if p.is_dir() and not (p / "wav.scp").is_file()
                        and any((p / table).is_file() for table in ("text", "utt2spk", "spk2utt", "segments")))
        found = match_splits(names + broken, dict(split_dirs or {}), src)
        lost = next((name for name in found.values() if name in broken), None)
        if lost is not None:
            raise DataError(f"{src / lost / 'wav.scp'}: missing ({src / lost} holds Kaldi tables but no wav.scp)")
    require_train(found, src, names)
    check_valid_speakers(valid_speakers, "valid" in found)
    ali = Path(alignments) if alignments else None
    splits = {}
    with decoded_audio(Path(out)) as decoded:
        for split, name in found.items():
            path = src if name is None else src / name
            splits[split] = import_split(path, ali, skip_bad, progress, optional_alignments=split != "train",
                                         channel=channel, decoded=decoded, sample_rate=sample_rate,
                                         phones=None if (path / "phones.txt").is_file() else shared)
        extra = move_decoded(decoded, [u for s in splits.values() for u in s.utterances], Path(out))
        return write_corpus(Path(out), splits, src, valid_speakers, overwrite, "kaldi", extra_dirs=extra,
                            inputs=inputs, lexicon=lexicon)
