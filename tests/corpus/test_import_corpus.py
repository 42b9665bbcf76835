"""`asrdist corpus import-kaldi` builds a whole corpus: split names, valid carving, checks, and
Kaldi files that kaldiio and lhotse read from any working directory. Real FSDD recordings."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrdist.cli import main
from asrdist.io.audio import read_wav
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.fsdd_kaldi import FSDD, WORDS, make_kaldi_tree
from tests.support.paths import DEFAULT_RECIPE

pytestmark = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


def _one_error(capsys) -> str:
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("asrdist: error")]
    assert len(err) == 1, err
    return err[0]


def test_directory_of_kaldi_dirs_becomes_a_corpus_with_a_carved_valid_set(tmp_path: Path):
    src = make_kaldi_tree(tmp_path)
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--valid-speakers", "1"]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["phones.txt", "summary.json", "test", "train", "valid"]
    splits = {name: read_data_dir(out / name) for name in ("train", "valid", "test")}
    # valid: the training speaker with the smallest name hash, the same on every machine
    expected = min(("george", "jackson", "nicolas"), key=lambda s: hashlib.sha256(s.encode()).hexdigest())
    assert splits["valid"].speakers == [expected]
    assert sorted(splits["train"].speakers) == sorted({"george", "jackson", "nicolas"} - {expected})
    assert splits["test"].speakers == ["theo"]
    assert splits["valid"].utterances[f"{expected}-2-1"].text == "two"
    summary = json.loads((out / "summary.json").read_text())
    assert summary["splits"]["valid"]["carved_from"] == "train" and summary["utterances"] == 24
    # the same source gives the same corpus
    again = tmp_path / "again"
    assert main(["corpus", "import-kaldi", str(src), str(again), "--valid-speakers", "1"]) == 0
    for name in ("train/text", "valid/text", "test/utt2spk"):
        assert (out / name).read_text() == (again / name).read_text()


def test_written_kaldi_files_are_read_by_kaldiio_and_lhotse_from_another_directory(tmp_path: Path, monkeypatch):
    from lhotse.kaldi import load_kaldi_data_dir

    src = make_kaldi_tree(tmp_path, test=())
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src / "train"), str(out), "--split", "train"]) == 0
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    train = out / "train"
    for utt, (rate, samples) in kaldiio.load_scp(str(train / "wav.scp")).items():
        assert rate == 8000
        np.testing.assert_array_equal(samples, read_wav(read_data_dir(train).wav_path(
            read_data_dir(train).utterances[utt]))[0])
    recordings, supervisions, _ = load_kaldi_data_dir(train, sampling_rate=8000)
    assert len(recordings) == len(read_data_dir(train).utterances)
    first = recordings[0]
    assert first.load_audio().shape[1] == first.num_samples
    assert {s.text for s in supervisions} <= {"zero", "one", "two"}


def test_alignment_scp_is_absolute_and_old_relative_corpora_still_load(tmp_path: Path, monkeypatch):
    from tests.support.corpus_fixture import make_tone_corpus

    corpus = make_tone_corpus(tmp_path / "tones", utterances_per_speaker=2, speakers=3)
    scp = corpus / "train" / "alignment.scp"
    monkeypatch.chdir(tmp_path)
    loaded = kaldiio.load_scp(str(scp))
    ours = read_data_dir(corpus / "train")
    for utt, ali in loaded.items():
        np.testing.assert_array_equal(ali, ours.utterances[utt].alignment)
    # a corpus written before paths were absolute: relative to the split directory
    old = tmp_path / "old"
    shutil.copytree(corpus, old)
    rel = [f"{u} alignment.ark:{loc.rpartition(':')[2]}"
           for u, loc in (line.split() for line in (old / "train" / "alignment.scp").read_text().splitlines())]
    (old / "train" / "alignment.scp").write_text("\n".join(rel) + "\n")
    (corpus / "train" / "alignment.ark").unlink()  # nothing may still point at the first copy
    np.testing.assert_array_equal(read_data_dir(old / "train").utterances["spk2-000"].alignment,
                                  ours.utterances["spk2-000"].alignment)


def test_kaldi_split_names_and_explicit_choice(tmp_path: Path, capsys):
    src = make_kaldi_tree(tmp_path, train=("george", "jackson"), test=("theo",), dev=("nicolas",),
                          names=("train_si284", "test_eval92", "dev_clean"))
    shutil.copytree(src / "test_eval92", src / "test_dev93")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out)]) != 0
    err = _one_error(capsys)
    assert "test_dev93 and test_eval92" in err and "--split test=NAME" in err and not out.exists()
    assert main(["corpus", "import-kaldi", str(src), str(out), "--split", "test=test_eval92"]) == 0
    # the data directory left out is named, not dropped without a word
    assert (f"asrdist: note: {src}: test_dev93 not imported (no split took it; choose with --split SPLIT=NAME, "
            "SPLIT one of train, valid, test)") in capsys.readouterr().err.splitlines()
    summary = json.loads((out / "summary.json").read_text())
    assert summary["splits"]["valid"]["source"].endswith("dev_clean")  # a dev set: nothing carved
    assert "carved_from" not in summary["splits"]["valid"]
    assert summary["splits"]["test"]["source"].endswith("test_eval92")


@pytest.mark.parametrize("case,args,message", [
    ("no-train", [], "no training split"),
    ("dev-and-carve", ["--valid-speakers", "1"], "already has a valid split"),
    ("one-speaker", [], "cannot carve a valid set of 1 speaker(s) off a training set of 1"),
    ("too-many", ["--valid-speakers", "3"], "cannot carve a valid set of 3 speaker(s)"),
    ("bare-split", ["--split", "train"], "holds no wav.scp"),
    ("lost-wav-scp", [], "kaldi/test/wav.scp: missing (")])
def test_missing_splits_are_found_before_anything_is_written(tmp_path: Path, capsys, case, args, message):
    if case == "no-train":
        src = make_kaldi_tree(tmp_path, train=(), test=("theo",), dev=("george",))
    elif case == "dev-and-carve":
        src = make_kaldi_tree(tmp_path, train=("jackson",), dev=("george",))
    elif case == "one-speaker":
        src = make_kaldi_tree(tmp_path, train=("jackson",))
    else:
        src = make_kaldi_tree(tmp_path)
        if case == "lost-wav-scp":  # a test directory with its text and utt2spk but no audio list
            (src / "test" / "wav.scp").unlink()
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), *args]) != 0
    assert message in _one_error(capsys)
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".corpus")]


def test_training_checks_its_splits_up_front(tmp_path: Path, capsys):
    src = make_kaldi_tree(tmp_path, test=())
    recipe = DEFAULT_RECIPE
    split_only = tmp_path / "split"
    assert main(["corpus", "import-kaldi", str(src / "train"), str(split_only)]) == 0
    capsys.readouterr()
    assert main(["train", str(recipe), "--data", str(split_only), "--out", str(tmp_path / "run")]) != 0
    assert "one split directory" in _one_error(capsys) and not (tmp_path / "run").exists()
    no_valid = tmp_path / "no_valid"
    (no_valid / "train").mkdir(parents=True)
    for name in ("wav.scp", "text", "utt2spk"):
        shutil.copy(split_only / name, no_valid / "train" / name)
    assert main(["train", str(recipe), "--data", str(no_valid), "--out", str(tmp_path / "run")]) != 0
    err = _one_error(capsys)
    assert "no valid/ split" in err and "--valid-speakers" in err and not (tmp_path / "run").exists()


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_overwrite_never_deletes_the_source(tmp_path: Path, capsys):
    """`import-kaldi par/train par --split train --overwrite` and the like: one error, source intact."""
    src = make_kaldi_tree(tmp_path)
    fsdd = tmp_path / "fsdd"
    (fsdd / "recordings").mkdir(parents=True)
    for digit in (0, 1):
        for spk in ("george", "jackson"):
            for take in range(6):
                shutil.copy(FSDD / f"{digit}_{spk}_{take}.wav", fsdd / "recordings")
    before = _tree(tmp_path)
    for args in (["import-kaldi", src / "train", src, "--split", "train"],
                 ["import-kaldi", src / "train", src / "train", "--split", "train"],
                 ["import-kaldi", src, src], ["import-kaldi", src, tmp_path],
                 ["fsdd", fsdd, "--source", fsdd], ["fsdd", tmp_path, "--source", fsdd],
                 ["fsdd", fsdd / "recordings", "--source", fsdd]):
        assert main(["corpus", *map(str, args), "--overwrite"]) != 0
        assert "output directory" in _one_error(capsys), args
        assert _tree(tmp_path) == before, args


def test_empty_transcripts_are_counted_in_the_corpus_summary(tmp_path: Path):
    src = make_kaldi_tree(tmp_path)
    text = src / "train" / "text"
    text.write_text(text.read_text().replace("george-1-0 one", "george-1-0"))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--valid-speakers", "1"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["empty_transcripts"] == 1 and summary["utterances"] == 24


def test_audio_at_other_rates_is_resampled_on_request_and_a_chosen_channel_stored_as_mono(tmp_path: Path, capsys):
    from asrdist.io.audio import resample, write_wav
    from asrdist.features.extract import extract_features

    src = make_kaldi_tree(tmp_path)
    audio = tmp_path / "audio"
    originals = {p.stem: read_wav(p) for p in audio.iterdir()}
    for stem, (samples, rate) in originals.items():
        if stem.startswith("george-"):  # george recorded at 16 kHz, the others at 8 kHz
            write_wav(audio / f"{stem}.wav", resample(samples, rate, 16000), 16000)
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--valid-speakers", "1"]) != 0
    error = _one_error(capsys)
    assert "sample rate 16000 Hz, expected 8000 Hz (the rate of 12 of 18 recordings)" in error
    assert "--sample-rate" in error and not out.exists()
    assert main(["corpus", "import-kaldi", str(src), str(out), "--valid-speakers", "1", "--sample-rate", "8000"]) == 0
    assert json.loads((out / "summary.json").read_text())["sample_rate"] == 8000
    for name in ("train", "valid", "test"):
        for utt in read_data_dir(out / name).utterances.values():
            samples, rate = read_wav(utt.wav)
            assert rate == 8000 and (Path(utt.wav).parent == out.resolve() / "audio") == utt.speaker.startswith("george")
            if utt.speaker == "george":  # a resampled copy of the 16 kHz file
                expected = resample(read_wav(audio / f"{utt.utt_id}.wav")[0], 16000, 8000)
                np.testing.assert_array_equal(samples, expected)
            else:  # the original, referenced in place
                assert Path(utt.wav) == (audio / f"{utt.utt_id}.wav").resolve()

    # one recording in channel 1 of a stereo file: taken at import, stored as mono, so the corpus
    # needs no --channel later (features extract without one)
    stereo_src = make_kaldi_tree(tmp_path / "stereo")
    samples, rate = originals["theo-0-0"]
    import soundfile as sf
    sf.write(tmp_path / "stereo" / "audio" / "theo-0-0.wav", np.stack([np.zeros_like(samples), samples], 1), rate,
             subtype="PCM_16")
    stereo = tmp_path / "stereo-corpus"
    assert main(["corpus", "import-kaldi", str(stereo_src), str(stereo), "--valid-speakers", "1"]) != 0
    assert "has 2 channels; pick one with --channel K" in _one_error(capsys)
    assert main(["corpus", "import-kaldi", str(stereo_src), str(stereo), "--valid-speakers", "1",
                 "--channel", "1"]) == 0
    utt = read_data_dir(stereo / "test").utterances["theo-0-0"]
    assert Path(utt.wav).parent == stereo.resolve() / "audio"
    np.testing.assert_array_equal(read_wav(utt.wav)[0], samples)
    extract_features(stereo, jobs=1, progress=False)


def test_splits_that_share_utterances_or_speakers_with_train_are_noted(tmp_path: Path, capsys):
    """Kaldi splits are meant to be by speaker: a test set of training speakers, or of training
    utterances, imports (a user may want it) with a note saying what its figures are."""
    src = make_kaldi_tree(tmp_path, train=("george", "jackson", "nicolas"), test=("george",), dev=("jackson",))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out)]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "training" in line or "seen" in line]
    assert notes == [f"asrdist: note: {out}: 6 valid utterance(s) are training utterances (the same id or audio): "
                     f"their figures are on training data",
                     f"asrdist: note: {out}: 6 test utterance(s) are training utterances (the same id or audio): "
                     f"their figures are on training data"], notes
    # the same speakers, other recordings: seen speakers
    src = make_kaldi_tree(tmp_path / "takes", train=("george", "jackson"), test=())
    test = src / "test"
    test.mkdir()
    from tests.support.fsdd_kaldi import copy_recordings
    rows = copy_recordings(tmp_path / "takes" / "audio", ("george",), takes=(5, 6))
    (test / "wav.scp").write_text("".join(f"{u} {p}\n" for u, _, _, p in rows))
    (test / "text").write_text("".join(f"{u} {WORDS[g]}\n" for u, _, g, _ in rows))
    (test / "utt2spk").write_text("".join(f"{u} {s}\n" for u, s, _, _ in rows))
    out = tmp_path / "takes-corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--valid-speakers", "1"]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "seen" in line or "training" in line]
    valid = read_data_dir(out / "valid").speakers
    assert valid in (["george"], ["jackson"])
    assert notes == ([f"asrdist: note: {out}: 1 test speaker(s) also speak in train (george): its figures are on "
                      f"seen speakers"] if valid == ["jackson"] else []), notes


def test_one_data_directory_with_valid_speakers_is_the_train_split_of_a_corpus(tmp_path: Path, capsys):
    """`import-kaldi DATA/train OUT --valid-speakers N --lexicon L`, as a user with one Kaldi
    directory of recordings types it (docs/an4.md): a corpus to train on, valid by whole speakers."""
    src = make_kaldi_tree(tmp_path, test=()) / "train"
    lexicon = tmp_path / "digits.dic"
    lexicon.write_text("ZERO Z IH R OW\nONE W AH N\nTWO T UW\n", encoding="utf-8")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--valid-speakers", "1", "--lexicon", str(lexicon)]) == 0
    assert sorted(p.name for p in out.iterdir()) == ["lexicon.txt", "phones.txt", "summary.json", "train", "valid"]
    train, valid = read_data_dir(out / "train"), read_data_dir(out / "valid")
    assert len(valid.speakers) == 1 and not set(valid.speakers) & set(train.speakers)
    assert sorted(train.speakers + valid.speakers) == ["george", "jackson", "nicolas"]
    assert (out / "lexicon.txt").read_text() == "one w ah n\ntwo t uw\nzero z ih r ow\n"
    summary = json.loads(capsys.readouterr().out)
    assert summary["splits"]["valid"]["speaker_list"] == valid.speakers
    assert summary["lexicon"]["missing_words"] == []
