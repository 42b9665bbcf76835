"""`asrdist decode --same-speaker / --utt2spk`: files that share a speaker are decoded as `asrdist eval`
decodes a speaker (CMVN statistics pooled over the speaker's files, the run's speaker adaptation),
so decoding a test split's audio gives eval's hypotheses; by default each file is its own speaker.
A tiny character CTC model with speaker CMVN, trained on a few real FSDD recordings."""
from __future__ import annotations

import json

import numpy as np
import pytest
import torch

from asrdist.cli import main
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.features.frontend import features_of, normalize, raw_features
from asrdist.run.decode import read_utt2spk
from asrdist.errors import DataError
from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree
from tests.support.paths import DEFAULT_RECIPE

pytestmark = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")

RECIPE = """seed: 0
data: {corpus: CORPUS, num_mel_bins: 23, cmvn: speaker, targets: chars, batch_size: 1500}
model: {name: ctc, hidden_layers: 1, hidden_dim: 24, subsample: 2}
optim: {name: sgd, lr: 0.3, momentum: 0.9, warmup_steps: 0}
train: {epochs: 1, log_every: 2, threads: 1}
eval: {beam: 2, vocabulary: train}
"""


@pytest.fixture(scope="module")
def speaker_run(tmp_path_factory):
    """(run dir, corpus) of a run whose features use speaker CMVN; the test split has two speakers."""
    root = tmp_path_factory.mktemp("decode_speakers")
    corpus = root / "corpus"
    kaldi = make_kaldi_tree(root, train=("george", "jackson"), test=("theo", "yweweler"))
    assert main(["corpus", "import-kaldi", str(kaldi), str(corpus)]) == 0
    recipe = root / "chars.yaml"
    recipe.write_text(RECIPE.replace("CORPUS", str(corpus)))
    run = root / "run"
    assert main(["train", str(recipe), "--out", str(run), "--no-progress"]) == 0
    return run, corpus


def _test_files(corpus):
    test = read_data_dir(corpus / "test")
    return test, [test.wav_path(test.utterances[u]) for u in test.utt_ids]


def _lines(text: str) -> dict[str, str]:
    return {line.split(maxsplit=1)[0]: (line.split(maxsplit=1) + [""])[1] for line in text.splitlines()}


@pytest.mark.parametrize("rounds, balance", [(0, "0"), (1, "0"), (1, "1")])
def test_decode_by_speaker_gives_evals_hypotheses(speaker_run, capsys, rounds, balance):
    """Also with the words objective (--adapt-word-balance): eval and decode fit the same maps."""
    run, corpus = speaker_run
    test, wavs = _test_files(corpus)
    assert {w.stem for w in wavs} == set(test.utt_ids)  # decode's ids are the corpus' ids here
    out = run / f"eval{rounds}-{balance}.json"
    adapt = ["--adapt-rounds", str(rounds), "--adapt-word-balance", balance]
    assert main(["eval", str(run), "--data", str(corpus), *adapt, "--out", str(out)]) == 0
    if rounds:
        adaptation = json.loads(out.read_text())["adaptation"]
        assert adaptation["word_balance"] == float(balance)
        assert 0 <= adaptation["speakers_held_to_word_frequencies"] <= (2 if balance == "1" else 0)
    evaluated = _lines(out.with_suffix(".hyp.txt").read_text())
    if balance == "1" and not torch.cuda.is_available():  # the default device is the CPU: naming it changes nothing
        explicit = run / "eval-cpu.json"
        assert main(["eval", str(run), "--data", str(corpus), *adapt, "--out", str(explicit), "--device", "cpu"]) == 0
        assert explicit.read_text() == out.read_text()
        assert explicit.with_suffix(".hyp.txt").read_text() == out.with_suffix(".hyp.txt").read_text()
        adapt += ["--device", "cpu"]  # the decodes below: --device cpu's lines are the default's eval's
    utt2spk = run / "utt2spk"
    utt2spk.write_text("".join(f"{u} {test.utterances[u].speaker}\n" for u in reversed(test.utt_ids)) + "other x\n")
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs), "--utt2spk", str(utt2spk), *adapt]) == 0
    printed = capsys.readouterr().out
    assert [line.split()[0] for line in printed.splitlines()] == [w.stem for w in wavs]  # the order given
    assert _lines(printed) == evaluated
    # one speaker's files alone, --same-speaker: the same lines as that speaker's in the grouped run
    theo = [w for w in wavs if test.utterances[w.stem].speaker == "theo"]
    assert main(["decode", str(run), *map(str, theo), "--same-speaker", *adapt]) == 0
    assert _lines(capsys.readouterr().out) == {w.stem: evaluated[w.stem] for w in theo}


