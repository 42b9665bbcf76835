"""Kaldi data directory import / export: formats, checks, round trip, bad input."""
from __future__ import annotations

import json
from pathlib import Path

import kaldiio
import numpy as np
import pytest

from asrdist.cli import main
from asrdist.io.audio import num_frames, read_wav, write_wav
from asrdist.corpus.export_kaldi import export_kaldi_dir
from asrdist.corpus.import_kaldi import import_kaldi
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.errors import ConfigError, DataError
from asrdist.features.store import FeatureStore

RATE = 16000
UTTS = {"spkA-001": ("spkA", "hello world", 0.31), "spkA-002": ("spkA", "good bye", 0.22),
        "spkB-001": ("spkB", "yes", 0.27)}


def _samples(seconds: float, seed: int, rate: int = RATE) -> np.ndarray:
    return (np.random.default_rng(seed).standard_normal(int(seconds * rate)) * 1000).astype(np.int16)


def _alignment(utt_id: str, frames: int) -> np.ndarray:
    return (np.arange(frames) // 3 + len(utt_id)) % 40


def make_kaldi_dir(root: Path, alignment_format: str | None = "text", feats: bool = False) -> Path:
    """A plain Kaldi dir: audio in root/audio, relative wav paths, alignments in a chosen format."""
    src, audio = root / "kaldi", root / "audio"
    src.mkdir(parents=True)
    audio.mkdir(exist_ok=True)
    wav_scp, text, utt2spk, alignments, features = [], [], [], {}, {}
    for i, (utt_id, (spk, words, seconds)) in enumerate(sorted(UTTS.items())):
        samples = _samples(seconds, i)
        write_wav(audio / f"{utt_id}.wav", samples, RATE)
        wav_scp.append(f"{utt_id} ../audio/{utt_id}.wav")
        text.append(f"{utt_id} {words}")
        utt2spk.append(f"{utt_id} {spk}")
        frames = num_frames(len(samples), RATE)
        alignments[utt_id] = _alignment(utt_id, frames).astype(np.int32)
        features[utt_id] = np.random.default_rng(i).standard_normal((frames, 13)).astype(np.float32)
    for name, lines in (("wav.scp", wav_scp), ("text", text), ("utt2spk", utt2spk)):
        (src / name).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    if alignment_format == "text":
        (src / "ali.txt").write_text("".join(f"{u} {' '.join(map(str, a))}\n" for u, a in alignments.items()))
    elif alignment_format in ("ark", "scp"):
        kaldiio.save_ark(str(src / "ali.ark"), alignments, scp=str(src / "ali.scp"))
    if feats:
        kaldiio.save_ark(str(src / "feats.ark"), features, scp=str(src / "feats.scp"))
    return src


def _ali_arg(src: Path, fmt: str) -> list[str]:
    return {"text": ["--alignments", str(src / "ali.txt")], "ark": ["--alignments", str(src / "ali.ark")],
            "scp": ["--alignments", str(src / "ali.scp")]}.get(fmt, [])


@pytest.mark.parametrize("fmt", ["text", "ark", "scp"])
def test_import_reads_every_alignment_format(tmp_path: Path, fmt: str):
    src = make_kaldi_dir(tmp_path, fmt)
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "out"), *_ali_arg(src, fmt)]) == 0
    data = read_data_dir(tmp_path / "out")
    assert data.utt_ids == sorted(UTTS)
    for utt_id, (spk, words, seconds) in UTTS.items():
        utt = data.utterances[utt_id]
        assert (utt.speaker, utt.text) == (spk, words)
        assert Path(utt.wav) == (tmp_path / "audio" / f"{utt_id}.wav").resolve()
        assert utt.duration == pytest.approx(int(seconds * RATE) / RATE, abs=1e-3)
        frames = num_frames(int(seconds * RATE), RATE)
        np.testing.assert_array_equal(utt.alignment, _alignment(utt_id, frames))
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    assert summary["utterances"] == 3 and summary["speakers"] == 2 and summary["skipped"] == 0
    assert (tmp_path / "out" / "phones.txt").is_file()


