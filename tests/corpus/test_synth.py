"""`asrdist corpus synth`: layout, exact alignments, speaker splits, determinism, flite, errors."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.corpus import espeak, flite, synth
from asrdist.io.audio import num_frames, read_wav
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.corpus.phones import PhoneTable
from asrdist.corpus.textsource import sentence, vocabulary
from asrdist.errors import AsrdistError, ConfigError, DataError

SEED = 5
UTTERANCES = 24
TABLE = PhoneTable()
SUMMARY_KEYS = {"synthesizer", "seed", "sample_rate", "utterances", "speakers", "hours", "skipped", "splits"}


def build(out: Path, **kw) -> dict:
    kw.setdefault("utterances", UTTERANCES)
    kw.setdefault("seed", SEED)
    kw.setdefault("jobs", 1)
    return synth.build_corpus(out, progress=False, **kw)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("synth") / "corpus"
    build(out, jobs=2)  # the multi-process path; the determinism test compares it with --jobs 1
    return out


def splits(root: Path):
    return {name: read_data_dir(root / name) for name in synth.SPLITS}


def collapse(seq):
    return [k for k, _ in itertools.groupby(seq)]


def test_layout_and_summary(corpus):
    assert sorted(p.name for p in corpus.iterdir()) == ["phones.txt", "summary.json", "test", "train", "valid"]
    assert PhoneTable.read(corpus / "phones.txt").symbols == TABLE.symbols
    summary = json.loads((corpus / "summary.json").read_text())
    assert set(summary) == SUMMARY_KEYS
    assert (summary["synthesizer"], summary["seed"], summary["sample_rate"]) == ("espeak", SEED, 16000)
    assert summary["utterances"] == UTTERANCES and summary["skipped"] == 0
    data = splits(corpus)
    total_frames = 0
    for name, d in data.items():
        s = summary["splits"][name]
        assert set(s) == {"utterances", "speakers", "hours", "phones"}
        assert s["utterances"] == len(d.utterances) and s["speakers"] == len(d.speakers)
        assert s["hours"] == pytest.approx(d.hours, abs=1e-4)
        assert list(s["phones"]) == list(TABLE.symbols)
        frames = np.concatenate([u.alignment for u in d.utterances.values()])
        assert list(s["phones"].values()) == np.bincount(frames, minlength=len(TABLE)).tolist()
        total_frames += len(frames)
        for u in d.utterances.values():
            assert u.wav == str((d.path / f"wav/{u.utt_id}.wav").resolve()) and d.wav_path(u).is_file()
            index = int(u.utt_id.rsplit("-", 1)[1])
            assert u.text == sentence(SEED, index)[0] and u.text == u.text.lower()
            assert set(u.text.split()) <= vocabulary()
    assert summary["speakers"] == sum(len(d.speakers) for d in data.values())
    assert summary["hours"] == pytest.approx(sum(d.hours for d in data.values()), abs=1e-3)
    assert total_frames == sum(sum(v["phones"].values()) for v in summary["splits"].values())


def test_alignment_length_matches_audio(corpus):
    for d in splits(corpus).values():
        assert d.has_alignments
        for u in d.utterances.values():
            samples, rate = read_wav(d.wav_path(u), expected_rate=16000)
            assert len(u.alignment) == num_frames(len(samples), rate)
            assert u.duration == pytest.approx(len(samples) / rate, abs=1e-3)


def test_alignments_are_acoustically_plausible(corpus):
    """Vowels are loud, sibilants are high-frequency, pauses are quiet: labels sit on the audio."""
    ids = lambda names: [TABLE.id(p) for p in names.split()]  # noqa: E731
    vowels, sibilants = ids("aa ae ah ao aw ay eh er ey ih iy ow oy uh uw"), ids("s sh z")
    energy = {"sil": [], "vowel": []}
    hf_share = {"vowel": [], "sibilant": []}
    for d in splits(corpus).values():
        for u in d.utterances.values():
            a = u.alignment
            assert a[0] == a[-1] == TABLE.silence_id and np.mean(a != TABLE.silence_id) > 0.5
            x, _ = read_wav(d.wav_path(u))
            x = np.pad(x.astype(np.float64), (0, 161 * len(a) - len(x) + 1))
            frames = np.stack([x[t * 160:t * 160 + 161] for t in range(len(a))])
            power = np.mean(frames[:, :160] ** 2, axis=1) + 1.0
            hf = np.mean(np.diff(frames, axis=1) ** 2, axis=1) / power  # first-difference energy share
            energy["sil"] += list(power[a == TABLE.silence_id])
            energy["vowel"] += list(power[np.isin(a, vowels)])
            hf_share["vowel"] += list(hf[np.isin(a, vowels)])
            hf_share["sibilant"] += list(hf[np.isin(a, sibilants)])
    assert np.mean(energy["vowel"]) > 1000 * np.mean(energy["sil"])
    assert np.median(hf_share["sibilant"]) > 4 * np.median(hf_share["vowel"])


def test_phones_match_espeak_and_boundaries_follow_events(tmp_path):
    """Frame labels spell exactly the phonemes espeak reports for the text (espeak_TextToPhonemes),
    and segment starts are espeak's event sample positions scaled to 16 kHz."""
    engine = espeak.engine()
    for job in synth.plan(synth.choose_speakers("espeak", SEED, 12), SEED, 12, None, tmp_path)[::3]:
        voice = job.speaker.voice
        reference = engine.text_to_phonemes(job.spoken, voice)
        syn = engine.synthesize(job.spoken, voice)
        assert [p for p, _ in syn.phonemes if p not in espeak.PAUSES] == reference
        expected = collapse(a for p in reference for a in espeak.ESPEAK_TO_ARPABET[p])
        audio, segments = synth.render(job)
        labels = synth.frame_alignment(segments, len(audio), TABLE, job.utt_id)
        assert collapse(p for p in collapse(TABLE.symbol(i) for i in labels) if p != "sil") == expected

        before = segments[0][1]
        event_starts = {before + round(s * 16000 / syn.sample_rate) for _, s in syn.phonemes}
        starts = [s for _, s, _ in segments]
        assert np.mean([s in event_starts for s in starts]) > 0.8  # the rest: second halves of compounds
        reference_labels = [next((p for p, s, e in segments if s <= min(t * 160 + 80, len(audio) - 1) < e), "sil")
                            for t in range(num_frames(len(audio), 16000))]
        assert [TABLE.symbol(i) for i in labels] == reference_labels


