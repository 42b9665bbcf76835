"""lhotse CutSets in and out: `asrdist corpus import-lhotse CUTS.jsonl.gz OUT` and
`asrdist corpus export-lhotse CORPUS OUT`, through lhotse's own reader and writer.

Import (`read_cuts_part`): 1. lhotse reads the CutSet; 2. every supervision of every cut is one
utterance, its times moved from the cut onto the recording (cut start + supervision start); 3. its
recording is referenced in place or decoded, as for a recordings manifest (`import_lhotse`);
4. a cut's precomputed features (10 ms frames) give the utterance the rows its supervision spans,
stored in the feature store and checked against the audio's frame count as Kaldi's feats.scp is.
Export (`export_lhotse`): each utterance one MonoCut over its segment of the recording, with one
supervision (text, speaker) spanning it and, where the split is aligned, the frame alignment as the
supervision's `phone` alignment (one item per run of equal phones, timed on the recording as
lhotse times them), read back onto the table its symbols make (`phones.inventory`); one
`cuts_SPLIT.jsonl.gz` per split.
"""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
from lhotse import CutSet, Recording, SupervisionSegment  # this module runs only for its commands
from lhotse.cut import MonoCut
from lhotse.supervision import AlignmentItem
from lhotse.utils import compute_num_frames

from asrdist.corpus.import_lhotse import load_manifest, utterance_tables
from asrdist.corpus.phones import PhoneTable, inventory
from asrdist.errors import DataError
from asrdist.features.extract import find_splits
from asrdist.io.atomic import atomic_dir, check_output_dir, output_errors
from asrdist.io.kaldi_dir import read_data_dir

FRAME_SHIFT = 0.01
"""asrdist's frames; imported features must have lhotse's frame shift equal to it."""
SILENCE_ID = 0
ALIGNMENT_KEY = "phone"
"""The supervision alignment type export writes (lhotse's convention: `word`, `phone`, ...)."""


def read_cuts_part(path: Path, audio_dir: Path, skip_bad: bool):
    """One split's Kaldi-style tables from a CutSet manifest; returns (tables, files, bad, given):
    `given` the keywords of `import_split` for its features and phone alignments, where it has them."""
    cuts = load_manifest(path, "cuts")
    recordings, supervisions, owner = {}, [], {}
    for cut in cuts:
        where = f"{path}: cut {cut.id}"
        if type(cut).__name__ != "MonoCut":
            raise DataError(f"{where}: a {type(cut).__name__}; one recording per cut expected (MonoCut)")
        if not cut.has_recording:
            raise DataError(f"{where}: no recording; an asrdist corpus is made from audio")
        recordings.setdefault(cut.recording.id, cut.recording)
        for sup in cut.supervisions:  # a cut without any (lhotse keeps such) is no utterance
            moved = sup.with_offset(cut.start)
            supervisions.append(moved)
            owner[moved.id] = (cut, sup, moved)
    if not supervisions:
        raise DataError(f"{path}: no cut holds a supervision")
    tables, files, bad = utterance_tables(recordings, supervisions, path, path, audio_dir, skip_bad)
    files["feats.scp"] = path
    given = {}
    if any(cut.has_features for cut, _, _ in owner.values()):
        given["features"] = _features(path, tables["segments"], owner)
    aligned = {u: moved for u, (_, _, moved) in owner.items()
               if u in tables["segments"] and ALIGNMENT_KEY in (moved.alignment or {})}
    if aligned:
        table = inventory(item.symbol for sup in aligned.values() for item in sup.alignment[ALIGNMENT_KEY])
        given["phones"] = table
        given["given_alignments"] = {u: _frames(sup, owner[u][0].sampling_rate, table, f"{path}: utterance {u}")
                                     for u, sup in aligned.items()}
    return tables, files, bad, given


def one_table(given: list[dict]) -> None:
    """Put the phone alignments of several parts (`read_cuts_part`'s `given`) onto one table, that
    of all their symbols: a test part may lack phones that train has."""
    tables = [g["phones"] for g in given if "phones" in g]
    if len({t.symbols for t in tables}) <= 1:
        return
    table = inventory(s for t in tables for s in t.symbols)
    for g in given:
        if "phones" in g:
            remap = np.asarray([table.id(s) for s in g["phones"].symbols], dtype=np.int32)
            g["given_alignments"] = {u: remap[a] for u, a in g["given_alignments"].items()}
            g["phones"] = table


