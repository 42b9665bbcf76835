"""`asrdist corpus import-lhotse`: manifests written by lhotse, read by lhotse; WAV and FLAC files
referenced in place, other audio (speed-perturbed recordings) decoded; bad supervisions named by
manifest. Real FSDD recordings."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.io.audio import read_wav
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.fsdd_kaldi import FSDD, WORDS, copy_recordings

pytestmark = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


def _manifests(root: Path, part: str, speakers, flac: bool = False, drop_speaker: str | None = None,
               speed: float | None = None, mp3: bool = False, rate: int | None = None) -> None:
    import soundfile
    from lhotse import Recording, RecordingSet, SupervisionSegment, SupervisionSet

    recordings, supervisions = [], []
    for utt, spk, digit, path in copy_recordings(root / "audio", speakers):
        if rate is not None:  # recorded at another rate
            from asrdist.io.audio import resample, write_wav

            samples, own = read_wav(path)
            write_wav(path, resample(samples, own, rate), rate)
        if flac:
            samples, rate = read_wav(path)
            path = path.with_suffix(".flac")
            soundfile.write(path, samples, rate, subtype="PCM_16")
        if mp3:  # as Common Voice ships its clips
            samples, rate = read_wav(path)
            path = path.with_suffix(".mp3")
            soundfile.write(path, samples, rate, format="MP3")
        rec = Recording.from_file(path, recording_id=utt)
        if speed is not None:  # lhotse's transform: the file is not what lhotse plays
            rec = rec.perturb_speed(speed, affix_id=False)
        recordings.append(rec)
        supervisions.append(SupervisionSegment(id=f"{utt}-sup", recording_id=utt, start=0.0, duration=rec.duration,
                                               text=WORDS[digit].upper(), speaker=None if utt == drop_speaker else spk))
    RecordingSet.from_recordings(recordings).to_file(root / f"fsdd_recordings_{part}.jsonl.gz")
    SupervisionSet.from_segments(supervisions).to_file(root / f"fsdd_supervisions_{part}.jsonl.gz")


def test_lhotse_manifests_become_a_corpus(tmp_path: Path):
    src = tmp_path / "manifests"
    _manifests(src, "train-clean", ("george", "jackson", "nicolas"))
    _manifests(src, "test-clean", ("theo",), flac=True)
    _manifests(src, "dev-clean", ("yweweler",), speed=1.25)
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["imported_from"] == "lhotse" and "carved_from" not in summary["splits"]["valid"]
    assert summary["splits"]["test"]["speakers"] == 1 and summary["utterances"] == 30
    test = read_data_dir(out / "test")
    utt = test.utterances["theo-1-0-sup"]
    assert utt.text == "ONE" and utt.speaker == "theo" and utt.segment.recording == "theo-1-0"
    flac = test.wav_path(utt)  # FLAC, read in place
    assert flac == (src / "audio" / "theo-1-0.flac").resolve()
    np.testing.assert_array_equal(read_wav(flac)[0], read_wav(src / "audio" / "theo-1-0.wav")[0])
    valid = read_data_dir(out / "valid")
    fast = valid.utterances["yweweler-1-0-sup"]
    decoded = valid.wav_path(fast)  # speed-perturbed by lhotse: decoded into the corpus
    assert decoded.parent == (out / "audio").resolve()
    original = len(read_wav(src / "audio" / "yweweler-1-0.wav")[0])
    assert abs(len(read_wav(decoded)[0]) - original / 1.25) <= 2
    train = read_data_dir(out / "train")
    assert all(Path(u.wav).parent == (src / "audio").resolve() for u in train.utterances.values())  # WAV in place
    assert main(["features", str(out)]) == 0  # the corpus is usable as any other


def test_mp3_recordings_are_decoded_by_lhotse_to_their_manifest_length(tmp_path: Path):
    """Common Voice ships MP3: lhotse decodes each clip into the corpus (not read in place, where
    another decoder could disagree about its length), and the corpus trains as any other."""
    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"), mp3=True)
    _manifests(src, "test", ("theo",), mp3=True)
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) == 0
    from lhotse import load_manifest

    recordings = load_manifest(src / "fsdd_recordings_test.jsonl.gz")
    test = read_data_dir(out / "test")
    for utt in test.utterances.values():
        path = test.wav_path(utt)
        assert path.parent == (out / "audio").resolve() and path.suffix == ".wav"
        assert len(read_wav(path)[0]) == recordings[utt.segment.recording].num_samples
    assert main(["features", str(out)]) == 0


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


def _rewrite(path: Path, change) -> None:
    """Edit a manifest's entries as JSON (lhotse itself refuses to build some of the bad ones)."""
    import gzip

    entries = [json.loads(line) for line in gzip.open(path, "rt")]
    change(entries)
    with gzip.open(path, "wt") as f:
        f.writelines(json.dumps(e) + "\n" for e in entries)


