"""`asrdist corpus import-lhotse`: a corpus from lhotse manifests, read by lhotse itself.

SRC is one CutSet manifest (read by `asrdist.corpus.lhotse_cuts`: cuts onto their recordings,
features, phone alignments), or holds manifests named as lhotse recipes write them,
`{prefix}_cuts_{part}.jsonl.gz`, or `{prefix}_recordings_{part}.jsonl.gz` and
`{prefix}_supervisions_{part}.jsonl.gz` (`.jsonl`, `.json` too); each part is a split (`train-clean-5` -> train, `dev-clean-2` -> valid, see
`asrdist.corpus.assemble`). Every supervision becomes one utterance (id, speaker, text, and its
segment of the recording). A recording that is one mono WAV, FLAC, Ogg, AIFF, NIST SPHERE, AU or
CAF file, played as it is, is referenced where it lies; any other (MP3, several channels, a
command, a URL, in memory, transformed by speed perturbation or resampling) is decoded by lhotse
and stored as a 16-bit WAV under OUT/audio/. The checks and messages are the Kaldi importer's,
naming the manifest.
"""
from __future__ import annotations

import gzip
import json
import math
import re
import sys
from pathlib import Path

import numpy as np

from asrdist.corpus.assemble import (
    check_valid_speakers,
    match_splits,
    parse_split_options,
    require_train,
    write_corpus,
)
from asrdist.corpus.import_kaldi import (
    decoded_audio,
    import_split,
    move_decoded,
)
from asrdist.corpus.kaldi_tables import resolve_path
from asrdist.errors import ConfigError, DataError, Stopped
from asrdist.io.atomic import check_output_dir, output_errors
from asrdist.io.audio import AUDIO_SUFFIXES, write_wav

_MANIFEST = re.compile(r"^(?P<prefix>.*?)_?(?P<kind>recordings|supervisions|cuts)(?:_(?P<part>.+?))?"
                       r"\.(?:jsonl|json)(?:\.gz)?$")


def part_name(path: Path) -> str:
    """The part a lhotse manifest's name says (`librispeech_cuts_dev-clean.jsonl.gz` -> dev-clean);
    the name without its suffixes where it follows no recipe's pattern."""
    m = _MANIFEST.match(path.name)
    return m["part"] or m["prefix"] if m else path.name.split(".")[0]


def find_manifests(src: Path) -> dict[str, dict[str, Path]]:
    """Part name -> {"cuts": path} or {"recordings": path, "supervisions": path} in `src`; a part
    with a CutSet takes it (cuts carry the recordings, supervisions and any features)."""
    found: dict[tuple[str, str], dict[str, Path]] = {}
    for path in sorted(src.iterdir()):
        m = _MANIFEST.match(path.name)
        if m and path.is_file():
            key = (m["prefix"], m["part"] or "")
            if m["kind"] in found.setdefault(key, {}):
                raise DataError(f"{path}: a second {m['kind']} manifest for part '{key[1]}'")
            found[key][m["kind"]] = path
    prefixes = {prefix for prefix, _ in found}
    out = {}
    for (prefix, part), files in found.items():
        name = part if len(prefixes) == 1 else "_".join(x for x in (prefix, part) if x)
        if "cuts" in files:
            out[name] = {"cuts": files["cuts"]}
            continue
        missing = {"recordings", "supervisions"} - set(files)
        if missing:
            raise DataError(f"{next(iter(files.values()))}: no matching {missing.pop()} manifest in {src}")
        out[name] = files
    return out


IN_PLACE_SUFFIXES = tuple(s for s in AUDIO_SUFFIXES if s != ".mp3")
"""Files asrdist's reader reads as they are (`asrdist.io.audio.read_wav`) to the sample lhotse
counts. MP3 is not among them: its length depends on the decoder's handling of encoder delay, so
lhotse decodes it (to the length its manifest says)."""


def _wav_file(recording, base: Path) -> Path | None:
    """The recording's own file when asrdist can read it in place: one mono file with a suffix of
    IN_PLACE_SUFFIXES that lhotse plays as it is (no transforms such as speed perturbation or
    resampling)."""
    sources = recording.sources
    if len(sources) != 1 or sources[0].type != "file" or recording.num_channels != 1 or recording.transforms:
        return None
    path = resolve_path(base, str(sources[0].source))
    return path if path.suffix.lower() in IN_PLACE_SUFFIXES else None


def _decode(recording, channel: int | None, out: Path) -> None:
    """Decode one channel of `recording` with lhotse into a 16-bit WAV at `out`."""
    audio = recording.load_audio(channels=channel)
    samples = np.asarray(audio, dtype=np.float64).reshape(-1, audio.shape[-1])[0]
    write_wav(out, np.clip(samples * 32768.0, -32768, 32767), recording.sampling_rate)


