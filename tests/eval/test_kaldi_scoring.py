"""Scores as Kaldi and icefall users read them (asrdist/eval/kaldi_scoring.py): the `%WER` line's
exact form, errs.txt's alignments, `eval --bootstrap`'s intervals from kaldialign; and `asrdist
decode --scp wav.scp`. A character CTC model trained a few steps on real FSDD digits."""
from __future__ import annotations

import json
import re
from pathlib import Path

import kaldialign
import pytest

from asrdist.cli import main
from asrdist.eval.kaldi_scoring import bootstrap, bootstrap_line, errs_path, errs_text, kaldi_line
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree

RECIPE = """seed: 0
data: {corpus: CORPUS, num_mel_bins: 40, cmvn: global, targets: chars, batch_size: 1500}
model: {name: ctc, hidden_layers: 1, hidden_dim: 24, subsample: 2}
optim: {name: sgd, lr: 0.3, momentum: 0.9, warmup_steps: 0}
train: {epochs: 1, log_every: 2, threads: 1}
"""


def test_the_wer_line_is_kaldis():
    counts = {"errors": 97, "ref_length": 773, "ins": 10, "del": 15, "sub": 72}
    assert kaldi_line("wer", counts) == "%WER 12.55 [ 97 / 773, 10 ins, 15 del, 72 sub ]"
    assert kaldi_line("per", {**counts, "errors": 0, "ins": 0, "del": 0, "sub": 0}) == \
        "%PER 0.00 [ 0 / 773, 0 ins, 0 del, 0 sub ]"
    assert bootstrap_line("cer", {"rate": 0.1255, "low": 0.102, "high": 0.149}) == \
        "%CER 12.55 95% Conf Interval [ 10.20, 14.90 ]"
    assert errs_path(Path("r/eval.json")) == Path("r/errs.txt")
    assert errs_path(Path("r/lm.json")) == Path("r/lm.errs.txt")


def test_errs_file_aligns_each_utterance_and_counts_the_errors():
    records = [{"utt": "b", "ref": "one two three", "hyp": "one too three four"},
               {"utt": "a", "ref": "five six", "hyp": "six"}]
    text = errs_text(records, "wer").splitlines()
    assert text[0] == "%WER 60.00 [ 3 / 5, 1 ins, 1 del, 1 sub ]"
    assert text[1] == "Errors: 1 insertions, 1 deletions, 1 substitutions, over 5 reference words (3 correct)"
    details = text[text.index("PER-UTT DETAILS: corr or (ref->hyp)") + 1:]
    assert details[:2] == ["a:\t(five->*) six", "b:\tone (two->too) three (*->four)"]
    assert text[text.index("SUBSTITUTIONS: count ref -> hyp") + 1] == "1   two -> too"
    assert text[text.index("DELETIONS: count ref") + 1] == "1   five"
    assert text[text.index("INSERTIONS: count hyp") + 1] == "1   four"
    stats = text[text.index("PER-WORD STATS: word  corr tot_errs count_in_ref count_in_hyp") + 1:]
    assert "six   1 0 1 1" in stats and "two   0 1 1 0" in stats and "too   0 1 0 1" in stats


def test_bootstrap_is_kaldialigns():
    refs = [["a", "b", "c"], ["d", "e"], ["f"]] * 4
    hyps = [["a", "x", "c"], ["d", "e"], []] * 4
    (interval,) = bootstrap({"wer": (refs, hyps)}, replications=500, seed=3).values()
    expected = kaldialign.bootstrap_wer_ci(refs, hyps, replications=500, seed=3)
    assert interval["rate"] == pytest.approx(expected["wer"], abs=1e-6)
    assert interval["low"] == pytest.approx(expected["ci95min"], abs=1e-6)
    assert interval["high"] == pytest.approx(expected["ci95max"], abs=1e-6)
    assert interval["low"] < interval["rate"] < interval["high"]
    assert bootstrap({"wer": ([], [])}) == {}


needs_fsdd = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


@pytest.fixture(scope="module")
def char_run(tmp_path_factory):
    root = tmp_path_factory.mktemp("kaldi_scoring")
    corpus = root / "corpus"
    assert main(["corpus", "import-kaldi", str(make_kaldi_tree(root)), str(corpus)]) == 0
    recipe = root / "chars.yaml"
    recipe.write_text(RECIPE.replace("CORPUS", str(corpus)))
    assert main(["train", str(recipe), "--out", str(root / "run"), "--no-progress"]) == 0
    return root / "run", corpus


def _numbers(line: str) -> list[float]:
    return [float(x) for x in re.findall(r"\d+(?:\.\d+)?", line)]


