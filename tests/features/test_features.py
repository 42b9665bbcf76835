"""Fbank against a numpy reference, the feature store, CMVN, alignment checks, bad audio."""
from __future__ import annotations

import json
import os
import pickle
import shutil
import zlib
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrdist.cli import main
from asrdist.io.audio import num_frames, write_wav
from asrdist.io.kaldi_dir import Utterance, write_data_dir
from asrdist.errors import ConfigError, DataError
from asrdist.features.fbank import check_mel_bins, compute_fbank
from asrdist.features.store import FeatureStore, FeatureStoreWriter, has_features

RATE = 16000


def reference_fbank(samples: np.ndarray, rate: int, bins: int) -> np.ndarray:
    """Kaldi's fbank written out plainly: snip_edges=false mirroring, DC removal, pre-emphasis,
    Povey window, power spectrum, triangular mel bins from 20 Hz to Nyquist, log."""
    x = samples.astype(np.float64)
    n, shift, length = len(x), rate // 100, rate * 25 // 1000
    fft = 1 << (length - 1).bit_length()
    window = (0.5 - 0.5 * np.cos(2 * np.pi * np.arange(length) / (length - 1))) ** 0.85

    def mel(f):
        return 1127.0 * np.log(1.0 + f / 700.0)

    edges = np.linspace(mel(20.0), mel(rate / 2), bins + 2)
    fft_mel = mel(np.arange(fft // 2) * rate / fft)
    banks = np.zeros((bins, fft // 2 + 1))
    for b in range(bins):
        left, center, right = edges[b:b + 3]
        rising, falling = (fft_mel - left) / (center - left), (right - fft_mel) / (right - center)
        inside = (fft_mel > left) & (fft_mel < right)
        banks[b, :fft // 2] = np.where(inside, np.where(fft_mel <= center, rising, falling), 0.0)
    out = np.empty(((n + shift // 2) // shift, bins))
    for i in range(len(out)):
        idx = i * shift + shift // 2 - length // 2 + np.arange(length)
        idx = np.where(idx < 0, -idx - 1, idx)
        idx = np.where(idx >= n, 2 * n - 1 - idx, idx)
        frame = x[idx] - x[idx].mean()
        frame = np.concatenate([[frame[0] * 0.03], frame[1:] - 0.97 * frame[:-1]])
        power = np.abs(np.fft.rfft(frame * window, fft)) ** 2
        out[i] = np.log(np.maximum(banks @ power, np.finfo(np.float32).eps))
    return out


def _audio(seed: int, seconds: float, rate: int = RATE) -> np.ndarray:
    rng = np.random.default_rng(seed)
    t = np.arange(int(seconds * rate)) / rate
    tone = np.sin(2 * np.pi * (200 + 50 * seed) * t) * 4000
    return (tone + rng.standard_normal(len(t)) * 500).astype(np.int16)


def make_split(path: Path, spec: list[tuple[str, str, float]], rate: int = RATE,
               alignment_delta: dict[str, int] | None = None) -> None:
    """A split dir with WAVs and alignments (length num_frames + delta) for (utt, speaker, seconds)."""
    (path / "wav").mkdir(parents=True)
    utts = []
    for i, (utt_id, spk, seconds) in enumerate(spec):
        samples = _audio(zlib.crc32(utt_id.encode()) % 1000, seconds, rate)
        write_wav(path / "wav" / f"{utt_id}.wav", samples, rate)
        frames = num_frames(len(samples), rate) + (alignment_delta or {}).get(utt_id, 0)
        utts.append(Utterance(utt_id, spk, f"wav/{utt_id}.wav", "a b", len(samples) / rate,
                              alignment=np.arange(frames, dtype=np.int32) % 40))
    write_data_dir(path, utts)


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    root = tmp_path / "corpus"
    make_split(root / "train", [("s1-a", "s1", 0.5), ("s1-b", "s1", 0.3), ("s2-a", "s2", 0.42)])
    make_split(root / "valid", [("s1-c", "s1", 0.25)])
    make_split(root / "test", [("s3-a", "s3", 0.37), ("s3-b", "s3", 0.21)])
    return root


@pytest.mark.parametrize("rate,bins", [(8000, 23), (8000, 40), (8000, 80), (16000, 23), (16000, 40), (16000, 80)])
def test_fbank_matches_reference(rate: int, bins: int):
    samples = _audio(3, 0.3, rate)[:-17]  # an odd length exercises the edge mirroring
    feats = compute_fbank(samples, rate, bins)
    assert feats.dtype == np.float32 and feats.shape == (num_frames(len(samples), rate), bins)
    np.testing.assert_allclose(feats, reference_fbank(samples, rate, bins), atol=2e-3)


def test_fbank_is_deterministic_and_rejects_too_short_audio():
    samples = _audio(1, 0.2)
    np.testing.assert_array_equal(compute_fbank(samples, RATE), compute_fbank(samples, RATE))
    with pytest.raises(DataError, match="too short"):
        compute_fbank(samples[:50], RATE)


@pytest.mark.parametrize("rate,bins,empty", [(8000, 95, 0), (8000, 96, 1), (8000, 128, 4), (16000, 126, 0),
                                             (16000, 128, 1)])
def test_too_many_mel_filters_for_the_rate_are_refused(rate: int, bins: int, empty: int):
    """A filter narrower than the FFT's bin spacing covers no bin: the reference filterbank's
    empty rows are the ones check_mel_bins refuses, and it names the largest size that fits."""
    silent = reference_fbank(_audio(2, 0.05, rate), rate, bins).max(axis=0) <= np.log(np.finfo(np.float32).eps)
    assert int(silent.sum()) == empty
    if empty:
        with pytest.raises(ConfigError, match=f"leave {empty} of them empty at {rate} Hz.*use at most"):
            check_mel_bins(bins, rate)
    else:
        check_mel_bins(bins, rate)
    for outside in (9, 129):
        with pytest.raises(ConfigError, match=">= 10 and <= 128"):
            check_mel_bins(outside, rate)


def test_features_take_any_filterbank_size_the_rate_allows(corpus: Path, capsys):
    assert main(["features", str(corpus), "--jobs", "1", "--num-mel-bins", "128"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("asrdist: error: --num-mel-bins: 128 mel filters leave 1"), err
    assert not any(has_features(corpus / split) for split in ("train", "valid", "test"))  # nothing half-written
    assert main(["features", str(corpus), "--jobs", "1", "--num-mel-bins", "23"]) == 0
    store = FeatureStore(corpus / "train")
    assert store.meta["num_mel_bins"] == 23 and store[store.utt_ids[0]].shape[1] == 23


def test_store_roundtrip_across_shards(tmp_path: Path):
    rng = np.random.default_rng(0)
    mats = {f"u{i}": rng.standard_normal((5 + 3 * i, 4)).astype(np.float32) for i in range(6)}
    writer = FeatureStoreWriter(tmp_path / "split" / "feats", 4, shard_bytes=4 * 4 * 20)
    for utt_id in ["u3", "u0", "u5", "u1", "u4", "u2"]:
        writer.add(utt_id, mats[utt_id])
    meta = writer.close({"cmvn": "none"})
    assert meta["num_shards"] > 1 and meta["total_frames"] == sum(len(m) for m in mats.values())
    assert has_features(tmp_path / "split") and not has_features(tmp_path)
    store = FeatureStore(tmp_path / "split")
    assert store.utt_ids == sorted(mats) and len(store) == 6 and "u2" in store and "x" not in store
    assert store.dim == 4 and store.total_frames == meta["total_frames"] and store.meta["cmvn"] == "none"
    for utt_id, mat in mats.items():
        np.testing.assert_array_equal(store[utt_id], mat)
        assert store.num_frames(utt_id) == len(mat)
    with pytest.raises(ValueError):
        store["u1"][0, 0] = 1.0  # views are read-only
    clone = pickle.loads(pickle.dumps(store))
    np.testing.assert_array_equal(clone["u4"], mats["u4"])
    shard = tmp_path / "split" / "feats" / f"shard-{meta['num_shards'] - 1:05d}.f32"
    shard.write_bytes(shard.read_bytes()[:-16])
    with pytest.raises(DataError, match="truncated"):
        FeatureStore(tmp_path / "split" / "feats")


def test_corpus_global_cmvn_uses_train_statistics(corpus: Path):
    from asrdist.features.extract import extract_features

    summary = extract_features(corpus, jobs=1, export_kaldi=True, progress=False)
    assert summary["utterances"] == 6 and summary["skipped"] == 0
    raw = {split: {utt: compute_fbank(_audio(zlib.crc32(utt.encode()) % 1000, secs), RATE)
                   for utt, secs in utts}
           for split, utts in {"train": [("s1-a", 0.5), ("s1-b", 0.3), ("s2-a", 0.42)],
                               "test": [("s3-a", 0.37), ("s3-b", 0.21)]}.items()}
    train = np.concatenate(list(raw["train"].values())).astype(np.float64)
    mean, std = train.mean(axis=0), train.std(axis=0)
    for split, mats in raw.items():
        store = FeatureStore(corpus / split)
        assert store.meta["cmvn"] == "global" and store.meta["sample_rate"] == RATE
        for utt, mat in mats.items():
            np.testing.assert_allclose(store[utt], (mat - mean) / std, atol=1e-4)
        kaldi = kaldiio.load_scp(str(corpus / split / "feats" / "feats.scp"))
        for utt in store.utt_ids:
            np.testing.assert_array_equal(kaldi[utt], store[utt])
    stats = json.loads((corpus / "test" / "feats" / "cmvn.json").read_text())
    assert stats["source"] == "train" and stats["count"] == len(train)


def test_speaker_cmvn_and_parallel_jobs_are_identical(corpus: Path, tmp_path: Path):
    from asrdist.features.extract import extract_features

    extract_features(corpus, cmvn="speaker", num_mel_bins=80, jobs=1, progress=False)
    one = {u: np.array(FeatureStore(corpus / "train")[u]) for u in ("s1-a", "s1-b", "s2-a")}
    extract_features(corpus, cmvn="speaker", num_mel_bins=80, jobs=2, overwrite=True, progress=False)
    for utt, mat in one.items():
        np.testing.assert_array_equal(FeatureStore(corpus / "train")[utt], mat)


def test_all_cores_start_workers_only_for_a_split_worth_them(corpus: Path, monkeypatch):
    """`--jobs 0` extracts a small split in this process (starting workers costs more than its
    features), a split of 30 min of audio or more (or 2,000 utterances without durations) in a pool;
    `--jobs 2` always starts its workers. The summary's `jobs` says how many ran."""
    from asrdist.features import extract
    from asrdist.io.kaldi_dir import read_data_dir

    split = read_data_dir(corpus / "train", require_text=False)
    assert not extract.worth_a_pool(split)
    for u in split.utterances.values():
        u.duration = extract.POOL_MIN_AUDIO_HOURS * 3600 / len(split.utterances)
    assert extract.worth_a_pool(split)
    for u in split.utterances.values():
        u.duration = 0.0  # no utt2dur: counted in utterances
    assert not extract.worth_a_pool(split)
    monkeypatch.setattr(extract, "POOL_MIN_UTTERANCES", len(split.utterances))
    assert extract.worth_a_pool(split)

    pools = []
    monkeypatch.setattr(extract, "worth_a_pool", lambda d: d.path.name == "train")
    real = extract._run_tasks
    monkeypatch.setattr(extract, "_run_tasks", lambda tasks, jobs, *a: pools.append(jobs) or real(tasks, 1, *a))
    assert extract.extract_features(corpus, jobs=0, overwrite=True, progress=False)["jobs"] == (os.cpu_count() or 1)
    assert pools == [os.cpu_count() or 1 if name == "train" else 1 for name in extract.find_splits(corpus)]
    monkeypatch.setattr(extract, "worth_a_pool", lambda d: False)
    pools.clear()
    assert extract.extract_features(corpus, jobs=0, overwrite=True, progress=False)["jobs"] == 1 and set(pools) == {1}
    pools.clear()
    assert extract.extract_features(corpus, jobs=2, overwrite=True, progress=False)["jobs"] == 2 and set(pools) == {2}


def _speaker_stats(mats: list[np.ndarray]) -> tuple[int, np.ndarray, np.ndarray]:
    x = np.concatenate(mats).astype(np.float64)
    return len(x), x.mean(axis=0), x.var(axis=0)


def test_speaker_cmvn_tops_up_a_short_speaker_from_the_training_speakers(tmp_path: Path):
    """A speaker of at least PRIOR_FRAMES frames is normalized by its own statistics alone; a
    shorter one (a lone test file) gets the rest from the training speakers' average, at its own
    level. Checked against the statistics written out with numpy."""
    from asrdist.features.cmvn import PRIOR_FRAMES
    from asrdist.features.extract import extract_features

    root = tmp_path / "corpus"
    train = [("s1-a", "s1", 0.7), ("s1-b", "s1", 0.6), ("s2-a", "s2", 1.1), ("s2-b", "s2", 0.2)]
    make_split(root / "train", train)
    make_split(root / "test", [("s3-a", "s3", 0.37), ("s4-a", "s4", 1.3)])
    extract_features(root, cmvn="speaker", num_mel_bins=23, jobs=1, progress=False)
    raw = {u: compute_fbank(_audio(zlib.crc32(u.encode()) % 1000, secs), RATE, 23)
           for u, _, secs in train + [("s3-a", "s3", 0.37), ("s4-a", "s4", 1.3)]}
    speakers = [_speaker_stats([raw["s1-a"], raw["s1-b"]]), _speaker_stats([raw["s2-a"], raw["s2-b"]])]
    assert all(n >= PRIOR_FRAMES for n, _, _ in speakers)
    total = sum(n for n, _, _ in speakers)
    prior_mean = sum(n * m for n, m, _ in speakers) / total
    prior_var = sum(n * v for n, _, v in speakers) / total
    test = FeatureStore(root / "test")
    for utt in ("s1-a", "s2-b"):  # long enough: their own statistics, mean 0 and deviation 1 over the speaker
        mats = [FeatureStore(root / "train")[u] for u in (utt, utt[:2] + ("-b" if utt.endswith("a") else "-a"))]
        x = np.concatenate(mats)
        np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-4)
        np.testing.assert_allclose(x.std(axis=0), 1, atol=1e-3)
    x = np.asarray(test["s4-a"])  # 131 frames
    np.testing.assert_allclose(x.mean(axis=0), 0, atol=1e-4)
    n, m, v = _speaker_stats([raw["s3-a"]])
    assert n < PRIOR_FRAMES
    missing = PRIOR_FRAMES - n
    shifted = prior_mean + (m.mean() - prior_mean.mean())
    mean = (n * m + missing * shifted) / PRIOR_FRAMES
    var = (n * (v + m * m) + missing * (prior_var + shifted * shifted)) / PRIOR_FRAMES - mean * mean
    np.testing.assert_allclose(test["s3-a"], (raw["s3-a"] - mean) / np.sqrt(var), atol=1e-4)
    body = json.loads((root / "test" / "feats" / "cmvn.json").read_text())
    assert body["prior"]["frames"] == PRIOR_FRAMES and body["speakers"]["s3"]["count"] == PRIOR_FRAMES
    np.testing.assert_allclose(body["prior"]["mean"], prior_mean, atol=1e-6)
    np.testing.assert_allclose(body["prior"]["var"], prior_var, atol=1e-6)


def test_a_short_speakers_features_do_not_depend_on_its_level():
    """A gain adds one constant to every log-mel bin: a short speaker topped up by the prior is
    normalized to the same features at any level, as a speaker with its own statistics is."""
    from asrdist.features.cmvn import CmvnStats, SpeakerPrior

    rng = np.random.default_rng(0)
    speakers = []
    for _ in range(3):
        s = CmvnStats(23)
        s.accumulate(rng.normal(rng.normal(0, 2, 23), rng.uniform(0.5, 2, 23), size=(200, 23)))
        speakers.append(s)
    prior = SpeakerPrior.of(speakers)
    x = rng.normal(3, 1.5, size=(40, 23))
    out = []
    for gain in (0.0, -4.6, 2.3):  # log-mel offsets of 1, 0.01 and 10 times the power
        stats = CmvnStats(23)
        stats.accumulate(x + gain)
        filled = prior.fill(stats)
        assert filled.count == prior.frames
        out.append(filled.apply(x + gain))
    np.testing.assert_allclose(out[1], out[0], atol=1e-4)
    np.testing.assert_allclose(out[2], out[0], atol=1e-4)
    long = CmvnStats(23)
    long.accumulate(rng.normal(size=(prior.frames, 23)))
    assert prior.fill(long) is long
    # a store from before the prior: the prior comes from its speakers' statistics
    body = {"mode": "speaker", "speakers": {str(i): s.to_json() for i, s in enumerate(speakers)}}
    again = SpeakerPrior.of_cmvn_file(body)
    np.testing.assert_allclose(again.mean, prior.mean, atol=1e-9)
    np.testing.assert_allclose(again.var, prior.var, atol=1e-9)


def test_single_split_uses_its_own_statistics_and_refuses_to_overwrite(corpus: Path, capsys):
    assert main(["features", str(corpus / "test"), "--jobs", "1"]) == 0
    store = FeatureStore(corpus / "test" / "feats")
    frames = np.concatenate([store[u] for u in store.utt_ids])
    np.testing.assert_allclose(frames.mean(axis=0), 0, atol=1e-4)
    assert not has_features(corpus / "train")
    capsys.readouterr()
    assert main(["features", str(corpus / "test"), "--jobs", "1"]) != 0
    assert "exists" in capsys.readouterr().err
    assert main(["features", str(corpus / "test"), "--jobs", "1", "--cmvn", "none", "--overwrite"]) == 0
    assert FeatureStore(corpus / "test").meta["cmvn"] == "none"


def test_alignment_within_one_frame_is_tolerated(tmp_path: Path):
    from asrdist.features.extract import extract_features

    split = tmp_path / "split"
    make_split(split, [("a", "s", 0.3), ("b", "s", 0.3), ("c", "s", 0.3)],
               alignment_delta={"a": 1, "b": -1})
    assert extract_features(split, jobs=1, progress=False)["utterances"] == 3


def _break(wav: Path, how: str) -> None:
    if how == "corrupt":
        wav.write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk")
    elif how == "empty":
        write_wav(wav, np.zeros(0, dtype=np.int16), RATE)
    elif how == "truncated":
        wav.write_bytes(wav.read_bytes()[:-1000])
    elif how == "rate":
        write_wav(wav, _audio(1, 0.3, 8000), 8000)


@pytest.mark.parametrize("how,reason", [
    ("corrupt", "corrupt WAV"), ("empty", "empty audio"), ("truncated", "truncated WAV"),
    ("rate", "sample rate 8000 Hz, expected 16000 Hz"), ("long", "alignment has"),
    ("short", "alignment has")])
def test_bad_input_fails_cleanly_or_is_skipped(corpus: Path, tmp_path: Path, capsys, how, reason):
    if how in ("long", "short"):
        shutil.rmtree(corpus / "test")
        make_split(corpus / "test", [("s9-x", "s9", 0.3), ("s9-y", "s9", 0.3)],
                   alignment_delta={"s9-x": 2 if how == "long" else -2})
        bad_utt = "s9-x"
    else:
        bad_utt = "s3-b"
        _break(corpus / "test" / "wav" / f"{bad_utt}.wav", how)
    assert main(["features", str(corpus), "--jobs", "1"]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and bad_utt in err[0] and reason in err[0], err
    assert not any(has_features(corpus / s) for s in ("train", "valid", "test"))
    assert not [p.name for s in ("train", "valid", "test") for p in (corpus / s).iterdir()
                if p.name.startswith(".feats")]
    assert main(["features", str(corpus), "--jobs", "2", "--skip-bad"]) == 0
    meta = FeatureStore(corpus / "test").meta
    assert meta["skipped"] == 1 and bad_utt in meta["skipped_utterances"][0] and meta["skip_bad"] is True
    assert bad_utt not in FeatureStore(corpus / "test") and len(FeatureStore(corpus / "test")) == 1
    if how in ("corrupt", "long"):  # a recipe's other settings re-extract, skipping what the user skipped
        from asrdist.config import config_from_tree
        from asrdist.run.prepare import ensure_features

        capsys.readouterr()
        ensure_features(corpus, config_from_tree({"data": {"num_mel_bins": 23, "cmvn": "speaker"}}), progress=False)
        assert "skipping unreadable audio as before (--skip-bad)" in capsys.readouterr().out
        meta = FeatureStore(corpus / "test").meta
        assert meta["num_mel_bins"] == 23 and meta["skipped"] == 1 and bad_utt not in FeatureStore(corpus / "test")


def test_speaker_cmvn_over_one_utterance_speakers_is_noted(tmp_path, capsys):
    """A split whose utt2spk names no speakers (each utterance its own, as many Kaldi dirs without
    speaker information have it) gets a note: per-utterance statistics cost accuracy."""
    from tests.support.corpus_fixture import make_tone_corpus

    corpus = make_tone_corpus(tmp_path / "c", utterances_per_speaker=3, speakers=3)
    capsys.readouterr()
    assert main(["features", str(corpus), "--cmvn", "speaker", "--jobs", "1"]) == 0
    assert "every speaker has one utterance" not in capsys.readouterr().err
    utt2spk = corpus / "test" / "utt2spk"
    utt2spk.write_text("".join(f"{line.split()[0]} {line.split()[0]}\n" for line in utt2spk.read_text().splitlines()))
    assert main(["features", str(corpus / "test"), "--cmvn", "speaker", "--jobs", "1", "--overwrite"]) == 0
    err = capsys.readouterr().err
    assert f"{corpus / 'test'}: every speaker has one utterance" in err and "utt2spk" in err