def test_kaldi_snip_edges_alignment_is_padded(tmp_path: Path):
    src = make_kaldi_dir(tmp_path, None)
    lines = []
    for i, utt_id in enumerate(sorted(UTTS)):
        frames = num_frames(int(UTTS[utt_id][2] * RATE), RATE)
        lines.append(f"{utt_id} " + " ".join(str(1 + (k % 5)) for k in range(frames - 2)))
    (src / "ali.txt").write_text("\n".join(lines) + "\n")
    import_kaldi(src, tmp_path / "out", alignments=src / "ali.txt", progress=False)
    utt = read_data_dir(tmp_path / "out").utterances["spkA-001"]
    inner = np.array([1 + (k % 5) for k in range(len(utt.alignment) - 2)])
    np.testing.assert_array_equal(utt.alignment, np.concatenate([[1], inner, inner[-1:]]))


def test_round_trip_import_export_import(tmp_path: Path):
    """Segments + alignments + features survive import -> export -> import byte for byte."""
    src = make_kaldi_dir(tmp_path, "ark", feats=True)
    # Two utterances cut from one recording through `segments`.
    (src / "segments").write_text("seg-1 recA 0.000 0.150\nseg-2 recA 0.150 0.310\n")
    (src / "wav.scp").write_text("recA ../audio/spkA-001.wav\n")
    (src / "text").write_text("seg-1 hello\nseg-2 world\n")
    (src / "utt2spk").write_text("seg-1 spkA\nseg-2 spkA\n")
    frames = {"seg-1": num_frames(int(0.15 * RATE), RATE), "seg-2": num_frames(int(0.16 * RATE), RATE)}
    kaldiio.save_ark(str(src / "ali.ark"), {u: _alignment(u, n).astype(np.int32) for u, n in frames.items()})
    feats = {u: np.full((n, 13), i, dtype=np.float32) for i, (u, n) in enumerate(frames.items())}
    kaldiio.save_ark(str(src / "feats.ark"), feats, scp=str(src / "feats.scp"))

    first, exported, second = tmp_path / "first", tmp_path / "exported", tmp_path / "second"
    assert main(["corpus", "import-kaldi", str(src), str(first), "--alignments", str(src / "ali.ark")]) == 0
    assert main(["corpus", "export-kaldi", str(first), str(exported)]) == 0
    assert main(["corpus", "import-kaldi", str(exported), str(second)]) == 0  # finds alignment.scp

    data = read_data_dir(first)
    assert data.utterances["seg-2"].segment.start == pytest.approx(0.15)
    np.testing.assert_array_equal(FeatureStore(first)["seg-2"], feats["seg-2"])
    names = sorted(p.relative_to(first).as_posix() for p in first.rglob("*") if p.is_file())
    assert names == sorted(p.relative_to(second).as_posix() for p in second.rglob("*") if p.is_file())
    for name in names:
        if name == "alignment.scp":  # absolute paths: the same but for the directory
            assert (first / name).read_text().replace(str(first), str(second)) == (second / name).read_text()
        elif name != "summary.json":
            assert (first / name).read_bytes() == (second / name).read_bytes(), name
    # The export is a plain Kaldi dir: absolute paths, text alignment, kaldiio-readable tables.
    assert Path((exported / "wav.scp").read_text().split()[1]).is_absolute()
    text_ali = dict(line.split(maxsplit=1) for line in (exported / "alignment.txt").read_text().splitlines())
    ark_ali = kaldiio.load_scp(str(exported / "alignment.scp"))
    for utt_id in frames:
        np.testing.assert_array_equal(np.array(text_ali[utt_id].split(), dtype=int), ark_ali[utt_id])
        np.testing.assert_array_equal(kaldiio.load_scp(str(exported / "feats.scp"))[utt_id], feats[utt_id])


