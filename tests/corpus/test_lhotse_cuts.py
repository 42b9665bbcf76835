"""lhotse CutSets: `asrdist corpus import-lhotse CUTS.jsonl.gz OUT` (a cut's supervision onto its
recording, precomputed features and phone alignments kept) and `asrdist corpus export-lhotse`,
written and read by lhotse itself; a corpus round-trips. Real FSDD recordings and the tone corpus."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.corpus.phones import PhoneTable
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.fsdd_kaldi import FSDD, WORDS, copy_recordings


def _same_splits(a: Path, b: Path, splits=("train", "valid", "test")) -> None:
    for split in splits:
        x, y = read_data_dir(a / split), read_data_dir(b / split)
        assert x.utt_ids == y.utt_ids
        for utt in x.utt_ids:
            u, v = x.utterances[utt], y.utterances[utt]
            assert (u.text, u.speaker) == (v.text, v.speaker)
            assert x.wav_path(u).resolve() == y.wav_path(v).resolve()
            assert u.duration == pytest.approx(v.duration, abs=1e-3)
            start = lambda d: d.segment.start if d.segment is not None else 0.0  # noqa: E731
            assert start(u) == pytest.approx(start(v), abs=1e-3)
            if u.alignment is None:
                assert v.alignment is None
            else:
                np.testing.assert_array_equal(u.alignment, v.alignment)


def test_a_corpus_round_trips_through_cutsets(tmp_path: Path):
    corpus = make_tone_corpus(tmp_path / "corpus", utterances_per_speaker=3, speakers=4)
    cuts = tmp_path / "cuts"
    assert main(["corpus", "export-lhotse", str(corpus), str(cuts)]) == 0
    assert sorted(p.name for p in cuts.iterdir()) == ["cuts_test.jsonl.gz", "cuts_train.jsonl.gz",
                                                      "cuts_valid.jsonl.gz"]
    from lhotse import CutSet

    train = read_data_dir(corpus / "train")
    first = CutSet.from_file(cuts / "cuts_train.jsonl.gz").to_eager()[train.utt_ids[0]]  # lhotse reads what was written
    utt = train.utterances[train.utt_ids[0]]
    (sup,) = first.supervisions
    assert (sup.text, sup.speaker) == (utt.text, utt.speaker)
    assert first.recording.sources[0].source == str(train.wav_path(utt).resolve())
    assert [item.symbol for item in sup.alignment["phone"]][0] == "sil"
    out = tmp_path / "back"
    assert main(["corpus", "import-lhotse", str(cuts), str(out)]) == 0
    _same_splits(corpus, out)
    assert (out / "phones.txt").read_text() == (corpus / "phones.txt").read_text()
    assert json.loads((out / "summary.json").read_text())["alignments"] == {"train": True, "valid": True, "test": True}
    # and out again: the same cuts
    again = tmp_path / "again"
    assert main(["corpus", "export-lhotse", str(out / "test"), str(again)]) == 0
    assert [c.id for c in CutSet.from_file(again / "cuts_test.jsonl.gz")] == read_data_dir(corpus / "test").utt_ids


needs_fsdd = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


def _cuts_with_features(root: Path, speakers) -> Path:
    """FSDD recordings as lhotse cuts: each cut 20 ms into its recording, its supervision 30 ms into
    the cut, a made-up language's phone alignment (timed on the recording) and fbank features."""
    from lhotse import CutSet, Fbank, FbankConfig, Recording, SupervisionSegment
    from lhotse.supervision import AlignmentItem

    cuts = []
    for utt, spk, digit, path in copy_recordings(root / "audio", speakers):
        recording = Recording.from_file(path, recording_id=utt)
        cut = recording.to_cut().truncate(offset=0.02, duration=recording.duration - 0.04)
        length = round(cut.duration - 0.06, 3)
        alignment = {"phone": [AlignmentItem("ɲ", 0.05, 0.1), AlignmentItem("a", 0.15, round(length - 0.1, 3))]}
        cut.supervisions = [SupervisionSegment(id=f"{utt}-sup", recording_id=utt, start=0.03, duration=length,
                                               text=WORDS[digit], speaker=spk, alignment=alignment)]
        cut.id = f"{utt}-cut"
        cuts.append(cut)
    path = root / "fsdd_cuts_train-clean.jsonl.gz"
    fbank = Fbank(FbankConfig(num_mel_bins=23, sampling_rate=8000))
    cuts = CutSet.from_cuts(cuts).compute_and_store_features(fbank, root / "feats", num_jobs=1, progress_bar=False)
    cuts.to_file(path)
    return path


@needs_fsdd
def test_a_cutset_with_features_and_alignments_imports(tmp_path: Path):
    from lhotse import CutSet

    path = _cuts_with_features(tmp_path / "src", ("george", "jackson", "nicolas"))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(path), str(out)]) == 0  # train-clean: the train split
    summary = json.loads((out / "summary.json").read_text())
    assert summary["utterances"] == 18 and summary["features"] and summary["splits"]["valid"]["carved_from"] == "train"
    table = PhoneTable.read(out / "phones.txt")
    assert table.symbols == ("sil", "a", "ɲ")  # the alignments' own phones
    cuts = CutSet.from_file(path).to_eager()
    for split in ("train", "valid"):
        data, store = read_data_dir(out / split), FeatureStore(out / split)
        assert store.meta["imported"] == "lhotse cuts"
        for utt_id, utt in data.utterances.items():
            cut = cuts[utt_id.removesuffix("-sup") + "-cut"]
            assert utt.segment.recording == cut.recording.id and utt.segment.start == pytest.approx(0.05)
            rows = cut.load_features()[3:3 + len(store[utt_id])]  # from 30 ms into the cut
            np.testing.assert_allclose(store[utt_id], rows, rtol=1e-6)
            assert len(store[utt_id]) == len(utt.alignment)
            assert set(utt.alignment[:10]) == {table.id("ɲ")} and set(utt.alignment[10:-1]) == {table.id("a")}


@needs_fsdd
def test_cuts_beside_recordings_manifests_and_bad_cuts(tmp_path: Path, capsys):
    from lhotse import CutSet, RecordingSet

    src = tmp_path / "src"
    path = _cuts_with_features(src, ("george", "jackson"))
    path.rename(src / "fsdd_cuts_train.jsonl.gz")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) == 0  # a directory of manifests: cuts_train
    assert json.loads((out / "summary.json").read_text())["utterances"] == 12
    # a cut without a recording (features only) is refused with one line naming it
    cut = next(iter(CutSet.from_file(src / "fsdd_cuts_train.jsonl.gz")))
    bare = cut.drop_recording()
    CutSet.from_cuts([bare]).to_file(tmp_path / "bare_cuts_train.jsonl.gz")
    capsys.readouterr()
    assert main(["corpus", "import-lhotse", str(tmp_path / "bare_cuts_train.jsonl.gz"), str(tmp_path / "x")]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and f"cut {bare.id}: no recording" in err[0]
    # a recordings manifest given as CUTS is named as such
    RecordingSet.from_recordings([cut.recording]).to_file(tmp_path / "recs.jsonl.gz")
    assert main(["corpus", "import-lhotse", str(tmp_path / "recs.jsonl.gz"), str(tmp_path / "y"), "--split",
                 "train"]) != 0
    err = capsys.readouterr().err
    assert "not a cuts manifest: it holds Recording entries" in err and not (tmp_path / "y").exists()