def test_splits_are_speaker_disjoint(corpus):
    data = splits(corpus)
    speakers = {name: set(d.speakers) for name, d in data.items()}
    assert all(speakers.values())
    assert not (speakers["train"] & speakers["test"] or speakers["train"] & speakers["valid"]
                or speakers["valid"] & speakers["test"])
    for d in data.values():
        ids = d.utt_ids
        assert [d.utterances[u].speaker for u in ids] == sorted(d.utterances[u].speaker for u in ids)
        assert all(u.startswith(d.utterances[u].speaker + "-") for u in ids)


def test_speaker_choice_for_a_large_corpus():
    chosen = synth.choose_speakers("espeak", 0, 1000)
    assert len(chosen) == 40 and len({s.id for s in chosen}) == 40
    assert {s.voice.variant for s in chosen} == set(synth.ESPEAK_VARIANTS)
    assert sorted(sum(s.split == name for s in chosen) for name in synth.SPLITS) == [4, 4, 32]
    assert [s.id for s in synth.choose_speakers("espeak", 0, 1000)] == [s.id for s in chosen]
    assert [s.id for s in synth.choose_speakers("espeak", 1, 1000)] != [s.id for s in chosen]
    with pytest.raises(ConfigError, match="at least 3"):
        synth.choose_speakers("espeak", 0, 2)


