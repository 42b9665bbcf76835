"""The feature store against the split it was made from, and against the model that reads it.

Defects (a tester's report): a store extracted before an utterance was added to its split was
used as it was (`asrdist eval` scored 20 of 21 utterances); `asrdist eval` on 16 kHz audio for a
model trained at 8 kHz computed 16 kHz filterbanks silently (`asrdist decode` resamples); `asrdist
train` re-extracting with the recipe's settings dropped the channel `asrdist features --channel`
had recorded (and its hint named a flag `train` lacks); a shard overwritten with NaN was scored;
`asrdist features --jobs -5` was accepted.
"""
from __future__ import annotations

import json
import shutil
import wave
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.config import load_config
from asrdist.io.audio import read_wav, resample, write_wav
from asrdist.io.kaldi_dir import read_data_dir, write_data_dir
from asrdist.errors import ConfigError, DataError
from asrdist.features.extract import extract_features
from asrdist.features.store import FeatureStore
from asrdist.run.prepare import ensure_features, feature_mismatch
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.paths import ROOT

RECIPE = str(ROOT / "configs/default.yaml")
TINY = ["data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1", "optim.warmup_steps=0",
        "optim.anneal_after_epoch=null", "train.log_every=5", "train.threads=1", "--no-progress"]


def _error_line(capsys) -> str:
    lines = [line.split("\r")[-1] for line in capsys.readouterr().err.splitlines()]
    lines = [line for line in lines if line.strip() and "%|" not in line]
    assert len(lines) == 1 and lines[0].startswith("asrdist: error: "), lines
    return lines[0]


def _resampled_copy(src: Path, dst: Path, rate: int) -> Path:
    """Corpus `src` with every recording resampled to `rate` (same utterances and alignments)."""
    dst.mkdir(parents=True)
    shutil.copy(src / "phones.txt", dst / "phones.txt")
    for split in ("train", "valid", "test"):
        data = read_data_dir(src / split)
        (dst / split / "wav").mkdir(parents=True)
        utts = []
        for utt_id in data.utt_ids:
            u = data.utterances[utt_id]
            samples, have = read_wav(data.wav_path(u))
            write_wav(dst / split / "wav" / f"{utt_id}.wav", resample(samples, have, rate), rate)
            utts.append(type(u)(utt_id, u.speaker, f"wav/{utt_id}.wav", u.text, u.duration, u.alignment))
        write_data_dir(dst / split, utts)
    return dst


def _own_copy(src: Path, dst: Path) -> Path:
    """Copy corpus `src` with its tables pointed at the copy's audio, which a test may then change
    (a plain copy's tables name the fixture's audio by absolute path)."""
    shutil.copytree(src, dst)
    for table in list(dst.rglob("wav.scp")) + list(dst.rglob("alignment.scp")):
        table.write_text(table.read_text().replace(str(src), str(dst)))
    return dst


def _add_copy(split: Path, utt_id: str, new_id: str) -> None:
    """Add utterance `new_id` to `split`: a copy of `utt_id`'s audio, tables and alignment."""
    wav = split / "wav" / f"{new_id}.wav"
    shutil.copy(split / "wav" / f"{utt_id}.wav", wav)
    for table in ("wav.scp", "text", "utt2spk", "utt2dur", "alignment.scp"):
        path = split / table
        if not path.is_file():
            continue
        lines = path.read_text().splitlines()
        line = next(x for x in lines if x.split()[0] == utt_id).split(maxsplit=1)[1]
        if table == "wav.scp":
            line = str(wav.resolve())
        path.write_text("\n".join(sorted(lines + [f"{new_id} {line}"])) + "\n")
    speaker = next(x.split()[1] for x in (split / "utt2spk").read_text().splitlines() if x.split()[0] == utt_id)
    lines = [x + f" {new_id}" if x.split()[0] == speaker else x for x in (split / "spk2utt").read_text().splitlines()]
    (split / "spk2utt").write_text("\n".join(lines) + "\n")


def _eval(run: Path, data: Path, out: Path) -> dict:
    assert main(["eval", str(run), "--data", str(data), "--out", str(out)]) == 0
    return json.loads(out.read_text())