def test_export_of_a_whole_corpus(tmp_path: Path):
    src = make_kaldi_dir(tmp_path, "text")
    corpus = tmp_path / "corpus"
    import_kaldi(src, corpus / "train", alignments=src / "ali.txt", progress=False)
    import_kaldi(src, corpus / "test", progress=False)
    export_kaldi_dir(corpus, tmp_path / "kaldi_out")
    assert (tmp_path / "kaldi_out" / "train" / "alignment.txt").is_file()
    assert not (tmp_path / "kaldi_out" / "test" / "alignment.scp").exists()
    assert read_data_dir(tmp_path / "kaldi_out" / "test").utt_ids == sorted(UTTS)


def _break(src: Path, how: str) -> str:
    """Damage the fixture one way; return the utterance that is now bad."""
    wav = src.parent / "audio" / "spkA-002.wav"
    ali = src / "ali.txt"
    if how == "corrupt":
        wav.write_bytes(b"RIFF\x10\x00\x00\x00WAVEjunk")
    elif how == "empty":
        write_wav(wav, np.zeros(0, dtype=np.int16), RATE)
    elif how == "truncated":
        wav.write_bytes(wav.read_bytes()[:-200])
    elif how == "rate":
        write_wav(wav, _samples(0.22, 1, 8000), 8000)
    elif how == "transcript":
        lines = (src / "text").read_text().splitlines()
        (src / "text").write_text("".join(f"{line}\n" for line in lines if not line.startswith("spkA-002")))
    elif how in ("long", "short", "phone"):
        lines = []
        for line in ali.read_text().splitlines():
            utt, ids = line.split(maxsplit=1)
            if utt == "spkA-002":
                ids = {"long": ids + " 1 1", "short": " ".join(ids.split()[:-3]), "phone": ids + " 40"}[how]
                if how == "phone":
                    ids = " ".join(ids.split()[1:])
            lines.append(f"{utt} {ids}\n")
        ali.write_text("".join(lines))
    elif how == "utf8":
        (src / "text").write_bytes((src / "text").read_bytes().replace(b"good bye", b"gr\xfc\xdf gott"))
    elif how in ("pipe", "pipe-output"):  # a command that fails, or that prints no audio
        command = {"pipe": "sox in.flac -t wav - |", "pipe-output": "echo hello |"}[how]
        (src / "wav.scp").write_text((src / "wav.scp").read_text().replace(
            "spkA-002 ../audio/spkA-002.wav", f"spkA-002 {command}"))
    elif how in ("nan", "inf", "overshoot", "backwards", "empty-segment", "no-recording"):  # one bad segment
        times = {"nan": "nan nan", "inf": "0 inf", "overshoot": "0 0.8", "backwards": "0.2 0.1",
                 "empty-segment": "0.1 0.1", "no-recording": "0 -1"}[how]
        rec = {u: "nosuchrec" if how == "no-recording" and u == "spkA-002" else u for u in UTTS}
        (src / "segments").write_text("".join(f"{u} {rec[u]} {times if u == 'spkA-002' else '0 -1'}\n"
                                              for u in sorted(UTTS)))
    elif how == "speaker":  # an id alone on its line
        (src / "utt2spk").write_text((src / "utt2spk").read_text().replace("spkA-002 spkA", "spkA-002"))
    return "spkA-002"


@pytest.mark.parametrize("how,reason", [
    ("corrupt", "corrupt WAV"), ("empty", "empty audio"), ("truncated", "truncated WAV"),
    ("rate", "sample rate 8000 Hz, expected 16000 Hz"), ("transcript", "missing transcript"),
    ("long", "alignment has"), ("short", "alignment has"), ("phone", "unknown phone id 40"),
    ("utf8", "not valid UTF-8"), ("pipe", "command 'sox in.flac -t wav -' failed (exit code"),
    ("pipe-output", "the output of 'echo hello': corrupt WAV file (file does not start"),
    ("nan", "segments: utterance spkA-002: bad times"),
    ("inf", "segments: utterance spkA-002: bad times"),
    ("overshoot", "segment 0.000-0.800 s outside the recording (0.220 s; a segment may end at most 0.5 s after"),
    ("backwards", "segment 0.200-0.100 s ends before it starts"), ("empty-segment", "segment 0.100-0.100 s is empty"),
    ("no-recording", "segments: utterance spkA-002: recording 'nosuchrec' not in wav.scp"),
    ("speaker", "utt2spk:2: utterance spkA-002: no speaker")])