def test_word_balance_without_a_vocabulary_fits_the_hypotheses(speaker_run, capsys):
    run, corpus = speaker_run
    out = run / "free.json"
    assert main(["eval", str(run), "--data", str(corpus), "--vocabulary", "none", "--adapt-rounds", "1",
                 "--adapt-word-balance", "1", "--out", str(out)]) == 0
    adaptation = json.loads(out.read_text())["adaptation"]
    assert adaptation["word_balance"] == 0.0 and adaptation["speakers_held_to_word_frequencies"] == 0
    assert ("note: eval.adapt_word_balance: the decoding has no vocabulary (eval.vocabulary=none); each "
            "speaker's map is fitted to its hypotheses instead") in capsys.readouterr().err


def test_each_file_is_its_own_speaker_by_default(speaker_run, capsys):
    run, corpus = speaker_run
    _, wavs = _test_files(corpus)
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs[:2])]) == 0
    captured = capsys.readouterr()
    assert len(captured.out.splitlines()) == 2  # stdout holds only the `utt text` lines
    assert "each file is normalised as its own speaker" in captured.err and "--same-speaker" in captured.err
    assert main(["decode", str(run), str(wavs[0])]) == 0
    assert "--same-speaker" not in capsys.readouterr().err  # one file: nothing to pool
    front = {"sample_rate": 8000, "num_mel_bins": 23, "cmvn": "speaker"}
    alone = features_of(wavs[0], front)
    assert np.allclose(alone.mean(0), 0, atol=1e-4) and np.allclose(alone.std(0), 1, atol=1e-3)
    pooled = normalize([raw_features(w, front) for w in wavs[:4]], front)
    assert np.allclose(np.concatenate(pooled).mean(0), 0, atol=1e-4)
    assert not np.allclose(pooled[0], alone, atol=1e-2)  # the file's own statistics are not its speaker's
    store = json.loads((corpus / "test" / "feats" / "cmvn.json").read_text())
    assert store["mode"] == "speaker"


def test_a_lone_file_is_normalised_as_asrdist_features_normalises_a_one_file_speaker(speaker_run, tmp_path, capsys):
    """A file decoded alone (under a second) has its statistics topped up by the training
    speakers' prior, exactly as `asrdist features` tops up a speaker with that one file, so
    `asrdist decode` of the file alone says what `asrdist eval` says of it as its own speaker."""
    import shutil

    from asrdist.run.evaluate import load_run_model
    from asrdist.features.store import FeatureStore

    run, corpus = speaker_run
    test, wavs = _test_files(corpus)
    copy = tmp_path / "corpus"
    shutil.copytree(corpus, copy)
    (copy / "test" / "utt2spk").write_text("".join(f"{u} {u}\n" for u in test.utt_ids))
    (copy / "test" / "spk2utt").write_text("".join(f"{u} {u}\n" for u in test.utt_ids))
    assert main(["features", str(copy), "--cmvn", "speaker", "--num-mel-bins", "23", "--jobs", "1", "--overwrite"]) == 0
    front = load_run_model(run)[2].features
    assert front["speaker_prior"]["frames"] == 100
    store = FeatureStore(copy / "test")
    for wav in wavs[:3]:
        alone = features_of(wav, front)
        assert len(alone) < 100
        np.testing.assert_allclose(alone, store[wav.stem], atol=1e-5)
        assert not np.allclose(alone.mean(0), 0, atol=1e-2)  # not the file's own statistics
    out = run / "lone.json"
    assert main(["eval", str(run), "--data", str(copy), "--adapt-rounds", "0", "--out", str(out)]) == 0
    evaluated = _lines((run / "lone.hyp.txt").read_text())
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs[:6])]) == 0
    assert _lines(capsys.readouterr().out) == {w.stem: evaluated[w.stem] for w in wavs[:6]}


