"""`asrdist corpus import-lhotse`: manifests written by lhotse, read by lhotse; WAV referenced in
place, other audio (FLAC) decoded; bad supervisions named by manifest. Real FSDD recordings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.corpus.audio import read_wav
from asrdist.corpus.kaldi_dir import read_data_dir
from fsdd_kaldi import FSDD, WORDS, copy_recordings

pytestmark = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


def _manifests(root: Path, part: str, speakers, flac: bool = False, drop_speaker: str | None = None) -> None:
    import soundfile
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings, supervisions = [], []
    for utt, spk, digit, path in copy_recordings(root / "audio", speakers):
        if flac:
            samples, rate = read_wav(path)
            path = path.with_suffix(".flac")
            soundfile.write(path, samples, rate, subtype="PCM_16")
        rec = Recording.from_file(path, recording_id=utt)
        recordings.append(rec)
        supervisions.append(SupervisionSegment(id=f"{utt}-sup", recording_id=utt, start=0.0, duration=rec.duration,
                                               text=WORDS[digit].upper(), speaker=None if utt == drop_speaker else spk))
    RecordingSet.from_recordings(recordings).to_file(root / f"fsdd_recordings_{part}.jsonl.gz")
    SupervisionSet.from_segments(supervisions).to_file(root / f"fsdd_supervisions_{part}.jsonl.gz")


def test_lhotse_manifests_become_a_corpus(tmp_path: Path):
    src = tmp_path / "manifests"
    _manifests(src, "train-clean", ("george", "jackson", "nicolas"))
    _manifests(src, "test-clean", ("theo",), flac=True)
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out), "--valid-speakers", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["imported_from"] == "lhotse" and summary["splits"]["valid"]["carved_from"] == "train"
    assert summary["splits"]["test"]["speakers"] == 1 and summary["utterances"] == 24
    test = read_data_dir(out / "test")
    utt = test.utterances["theo-1-0-sup"]
    assert utt.text == "ONE" and utt.speaker == "theo" and utt.segment.recording == "theo-1-0"
    decoded = test.wav_path(utt)  # FLAC, decoded by lhotse into the corpus
    assert decoded.parent == (out / "audio").resolve()
    np.testing.assert_array_equal(read_wav(decoded)[0], read_wav(src / "audio" / "theo-1-0.wav")[0])
    train = read_data_dir(out / "train")
    assert all(Path(u.wav).parent == (src / "audio").resolve() for u in train.utterances.values())  # WAV in place
    assert main(["features", str(out)]) == 0  # the corpus is usable as any other


def test_a_supervision_without_speaker_is_named_or_skipped(tmp_path: Path, capsys):
    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"), drop_speaker="jackson-2-1")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("asrdist: error")]
    assert len(err) == 1 and "fsdd_supervisions_train.jsonl.gz: utterance jackson-2-1-sup: no speaker" in err[0]
    assert not out.exists()
    assert main(["corpus", "import-lhotse", str(src), str(out), "--skip-bad"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == 1 and summary["utterances"] == 11