def tree(root: Path) -> dict[str, bytes]:
    """Every file's bytes, the corpus' own absolute path (in wav.scp, alignment.scp) made relative."""
    prefix = str(root.resolve()).encode() + b"/"
    return {str(p.relative_to(root)): p.read_bytes().replace(prefix, b"")
            for p in sorted(root.rglob("*")) if p.is_file()}


def test_same_seed_same_bytes_whatever_the_jobs(corpus, tmp_path):
    build(tmp_path / "again", jobs=1)
    assert tree(tmp_path / "again") == tree(corpus)
    build(tmp_path / "other", seed=SEED + 1)
    other, same = tree(tmp_path / "other"), tree(corpus)
    assert other["train/text"] != same["train/text"]
    assert other["summary.json"] != same["summary.json"]


def test_noise_keeps_alignment_and_reaches_the_snr(tmp_path):
    build(tmp_path / "clean", utterances=3)
    build(tmp_path / "noisy", utterances=3, noise_snr=10.0)
    clean, noisy = splits(tmp_path / "clean"), splits(tmp_path / "noisy")
    for name in synth.SPLITS:
        for utt_id, u in clean[name].utterances.items():
            v = noisy[name].utterances[utt_id]
            assert np.array_equal(u.alignment, v.alignment)
            x = read_wav(clean[name].wav_path(u))[0].astype(np.float64)
            y = read_wav(noisy[name].wav_path(v))[0].astype(np.float64)
            snr = 10 * np.log10(np.mean(x ** 2) / np.mean((y - x) ** 2))
            assert 7.0 < snr < 10.5  # padding lowers the whole file's power a little below the speech's


def test_flite_corpus_shares_the_phone_table(tmp_path):
    summary = build(tmp_path / "flite", utterances=9, synthesizer="flite")
    assert summary["synthesizer"] == "flite" and summary["speakers"] == 3
    assert (tmp_path / "flite" / "phones.txt").read_text() == TABLE.to_text()
    voices = set()
    for d in splits(tmp_path / "flite").values():
        assert len(d.utterances) == 3
        for u in d.utterances.values():
            samples, rate = read_wav(d.wav_path(u), expected_rate=16000)
            assert len(u.alignment) == num_frames(len(samples), rate)
            assert np.mean(u.alignment != TABLE.silence_id) > 0.5
            voices.add(u.speaker.split("-")[1])
    assert voices == set(flite.VOICES)


def test_flite_psdur_parsing_and_mapping():
    phones = flite.parse_psdur("pau:0.100 hh:0.150 ax:0.200 l:0.250 ow:0.400 pau:0.500\n", "u1")
    segments = flite.phone_segments(phones, 8000, 16000, "u1")
    assert segments == [("sil", 0, 1600), ("hh", 1600, 2400), ("ah", 2400, 3200), ("l", 3200, 4000),
                        ("ow", 4000, 6400), ("sil", 6400, 8000)]
    with pytest.raises(DataError, match="u1: flite phone 'qq'"):
        flite.phone_segments([("qq", 0.5)], 8000, 16000, "u1")
    with pytest.raises(DataError, match="u1: flite phone times end"):  # kal-like timings
        flite.phone_segments(phones, 9600, 16000, "u1")
    with pytest.raises(DataError, match="cannot parse"):
        flite.parse_psdur("pau:x", "u1")


def test_unmapped_phone_is_an_error_or_skipped(tmp_path, monkeypatch):
    mapping = dict(espeak.ESPEAK_TO_ARPABET)
    del mapping["N"]  # the "ng" of sing, young, morning
    monkeypatch.setattr(espeak, "ESPEAK_TO_ARPABET", mapping)
    out = tmp_path / "corpus"
    with pytest.raises(DataError, match=r"es-[a-z0-9]+-r\d+-p\d+-\d+: espeak phoneme 'N' has no ARPAbet mapping"):
        build(out, utterances=12)
    assert list(tmp_path.iterdir()) == []  # nothing half-written, no temporary directory left
    summary = build(out, utterances=12, skip_bad=True)
    assert 0 < summary["skipped"] < 12 and summary["utterances"] == 12 - summary["skipped"]
    assert all(v["phones"]["ng"] == 0 for v in summary["splits"].values())
    assert json.loads((out / "summary.json").read_text())["skipped"] == summary["skipped"]


