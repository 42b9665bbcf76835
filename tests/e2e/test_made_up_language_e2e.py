"""A language that is not English, end to end: real FSDD recordings transcribed with a made-up
language's words, whose lexicon's phones ("a", "ɲ", "tʃ", "ŋ̊") become the corpus' inventory;
a phone CTC model trained one epoch on it, evaluated through that lexicon (words from its phones),
and the model aligning the corpus in those phones."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrdist.cli import main
from asrdist.corpus.phones import PhoneTable
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree

pytestmark = [pytest.mark.slow,
              pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")]

WORDS = {"zero": "ɲatʃa", "one": "ŋ̊a", "two": "tʃaɲ"}
LEXICON = "ɲatʃa ɲ a tʃ a\nŋ̊a ŋ̊ a\ntʃaɲ tʃ a ɲ\n"


def test_a_made_up_language_imports_trains_and_evaluates(tmp_path: Path, capsys):
    src = make_kaldi_tree(tmp_path)
    for text in src.glob("*/text"):
        lines = [line.split() for line in text.read_text().splitlines()]
        text.write_text("".join(f"{u} {WORDS[w]}\n" for u, w in lines), encoding="utf-8")
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text(LEXICON, encoding="utf-8")
    corpus = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(corpus), "--lexicon", str(lexicon)]) == 0
    table = PhoneTable.read(corpus / "phones.txt")
    assert table.symbols == ("sil", "a", "tʃ", "ŋ̊", "ɲ")

    recipe = tmp_path / "phones.yaml"
    recipe.write_text(f"""seed: 0
data: {{corpus: {corpus}, num_mel_bins: 23, cmvn: speaker, targets: phones, batch_size: 1500}}
model: {{name: ctc, hidden_layers: 1, hidden_dim: 24, subsample: 2}}
optim: {{name: sgd, lr: 0.3, momentum: 0.9, warmup_steps: 0}}
train: {{epochs: 1, threads: 1}}
eval: {{beam: 4, vocabulary: train}}
""", encoding="utf-8")
    run = tmp_path / "run"
    assert main(["train", str(recipe), "--out", str(run), "--no-progress"]) == 0

    assert main(["eval", str(run), "--data", str(corpus)]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["utterances"] == len(read_data_dir(corpus / "test").utt_ids) > 0
    assert 0.0 <= result["per"] and 0.0 <= result["wer"] <= 1.0
    hyps = [line.split()[1:] for line in (run / "hyp.txt").read_text(encoding="utf-8").splitlines()]
    assert all(len(h) == 1 and h[0] in WORDS.values() for h in hyps)  # words of the language, by its phones

    capsys.readouterr()
    assert main(["align", str(run), "--data", str(corpus), "--no-progress"]) == 0
    aligned = read_data_dir(corpus / "test")
    for utt in aligned.utterances.values():
        spoken = {table.symbol(int(p)) for p in set(utt.alignment.tolist())} - {"sil"}
        word = utt.text
        assert spoken <= set(LEXICON.split(f"{word} ")[1].split("\n")[0].split())  # its own word's phones