@pytest.fixture(scope="module")
def corpus8k(tmp_path_factory) -> Path:
    """The tone corpus at 8 kHz, with features."""
    root = tmp_path_factory.mktemp("rate")
    tones = make_tone_corpus(root / "tones16", utterances_per_speaker=8, speakers=4)
    corpus = _resampled_copy(tones, root / "corpus8k", 8000)
    assert main(["features", str(corpus), "--jobs", "1"]) == 0
    return corpus


@pytest.fixture(scope="module")
def run8k(corpus8k, tmp_path_factory) -> Path:
    """A hybrid model trained on the 8 kHz corpus."""
    run = tmp_path_factory.mktemp("run8k") / "run"
    assert main(["train", RECIPE, *TINY, "--epochs", "3", "--data", str(corpus8k), "--out", str(run)]) == 0
    return run


# ------------------------------------------------------------------ a store older than its split

def test_eval_re_extracts_a_split_with_an_added_utterance(corpus8k, run8k, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus8k, corpus)
    before = _eval(run8k, corpus, tmp_path / "a.json")["utterances"]
    capsys.readouterr()
    _add_copy(corpus / "test", "spk0-000", "spk0-100")
    result = _eval(run8k, corpus, tmp_path / "b.json")
    out = capsys.readouterr().out
    assert result["utterances"] == before + 1
    assert "test: it lists 9 utterances, 8 when its features were extracted (spk0-100 has none)" in out
    assert "spk0-100" in FeatureStore(corpus / "test")
    _eval(run8k, corpus, tmp_path / "c.json")  # now fresh: left alone
    assert "extracting" not in capsys.readouterr().out


def test_a_store_without_a_source_record_is_compared_by_utterance_ids(corpus8k, tmp_path, capsys):
    """Stores of the previous version keep no `source`: they still load and stay in use while they
    cover the split, and are re-extracted when it lists utterances they lack."""
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus8k, corpus)
    cfg = load_config(RECIPE, [f"data.corpus={corpus}"])
    for split in ("train", "valid", "test"):
        meta_path = corpus / split / "feats" / "meta.json"
        meta = json.loads(meta_path.read_text())
        meta.pop("source", None)
        meta_path.write_text(json.dumps(meta))
    assert feature_mismatch(corpus / "train", cfg) is None
    _add_copy(corpus / "train", "spk2-000", "spk2-100")
    assert feature_mismatch(corpus / "train", cfg) == "1 utterance(s) of wav.scp have no features (e.g. spk2-100)"
    (corpus / "train" / "augmented" / "old").mkdir(parents=True)  # copies of the old features
    capsys.readouterr()
    ensure_features(corpus, cfg, progress=False)
    assert "train: 1 utterance(s) of wav.scp have no features" in capsys.readouterr().out
    assert len(FeatureStore(corpus / "train")) == 17 and "source" in FeatureStore(corpus / "train").meta
    assert not (corpus / "train" / "augmented").exists()


def test_changed_audio_or_speakers_make_the_store_stale(corpus8k, tmp_path):
    corpus = _own_copy(corpus8k, tmp_path / "corpus")
    cfg = load_config(RECIPE, [f"data.corpus={corpus}"])
    split = corpus / "valid"
    assert feature_mismatch(split, cfg) == "wav.scp, segments or utt2spk changed since its features were extracted"
    extract_features(corpus, jobs=1, overwrite=True, progress=False)
    assert feature_mismatch(split, cfg) is None
    wav = split / "wav" / "spk1-003.wav"
    samples, rate = read_wav(wav)
    write_wav(wav, samples[::-1], rate)  # other audio of the same size
    assert feature_mismatch(split, cfg) == ("audio files changed (size or modification time) since its features "
                                            "were extracted")
    extract_features(corpus, jobs=1, overwrite=True, progress=False)
    assert feature_mismatch(split, cfg) is None
    (split / "utt2spk").write_text((split / "utt2spk").read_text().replace("spk1-003 spk1", "spk1-003 spk9"))
    assert feature_mismatch(split, cfg) == "wav.scp, segments or utt2spk changed since its features were extracted"


