"""Word-constrained decoding for phone CTC models (`eval.vocabulary` with data.targets=phones): the
words' pronunciations from a lexicon, searched as characters are (checked against brute force),
read back as words; and end to end on real FSDD digits, eval scoring words and decode printing them."""
from __future__ import annotations

import itertools
import json
from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.corpus.lexicon import Lexicon
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import DataError
from asrdist.eval.vocabulary import PronouncedSearch
from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree
from tests.support.ctc_reference import (
    best_path_log_prob,
    following_words_best_paths,
    labelling_log_prob,
    sequences,
)

DIGITS = ("zero z ih r ow\nzero z iy r ow\none w ah n\ntwo t uw\nthree th r iy\nfour f ao r\nfive f ay v\n"
          "six s ih k s\nseven s eh v ah n\neight ey t\nnine n ay n\n")


def _lexicon(tmp_path: Path, text: str) -> Lexicon:
    path = tmp_path / "lexicon.txt"
    path.write_text(text)
    return Lexicon.read(path, PhoneTable())


def _random_phone_posteriors(prons, seed: int) -> np.ndarray:
    symbols = sorted({p for pron in prons for p in pron})
    rng = np.random.default_rng(seed)
    frames = rng.dirichlet(np.full(len(symbols) + 1, 0.5), size=6)  # blank and the four phones; the rest ~0
    probs = np.full((6, len(PhoneTable())), 1e-9)
    probs[:, [0, *symbols]] = frames
    return np.log(probs / probs.sum(1, keepdims=True))


@pytest.mark.parametrize("seed", range(4))
def test_the_prefix_search_finds_the_most_probable_pronunciation_sequence(tmp_path: Path, seed: int):
    # eval.decoder prefix (the default): each sequence by its summed CTC probability
    lexicon = _lexicon(tmp_path, "a t uw\na t ah\nb t uw\nc t uw ey\nd ey\n")
    search = PronouncedSearch(lexicon, ["a", "b", "c", "d"], beam=10_000)
    prons = sorted(search.word_of)
    log_probs = _random_phone_posteriors(prons, seed)
    best = max(sequences(prons, None, 6), key=lambda s: (labelling_log_prob(log_probs, s), s))
    found = search.search(log_probs)
    assert np.isclose(labelling_log_prob(log_probs, found), labelling_log_prob(log_probs, best))
    single = PronouncedSearch(lexicon, ["a", "b", "c", "d"], beam=10_000, one_word=True).search(log_probs)
    assert tuple(single) in prons
    assert np.isclose(labelling_log_prob(log_probs, single), max(labelling_log_prob(log_probs, p) for p in prons))


@pytest.mark.parametrize("seed", range(4))
def test_search_finds_the_most_probable_pronunciation_sequence(tmp_path: Path, seed: int):
    # eval.decoder flashlight: each sequence by its best path
    # two pronunciations of one word, a homophone, and a pronunciation that is a prefix of another
    lexicon = _lexicon(tmp_path, "a t uw\na t ah\nb t uw\nc t uw ey\nd ey\n")
    search = PronouncedSearch(lexicon, ["a", "b", "c", "d"], beam=10_000, decoder="flashlight")
    prons = sorted(search.word_of)
    log_probs = _random_phone_posteriors(prons, seed)
    scores = following_words_best_paths(search.decoder, log_probs, prons)
    found = search.search(log_probs)
    assert scores[tuple(found)] == pytest.approx(max(scores.values()), abs=1e-4)
    said = search.words(found)  # the words the search read, which pronounced make its tokens
    assert said and any(sum(prons, ()) == tuple(found)
                        for prons in itertools.product(*(search.spellings[w] for w in said)))
    single = PronouncedSearch(lexicon, ["a", "b", "c", "d"], beam=10_000, one_word=True,
                              decoder="flashlight").search(log_probs)
    assert tuple(single) in prons
    assert best_path_log_prob(log_probs, single) == pytest.approx(
        max(best_path_log_prob(log_probs, p) for p in prons), abs=1e-4)