def _channel(sup, recording, where: str) -> int | None:
    channel = sup.channel
    if isinstance(channel, list):
        if len(channel) != 1:
            raise DataError(f"{where}: supervision on channels {channel}; one channel per utterance expected")
        channel = channel[0]
    if int(channel) not in recording.channel_ids:
        raise DataError(f"{where}: supervision on channel {channel}, recording '{recording.id}' has channels "
                        f"{recording.channel_ids}")
    return None if recording.num_channels == 1 else int(channel)


def load_manifest(path: Path, kind: str) -> list:
    """The entries of one manifest, `kind` "recordings", "supervisions" or "cuts". lhotse reads a
    file by what each line holds, not by the set asked for, so a file of another kind is caught
    here by the entries' type; an empty file reads as None."""
    from lhotse import CutSet, Recording, RecordingSet, SupervisionSegment, SupervisionSet  # seconds to import
    from lhotse.cut import Cut

    manifest_set, entry = {"recordings": (RecordingSet, Recording), "cuts": (CutSet, Cut),
                           "supervisions": (SupervisionSet, SupervisionSegment)}[kind]
    try:
        manifest = manifest_set.from_file(path)
        entries = list(manifest) if manifest is not None else []
    except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
        raise
    except Exception as exc:  # lhotse raises many types for a malformed manifest
        bad = _bad_json_line(path)
        if bad is not None:  # lhotse's JSON error counts lines of one entry, not of the file
            raise DataError(f"{path}:{bad[0]}: cannot read lhotse {kind} manifest: not a JSON line "
                            f"({bad[1]})") from None
        raise DataError(f"{path}: cannot read lhotse {kind} manifest ({exc})") from None
    if not entries:
        raise DataError(f"{path}: holds no {kind}")
    wrong = next((e for e in entries if not isinstance(e, entry)), None)
    if wrong is not None:
        hint = "" if kind == "cuts" else " (recordings and supervisions files swapped?)"
        raise DataError(f"{path}: not a {kind} manifest: it holds {type(wrong).__name__} entries{hint}")
    return entries


def _bad_json_line(path: Path) -> tuple[int, str] | None:
    """(line number, why) of the first line of a JSON-lines manifest (.jsonl or .jsonl.gz) that is not
    JSON; None when every line is (or the file is not JSON lines at all)."""
    if not path.name.endswith((".jsonl", ".jsonl.gz")):
        return None
    try:
        with (gzip.open(path, "rt", encoding="utf-8") if path.name.endswith(".gz")
              else open(path, encoding="utf-8")) as f:
            for number, line in enumerate(f, 1):
                if line.strip():
                    try:
                        json.loads(line)
                    except json.JSONDecodeError as exc:
                        return number, exc.msg
    except (OSError, UnicodeDecodeError, EOFError):
        return None
    return None


def _check_times(sup, where: str) -> None:
    """A supervision's segment must be a finite, non-negative start and a positive duration (a
    negative end would read as Kaldi's 'to the end of the recording')."""
    if not (math.isfinite(sup.start) and math.isfinite(sup.duration)) or sup.start < 0 or sup.duration <= 0:
        raise DataError(f"{where}: bad times (start {sup.start}, duration {sup.duration})")


def _decoded_path(audio_dir: Path, key: str, where: str) -> Path:
    """Where a decoded recording goes: `audio_dir/KEY.wav`, so its id must be one plain file name;
    an id with '/' (`../x`, `a/b`) would write outside the corpus or fail half way."""
    name = f"{key}.wav"
    bad = next((c for c in ("/", "\\", "\0") if c in key), None)
    if bad is not None or len(name.encode("utf-8")) > 255:
        reason = f"it holds {bad!r}" if bad is not None else "it is too long"
        raise DataError(f"{where}: recording id '{key}' cannot be a file name ({reason}); "
                        f"its audio must be decoded and is stored as ID.wav")
    return audio_dir / name


def read_part(recordings_path: Path, supervisions_path: Path, audio_dir: Path, skip_bad: bool):
    """One split's Kaldi-style tables from its two manifests (lhotse reads them), decoding the
    audio asrdist cannot read in place into `audio_dir`; returns (tables, files, bad)."""
    recordings = {r.id: r for r in load_manifest(recordings_path, "recordings")}
    supervisions = load_manifest(supervisions_path, "supervisions")
    return utterance_tables(recordings, supervisions, recordings_path, supervisions_path, audio_dir, skip_bad)