@needs_fsdd
def test_eval_prints_kaldi_lines_keeps_the_counts_and_writes_errs(char_run, capsys):
    run, corpus = char_run
    capsys.readouterr()
    assert main(["eval", str(run), "--data", str(corpus), "--bootstrap"]) == 0
    out = capsys.readouterr().out.splitlines()
    result = json.loads((run / "eval.json").read_text())
    for metric in ("wer", "cer"):
        counts = result["error_counts"][metric]
        assert counts["errors"] == counts["ins"] + counts["del"] + counts["sub"]
        assert counts["errors"] / counts["ref_length"] == pytest.approx(result[metric])
        assert kaldi_line(metric, counts) in out
        (line,) = [x for x in out if x.startswith(f"%{metric.upper()} ") and "Conf Interval" in x]
        interval = result["bootstrap"][metric]
        assert interval["low"] <= interval["rate"] <= interval["high"] and interval["replications"] == 10000
        assert line == bootstrap_line(metric, interval)
    test = read_data_dir(corpus / "test")
    hyps = dict(line.split(" ", 1) if " " in line else (line, "") for line in
                (run / "hyp.txt").read_text().splitlines())
    errs = (run / "errs.txt").read_text().splitlines()
    assert errs[0] == kaldi_line("wer", result["error_counts"]["wer"])
    details = errs[errs.index("PER-UTT DETAILS: corr or (ref->hyp)") + 1:errs.index("SUBSTITUTIONS: count ref -> hyp") - 1]
    assert [d.split(":\t")[0] for d in details] == test.utt_ids
    for d in details:  # each line is the reference read through the marks, and the hypothesis likewise
        utt, marked = d.split(":\t")
        tokens = re.findall(r"\(([^()]*)->([^()]*)\)|(\S+)", marked)
        assert [t[2] or t[0] for t in tokens if (t[2] or t[0]) != "*"] == test.utterances[utt].text.split()
        assert [t[2] or t[1] for t in tokens if (t[2] or t[1]) != "*"] == hyps[utt].split()
    capsys.readouterr()
    assert main(["eval", str(run), "--data", str(corpus), "--out", str(run / "plain.json")]) == 0
    assert "bootstrap" not in json.loads((run / "plain.json").read_text())
    assert "Conf Interval" not in capsys.readouterr().out and (run / "plain.errs.txt").is_file()


@needs_fsdd
def test_decode_reads_a_wav_scp(char_run, tmp_path, capsys):
    run, corpus = char_run
    test = read_data_dir(corpus / "test")
    wavs = [test.wav_path(test.utterances[u]) for u in test.utt_ids[:3]]
    (tmp_path / "audio").mkdir()
    for i, wav in enumerate(wavs):  # a relative path is read from the wav.scp's directory
        (tmp_path / "audio" / f"f{i}.wav").symlink_to(wav)
    scp = tmp_path / "wav.scp"
    scp.write_text("".join(f"utt-{i} audio/f{i}.wav\n" for i in range(len(wavs))), encoding="utf-8")
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs)]) == 0
    by_path = [line.partition(" ")[2] for line in capsys.readouterr().out.splitlines()]
    assert main(["decode", str(run), "--scp", str(scp), "--out", str(tmp_path / "out.txt")]) == 0
    printed = capsys.readouterr().out.splitlines()
    assert [line.partition(" ")[0] for line in printed] == ["utt-0", "utt-1", "utt-2"]
    assert [line.partition(" ")[2] for line in printed] == by_path
    assert (tmp_path / "out.txt").read_text().splitlines() == printed
    # its ids are those --utt2spk names
    (tmp_path / "utt2spk").write_text("utt-0 s\nutt-1 s\nutt-2 s\n")
    assert main(["decode", str(run), "--scp", str(scp), "--utt2spk", str(tmp_path / "utt2spk")]) == 0
    capsys.readouterr()

    for entry, what in ((f"flac -c -d -s {wavs[0]} |", "a command pipe"), ("wav.ark:123", "a Kaldi archive entry")):
        bad = tmp_path / "bad.scp"
        bad.write_text(f"utt-0 audio/f0.wav\nutt-1 {entry}\n", encoding="utf-8")
        assert main(["decode", str(run), "--scp", str(bad)]) != 0
        captured = capsys.readouterr()
        err = captured.err.strip().splitlines()
        assert len(err) == 1 and f"{bad}: utterance utt-1: {what}" in err[0], err
        assert captured.out == ""  # refused before anything is decoded
    for argv, said in (([str(wavs[0]), "--scp", str(scp)], "not both"), ([], "give audio files")):
        assert main(["decode", str(run), *argv]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and said in err[0], err