def test_hypotheses_read_back_as_the_fewest_words(tmp_path: Path, capsys):
    lexicon = _lexicon(tmp_path, "a t uw\na t ah\nb t uw\nc t uw ey\nd ey\nzz ey ey\n")
    search = PronouncedSearch(lexicon, ["a", "b", "c", "d", "missing"], beam=4)
    assert "1 of 5 words have no pronunciation" in capsys.readouterr().err
    assert search.num_words == 3  # b is a homophone of a: a pronunciation reads back as its first word
    t, uw, ah, ey = (PhoneTable().id(p) for p in ("t", "uw", "ah", "ey"))
    assert search.words([t, uw]) == ["a"] and search.words([t, ah]) == ["a"]
    assert search.words([t, uw, ey]) == ["c"]  # one word rather than "a d"
    assert search.words([t, uw, ey, ey]) == ["c", "d"]  # zz is not in the vocabulary
    # what speaker adaptation scores each word by (eval.adapt_word_balance): its pronunciations
    assert {w: sorted(p) for w, p in search.spellings.items()} == {
        "a": sorted([(t, uw), (t, ah)]), "c": [(t, uw, ey)], "d": [(ey,)]}
    assert search.word_key("A") == "a"
    assert search.words([t, ey]) == [] and search.words([]) == []
    with pytest.raises(DataError, match="none of its 1 words is in the lexicon"):
        PronouncedSearch(lexicon, ["missing"], beam=4)


@pytest.fixture(scope="module")
def phone_run(tmp_path_factory):
    """A phone CTC model trained a few steps on FSDD digits imported with a lexicon."""
    if not FSDD.is_dir():
        pytest.skip(f"FSDD recordings not found at {FSDD}")
    root = tmp_path_factory.mktemp("phone_vocab")
    lexicon = root / "digits.dict"
    lexicon.write_text(DIGITS)
    corpus = root / "corpus"
    assert main(["corpus", "import-kaldi", str(make_kaldi_tree(root)), str(corpus), "--lexicon", str(lexicon)]) == 0
    recipe = root / "phones.yaml"
    recipe.write_text(f"""seed: 0
data: {{corpus: {corpus}, num_mel_bins: 23, cmvn: speaker, targets: phones, batch_size: 1500}}
model: {{name: ctc, hidden_layers: 1, hidden_dim: 24, subsample: 2}}
optim: {{name: sgd, lr: 0.3, momentum: 0.9, warmup_steps: 0}}
train: {{epochs: 2, threads: 1}}
eval: {{beam: 4, vocabulary: train}}
""")
    run = root / "run"
    assert main(["train", str(recipe), "--out", str(run), "--no-progress"]) == 0
    return run, corpus, root


def test_eval_and_decode_of_a_phone_model_say_words(phone_run, capsys):
    run, corpus, root = phone_run
    assert main(["eval", str(run), "--data", str(corpus)]) == 0
    result = json.loads((run / "eval.json").read_text())
    assert result["vocabulary"] == "train" and 0.0 <= result["wer"] <= 1.0 and 0.0 <= result["per"]
    train_words = {"zero", "one", "two"}  # make_kaldi_tree's digits
    lines = (run / "hyp.txt").read_text().splitlines()
    hyps = [line.split()[1:] for line in lines]
    assert len(lines) == result["utterances"] > 0
    assert all(len(h) == 1 and h[0] in train_words for h in hyps)  # isolated words: one word each
    references = {u.split("-")[1] for u in (line.split()[0] for line in lines)}
    assert references == {"0", "1", "2"}
    # sentence accuracy counts words: hyp.txt against the digit in each utterance id
    right = sum(h[0] == ("zero", "one", "two")[int(line.split()[0].split("-")[1])] for h, line in zip(hyps, lines))
    assert result["sentence_accuracy"] == pytest.approx(right / len(lines))
    test = sorted((root / "audio").glob("theo-*.wav"))
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, test), "--same-speaker"]) == 0
    decoded = dict(line.split(maxsplit=1) for line in capsys.readouterr().out.splitlines())
    assert set(decoded.values()) <= train_words and len(decoded) == len(test)
    assert [decoded[p.stem] for p in test] == [h[0] for h in hyps]  # decode says what eval says