def test_bad_input_fails_cleanly_or_is_skipped(tmp_path: Path, capsys, how: str, reason: str):
    src = make_kaldi_dir(tmp_path, "text")
    bad_utt = _break(src, how)
    out = tmp_path / "out"
    args = ["corpus", "import-kaldi", str(src), str(out), "--alignments", str(src / "ali.txt")]
    assert main(args) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and bad_utt in err[0] and reason in err[0], err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]
    assert main(args + ["--skip-bad"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["skipped"] == 1 and summary["utterances"] == 2 and reason in summary["skipped_reasons"][0]
    assert bad_utt not in read_data_dir(out).utterances


@pytest.mark.parametrize("end", ["-1", "0.5"])
def test_features_of_a_segmented_import(tmp_path: Path, capsys, end: str):
    """The second segment runs to the recording's end: by -1, or by an end time 0.19 s after the
    0.31 s recording, which is cut at its end as Kaldi's extract-segments does (with a note)."""
    from asrdist.features.extract import extract_features
    from asrdist.features.fbank import compute_fbank

    src = make_kaldi_dir(tmp_path, None)
    (src / "segments").write_text(f"seg-1 recA 0.000 0.120\nseg-2 recA 0.120 {end}\n")
    (src / "wav.scp").write_text("recA ../audio/spkA-001.wav\n")
    (src / "text").write_text("seg-1 hello\nseg-2 world\n")
    (src / "utt2spk").write_text("seg-1 spkA\nseg-2 spkA\n")
    import_kaldi(src, tmp_path / "out", progress=False)
    note = [line for line in capsys.readouterr().err.splitlines() if "cut at its end" in line]
    assert len(note) == (end != "-1") and (not note or "1 segment(s) end 10 ms to 0.5 s after their recording" in note[0])
    assert read_data_dir(tmp_path / "out").utterances["seg-2"].segment.end == 0.31
    extract_features(tmp_path / "out", cmvn="none", jobs=1, progress=False)
    samples, _ = read_wav(tmp_path / "audio" / "spkA-001.wav")
    store = FeatureStore(tmp_path / "out")
    cut = int(0.12 * RATE)
    np.testing.assert_array_equal(store["seg-1"], compute_fbank(samples[:cut], RATE))
    np.testing.assert_array_equal(store["seg-2"], compute_fbank(samples[cut:], RATE))


def _tree(root: Path) -> dict[str, bytes]:
    return {p.relative_to(root).as_posix(): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_an_output_that_is_or_holds_the_source_is_refused_before_anything_is_deleted(tmp_path: Path, capsys):
    src = make_kaldi_dir(tmp_path, "text")
    before = _tree(tmp_path)
    for command, out, extra in (("import-kaldi", src, []), ("import-kaldi", tmp_path, ["--split", "train"]),
                                ("import-kaldi", src, ["--split", "train"]), ("export-kaldi", src, []),
                                ("export-kaldi", tmp_path, [])):
        assert main(["corpus", command, str(src), str(out), "--overwrite", *extra]) != 0
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and "output directory" in err[0] and "the input" in err[0], (command, out, err)
        assert _tree(tmp_path) == before, (command, out)
    # an alignment file (or lexicon) is an input too: OUT holding it would delete it
    elsewhere = tmp_path / "ali_dir"
    elsewhere.mkdir()
    (elsewhere / "ali.txt").write_bytes((src / "ali.txt").read_bytes())
    assert main(["corpus", "import-kaldi", str(src), str(elsewhere), "--overwrite",
                 "--alignments", str(elsewhere / "ali.txt")]) != 0
    assert "holds the input" in capsys.readouterr().err and (elsewhere / "ali.txt").is_file()


def test_an_output_that_is_a_file_or_lies_under_one_is_one_error(tmp_path: Path, capsys):
    src = make_kaldi_dir(tmp_path, None)
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    for out, message in ((afile, "is an existing file"), (afile / "sub", "afile is a file")):
        for extra in ([], ["--split", "train"]):
            assert main(["corpus", "import-kaldi", str(src), str(out), "--overwrite", *extra]) != 0
            err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
            assert len(err) == 1 and err[0].startswith("asrdist: error:") and message in err[0], err
    assert afile.read_text() == "keep\n"


def test_a_byte_order_mark_is_not_part_of_the_first_utterance_id(tmp_path: Path):
    src = make_kaldi_dir(tmp_path, None)
    for name in ("text", "utt2spk", "wav.scp"):
        (src / name).write_bytes(b"\xef\xbb\xbf" + (src / name).read_bytes())
    import_kaldi(src, tmp_path / "out", progress=False)
    data = read_data_dir(tmp_path / "out")
    assert data.utt_ids == sorted(UTTS) and data.utterances["spkA-001"].text == "hello world"
    (tmp_path / "out" / "text").write_bytes(b"\xef\xbb\xbf" + (tmp_path / "out" / "text").read_bytes())
    assert read_data_dir(tmp_path / "out").utterances["spkA-001"].text == "hello world"


def test_a_split_directory_with_a_speakerless_utt2spk_line_is_refused(tmp_path: Path):
    from asrdist.errors import DataError

    src = make_kaldi_dir(tmp_path, None)
    import_kaldi(src, tmp_path / "out", progress=False)
    utt2spk = tmp_path / "out" / "utt2spk"
    utt2spk.write_text(utt2spk.read_text().replace("spkB-001 spkB", "spkB-001"))
    with pytest.raises(DataError, match="utt2spk: utterance spkB-001: no speaker"):
        read_data_dir(tmp_path / "out")


def test_empty_transcripts_are_kept_and_counted(tmp_path: Path):
    src = make_kaldi_dir(tmp_path, None)
    (src / "text").write_text((src / "text").read_text().replace("spkB-001 yes", "spkB-001"))
    summary = import_kaldi(src, tmp_path / "out", progress=False)
    assert summary["utterances"] == 3 and summary["empty_transcripts"] == 1
    assert json.loads((tmp_path / "out" / "summary.json").read_text())["empty_transcripts"] == 1
    assert read_data_dir(tmp_path / "out").utterances["spkB-001"].text == ""


def test_flac_sphere_and_24_bit_recordings_import_as_their_16_bit_originals(tmp_path: Path):
    """Real corpora ship FLAC (LibriSpeech), NIST SPHERE named `.WAV` (TIMIT) or studio 24-bit WAV:
    imported and featurised in place, with exactly the features of the 16-bit WAVs they were made
    from."""
    soundfile = pytest.importorskip("soundfile")
    from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree

    if not FSDD.is_dir():
        pytest.skip(f"FSDD recordings not found at {FSDD}")
    plain = make_kaldi_tree(tmp_path / "plain", train=("george", "jackson"), test=("theo",))
    other = make_kaldi_tree(tmp_path / "other", train=("george", "jackson"), test=("theo",))
    for split in ("train", "test"):
        scp = other / split / "wav.scp"
        lines = []
        for n, line in enumerate(scp.read_text().splitlines()):
            utt, rel = line.split()
            wav = (scp.parent / rel).resolve()
            samples, rate = soundfile.read(wav, dtype="int16")
            if n % 3 == 1:
                new, kw = wav.with_suffix(".flac"), {"subtype": "PCM_16"}
            elif n % 3 == 2:
                new, kw = wav.with_name(wav.stem + "-timit.WAV"), {"subtype": "PCM_16", "format": "NIST"}
            else:
                new, kw = wav.with_name(wav.stem + "-24.wav"), {"subtype": "PCM_24"}
            soundfile.write(new, samples.astype(np.int32) * 65536, rate, **kw)
            lines.append(f"{utt} {new}")
        scp.write_text("\n".join(lines) + "\n")
    for tree, corpus in ((plain, tmp_path / "c16"), (other, tmp_path / "cflac")):
        assert main(["corpus", "import-kaldi", str(tree), str(corpus)]) == 0
        assert main(["features", str(corpus), "--cmvn", "none", "--num-mel-bins", "23", "--jobs", "1"]) == 0
    wavs = read_data_dir(tmp_path / "cflac" / "test")
    assert {Path(wavs.wav_path(u)).suffix for u in wavs.utterances.values()} == {".flac", ".wav", ".WAV"}
    a, b = FeatureStore(tmp_path / "c16" / "test"), FeatureStore(tmp_path / "cflac" / "test")
    assert a.utt_ids == b.utt_ids
    for utt in a.utt_ids:
        np.testing.assert_array_equal(np.array(a[utt]), np.array(b[utt]))


def test_command_pipes_in_wav_scp_are_run_and_their_audio_stored(tmp_path: Path):
    """Kaldi recipes list audio as commands (`flac -c -d -s x.flac |`, `sph2pipe ... |`): each is
    run once, its WAV output stored as OUT/audio/REC.wav, with the features of the file itself."""
    src = make_kaldi_dir(tmp_path, "text")
    direct, piped = tmp_path / "direct", tmp_path / "piped"
    assert main(["corpus", "import-kaldi", str(src), str(direct)]) == 0
    lines = (src / "wav.scp").read_text().splitlines()
    streamed = ("python3 -c 'import sys; b = open(sys.argv[1], \"rb\").read(); "
                "sys.stdout.buffer.write(b[:4] + bytes([255] * 4) + b[8:40] + bytes([255] * 4) + b[44:])'")
    commands = []
    for n, line in enumerate(lines):
        utt, rel = line.split()
        wav = (src / rel).resolve()
        # cat, and a writer that cannot seek back (sizes 0xFFFFFFFF, as sox leaves them in a pipe)
        commands.append(f"{utt} cat {wav} |" if n % 2 == 0 else f"{utt} {streamed} {wav} |")
    (src / "wav.scp").write_text("\n".join(commands) + "\n")
    with pytest.raises(DataError, match=r"wav.scp: utterance .*: a command pipe .*asrdist corpus import-kaldi"):
        read_data_dir(src)  # a split asrdist reads directly names the import that runs them
    assert main(["corpus", "import-kaldi", str(src), str(piped)]) == 0
    data = read_data_dir(piped)
    for utt in data.utt_ids:
        path = data.wav_path(data.utterances[utt])
        assert path == (piped / "audio" / f"{utt}.wav").resolve() and path.is_file()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".piped")]  # no temporary left
    for corpus in (direct, piped):
        assert main(["features", str(corpus), "--cmvn", "none", "--jobs", "1"]) == 0
    a, b = FeatureStore(direct), FeatureStore(piped)
    assert a.utt_ids == b.utt_ids
    for utt in a.utt_ids:
        np.testing.assert_array_equal(np.array(a[utt]), np.array(b[utt]))


def test_a_corpus_of_piped_data_directories_keeps_its_audio(tmp_path: Path):
    from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree

    if not FSDD.is_dir():
        pytest.skip(f"FSDD recordings not found at {FSDD}")
    tree = make_kaldi_tree(tmp_path, train=("george", "jackson"), test=("theo",))
    for split in ("train", "test"):
        scp = tree / split / "wav.scp"
        scp.write_text("".join(f"{u} cat {(scp.parent / rel).resolve()} |\n"
                               for u, rel in (line.split() for line in scp.read_text().splitlines())))
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(tree), str(out)]) == 0
    for split in ("train", "valid", "test"):
        data = read_data_dir(out / split)
        assert {data.wav_path(u).parent for u in data.utterances.values()} == {(out / "audio").resolve()}
    assert len(list((out / "audio").iterdir())) == 18  # 3 speakers x 3 digits x 2 takes, each once
    assert main(["features", str(out), "--jobs", "1"]) == 0


