"""Import a Kaldi data directory as an asrdist split directory (`export_kaldi` writes one back).

Import reads `wav.scp` (audio files, command pipes, or a Kaldi archive), `segments`, `text`,
`utt2spk`, optional `feats.scp` and alignments, resamples or takes one channel on request, and
checks every utterance (audio, transcript, alignment ids and lengths; Kaldi's `snip_edges=true`
frames padded to asrdist's). What it reads and checks:
docs/data.md#what-import-kaldi-reads-and-checks-corpusimport_kaldipy."""
from __future__ import annotations

import json
import math
import re
import shutil
import subprocess
import sys
import tempfile
from collections import Counter
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import kaldiio
import numpy as np
from tqdm import tqdm

from asrdist.corpus.kaldi_tables import (
    UNMATCHED,
    load_scp,
    read_alignment_file,
    read_speakers,
    read_table,
    resolve_path,
)
from asrdist.corpus.lexicon import Lexicon, corpus_phones, store_lexicon
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import DataError, Stopped
from asrdist.features.store import FeatureStoreWriter
from asrdist.io.atomic import (
    atomic_dir,
    check_output_dir,
    output_errors,
    sigterm_as_exit,
    write_json_atomic,
)
from asrdist.io.audio import (
    READABLE,
    num_frames,
    pick_channel,
    read_wav,
    read_wav_format,
    resample,
    write_wav,
)
from asrdist.io.kaldi_dir import (
    ARCHIVE_ENTRY,
    COMMAND_PIPE,
    Segment,
    Utterance,
    wav_entry_kind,
    write_data_dir,
)

TOLERANCE_FRAMES = 1
COMMAND_TIMEOUT_S = 600
"""How long one wav.scp command may run before the import calls it hung."""
KALDI_SNIP_EDGES_DEFICIT = 2
MAX_OVERSHOOT_S = 0.5
"""A segment may end this much after its recording (rounded end times); it is cut at the
recording's end, as Kaldi's extract-segments does (its --max-overshoot default)."""
def _short(text: str) -> str:
    return text if len(text) <= 60 else text[:57] + "..."