def utterance_tables(recordings: dict, supervisions, recordings_path: Path, supervisions_path: Path,
                     audio_dir: Path, skip_bad: bool, checked=None):
    """Kaldi-style tables of `supervisions` (times on their recordings, `recordings` by id): each
    one utterance; audio asrdist cannot read in place decoded into `audio_dir`. `checked(sup, where)`
    (optional) checks more of each one, raising DataError. Returns (tables, files, bad)."""
    wav_scp, segments, text, utt2spk, bad = {}, {}, {}, {}, {}
    for sup in supervisions:
        where = f"{supervisions_path}: utterance {sup.id}"
        if any(c.isspace() for c in sup.id + sup.recording_id):
            raise DataError(f"{where}: ids must not contain white space")
        if sup.id in segments:
            raise DataError(f"{where}: duplicate supervision id")
        try:
            _check_times(sup, where)
            if checked is not None:
                checked(sup, where)
            if sup.recording_id not in recordings:
                raise DataError(f"{where}: recording '{sup.recording_id}' not in the recordings manifest "
                                f"{recordings_path}")
            recording = recordings[sup.recording_id]
            channel = _channel(sup, recording, where)
            key = sup.recording_id if channel is None else f"{sup.recording_id}-ch{channel}"
            if key not in wav_scp:
                path = _wav_file(recording, recordings_path.parent)
                if path is None:
                    path = _decoded_path(audio_dir, key, f"{recordings_path}: utterance {sup.id}")
                    try:
                        _decode(recording, channel, path)
                    except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
                        raise
                    except Exception as exc:  # any decoder failure is this recording's problem
                        raise DataError(f"{recordings_path}: utterance {sup.id}: cannot decode recording "
                                        f"'{sup.recording_id}' ({str(exc).splitlines()[0] if str(exc) else exc!r})")
                wav_scp[key] = str(path)
        except DataError as exc:
            if not skip_bad:
                raise
            bad[sup.id] = str(exc)
            continue
        segments[sup.id] = f"{key} {sup.start:.3f} {sup.start + sup.duration:.3f}"
        if sup.text is not None:
            text[sup.id] = " ".join(sup.text.split())
        if sup.speaker:
            utt2spk[sup.id] = sup.speaker
    if not segments and not bad:
        raise DataError(f"{supervisions_path}: no supervisions")
    files = {"wav.scp": recordings_path, "segments": supervisions_path, "text": supervisions_path,
             "utt2spk": supervisions_path}
    return {"wav.scp": wav_scp, "segments": segments, "text": text, "utt2spk": utt2spk}, files, bad


def import_lhotse_corpus(src: str | Path, out: str | Path, single_split: str | None = None,
                         split_parts: dict[str, str] | None = None, valid_speakers: int | None = None,
                         skip_bad: bool = False, overwrite: bool = False, progress: bool = True,
                         sample_rate: int | None = None) -> dict:
    """Build the asrdist corpus OUT from the lhotse manifests in SRC (a directory of them, or one
    CutSet manifest); returns its summary."""
    from asrdist.corpus.lhotse_cuts import one_table, read_cuts_part  # (it imports this module)

    src, out = Path(src), Path(out)
    check_output_dir(out, overwrite, (src,))  # before any audio is decoded; SRC holds the manifests
    if src.is_file():
        parts = {part_name(src): {"cuts": src}}
    elif not src.is_dir():
        raise DataError(f"{src}: not found")
    else:
        parts = find_manifests(src)
    if not parts:
        raise DataError(f"{src}: no lhotse manifests (*cuts*.jsonl[.gz], or *recordings*.jsonl[.gz] and "
                        f"*supervisions*.jsonl[.gz])")
    if single_split is not None:
        if single_split != "train" or len(parts) != 1:
            raise ConfigError(f"--split {single_split}: a bare split names the one part of SRC as train; "
                              f"SRC has {len(parts)} part(s): choose with SPLIT=PART")
        found = {"train": next(iter(parts))}
    else:
        found = match_splits(sorted(parts), dict(split_parts or {}), src)
    require_train(found, src, sorted(parts) if src.is_dir() else [f"{next(iter(parts))} (give --split train)"])
    check_valid_speakers(valid_speakers, "valid" in found)
    with decoded_audio(out) as decoded:
        splits, read = {}, {}
        for split, part in found.items():
            files = parts[part]
            if "cuts" in files:
                read[split] = read_cuts_part(files["cuts"], decoded, skip_bad)
            else:
                read[split] = (*read_part(files["recordings"], files["supervisions"], decoded, skip_bad), {})
        one_table([given for *_, given in read.values()])
        for split, (tables, where, bad, given) in read.items():
            for reason in bad.values():
                print(f"asrdist: skipped: {reason}", file=sys.stderr)
            source = parts[found[split]].get("cuts", parts[found[split]].get("supervisions"))
            imported = import_split(source, skip_bad=skip_bad, progress=progress, tables=tables, files=where,
                                    decoded=decoded, sample_rate=sample_rate, **given)
            imported.skipped[:0] = list(bad.values())
            imported.source = source
            splits[split] = imported
        extra = move_decoded(decoded, [u for s in splits.values() for u in s.utterances], out)
        return write_corpus(out, splits, src, valid_speakers, overwrite, "lhotse", extra_dirs=extra, inputs=(src,))


def import_lhotse_command(args) -> int:
    single, mapping = parse_split_options(args.split or [])
    with output_errors(args.out):  # a full disk or a read-only place names OUT, not a temporary beside it
        summary = import_lhotse_corpus(args.src, args.out, single_split=single, split_parts=mapping,
                                       valid_speakers=args.valid_speakers, skip_bad=args.skip_bad,
                                       overwrite=args.overwrite, sample_rate=args.sample_rate)
    print(json.dumps(summary, indent=2))
    return 0