def test_wavs_inside_a_kaldi_archive_are_read_and_stored(tmp_path: Path, capsys):
    """`wav.ark:OFFSET` entries (as `wav-copy` writes them) are read by kaldiio and stored as
    OUT/audio/REC.wav, with the features of the WAV files they hold."""
    src = make_kaldi_dir(tmp_path, "text")
    direct, archived = tmp_path / "direct", tmp_path / "archived"
    assert main(["corpus", "import-kaldi", str(src), str(direct)]) == 0
    waves = {}
    for line in (src / "wav.scp").read_text().splitlines():
        utt, rel = line.split()
        samples, rate = read_wav(src / rel)
        waves[utt] = (rate, samples)
    kaldiio.save_ark(str(src / "wav.ark"), waves, scp=str(src / "wav.scp"))
    assert all(line.split()[1].startswith(str(src / "wav.ark:")) for line in (src / "wav.scp").read_text().splitlines())
    with pytest.raises(DataError, match=r"a Kaldi archive entry .*asrdist corpus import-kaldi"):
        read_data_dir(src)
    assert main(["corpus", "import-kaldi", str(src), str(archived)]) == 0
    data = read_data_dir(archived)
    assert {data.wav_path(u).parent for u in data.utterances.values()} == {(archived / "audio").resolve()}
    for corpus in (direct, archived):
        assert main(["features", str(corpus), "--cmvn", "none", "--jobs", "1"]) == 0
    a, b = FeatureStore(direct), FeatureStore(archived)
    for utt in a.utt_ids:
        np.testing.assert_array_equal(np.array(a[utt]), np.array(b[utt]))
    feats = src / "feats.ark"  # a matrix where a WAV should be: one line naming it
    kaldiio.save_ark(str(feats), {"x": np.zeros((3, 4), dtype=np.float32)}, scp=str(tmp_path / "f.scp"))
    offset = (tmp_path / "f.scp").read_text().split()[1].rsplit(":", 1)[1]
    (src / "wav.scp").write_text("".join(f"{u} {feats}:{offset}\n" for u in sorted(waves)))
    capsys.readouterr()
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "bad")]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "feats.ark" in err[0] and "holds a matrix, not a WAV" in err[0], err
    assert not (tmp_path / "bad").exists()


