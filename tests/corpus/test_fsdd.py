"""FSDD corpus: splits, layout, resampling, bad recordings; on a small copy of the real data."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.io.audio import num_frames, read_wav
from asrdist.corpus.fsdd import DIGIT_WORDS, build_fsdd
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.corpus.phones import PhoneTable
from tests.support.paths import FSDD

# ../shared beside the checkout, as in CI and in the project layout
SPEAKERS = ("george", "jackson")
DIGITS = (0, 7)
TAKES = range(12)

pytestmark = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


@pytest.fixture
def source(tmp_path: Path) -> Path:
    """2 speakers x 2 digits x 12 takes of the real recordings."""
    src = tmp_path / "fsdd" / "recordings"
    src.mkdir(parents=True)
    for spk in SPEAKERS:
        for digit in DIGITS:
            for take in TAKES:
                name = f"{digit}_{spk}_{take}.wav"
                shutil.copy(FSDD / name, src / name)
    (src.parent / "README.md").write_text("not a recording\n")
    return src.parent


def test_speaker_split_layout_and_content(source: Path, tmp_path: Path):
    out = tmp_path / "corpus"
    assert main(["corpus", "fsdd", str(out), "--source", str(source)]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert PhoneTable.read(out / "phones.txt").symbols == PhoneTable().symbols
    splits = {name: read_data_dir(out / name) for name in ("train", "valid", "test")}
    # Default test speaker = last by name; whole speaker held out.
    assert summary["test_speaker"] == "jackson"
    assert splits["test"].speakers == ["jackson"]
    assert splits["train"].speakers == splits["valid"].speakers == ["george"]
    assert len(splits["test"].utterances) == len(DIGITS) * len(TAKES)
    for name, data in splits.items():
        assert summary["splits"][name]["utterances"] == len(data.utterances)
        for utt in data.utterances.values():
            spk, digit, take = utt.utt_id.split("-")
            assert utt.text == DIGIT_WORDS[int(digit)]
            assert Path(utt.wav).is_absolute() and Path(utt.wav).is_file()  # readable from any cwd
            if name == "valid":
                assert 5 <= int(take) <= 9
            if name == "train":
                assert not 5 <= int(take) <= 9
            copied, rate = read_wav(data.wav_path(utt))
            original, _ = read_wav(source / "recordings" / f"{digit}_{spk}_{int(take)}.wav")
            assert rate == 8000
            np.testing.assert_array_equal(copied, original)
            assert utt.duration == pytest.approx(len(original) / 8000, abs=1e-3)
            assert utt.alignment is None
    assert summary["utterances"] == 2 * len(DIGITS) * len(TAKES)
    assert summary["speakers"] == 2 and summary["skipped"] == 0
    assert summary["hours"] == pytest.approx(sum(d.hours for d in splits.values()), abs=1e-5)


def test_official_split_and_resampling(source: Path, tmp_path: Path):
    out = tmp_path / "corpus"
    summary = build_fsdd(out, source=source, split="official", sample_rate=16000, progress=False)
    test = read_data_dir(out / "test")
    assert sorted({int(u.split("-")[2]) for u in test.utterances}) == [0, 1, 2, 3, 4]
    assert test.speakers == list(SPEAKERS)
    assert summary["sample_rate"] == 16000
    utt = test.utterances[test.utt_ids[0]]
    samples, rate = read_wav(test.wav_path(utt))
    original, _ = read_wav(source / "recordings" / "0_george_0.wav")
    assert rate == 16000 and len(samples) == 2 * len(original)
    train = read_data_dir(out / "train")
    assert sorted({int(u.split("-")[2]) for u in train.utterances}) == [10, 11]


def test_any_checkout_more_speakers_and_test_speaker(source: Path, tmp_path: Path):
    recordings = source / "recordings"
    for take in TAKES:  # a third speaker, as a newer checkout would have
        shutil.copy(recordings / "0_george_0.wav", recordings / f"0_zoe_{take}.wav")
    summary = build_fsdd(tmp_path / "c1", source=source, progress=False)
    assert summary["test_speaker"] == "zoe" and summary["speakers"] == 3
    summary = build_fsdd(tmp_path / "c2", source=source, test_speaker="george", progress=False)
    assert read_data_dir(tmp_path / "c2" / "test").speakers == ["george"]
    assert read_data_dir(tmp_path / "c2" / "train").speakers == ["jackson", "zoe"]


def test_unknown_test_speaker_is_an_error(source: Path, tmp_path: Path, capsys):
    out = tmp_path / "corpus"
    assert main(["corpus", "fsdd", str(out), "--source", str(source), "--test-speaker", "nobody"]) != 0
    err = capsys.readouterr().err.strip()
    assert "nobody" in err and len(err.splitlines()) == 1
    assert not out.exists()


def test_bad_recording_fails_cleanly_or_is_skipped(source: Path, tmp_path: Path, capsys):
    bad = source / "recordings" / "7_jackson_3.wav"
    bad.write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk")
    out = tmp_path / "corpus"
    assert main(["corpus", "fsdd", str(out), "--source", str(source)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "7_jackson_3.wav" in err[0] and "corrupt" in err[0]
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".corpus")]
    assert main(["corpus", "fsdd", str(out), "--source", str(source), "--skip-bad"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == 1
    assert "jackson-7-003" not in read_data_dir(out / "test").utterances


def test_other_audio_suffixes_channels_and_names_in_a_users_recordings(source: Path, tmp_path: Path, capsys):
    """A user's own FSDD-style folder: FLAC and stereo takes are read (stereo with --channel), audio
    not named {digit}_{speaker}_{take} is named in one note, two files of one take are refused, and
    too few takes for FSDD's valid takes (5-9) says so."""
    soundfile = pytest.importorskip("soundfile")
    recordings = source / "recordings"
    samples, rate = read_wav(recordings / "7_jackson_3.wav")
    (recordings / "7_jackson_3.wav").unlink()
    soundfile.write(recordings / "7_jackson_3.flac", samples, rate, subtype="PCM_16")
    (recordings / "0_george_4.wav").unlink()
    soundfile.write(recordings / "0_george_4.wav", np.stack([samples, -samples], axis=1), rate, subtype="PCM_16")
    shutil.copy(recordings / "0_george_0.wav", recordings / "george says zero.wav")
    out = tmp_path / "corpus"
    assert main(["corpus", "fsdd", str(out), "--source", str(source)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert "1 audio file(s) not named {digit}_{speaker}_{take}, left out: george says zero.wav" in err[0]
    assert len(err) == 2 and "0_george_4.wav has 2 channels; pick one with --channel K" in err[1]
    assert main(["corpus", "fsdd", str(out), "--source", str(source), "--channel", "1"]) == 0
    test = read_data_dir(out / "test")
    np.testing.assert_array_equal(read_wav(test.wav_path(test.utterances["jackson-7-003"]))[0], samples)
    train = read_data_dir(out / "train")
    np.testing.assert_array_equal(read_wav(train.wav_path(train.utterances["george-0-004"]))[0], -samples)
    shutil.copy(recordings / "0_george_0.wav", recordings / "0_george_0.FLAC")
    assert main(["corpus", "fsdd", str(tmp_path / "dup"), "--source", str(source), "--channel", "1"]) != 0
    assert "0_george_0.FLAC and 0_george_0.wav are both digit 0, speaker george, take 0; keep one" \
        in capsys.readouterr().err
    few = tmp_path / "few" / "recordings"
    few.mkdir(parents=True)
    for name in ("0_ann_0.wav", "0_ann_1.wav", "0_bob_0.wav"):
        shutil.copy(recordings / "0_jackson_0.wav", few / name)
    assert main(["corpus", "fsdd", str(tmp_path / "c"), "--source", str(few.parent)]) != 0
    assert "split 'valid' would be empty (--split speaker: no take 5-9 of a training speaker" in capsys.readouterr().err


def test_fsdd_features_match_the_frame_rule(source: Path, tmp_path: Path):
    from asrdist.features.extract import extract_features
    from asrdist.features.store import FeatureStore

    out = tmp_path / "corpus"
    build_fsdd(out, source=source, progress=False)
    summary = extract_features(out, jobs=1, progress=False)
    assert summary["sample_rate"] == 8000
    test = read_data_dir(out / "test")
    store = FeatureStore(out / "test")
    assert store.utt_ids == test.utt_ids
    for utt in test.utterances.values():
        samples, rate = read_wav(test.wav_path(utt))
        assert store.num_frames(utt.utt_id) == num_frames(len(samples), rate)


def test_measure_speed_reports_its_figures(source: Path):
    from asrdist.bench.data import measure_speed

    result = measure_speed(source, max_files=5, repeats=1)
    assert result["files"] == 5 and result["sample_rates"] == [8000]
    assert result["fbank_x_realtime"] > 0 and result["audio_seconds"] > 0


def test_default_source_is_found_beside_the_working_directory(monkeypatch):
    from asrdist.corpus.fsdd import resolve_source

    monkeypatch.chdir(FSDD.parents[2])  # inside shared/ itself: the checkout's sibling is still found first
    assert resolve_source(None).resolve() == FSDD.resolve()
    assert resolve_source(FSDD.parent) == FSDD and resolve_source(FSDD) == FSDD