def test_a_phone_model_needs_pronunciations(phone_run, capsys):
    run, corpus, root = phone_run
    words = root / "words.txt"
    words.write_text("one\ntwo\n")
    wav = next((root / "audio").glob("theo-*.wav"))
    capsys.readouterr()
    assert main(["decode", str(run), str(wav), "--vocabulary", str(words)]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs a lexicon" in err and "words.txt:1: word 'one' has no phones" in err
    (corpus / "lexicon.txt").rename(root / "kept.txt")
    try:
        assert main(["decode", str(run), str(wav)]) != 0  # the recipe's eval.vocabulary=train
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and "corpus lexicon" in err and "lexicon.txt), which is missing" in err
    finally:
        (root / "kept.txt").rename(corpus / "lexicon.txt")


def test_the_run_keeps_its_training_lm_and_eval_takes_an_lm_and_a_lexicon(phone_run, capsys):
    from flashlight.lib.text.dictionary import Dictionary

    from asrdist.eval.lexdecoder import load_kenlm

    run, corpus, root = phone_run
    words = Dictionary()
    for w in ("zero", "one", "two"):
        words.add_entry(w)
    lm = load_kenlm(run / "lm.arpa", words)  # written at training, valid: KenLM reads it
    assert lm.score(lm.start(False), 0)[1] > -2.0  # a training word, not <unk>
    lexicon = root / "own.dict"
    lexicon.write_text(DIGITS.replace("zero z iy r ow\n", ""))
    out = root / "lm-eval.json"
    assert main(["eval", str(run), "--data", str(corpus), "--lexicon", str(lexicon), "--lm-weight", "0.5",
                 "--out", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["lm"] == str(run / "lm.arpa") and result["lm_weight"] == 0.5 and result["decoder"] == "prefix"
    assert main(["eval", str(run), "--data", str(corpus), "--lexicon", str(lexicon), "--lm-weight", "0.5",
                 "--decoder", "flashlight", "--out", str(root / "fl-eval.json")]) == 0
    assert json.loads((root / "fl-eval.json").read_text())["decoder"] == "flashlight"
    capsys.readouterr()
    assert main(["eval", str(run), "--data", str(corpus), "--decoder", "viterbi"]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "eval.decoder: expected prefix or flashlight, got 'viterbi'" in err
    hyps = [line.split()[1:] for line in (root / "lm-eval.hyp.txt").read_text().splitlines()]
    assert hyps and all(len(h) == 1 and h[0] in {"zero", "one", "two"} for h in hyps)
    for flag, why in (("--lm", "language model not found"), ("--lexicon", "lexicon not found")):
        capsys.readouterr()
        missing = root / "missing.txt"
        assert main(["eval", str(run), "--data", str(corpus), flag, str(missing), "--lm-weight", "0.5"]) != 0
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and f"eval.{flag[2:]}: {missing}: {why}" in err


def test_the_prefix_search_refuses_a_word_lm_between_phone_words(tmp_path: Path):
    from types import SimpleNamespace

    from asrdist.config import EvalConfig
    from asrdist.data.targets import Targets
    from asrdist.eval.vocabulary import vocabulary_search

    (tmp_path / "lexicon.txt").write_text(DIGITS)
    (tmp_path / "train").mkdir()
    (tmp_path / "train" / "text").write_text("u1 one two\nu2 two\n")  # more than one word per utterance
    (tmp_path / "train" / "wav.scp").write_text("u1 a.wav\nu2 b.wav\n")
    (tmp_path / "train" / "utt2spk").write_text("u1 s\nu2 s\n")
    table = PhoneTable()
    targets = Targets(kind="phones", phones=list(table.symbols), silence_id=0, num_classes=len(table))
    for decoder, refused in (("prefix", True), ("flashlight", False)):
        cfg = SimpleNamespace(eval=EvalConfig(vocabulary="train", lm_weight=0.5, decoder=decoder, beam=4),
                              data=SimpleNamespace(corpus=str(tmp_path)))
        if refused:
            with pytest.raises(DataError, match=r"^eval.decoder=prefix: a phone model's words follow each other"):
                vocabulary_search(cfg, targets)
        else:
            assert vocabulary_search(cfg, targets).decoder_name == "flashlight"