def test_missing_synthesizers_are_one_line_errors(tmp_path, monkeypatch, capsys):
    monkeypatch.setattr(espeak, "LIBRARY", "libespeak-ng-missing.so.9")
    with pytest.raises(DataError, match="apt-get install espeak-ng libespeak-ng1"):
        build(tmp_path / "a")
    assert main(["corpus", "synth", str(tmp_path / "b"), "--utterances", "3"]) == DataError.exit_code
    err = capsys.readouterr().err.strip()
    assert err.startswith("asrdist: error: espeak-ng C library") and "\n" not in err
    monkeypatch.setattr(flite, "FLITE_BINARY", "flite-missing")
    with pytest.raises(DataError, match="apt-get install flite"):
        build(tmp_path / "c", synthesizer="flite")
    assert list(tmp_path.iterdir()) == []


def test_espeak_child_errors_reach_the_parent():
    class MissingVoice(espeak.EspeakVoice):
        name = "xx-no-such-language"

    with pytest.raises(DataError, match="espeak-ng: voice 'xx-no-such-language' not found"):
        espeak.engine().synthesize("Hello.", MissingVoice("m1", 170, 50))
    with pytest.raises(RuntimeError, match="espeak-ng child"):  # a bug is not reported as bad data
        espeak.engine().synthesize(None, espeak.EspeakVoice("m1", 170, 50))
    assert len(espeak.engine().synthesize("Hello.", espeak.EspeakVoice("m1", 170, 50)).samples) > 0


def test_existing_output_needs_overwrite(tmp_path, capsys):
    out = tmp_path / "corpus"
    out.mkdir()
    (out / "keep").write_text("x")
    with pytest.raises(AsrdistError, match="exists and is not empty"):
        build(out, utterances=3)
    assert (out / "keep").is_file()
    assert main(["corpus", "synth", str(out), "--utterances", "3", "--seed", "1", "--jobs", "1",
                 "--overwrite"]) == 0
    assert "3 utterances" in capsys.readouterr().out
    assert not (out / "keep").exists() and (out / "summary.json").is_file()
    assert [p.name for p in tmp_path.iterdir()] == ["corpus"]


def test_bad_arguments(tmp_path):
    with pytest.raises(ConfigError, match="--utterances"):
        build(tmp_path / "a", utterances=2)
    with pytest.raises(ConfigError, match="--jobs"):
        build(tmp_path / "b", jobs=-1)
    with pytest.raises(ConfigError, match="--noise-snr"):
        build(tmp_path / "c", noise_snr=float("nan"))
    with pytest.raises(ConfigError, match="--synthesizer"):
        build(tmp_path / "d", synthesizer="festival")
    assert list(tmp_path.iterdir()) == []


def test_sentences_are_deterministic_and_cover_the_phones():
    assert [sentence(3, i) for i in range(5)] == [sentence(3, i) for i in range(5)]
    assert [sentence(3, i) for i in range(5)] != [sentence(4, i) for i in range(5)]
    words, spoken = sentence(0, 0)
    assert spoken.lower().rstrip(".?") == words and words.replace(" ", "").isalpha()
    text = " ".join(sorted(vocabulary()))
    phonemes = espeak.engine().text_to_phonemes(text, espeak.EspeakVoice("m1", 170, 50))
    covered = {a for p in phonemes for a in espeak.ESPEAK_TO_ARPABET[p]}
    assert covered | {"sil"} == set(TABLE.symbols)