def test_stale_imported_features_are_an_error(corpus8k, tmp_path):
    """Imported Kaldi features cannot be re-extracted as they were made: a split that outgrew them
    is one error naming it, not a run on the old utterances."""
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus8k, corpus)
    meta_path = corpus / "test" / "feats" / "meta.json"
    meta = json.loads(meta_path.read_text())
    meta.update(num_mel_bins=None, imported="kaldi feats.scp")
    meta.pop("source", None)
    meta_path.write_text(json.dumps(meta))
    cfg = load_config(RECIPE, [f"data.corpus={corpus}"])
    assert feature_mismatch(corpus / "test", cfg) is None
    _add_copy(corpus / "test", "spk0-000", "spk0-100")
    with pytest.raises(DataError, match=r"test: its imported features no longer fit the split \(1 utterance"):
        feature_mismatch(corpus / "test", cfg)


# ------------------------------------------------------------------ the model's sample rate

def test_eval_computes_features_at_the_models_rate(corpus8k, run8k, tmp_path, capsys):
    """16 kHz audio for an 8 kHz model is resampled to 8 kHz, as `asrdist decode` does: the same
    recordings at either rate give (nearly) the same features and the same hypotheses."""
    corpus16 = _resampled_copy(corpus8k, tmp_path / "corpus16k", 16000)
    assert main(["features", str(corpus16), "--jobs", "1"]) == 0
    capsys.readouterr()
    a = _eval(run8k, corpus8k, tmp_path / "eval8.json")
    b = _eval(run8k, corpus16, tmp_path / "eval16.json")
    assert "test: its features are of 16000 Hz audio, not 8000 Hz" in capsys.readouterr().out
    meta = FeatureStore(corpus16 / "test").meta
    assert (meta["sample_rate"], meta["audio_sample_rate"]) == (8000, 16000)
    native, resampled = FeatureStore(corpus8k / "test"), FeatureStore(corpus16 / "test")
    assert native.utt_ids == resampled.utt_ids
    for utt in native.utt_ids:
        assert np.abs(np.asarray(native[utt]) - np.asarray(resampled[utt])).mean() < 0.05, utt
    hyps = (tmp_path / "eval8.hyp.txt").read_text()
    assert hyps == (tmp_path / "eval16.hyp.txt").read_text()
    assert sum(len(line.split()) > 2 for line in hyps.splitlines()) >= 4  # phones recognized, not silence
    assert b["per"] == a["per"] and b["utterances"] == a["utterances"]
    # training on the 16 kHz corpus computes its features at its own rate again
    ensure_features(corpus16, load_config(RECIPE, [f"data.corpus={corpus16}"]), progress=False)
    assert "resampled to 8000 Hz, not 16000 Hz" in capsys.readouterr().out
    assert FeatureStore(corpus16 / "train").meta["sample_rate"] == 16000


# ------------------------------------------------------------------ the channel a corpus recorded

def _stereo(path: Path) -> None:
    """Make `path` a 2-channel WAV: channel 1 its audio, channel 0 noise."""
    samples, rate = read_wav(path)
    noise = np.random.default_rng(0).normal(0, 2000, len(samples)).astype("<i2")
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(np.stack([noise, samples.astype("<i2")], axis=1).tobytes())


def test_train_re_extracts_with_the_channel_the_corpus_recorded(corpus8k, tmp_path, capsys):
    corpus = _own_copy(corpus8k, tmp_path / "stereo")
    for split in ("train", "valid", "test"):
        shutil.rmtree(corpus / split / "feats")
        for wav in (corpus / split / "wav").glob("*.wav"):
            _stereo(wav)
    run = tmp_path / "run"
    argv = ["train", RECIPE, *TINY, "train.max_steps=2", "--data", str(corpus), "--out", str(run)]
    capsys.readouterr()
    assert main(argv) != 0
    line = _error_line(capsys)
    assert f"has 2 channels; pick one with `asrdist features {corpus} --channel K --overwrite`" in line
    assert not run.exists() and not (corpus / "train" / "feats").exists()
    # the command the error names, with other settings than the recipe's: train re-extracts them
    assert main(["features", str(corpus), "--channel", "1", "--num-mel-bins", "23", "--jobs", "1"]) == 0
    capsys.readouterr()
    assert main(argv) == 0
    assert "channel 1 (train: its features have num_mel_bins=23" in capsys.readouterr().out
    store = FeatureStore(corpus / "train")
    assert (store.meta["channel"], store.meta["num_mel_bins"]) == (1, 40)
    mono = FeatureStore(corpus8k / "train")
    for utt in mono.utt_ids[:3]:
        np.testing.assert_allclose(store[utt], mono[utt], atol=1e-4)