def test_a_stereo_archive_entry_needs_a_channel_it_has(tmp_path: Path, capsys):
    """An archived WAV goes through the reader's channel rule: one line without --channel or with a
    channel it lacks; the channel asked for with one."""
    src = make_kaldi_dir(tmp_path, "text")
    waves = {}
    for line in (src / "wav.scp").read_text().splitlines():
        utt, rel = line.split()
        samples, rate = read_wav(src / rel)
        waves[utt] = (rate, np.stack([samples, -samples], axis=1))
    kaldiio.save_ark(str(src / "wav.ark"), waves, scp=str(src / "wav.scp"))
    for extra, says in (([], "has 2 channels; pick one with --channel K (0..1)"),
                        (["--channel", "5"], "channel 5 asked for, ")):
        capsys.readouterr()
        assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "out"), *extra]) != 0
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and "wav.ark:" in err[0] and says in err[0], err
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "out"), "--channel", "1"]) == 0
    data = read_data_dir(tmp_path / "out")
    utt = data.utt_ids[0]
    np.testing.assert_array_equal(read_wav(data.wav_path(data.utterances[utt]))[0], waves[utt][1][:, 1])


def test_augmentation_refuses_imported_features_before_making_anything(tmp_path: Path):
    """Speed and noise copies are remade from the audio by asrdist's front end, and the frequency
    warp reads bins as a mel filterbank: neither can match imported Kaldi features (13-dim here)."""
    from asrdist.config import DataConfig
    from asrdist.features.augment import AUGMENTED_DIR, check_front_end

    src = make_kaldi_dir(tmp_path, None, feats=True)
    out = tmp_path / "split"
    assert main(["corpus", "import-kaldi", str(src), str(out)]) == 0
    check_front_end(out, DataConfig(speed_perturb=[1.0], noise_snr=None))  # no augmentation: fine
    for change, named in (({"speed_perturb": [0.9, 1.0, 1.1]}, "data.speed_perturb"),
                          ({"speed_perturb": [1.0], "noise_snr": 20.0}, "data.noise_snr"),
                          ({"speed_perturb": [1.0], "freq_warp": 0.1}, "data.freq_warp")):
        with pytest.raises(ConfigError, match=f"{named}: {out} trains on features imported from Kaldi"):
            check_front_end(out, DataConfig(**change))
    assert not (out / AUGMENTED_DIR).exists()


