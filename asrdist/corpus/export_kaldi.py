"""Export a split directory, or every split of a corpus, back as plain Kaldi data directories
(absolute audio paths, phones.txt, alignments and features when the split has them)."""
from __future__ import annotations

import json
from pathlib import Path

from asrdist.corpus.phones import PhoneTable
from asrdist.features.extract import find_splits
from asrdist.features.store import FeatureStore, export_kaldi, has_features
from asrdist.io.atomic import atomic_dir, check_output_dir
from asrdist.io.kaldi_dir import DataDir, Utterance, read_data_dir, write_alignments, write_data_dir


def _phone_table_of(split: Path) -> PhoneTable:
    for candidate in (split / "phones.txt", split.parent / "phones.txt"):
        if candidate.is_file():
            return PhoneTable.read(candidate)
    return PhoneTable()


def _export_split(data: DataDir, out: Path, final: Path) -> None:
    """Write `data` into `out` as a plain Kaldi dir whose paths are absolute at `final`."""
    utts = []
    for utt_id in data.utt_ids:
        u = data.utterances[utt_id]
        utts.append(Utterance(utt_id=u.utt_id, speaker=u.speaker, wav=str(data.wav_path(u).resolve()),
                              text=u.text, duration=u.duration, segment=u.segment))
    write_data_dir(out, utts, final_dir=final)
    _phone_table_of(data.path).write(out / "phones.txt")
    if data.has_alignments:
        alignments = {u: data.utterances[u].alignment for u in data.utt_ids}
        write_alignments(out, alignments, final)
        (out / "alignment.txt").write_text(
            "".join(f"{u} {' '.join(map(str, a.tolist()))}\n" for u, a in sorted(alignments.items())),
            encoding="utf-8")
    if has_features(data.path):
        export_kaldi(FeatureStore(data.path), out, final_dir=final)


def export_kaldi_dir(src: str | Path, out: str | Path, overwrite: bool = False) -> dict:
    """Export a split directory, or every split of a corpus, as plain Kaldi data directories."""
    src, out = Path(src), Path(out)
    check_output_dir(out, overwrite, (src,))
    splits = find_splits(src)
    single = (src / "wav.scp").is_file()
    with atomic_dir(out, overwrite=overwrite, inputs=(src,)) as tmp:
        for name, path in splits.items():
            data = read_data_dir(path)
            _export_split(data, tmp if single else tmp / name, out if single else out / name)
    return {"source": str(src), "out": str(out), "splits": sorted(splits)}


def export_command(args) -> int:
    print(json.dumps(export_kaldi_dir(args.src, args.out, overwrite=args.overwrite), indent=2))
    return 0
