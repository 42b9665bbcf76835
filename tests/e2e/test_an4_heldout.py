"""A held-out set scored as docs/an4.md says: AN4 speakers the models never heard, made a Kaldi
data directory of their own and imported alone with `--lexicon` (lexicon.txt inside the split),
then `asrdist eval --data SPLIT` of a character CTC, a phone CTC and a hybrid model (trained a
minimal epoch on a few other speakers: it only has to run and score). The hybrid's PER comes
from the lexicon, without alignments, and no frame accuracy is claimed; eval prints Kaldi's
`%WER` / `%PER` lines and writes errs.txt."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from asrdist.cli import main
from tests.support.an4_slice import an4_slice
from tests.support.paths import AN4, CONFIGS

pytestmark = [
    pytest.mark.slow,
    pytest.mark.skipif(not (AN4 / "train.list").is_file(), reason=f"AN4 recordings not found at {AN4}"),
    pytest.mark.skipif(shutil.which("flac") is None, reason="the `flac` decoder is not installed "
                                                            "(scripts/system_deps.sh installs it)"),
]

TRAIN_SPEAKERS = ("fash", "fbbh", "fclc", "ffmm")
HELD_OUT = ("mcel",)
PER_SPEAKER = 4
TINY = ["--epochs", "1", "model.hidden_dim=16", "model.hidden_layers=1", "data.speed_perturb=[]", "train.threads=1"]
KALDI_LINE = r"%{} \d+\.\d\d \[ \d+ / \d+, \d+ ins, \d+ del, \d+ sub \]"


def _kaldi_dir(tmp_path: Path, name: str, speakers: tuple[str, ...]) -> Path:
    """A Kaldi data directory (NAME/train) of the first PER_SPEAKER utterances of `speakers`, made by
    the shipped script from a copy of its list (the audio linked from the shared directory)."""
    here = an4_slice(tmp_path / f"{name}-src", speakers, PER_SPEAKER)
    subprocess.run(["bash", str(here / "make_kaldi_dir.sh"), str(tmp_path / name)], check=True,
                   stdin=subprocess.DEVNULL, capture_output=True, timeout=600)
    return tmp_path / name / "train"


def _eval(run: Path, split: Path, capsys) -> tuple[dict, str]:
    capsys.readouterr()
    assert main(["eval", str(run), "--data", str(split)]) == 0
    return json.loads((run / "eval.json").read_text()), capsys.readouterr().out


def test_a_lone_held_out_split_is_scored_for_every_model_kind(tmp_path: Path, capsys):
    dic = str(AN4 / "etc" / "an4.dic")
    corpus, held_out = tmp_path / "corpus", tmp_path / "heldout"
    assert main(["corpus", "import-kaldi", str(_kaldi_dir(tmp_path, "train-kaldi", TRAIN_SPEAKERS)), str(corpus),
                 "--valid-speakers", "1", "--lexicon", dic]) == 0
    assert main(["corpus", "import-kaldi", str(_kaldi_dir(tmp_path, "test-kaldi", HELD_OUT)), str(held_out),
                 "--lexicon", dic]) == 0
    assert (held_out / "lexicon.txt").is_file() and not (tmp_path / "lexicon.txt").exists()

    chars = tmp_path / "chars"
    assert main(["train", str(CONFIGS / "an4_chars.yaml"), "--data", str(corpus), "--out", str(chars), *TINY]) == 0
    result, out = _eval(chars, held_out, capsys)
    assert result["utterances"] == PER_SPEAKER and {"cer", "wer"} <= set(result)
    assert re.search(KALDI_LINE.format("WER"), out) and re.search(KALDI_LINE.format("CER"), out), out
    assert (chars / "errs.txt").read_text().startswith("%WER ")

    phones = tmp_path / "phones"
    assert main(["train", str(CONFIGS / "an4_phones.yaml"), "--data", str(corpus), "--out", str(phones), *TINY]) == 0
    result, out = _eval(phones, held_out, capsys)  # the old code looked for lexicon.txt above the split
    assert result["utterances"] == PER_SPEAKER and 0 <= result["per"]
    assert re.search(KALDI_LINE.format("PER"), out), out

    assert main(["align", str(phones), "--data", str(corpus)]) == 0  # the hybrid trains on alignments
    assert not (held_out / "alignment.scp").exists()
    hybrid = tmp_path / "hybrid"
    assert main(["train", str(CONFIGS / "an4_hybrid.yaml"), "--data", str(corpus), "--out", str(hybrid), *TINY]) == 0
    result, out = _eval(hybrid, held_out, capsys)  # the old code refused a split without alignment.scp
    assert result["utterances"] == PER_SPEAKER and 0 <= result["per"] and result["reference"] == "lexicon"
    assert "frame_accuracy" not in result and "loss" not in result
    assert re.search(KALDI_LINE.format("PER"), out), out
    counts = result["error_counts"]["per"]
    assert counts["errors"] == counts["ins"] + counts["del"] + counts["sub"]
    # where the split has alignments, frame accuracy is reported as before
    valid, _ = _eval(hybrid, corpus / "valid", capsys)
    assert "frame_accuracy" in valid and "reference" not in valid
