"""AN4 end to end on a slice of the shared recordings (docs/an4.md): the shipped script writes the
Kaldi directory, `corpus import-kaldi` makes the corpus (valid by whole speakers, lexicon kept),
`train` runs one epoch of configs/an4_chars.yaml (shrunk) with its progress lines, `eval` writes
eval.json, hyp.txt and prints the per-speaker table, `decode` transcribes one recording."""
from __future__ import annotations

import json
import shutil
import subprocess
from pathlib import Path

import pytest

from asrdist.cli import main
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.an4_slice import an4_slice
from tests.support.paths import ROOT

AN4 = ROOT.parent / "shared" / "data" / "an4"
SPEAKERS = 4
PER_SPEAKER = 5

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (AN4 / "train.list").is_file(), reason=f"AN4 recordings not found at {AN4}"),
    pytest.mark.skipif(shutil.which("flac") is None, reason="the `flac` decoder is not installed "
                                                            "(scripts/system_deps.sh installs it)"),
]


def test_an4_slice_from_recordings_to_words(tmp_path: Path, capsys):
    an4 = an4_slice(tmp_path / "an4", SPEAKERS, PER_SPEAKER)
    subprocess.run(["bash", str(an4 / "make_kaldi_dir.sh"), str(tmp_path / "kaldi")], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    corpus = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(tmp_path / "kaldi" / "train"), str(corpus), "--valid-speakers", "1",
                 "--lexicon", str(AN4 / "etc" / "an4.dic")]) == 0
    train, valid = read_data_dir(corpus / "train"), read_data_dir(corpus / "valid")
    assert len(train.speakers) == SPEAKERS - 1 and len(valid.speakers) == 1
    assert len(train.utterances) + len(valid.utterances) == SPEAKERS * PER_SPEAKER
    words = {w.lower() for d in (train, valid) for u in d.utterances.values() for w in u.text.split()}
    assert {line.split()[0] for line in (corpus / "lexicon.txt").read_text().splitlines()} == words
    capsys.readouterr()

    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs" / "an4_chars.yaml"), "--data", str(corpus), "--out", str(run),
                 "--epochs", "1", "model.hidden_dim=16", "model.hidden_layers=1", "data.speed_perturb=[]",
                 "train.threads=1"]) == 0
    err = capsys.readouterr().err
    # not a terminal: plain progress lines, the last at the epoch's end
    progress = [line for line in err.splitlines() if line.startswith("[asrdist] epoch 1/1: ")]
    assert progress and "minibatches (100%)" in progress[-1] and "frames/s" in progress[-1], err

    assert main(["eval", str(run), "--data", str(corpus / "valid")]) == 0
    printed = capsys.readouterr().out
    result = json.loads((run / "eval.json").read_text())
    assert 0 <= result["cer"] and result["vocabulary"] == "train"
    hyps = (run / "hyp.txt").read_text().splitlines()
    assert [line.split(maxsplit=1)[0] for line in hyps] == valid.utt_ids
    assert f"\n{valid.speakers[0]} " in printed and "\nall " in printed  # the per-speaker table

    # the word bigram of the training transcripts in the same search
    assert main(["eval", str(run), "--data", str(corpus / "valid"), "--lm-weight", "0.5", "--out",
                 str(run / "lm.json")]) == 0
    capsys.readouterr()
    assert json.loads((run / "lm.json").read_text())["lm_weight"] == 0.5
    assert (run / "lm.hyp.txt").is_file()

    wav = valid.wav_path(valid.utterances[valid.utt_ids[0]])
    assert main(["decode", str(run), str(wav)]) == 0
    (line,) = capsys.readouterr().out.splitlines()
    utt, _, text = line.partition(" ")
    assert utt == wav.stem
    # held to the training words: whatever it says is made of them
    spoken = {w.lower() for u in train.utterances.values() for w in u.text.split()}  # characters lowercased
    assert set(text.split()) <= spoken