def test_transcripts_without_audio_and_speaker_tables_are_checked(tmp_path: Path, capsys):
    """A transcript whose utterance has no wav.scp entry is an error (or skipped and counted), as a
    wav.scp entry without a transcript is; spk2utt must agree with utt2spk, and stands in for it
    when utt2spk is missing (as Kaldi's spk2utt_to_utt2spk.pl does)."""
    src = make_kaldi_dir(tmp_path, None)
    out = tmp_path / "out"
    text = (src / "text").read_text()
    (src / "text").write_text(text + "spkA-009 lost words\n")
    assert main(["corpus", "import-kaldi", str(src), str(out)]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "text: 1 transcribed utterance(s) not in wav.scp (first: spkA-009)" in err[0], err
    assert not out.exists()
    assert main(["corpus", "import-kaldi", str(src), str(out), "--skip-bad"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["utterances"] == 3 and summary["skipped"] == 1 and "spkA-009" in summary["skipped_reasons"][0]
    (src / "text").write_text(text)
    capsys.readouterr()

    spk2utt = "spkA spkA-001 spkA-002\nspkB spkB-001\n"
    (src / "spk2utt").write_text(spk2utt.replace("spkA-002\nspkB spkB-001", "\nspkB spkB-001 spkA-002"))
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "contradicts")]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert len(err) == 1 and "spk2utt: utterance spkA-002 listed under speaker spkB, utt2spk says spkA" in err[0], err
    for table, message in ((spk2utt.replace(" spkA-002", ""), "spk2utt: utterance spkA-002 (speaker spkA in "
                                                                "utt2spk) is not listed"),
                           (spk2utt + "spkC spkC-001\n", "spk2utt: utterance spkC-001 (speaker spkC) is not in utt2spk")):
        (src / "spk2utt").write_text(table)
        assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "contradicts")]) != 0
        err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
        assert len(err) == 1 and message in err[0], err
    (src / "spk2utt").write_text(spk2utt)
    (src / "utt2spk").unlink()
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "derived")]) == 0
    derived = read_data_dir(tmp_path / "derived").utterances
    assert {u: d.speaker for u, d in derived.items()} == {"spkA-001": "spkA", "spkA-002": "spkA", "spkB-001": "spkB"}


def test_a_silent_recording_is_noted(tmp_path: Path, capsys):
    """A recording of zeros (a failed recording) imports, with a note naming it."""
    src = make_kaldi_dir(tmp_path, None)
    write_wav(tmp_path / "audio" / "spkA-002.wav", np.zeros(int(0.22 * RATE), dtype=np.int16), RATE)
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "out")]) == 0
    notes = [line for line in capsys.readouterr().err.splitlines() if "zero samples" in line]
    assert notes == [f"asrdist: note: {src / 'wav.scp'}: 1 recording(s) hold only zero samples (e.g. spkA-002): "
                     f"silence, whatever their transcripts say"], notes