def _errors(capsys) -> list[str]:
    return [line for line in capsys.readouterr().err.splitlines() if line.strip()]


@pytest.mark.parametrize("duration", [float("nan"), float("inf"), -0.5])
def test_a_supervision_with_bad_times_is_named_or_skipped(tmp_path: Path, capsys, duration: float):
    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    _rewrite(src / "fsdd_supervisions_train.jsonl.gz", lambda entries: entries[0].update(duration=duration))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0
    err = _errors(capsys)
    assert len(err) == 1 and "fsdd_supervisions_train.jsonl.gz: utterance george-0-0-sup: bad times" in err[0], err
    assert not out.exists()
    assert main(["corpus", "import-lhotse", str(src), str(out), "--skip-bad"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == 1 and summary["utterances"] == 11 and "bad times" in summary["skipped_reasons"][0]


def test_a_broken_line_or_an_unknown_recording_is_named_where_it_is(tmp_path: Path, capsys):
    import gzip

    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    sup = src / "fsdd_supervisions_train.jsonl.gz"
    _rewrite(sup, lambda entries: entries[3].update(recording_id="nosuch"))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0  # the supervision names it, not the recordings
    assert _errors(capsys) == [f"asrdist: error: {sup}: utterance george-1-1-sup: recording 'nosuch' not in the "
                               f"recordings manifest {src / 'fsdd_recordings_train.jsonl.gz'}"]
    lines = gzip.open(sup, "rt").read().splitlines()
    with gzip.open(sup, "wt") as f:
        f.write("\n".join(lines[:6] + ['{"id": "broken", "recording_id": '] + lines[7:]) + "\n")
    assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0  # the file's own line number
    err = _errors(capsys)
    assert len(err) == 1 and f"{sup}:7: cannot read lhotse supervisions manifest: not a JSON line" in err[0], err
    assert not out.exists()


def test_swapped_or_empty_manifests_are_named(tmp_path: Path, capsys):
    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    rec = (src / "fsdd_recordings_train.jsonl.gz").read_bytes()
    sup = (src / "fsdd_supervisions_train.jsonl.gz").read_bytes()
    cases = [({"recordings_train.jsonl.gz": rec, "supervisions_train.jsonl.gz": rec},
              "fsdd_supervisions_train.jsonl.gz: not a supervisions manifest: it holds Recording entries"),
             ({"recordings_train.jsonl.gz": sup, "supervisions_train.jsonl.gz": sup},
              "fsdd_recordings_train.jsonl.gz: not a recordings manifest: it holds SupervisionSegment entries"),
             ({"recordings_train.jsonl": b"", "supervisions_train.jsonl.gz": sup},
              "fsdd_recordings_train.jsonl: holds no recordings"),
             ({"recordings_train.jsonl.gz": rec, "supervisions_train.jsonl": b""},
              "fsdd_supervisions_train.jsonl: holds no supervisions")]
    out = tmp_path / "corpus"
    for files, message in cases:
        for old in src.glob("fsdd_*"):
            old.unlink()
        for name, data in files.items():
            (src / f"fsdd_{name}").write_bytes(data)
        assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0
        err = _errors(capsys)
        assert len(err) == 1 and message in err[0], (message, err)
        assert not out.exists()


def test_recording_ids_that_are_no_file_names_are_refused(tmp_path: Path, capsys):
    """A decoded recording is stored as OUT/audio/ID.wav: '../x' would land outside OUT."""
    for bad_id in ("../../escaped", "sub/dir/g0"):
        root = tmp_path / bad_id.replace("/", "_").strip("._")
        src = root / "manifests"
        _manifests(src, "train", ("george", "jackson"), speed=1.1)  # speed-perturbed: decoded into the corpus
        _rewrite(src / "fsdd_recordings_train.jsonl.gz", lambda entries: entries[0].update(id=bad_id))
        _rewrite(src / "fsdd_supervisions_train.jsonl.gz", lambda entries: entries[0].update(recording_id=bad_id))
        out = root / "corpus"
        assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0
        err = _errors(capsys)
        assert len(err) == 1 and f"recording id '{bad_id}' cannot be a file name" in err[0], err
        assert "fsdd_recordings_train.jsonl.gz" in err[0] and not out.exists()
        assert main(["corpus", "import-lhotse", str(src), str(out), "--skip-bad"]) == 0
        assert "Exception ignored" not in capsys.readouterr().err
        assert json.loads((out / "summary.json").read_text())["skipped"] == 1
    assert not list(tmp_path.rglob("escaped.wav")) and not list(tmp_path.parent.glob("escaped.wav"))


def test_an_output_that_is_or_holds_the_manifests_is_refused(tmp_path: Path, capsys):
    src = tmp_path / "data" / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    before = sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*"))
    for out in (src, src.parent):
        assert main(["corpus", "import-lhotse", str(src), str(out), "--overwrite"]) != 0
        err = _errors(capsys)
        assert len(err) == 1 and "the input" in err[0] and "output directory" in err[0], err
    assert sorted(p.relative_to(tmp_path) for p in tmp_path.rglob("*")) == before


def test_empty_transcripts_are_kept_and_counted(tmp_path: Path):
    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    _rewrite(src / "fsdd_supervisions_train.jsonl.gz", lambda entries: entries[0].update(text=""))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["utterances"] == 12 and summary["empty_transcripts"] == 1


def test_other_rates_are_resampled_on_request_and_overlong_supervisions_cut(tmp_path: Path, capsys):
    """A 16 kHz test part in an 8 kHz corpus: refused, or resampled into the corpus with
    --sample-rate; a supervision ending 50 ms after its recording (rounded times) is cut there."""
    from asrdist.io.audio import resample

    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    _manifests(src, "test", ("theo",), rate=16000)
    _rewrite(src / "fsdd_supervisions_train.jsonl.gz", lambda entries: entries[0].update(
        duration=entries[0]["duration"] + 0.05))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0
    err = _errors(capsys)
    assert "splits have different sample rates (train 8000 Hz, test 16000 Hz)" in err[-1], err
    assert "--sample-rate" in err[-1] and not out.exists()
    assert main(["corpus", "import-lhotse", str(src), str(out), "--sample-rate", "8000"]) == 0
    err = _errors(capsys)
    assert [line for line in err if "after their recording" in line] == [
        f"asrdist: note: {src / 'fsdd_supervisions_train.jsonl.gz'}: 1 segment(s) end 10 ms to 0.5 s after their "
        f"recording; cut at its end, as Kaldi's extract-segments does"], err
    test = read_data_dir(out / "test")
    for utt in test.utterances.values():
        path = test.wav_path(utt)
        assert path.parent == (out / "audio").resolve()
        original = read_wav(src / "audio" / f"{utt.segment.recording}.wav")
        assert original[1] == 16000
        np.testing.assert_array_equal(read_wav(path)[0], resample(original[0], 16000, 8000))
    first = next(d.utterances["george-0-0-sup"] for d in (read_data_dir(out / "train"), read_data_dir(out / "valid"))
                 if "george-0-0-sup" in d.utterances)
    assert first.segment.end == round(len(read_wav(src / "audio" / "george-0-0.wav")[0]) / 8000, 3)


def test_a_supervision_on_a_channel_its_recording_lacks_is_named(tmp_path: Path, capsys):
    src = tmp_path / "manifests"
    _manifests(src, "train", ("george", "jackson"))
    _rewrite(src / "fsdd_supervisions_train.jsonl.gz", lambda entries: entries[1].update(channel=1))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-lhotse", str(src), str(out)]) != 0
    err = _errors(capsys)
    assert len(err) == 1 and ("fsdd_supervisions_train.jsonl.gz: utterance george-0-1-sup: supervision on channel 1, "
                              "recording 'george-0-1' has channels [0]") in err[0], err
    assert not out.exists()