def test_a_run_from_before_the_prior_takes_it_from_its_corpus(speaker_run, tmp_path):
    """A run trained before `targets.pt` kept the speaker prior gets it from its corpus' training
    features when they are still the run's (rate, bins, CMVN); otherwise files keep their own."""
    import shutil

    from asrdist.run.evaluate import load_run_model
    from asrdist.features.frontend import front_end
    from asrdist.run.prepare import load_targets, save_targets

    run, corpus = speaker_run
    old = tmp_path / "run"
    shutil.copytree(run, old)
    targets = load_targets(old)
    prior = targets.features.pop("speaker_prior")
    save_targets(old, targets)
    model, cfg, targets, _ = load_run_model(old)
    assert "speaker_prior" not in targets.features
    assert front_end(old, cfg, targets.features)["speaker_prior"] == prior
    targets.features["num_mel_bins"] = 40  # the corpus' features are no longer the run's
    assert "speaker_prior" not in front_end(old, cfg, targets.features)


def test_a_damaged_cmvn_file_is_one_line(speaker_run, tmp_path, capsys):
    import shutil

    from asrdist.features.frontend import feature_record

    _, corpus = speaker_run
    train = tmp_path / "train"
    shutil.copytree(corpus / "train", train)
    (train / "feats" / "cmvn.json").write_text('{"mode": "speaker", "source": "train"}\n')
    with pytest.raises(DataError, match=r"cmvn.json: not a readable speaker CMVN statistics file \(KeyError"):
        feature_record(train)


def test_utt2spk_problems_are_one_line(speaker_run, tmp_path, capsys):
    run, corpus = speaker_run
    _, wavs = _test_files(corpus)
    ids = [w.stem for w in wavs]
    bad = tmp_path / "utt2spk"
    bad.write_text(f"{ids[0]} a\n")
    out = tmp_path / "lines.txt"
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs[:3]), "--utt2spk", str(bad), "--out", str(out)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"no speaker for utterance '{ids[1]}' and 1 more" in err[0], err
    assert not out.exists()
    bad.write_text(f"{ids[0]} a\n{ids[1]}\n")
    with pytest.raises(DataError, match=rf"utterance '{ids[1]}': expected one speaker, got ''"):
        read_utt2spk(bad, ids[:2])
    bad.write_text(f"{ids[0]} a b\n")
    with pytest.raises(DataError, match=rf"utterance '{ids[0]}': expected one speaker, got 'a b'"):
        read_utt2spk(bad, ids[:1])
    bad.write_text(f"{ids[0]} a\n{ids[0]} b\n")
    with pytest.raises(DataError, match=rf"utt2spk:2: duplicate key '{ids[0]}'"):
        read_utt2spk(bad, ids[:1])
    with pytest.raises(DataError, match="nowhere: missing"):
        read_utt2spk(tmp_path / "nowhere", ids[:1])
    with pytest.raises(DataError, match="not a regular file"):
        read_utt2spk(tmp_path, ids[:1])
    assert main(["decode", str(run), str(wavs[0]), "--adapt-rounds", "2"]) != 0
    assert "--adapt-rounds: adaptation needs files that share a speaker" in capsys.readouterr().err
    assert main(["decode", str(run), str(wavs[0]), "--adapt-word-balance", "1"]) != 0
    assert "--adapt-word-balance: adaptation needs files that share a speaker" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exit_info:  # argparse: one or the other
        main(["decode", str(run), str(wavs[0]), "--same-speaker", "--utt2spk", str(bad)])
    assert exit_info.value.code == 2
    assert "not allowed with argument" in capsys.readouterr().err


def test_a_bad_file_among_a_speakers_files_is_named_and_the_rest_decoded(speaker_run, tmp_path, capsys):
    run, corpus = speaker_run
    _, wavs = _test_files(corpus)
    short = tmp_path / "short.wav"
    short.write_bytes(wavs[0].read_bytes()[:60])
    capsys.readouterr()
    assert main(["decode", str(run), str(wavs[0]), str(short), str(wavs[1]), "--same-speaker"]) != 0
    captured = capsys.readouterr()
    assert [line.split()[0] for line in captured.out.splitlines()] == [wavs[0].stem, wavs[1].stem]
    err = captured.err.strip().splitlines()
    assert len(err) == 1 and "short.wav" in err[0] and "1 of 3 files not decoded" in err[0], err