@contextmanager
def decoded_audio(out: Path) -> Iterator[Path]:
    """A directory beside OUT for audio an import decodes (wav.scp commands, lhotse's other audio),
    removed afterwards; `move_decoded` puts what it holds into the output."""
    out = Path(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    path = Path(tempfile.mkdtemp(prefix=f".{out.name}.audio.", dir=out.parent)).resolve()
    try:
        with sigterm_as_exit():  # a `kill` must not leave the decoded audio behind
            yield path
    finally:
        shutil.rmtree(path, ignore_errors=True)


def move_decoded(decoded: Path, utterances, out: Path) -> dict[str, Path]:
    """Point `utterances` whose audio lies in `decoded` at OUT/audio/, where the import will put it;
    returns the `extra_dirs` of `write_corpus` ({} when nothing was decoded)."""
    final_audio = Path(out).resolve() / "audio"
    for u in utterances:
        if Path(u.wav).parent == decoded:
            u.wav = str(final_audio / Path(u.wav).name)
    return {"audio": decoded} if any(decoded.iterdir()) else {}


def _fit_frames(x: np.ndarray, frames: int, where: str, what: str) -> np.ndarray:
    """Check `x`'s length against the audio's frame count; pad Kaldi snip_edges=true framing."""
    if abs(len(x) - frames) <= TOLERANCE_FRAMES:
        return x
    if len(x) == frames - KALDI_SNIP_EDGES_DEFICIT and len(x) > 0:
        return np.concatenate([x[:1], x, x[-1:]])
    raise DataError(f"{where}: {what} has {len(x)} frames, audio {frames} "
                    f"(tolerance {TOLERANCE_FRAMES})")


@dataclass
class ImportedSplit:
    """One split's checked utterances, ready to be written by `write_split`."""

    source: Path
    utterances: list[Utterance]
    sample_rate: int
    phones: PhoneTable
    features: dict[str, np.ndarray]
    """Imported features by utterance (empty when the source has none)."""
    skipped: list[str]
    alignments: bool
    features_from: str = "kaldi feats.scp"
    """Where imported features came from (the feature store's `imported`)."""


class _Importer:
    """Collects per-utterance problems in `bad` so --skip-bad can drop exactly those.

    The source is Kaldi's tables: read from `src`, or given as `tables` (name -> {key: value})
    with `files` naming, for each table, the file that messages should point at (lhotse import).
    `optional_alignments`: an alignment file that covers none of this split's utterances is
    ignored (one file given for a whole corpus)."""

    channel: int | None = None
    """The channel read from multi-channel audio (which is an error without one)."""
    decoded: Path | None = None
    """Where the output of wav.scp commands goes (`decoded_audio`); None: commands are refused."""
    sample_rate: int | None = None
    """The corpus' rate, other audio resampled to it; None: the rate of most recordings, others refused."""

    def __init__(self, src: Path, alignments: Path | None, progress: bool,
                 tables: dict[str, dict[str, str]] | None = None, files: dict[str, Path] | None = None,
                 optional_alignments: bool = False):
        self.src, self.progress, self.files = src, progress, files or {}
        self.bad: dict[str, str] = {}
        self.cut_at_end = 0  # segments ending 10 ms to MAX_OVERSHOOT_S after their recording (cut there)
        self.silent: list[str] = []  # recordings whose every sample is zero (a failed recording?)
        if tables is None:
            tables = {"wav.scp": read_table(src / "wav.scp", self.bad),
                      "segments": read_table(src / "segments", self.bad, required=False),
                      "text": read_table(src / "text", self.bad),
                      "utt2spk": read_speakers(src, self.bad)}
        self.wav_scp, self.segments = tables["wav.scp"], tables.get("segments", {})
        self.text, self.utt2spk = tables["text"], tables["utt2spk"]
        self.phones = PhoneTable.read(src / "phones.txt") if (src / "phones.txt").is_file() else PhoneTable()
        if alignments is None and (src / "alignment.scp").is_file():
            alignments = src / "alignment.scp"
        self.utt_ids = sorted(self.segments) if self.segments else sorted(self.wav_scp)
        self.alignments = read_alignment_file(alignments, self.bad) if alignments else {}
        if optional_alignments and not set(self.utt_ids) & set(self.alignments):
            alignments, self.alignments = None, {}
        self.alignment_path = alignments
        has_feats = (src / "feats.scp").is_file()
        self.feats = load_scp(src / "feats.scp", self.bad, "features") if has_feats else {}

    def where(self, file: str) -> Path:
        return self.files.get(file, self.src / file)

    def fail(self, utt_id: str, reason: str, file: str = "wav.scp") -> None:
        self.bad.setdefault(utt_id, f"{self.where(file)}: utterance {utt_id}: {reason}")

    def recordings(self) -> dict[str, str]:
        """utt -> recording id, marking utterances without usable audio entries bad."""
        rec_of = {}
        for utt_id in self.utt_ids:
            if self.segments:
                fields = self.segments[utt_id].split()
                if len(fields) != 3:
                    self.fail(utt_id, "expected 'recording start end'", "segments")
                    continue
                rec = fields[0]
            else:
                rec = utt_id
            wav = self.wav_scp.get(rec)
            if wav is None:  # named where the recording id came from
                self.fail(utt_id, f"recording '{rec}' not in wav.scp", "segments" if self.segments else "wav.scp")
            elif wav_entry_kind(wav) is not None and self.decoded is None:
                self.fail(utt_id, f"{wav_entry_kind(wav)} '{_short(wav)}' is not supported here; list the audio "
                                  f"files ({READABLE}) instead")
            else:
                rec_of[utt_id] = rec
            if utt_id not in self.utt2spk:
                self.fail(utt_id, "no speaker", "utt2spk")
            if utt_id not in self.text:
                self.fail(utt_id, "missing transcript", "text")
        return rec_of

    def read_audio(self, rec_of: dict[str, str]) -> tuple[dict[str, tuple[Path, int, int]], int, Counter]:
        """rec -> (path, samples, rate) for every readable recording, the corpus rate and the
        count of recordings at each rate."""
        audio, first_utt = {}, {}
        for utt_id, rec in rec_of.items():
            first_utt.setdefault(rec, utt_id)
        for rec, utt_id in tqdm(first_utt.items(), desc="import audio", unit="file",
                                disable=None if self.progress else True, file=sys.stderr):
            where = f"{self.where('wav.scp')}: utterance {utt_id}"
            entry = self.wav_scp[rec]
            try:
                if wav_entry_kind(entry) == COMMAND_PIPE:
                    path = self._run_command(rec, entry, where)
                elif wav_entry_kind(entry) == ARCHIVE_ENTRY:
                    path = self._read_ark(rec, entry, where)
                else:
                    path = resolve_path(self.src, entry)
                samples, rate = read_wav(path, where=where, channel=self.channel)
                if not samples.any():
                    self.silent.append(rec)
                converted = path.parent != self.decoded and self.channel is not None and \
                    read_wav_format(path, where).channels > 1
                if self.sample_rate is not None and rate != self.sample_rate:
                    samples, rate, converted = resample(samples, rate, self.sample_rate), self.sample_rate, True
                if converted:  # a mono copy at the corpus' rate, so no later stage needs these options
                    path = path if path.parent == self.decoded else self._decoded_path(rec)
                    write_wav(path, samples, rate)
                audio[rec] = (path, len(samples), rate)
            except DataError as exc:
                for u, r in rec_of.items():
                    if r == rec:
                        self.bad.setdefault(u, str(exc))
        rates = Counter(rate for _, _, rate in audio.values())
        return audio, (rates.most_common(1)[0][0] if rates else 0), rates

    def _run_command(self, rec: str, entry: str, where: str) -> Path:
        """Run a wav.scp command pipe; its audio (the channel asked for) as a 16-bit WAV in `decoded`."""
        command = entry.rstrip()[:-1].strip()
        try:
            done = subprocess.run(command, shell=True, stdin=subprocess.DEVNULL, capture_output=True,
                                  timeout=COMMAND_TIMEOUT_S)
        except subprocess.TimeoutExpired:
            raise DataError(f"{where}: command '{_short(command)}' did not finish within {COMMAND_TIMEOUT_S} s") from None
        if done.returncode != 0:
            said = done.stderr.decode("utf-8", "replace").strip().splitlines()
            how = f"killed by signal {-done.returncode}" if done.returncode < 0 else f"exit code {done.returncode}"
            raise DataError(f"{where}: command '{_short(command)}' failed ({how}){': ' + said[-1] if said else ''}")
        path = self._decoded_path(rec)
        raw = self.decoded / f".{path.name}.out"
        raw.write_bytes(done.stdout)
        try:
            samples, rate = read_wav(raw, where=f"{where}: the output of '{_short(command)}'", channel=self.channel)
        except DataError as exc:  # the temporary's name means nothing to the user: the command's output was read
            raise DataError(str(exc).replace(f" {raw.name}", "")) from None
        finally:
            raw.unlink()
        write_wav(path, samples, rate)
        return path

    def _read_ark(self, rec: str, entry: str, where: str) -> Path:
        """A WAV inside a Kaldi archive (`wav.ark:OFFSET`, as `wav-copy` writes them), read by
        kaldiio; stored as a 16-bit WAV in `decoded` (the channel asked for)."""
        file, _, offset = entry.strip().rpartition(":")
        location = f"{resolve_path(self.src, file)}:{offset}"
        try:
            loaded = kaldiio.load_mat(location)
        except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
            raise
        except Exception as exc:  # kaldiio raises many types for a broken or missing ark
            raise DataError(f"{where}: cannot read {location} ({exc})") from None
        if not (isinstance(loaded, tuple) and len(loaded) == 2):
            raise DataError(f"{where}: {location} holds a matrix, not a WAV (is it a feats.ark?)")
        rate, samples = int(loaded[0]), np.asarray(loaded[1])
        samples = pick_channel(samples.reshape(len(samples), -1), self.channel, where, location)
        path = self._decoded_path(rec)
        write_wav(path, samples, rate)
        return path

    def _decoded_path(self, rec: str) -> Path:
        """A new file in `decoded` for recording `rec` (its id made a plain file name)."""
        name = re.sub(r"[^A-Za-z0-9_.-]", "_", rec).lstrip(".") or "recording"
        path = self.decoded / f"{name}.wav"
        for n in range(2, 1 << 30):
            if not path.exists():
                break
            path = self.decoded / f"{name}-{n}.wav"
        return path

    def utterance(self, utt_id: str, rec: str, path: Path, total: int, rate: int) -> Utterance:
        """One checked utterance; raises DataError naming it."""
        where = f"{self.where('wav.scp')}: utterance {utt_id}"
        segment, count = None, total
        if self.segments:
            _, start, end = self.segments[utt_id].split()
            try:
                start, end = round(float(start), 3), round(float(end), 3)
            except ValueError:
                raise DataError(f"{self.where('segments')}: utterance {utt_id}: bad times") from None
            if not (math.isfinite(start) and math.isfinite(end)):  # nan / inf parse as floats
                raise DataError(f"{self.where('segments')}: utterance {utt_id}: bad times "
                                f"({start} {end}: not finite)")
            end = round(total / rate, 3) if end < 0 else end
            first, last = int(round(start * rate)), int(round(end * rate))
            span = f"{self.where('segments')}: utterance {utt_id}: segment {start:.3f}-{end:.3f} s"
            if last <= first:
                raise DataError(f"{span} {'is empty' if last == first else 'ends before it starts'}")
            if start < 0 or first >= total or last > total + MAX_OVERSHOOT_S * rate:
                raise DataError(f"{span} outside the recording ({total / rate:.3f} s; a segment may end at "
                                f"most {MAX_OVERSHOOT_S} s after it)")
            if last > total:  # by more than the rounding of times to the millisecond: noted
                self.cut_at_end += last - total > rate // 100
                end, last = round(total / rate, 3), total
            segment, count = Segment(rec, start, end), last - first
        frames = num_frames(count, rate)
        if frames == 0:
            raise DataError(f"{where}: audio too short ({count} samples)")
        alignment = None
        if self.alignment_path is not None:
            ali_where = f"{self.alignment_path}: utterance {utt_id}"
            if utt_id not in self.alignments:
                raise DataError(f"{ali_where}: missing alignment")
            alignment = self.alignments[utt_id]
            if alignment.ndim != 1 or not np.issubdtype(alignment.dtype, np.integer):
                raise DataError(f"{ali_where}: alignment is not an integer vector")
            alignment = self.phones.map_ids(alignment, ali_where)  # Kaldi's ids onto the table's
            alignment = _fit_frames(alignment, frames, ali_where, "alignment").astype(np.int32)
        if self.feats:
            feats = self.feats.get(utt_id)
            if feats is None:
                raise DataError(f"{self.where('feats.scp')}: utterance {utt_id}: missing features")
            if feats.ndim != 2 or not np.all(np.isfinite(feats)):
                raise DataError(f"{self.where('feats.scp')}: utterance {utt_id}: not a finite matrix")
            self.feats[utt_id] = _fit_frames(feats, frames, f"{self.where('feats.scp')}: utterance {utt_id}",
                                             "features")
        return Utterance(utt_id=utt_id, speaker=self.utt2spk[utt_id], wav=str(path),
                         text=self.text[utt_id], duration=round(count / rate, 3),
                         alignment=alignment, segment=segment)


def import_split(src: Path, alignments: Path | None = None, skip_bad: bool = False, progress: bool = True,
                 optional_alignments: bool = False, tables: dict[str, dict[str, str]] | None = None,
                 files: dict[str, Path] | None = None, channel: int | None = None,
                 decoded: Path | None = None, sample_rate: int | None = None,
                 features: dict[str, np.ndarray] | None = None, given_alignments: dict[str, np.ndarray] | None = None,
                 phones: PhoneTable | None = None) -> ImportedSplit:
    """Read and check one Kaldi data directory (or the tables given); DataError on the first bad
    utterance, or with `skip_bad` every bad one is left out, reported and counted. Multi-channel
    audio needs `channel`. wav.scp commands are run, their audio stored in `decoded`
    (`decoded_audio`), and refused without it; so are the mono copies of multi-channel files and
    the copies resampled to `sample_rate` (default: the rate of most recordings; others refused).
    `features` (utt -> frames x dims, `files["feats.scp"]` naming their source) replace feats.scp;
    `given_alignments` (utt -> phone ids of `phones`, `src` naming their source) the alignment file."""
    if tables is None and not src.is_dir():
        raise DataError(f"{src}: Kaldi data directory not found")
    imp = _Importer(src, alignments, progress, tables, files, optional_alignments)
    imp.channel, imp.decoded, imp.sample_rate = channel, decoded, sample_rate
    if features is not None:
        imp.feats = features
    if phones is not None:
        imp.phones = phones
    if given_alignments is not None:
        imp.alignments, imp.alignment_path = given_alignments, src
    rec_of = imp.recordings()
    audio, rate, rates = imp.read_audio({u: r for u, r in rec_of.items() if u not in imp.bad})
    utts: list[Utterance] = []
    for utt_id in imp.utt_ids:
        if utt_id not in imp.bad:
            path, total, utt_rate = audio[rec_of[utt_id]]
            try:
                if utt_rate != rate:
                    raise DataError(f"{imp.where('wav.scp')}: utterance {utt_id}: sample rate {utt_rate} Hz, "
                                    f"expected {rate} Hz (the rate of {rates[rate]} of {sum(rates.values())} "
                                    f"recordings); give --sample-rate HZ to resample every recording to one rate")
                utts.append(imp.utterance(utt_id, rec_of[utt_id], path, total, rate))
                continue
            except DataError as exc:
                imp.bad[utt_id] = str(exc)
        if not skip_bad:
            raise DataError(imp.bad[utt_id])
        print(f"asrdist: skipped: {imp.bad[utt_id]}", file=sys.stderr)
    if imp.silent:
        print(f"asrdist: note: {imp.where('wav.scp')}: {len(imp.silent)} recording(s) hold only zero samples "
              f"(e.g. {imp.silent[0]}): silence, whatever their transcripts say", file=sys.stderr)
    if imp.cut_at_end:
        print(f"asrdist: note: {imp.where('segments')}: {imp.cut_at_end} segment(s) end 10 ms to {MAX_OVERSHOOT_S} s "
              f"after their recording; cut at its end, as Kaldi's extract-segments does", file=sys.stderr)
    skipped = [imp.bad[u] for u in imp.utt_ids if u in imp.bad]
    unheard = sorted(set(imp.text) - set(imp.utt_ids))
    if unheard:  # transcripts of utterances with no audio entry: a wav.scp or segments cut short?
        listed = "segments" if imp.segments else "wav.scp"
        reason = (f"{imp.where('text')}: {len(unheard)} transcribed utterance(s) not in {listed} (first: {unheard[0]}), "
                  f"so without audio")
        if not skip_bad:
            raise DataError(reason)
        print(f"asrdist: skipped: {reason}", file=sys.stderr)
        skipped.append(reason)
    if UNMATCHED in imp.bad:
        if not skip_bad:
            raise DataError(imp.bad[UNMATCHED])
        skipped.append(imp.bad[UNMATCHED])
    if not utts:
        raise DataError(f"{src}: no usable utterances")
    if imp.feats:
        dims = {imp.feats[u.utt_id].shape[1] for u in utts}
        if len(dims) != 1:
            raise DataError(f"{imp.where('feats.scp')}: features of different dimensions {sorted(dims)}")
    return ImportedSplit(source=src, utterances=utts, sample_rate=rate, phones=imp.phones,
                         features={u.utt_id: imp.feats[u.utt_id] for u in utts} if imp.feats else {},
                         skipped=skipped, alignments=imp.alignment_path is not None,
                         features_from="lhotse cuts" if features is not None else "kaldi feats.scp")


def write_split(tmp: Path, final: Path, split: ImportedSplit, utts: list[Utterance]) -> dict:
    """Write `utts` of `split` as a split directory at `tmp` (to be renamed to `final`): Kaldi
    tables with absolute paths, and its imported features in the feature store. Returns its stats."""
    write_data_dir(tmp, utts, final_dir=final)
    if split.features:
        writer = FeatureStoreWriter(tmp / "feats", next(iter(split.features.values())).shape[1])
        for u in utts:
            writer.add(u.utt_id, split.features[u.utt_id])
        writer.close({"num_mel_bins": None, "cmvn": "none", "sample_rate": split.sample_rate,
                      "frame_shift": 0.01, "imported": split.features_from, "skipped": 0, "skipped_utterances": []})
    return {"utterances": len(utts), "speakers": len({u.speaker for u in utts}),
            "hours": round(sum(u.duration for u in utts) / 3600.0, 6)}


def import_kaldi(src: str | Path, out: str | Path, alignments: str | Path | None = None,
                 skip_bad: bool = False, overwrite: bool = False, progress: bool = True,
                 channel: int | None = None, lexicon: str | Path | None = None, sample_rate: int | None = None) -> dict:
    """Import Kaldi data dir `src` into asrdist split directory `out`; returns the summary.
    OUT is checked before any audio is read; `lexicon` (a file) is stored as OUT/lexicon.txt.
    (`asrdist.corpus.assemble.import_kaldi_corpus` builds a whole corpus.)"""
    from asrdist.corpus.assemble import empty_transcripts  # here, not at the top: assemble imports this module

    src, out = Path(src), Path(out)
    inputs = (src, alignments, lexicon)
    check_output_dir(out, overwrite, inputs)
    lex = Lexicon.read(lexicon) if lexicon is not None else None  # a bad lexicon fails before any output
    with decoded_audio(out) as decoded:
        split = import_split(src, Path(alignments) if alignments else None, skip_bad, progress, channel=channel,
                             decoded=decoded, sample_rate=sample_rate)
        utts = split.utterances
        extra = move_decoded(decoded, utts, out)
        with atomic_dir(out, overwrite=overwrite, inputs=inputs) as tmp:
            stats = write_split(tmp, out, split, utts)
            for name, path in extra.items():
                shutil.move(str(path), str(tmp / name))
            table, lex = corpus_phones(split.phones, lex, split.alignments, src)
            table.write(tmp / "phones.txt")
            summary = {
                "source": str(src.resolve()), "sample_rate": split.sample_rate, **stats,
                "alignments": split.alignments, "features": bool(split.features),
                "empty_transcripts": empty_transcripts(utts),
                "skipped": len(split.skipped), "skipped_reasons": split.skipped,
            }
            if lex is not None:
                summary["lexicon"] = store_lexicon(lex, tmp, [u.text for u in utts], where=out)
            write_json_atomic(tmp / "summary.json", summary)
    return summary


def import_command(args) -> int:
    from asrdist.corpus.assemble import import_kaldi_corpus, parse_split_options  # (as above)

    single, mapping = parse_split_options(args.split or [])
    one_split = (args.src / "wav.scp").is_file() and single is None and not mapping
    if one_split and args.valid_speakers is not None:
        # carving a valid set asks for a corpus to train on: SRC, one data directory, is its train split
        one_split, single = False, "train"
    with output_errors(args.out):  # a full disk or a read-only place names OUT, not a temporary beside it
        if one_split:
            summary = import_kaldi(args.src, args.out, alignments=args.alignments, skip_bad=args.skip_bad,
                                   overwrite=args.overwrite, channel=args.channel, lexicon=args.lexicon,
                                   sample_rate=args.sample_rate)
        else:
            summary = import_kaldi_corpus(args.src, args.out, single_split=single, split_dirs=mapping,
                                          valid_speakers=args.valid_speakers, alignments=args.alignments,
                                          skip_bad=args.skip_bad, overwrite=args.overwrite, channel=args.channel,
                                          lexicon=args.lexicon, sample_rate=args.sample_rate)
    if one_split:
        print(f"asrdist: note: {args.src} is one Kaldi data directory, so {args.out} is one split directory "
              f"(for `asrdist eval --data` or `asrdist features`); to train, import with --split train, or give "
              f"a directory holding train / dev / test", file=sys.stderr)
    print(json.dumps(summary, indent=2))
    return 0