# ------------------------------------------------------------------ damaged values, bad flags

def test_non_finite_features_are_an_error_naming_shard_and_utterance(corpus8k, run8k, tmp_path, capsys):
    corpus = tmp_path / "corpus"
    shutil.copytree(corpus8k, corpus)
    store = FeatureStore(corpus / "test")
    utt = store.utt_ids[2]
    shard, offset, _ = store._index[utt]
    mm = np.memmap(store._shard_path(shard), dtype="<f4", mode="r+").reshape(-1, store.dim)
    mm[offset + 3, 5] = np.nan
    mm.flush()
    del mm
    with pytest.raises(DataError, match=rf"test/feats/shard-00000.f32: utterance {utt}: non-finite .* frame 3"):
        FeatureStore(corpus / "test")[utt]
    assert np.isfinite(FeatureStore(corpus / "test")[store.utt_ids[0]]).all()
    capsys.readouterr()
    assert main(["eval", str(run8k), "--data", str(corpus), "--out", str(tmp_path / "eval.json")]) != 0
    line = _error_line(capsys)
    assert f"shard-00000.f32: utterance {utt}: non-finite feature values" in line
    assert not (tmp_path / "eval.json").exists() and not (tmp_path / "eval.hyp.txt").exists()


def test_negative_jobs_are_refused(corpus8k, tmp_path, capsys):
    split = tmp_path / "test"
    shutil.copytree(corpus8k / "test", split, ignore=shutil.ignore_patterns("feats"))
    capsys.readouterr()
    with pytest.raises(SystemExit) as exit_info:  # argparse's usage error, naming the option
        main(["features", str(split), "--jobs", "-5"])
    assert exit_info.value.code == 2 and not (split / "feats").exists()
    assert "argument --jobs: expected an integer >= 0, got '-5'" in capsys.readouterr().err
    with pytest.raises(ConfigError, match=r"--jobs: expected an integer >= 0 \(0: all cores\), got -5"):
        extract_features(split, jobs=-5)  # callers from Python get the same check


def test_a_character_outside_the_alphabet_is_noted_with_its_file_and_utterance(tmp_path, capsys):
    """An utterance the model cannot spell has no CTC target (evaluation scores it from its text);
    a split of nothing but such utterances is refused naming its file."""
    import pytest

    from asrdist.data.targets import CharTokenizer, Targets
    from asrdist.errors import DataError
    from asrdist.data.labels import ctc_tokens

    split = tmp_path / "test"
    split.mkdir()
    (split / "wav.scp").write_text("u1 u1.wav\nu2 u2.wav\n")
    (split / "utt2spk").write_text("u1 s1\nu2 s1\n")
    (split / "text").write_text("u1 one\nu2 café\n")
    tokenizer = CharTokenizer.fit(["one", "cafe"])
    targets = Targets(kind="chars", phones=[], silence_id=0, num_classes=tokenizer.vocab_size, tokenizer=tokenizer)
    assert ctc_tokens(split, targets) == {"u1": tokenizer.encode("one")}
    assert "test/text: 1 of 2 utterance(s) hold characters the training transcripts never had ('é'; e.g. " \
           "utterance u2)" in capsys.readouterr().err
    (split / "text").write_text("u1 öne\nu2 café\n")
    with pytest.raises(DataError, match=r"test/text: every utterance holds characters .* \('é' 'ö'\)"):
        ctc_tokens(split, targets)