def _features(path: Path, utterances, owner) -> dict[str, np.ndarray]:
    features = {}
    for utt in utterances:
        cut, sup, _ = owner[utt]
        if not cut.has_features:
            continue  # the import names it: missing features
        if abs(cut.frame_shift - FRAME_SHIFT) > 1e-6:
            raise DataError(f"{path}: cut {cut.id}: features at a frame shift of {cut.frame_shift} s; asrdist's "
                            f"frames are {FRAME_SHIFT} s (compute them again, or import without them)")
        features[utt] = _rows(cut, sup, np.asarray(cut.load_features(), dtype=np.float32))
    return features


def _frames(sup, rate: int, table: PhoneTable, where: str) -> np.ndarray:
    """A supervision's `phone` alignment (items timed on the recording) as a phone id per 10 ms
    frame of it; frames no item covers are silence."""
    ids = np.full(compute_num_frames(sup.duration, FRAME_SHIFT, rate), SILENCE_ID, dtype=np.int32)
    for item in sup.alignment[ALIGNMENT_KEY]:
        first = max(int(round((item.start - sup.start) / FRAME_SHIFT)), 0)
        last = int(round((item.start + item.duration - sup.start) / FRAME_SHIFT))
        ids[first:last] = table.lookup(item.symbol, where)
    return ids


def _rows(cut, sup, feats: np.ndarray) -> np.ndarray:
    """The rows of a cut's features that its supervision spans (all of them when it spans the cut)."""
    rate = cut.sampling_rate
    first = compute_num_frames(max(sup.start, 0.0), FRAME_SHIFT, rate)
    count = compute_num_frames(sup.duration, FRAME_SHIFT, rate)
    return feats[first:first + count]


def _cut(utt, data, table: PhoneTable | None, recordings: dict):
    """The MonoCut of one utterance (its recording read by lhotse once per file)."""
    path = data.wav_path(utt).resolve()
    rec_id = utt.segment.recording if utt.segment is not None else utt.utt_id
    if rec_id not in recordings:
        recordings[rec_id] = Recording.from_file(path, recording_id=rec_id)
    recording = recordings[rec_id]
    start = utt.segment.start if utt.segment is not None else 0.0
    duration = round(min(utt.duration, recording.duration - start), 6)
    alignment = None
    if utt.alignment is not None and table is not None:
        a = np.asarray(utt.alignment)
        edges = np.flatnonzero(np.concatenate([[True], a[1:] != a[:-1]]))
        ends = np.append(edges[1:], len(a))
        alignment = {ALIGNMENT_KEY: [AlignmentItem(table.symbol(int(a[b])), round(start + b * FRAME_SHIFT, 3),
                                                   round((e - b) * FRAME_SHIFT, 3)) for b, e in zip(edges, ends)]}
    sup = SupervisionSegment(id=utt.utt_id, recording_id=rec_id, start=0.0, duration=duration, channel=0,
                             text=utt.text, speaker=utt.speaker, alignment=alignment)
    return MonoCut(id=utt.utt_id, start=start, duration=duration, channel=0, recording=recording, supervisions=[sup])


def export_lhotse(src: str | Path, out: str | Path, overwrite: bool = False) -> dict:
    """Write every split of corpus `src` (or the split directory `src`) as CutSet manifests in OUT."""
    src, out = Path(src), Path(out)
    check_output_dir(out, overwrite, (src,))
    splits = find_splits(src)
    if not splits:
        raise DataError(f"{src}: no split directories (train/, valid/, test/ with wav.scp)")
    phones = next((p / "phones.txt" for p in (src, src.parent) if (p / "phones.txt").is_file()), None)
    table = PhoneTable.read(phones) if phones is not None else None
    counts = {}
    with atomic_dir(out, overwrite=overwrite, inputs=(src,)) as tmp:
        for name, path in splits.items():
            data = read_data_dir(path)
            recordings: dict = {}
            cuts = CutSet.from_cuts(_cut(data.utterances[u], data, table, recordings) for u in data.utt_ids)
            cuts.to_file(tmp / f"cuts_{name}.jsonl.gz")
            counts[name] = len(data.utt_ids)
    return {"source": str(src), "out": str(out), "cuts": counts}


def export_lhotse_command(args) -> int:
    with output_errors(args.out):
        summary = export_lhotse(args.src, args.out, overwrite=args.overwrite)
    print(json.dumps(summary, indent=2))
    return 0