def test_a_hybrid_model_decodes_a_speakers_files_as_eval_does(tmp_path, capsys):
    """Frame classifiers take the pooled statistics too (they have no adaptation)."""

    from tests.support.corpus_fixture import make_tone_corpus

    corpus = make_tone_corpus(tmp_path / "corpus", utterances_per_speaker=4, speakers=4)
    run = tmp_path / "run"
    recipe = str(DEFAULT_RECIPE)
    assert main(["train", recipe, "--data", str(corpus), "--out", str(run), "data.cmvn=speaker",
                 "data.batch_size=128", "model.hidden_dim=16", "model.hidden_layers=1", "optim.warmup_steps=0",
                 "train.threads=1", "train.max_steps=6", "--epochs", "1", "--no-progress"]) == 0
    assert main(["eval", str(run), "--data", str(corpus)]) == 0
    test, wavs = _test_files(corpus)
    assert len(test.speakers) == 1
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs), "--same-speaker"]) == 0
    printed = _lines(capsys.readouterr().out)
    evaluated = _lines((run / "hyp.txt").read_text())
    assert printed == {w.stem: evaluated[u] for w, u in zip(wavs, test.utt_ids)}
    assert json.loads((run / "eval.json").read_text())["min_duration"] == 3  # the recipe's

    # the phone loop's settings from the command line, the same in both; a phone of at least 100
    # frames leaves at most T / 100 phones in a hypothesis of T frames
    search = ["--min-duration", "100", "--prior-scale", "0.5", "--acoustic-scale", "2"]
    out = tmp_path / "long.json"
    assert main(["eval", str(run), "--data", str(corpus), "--out", str(out), *search]) == 0
    result = json.loads(out.read_text())
    assert (result["min_duration"], result["prior_scale"], result["acoustic_scale"]) == (100, 0.5, 2.0)
    long = _lines((tmp_path / "long.hyp.txt").read_text())
    frames = FeatureStore(corpus / "test")
    assert all(len(long[u].split()) <= max(1, len(frames[u]) // 100) for u in test.utt_ids)
    assert long != evaluated
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs), "--same-speaker", *search]) == 0
    assert _lines(capsys.readouterr().out) == {w.stem: long[u] for w, u in zip(wavs, test.utt_ids)}


def test_a_channel_of_a_stereo_file_decodes_as_that_channel_alone(speaker_run, tmp_path, capsys):
    """`--channel K` reads channel K of multi-channel files (as `corpus` and `features` do); without
    it such a file is refused in one line that names the option decode has."""
    import soundfile as sf

    from asrdist.io.audio import read_wav

    run, corpus = speaker_run
    _, wavs = _test_files(corpus)
    left, _ = read_wav(wavs[0])
    right, rate = read_wav(wavs[1])
    n = min(len(left), len(right))
    stereo = tmp_path / "both.wav"
    sf.write(stereo, np.stack([left[:n], right[:n]], axis=1), rate, subtype="PCM_16")
    mono = tmp_path / "mono"
    mono.mkdir()
    for k, samples in enumerate((left[:n], right[:n])):
        sf.write(mono / f"both{k}.wav", samples, rate, subtype="PCM_16")
    capsys.readouterr()
    for k in (0, 1):
        assert main(["decode", str(run), str(stereo), "--channel", str(k)]) == 0
        picked = _lines(capsys.readouterr().out)["both"]
        assert main(["decode", str(run), str(mono / f"both{k}.wav")]) == 0
        assert picked == _lines(capsys.readouterr().out)[f"both{k}"]
    assert main(["decode", str(run), str(stereo)]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "2 channels" in err[0] and "--channel K" in err[0]
    assert main(["decode", str(run), str(stereo), "--channel", "2"]) != 0
    assert "channel 2 asked for" in capsys.readouterr().err
