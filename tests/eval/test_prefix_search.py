"""The prefix search (`eval.decoder: prefix`, asrdist.eval.prefixsearch) against brute force: every
word sequence the vocabulary allows, scored by its summed CTC path probability (torch's ctc_loss)
plus the word LM, read by KenLM (flashlight-text) from an ARPA file; an n-gram of order 3 used as
such; the default decoder and a bad decoder name."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asrdist.config import EvalConfig
from asrdist.data.targets import CharTokenizer
from asrdist.errors import ConfigError
from asrdist.eval.lexdecoder import lm_with_words
from asrdist.eval.prefixsearch import WordScorer, WordTrie, ctc_vocabulary_decode
from asrdist.eval.vocabulary import VocabularySearch
from asrdist.eval.wordlm import END, WordBigram
from tests.support.ctc_reference import best_path_log_prob, labelling_log_prob, sequences

WORDS = [(1,), (1, 2), (2, 2, 3), (3, 1), (2,)]  # tokens 1..3 letters, 4 the separator


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("separator", [4, None])
def test_exact_with_a_wide_beam_against_the_summed_brute_force(seed, separator):
    rng = np.random.default_rng(seed)
    log_probs = np.log(rng.dirichlet(np.full(5 if separator else 4, 0.6), size=7))
    scores = {s: labelling_log_prob(log_probs, s) for s in sequences(WORDS, separator, len(log_probs))}
    scores = {s: v for s, v in scores.items() if math.isfinite(v)}
    found = ctc_vocabulary_decode(log_probs, WordTrie(WORDS), separator, beam=10_000)
    assert tuple(found) == max(scores, key=lambda s: (scores[s], s))
    narrow = ctc_vocabulary_decode(log_probs, WordTrie(WORDS), separator, beam=2)
    assert tuple(narrow) in scores  # a narrow beam may miss the best, never leave the vocabulary or end empty
    single = ctc_vocabulary_decode(log_probs, WordTrie(WORDS), None, beam=10_000, one_word=True)
    assert tuple(single) == max(WORDS, key=lambda w: (labelling_log_prob(log_probs, w), w))


def test_the_default_decoder_sums_alignments_and_flashlight_takes_the_best_one():
    # Hand-built: "a" is said on both frames by several alignments, "b" by one sharper path.
    # Summed: P(a) = .45 x .45 + .45 x .5 + .05 x .45 = .45 > P(b) = .2775; best path: b (.25 > .225).
    tok = CharTokenizer(list("ab"))  # no space: one word per utterance
    log_probs = np.log(np.array([[0.05, 0.45, 0.5], [0.5, 0.45, 0.05]]))
    a, b = tok.encode("a"), tok.encode("b")
    assert labelling_log_prob(log_probs, a) > labelling_log_prob(log_probs, b)
    assert best_path_log_prob(log_probs, b) > best_path_log_prob(log_probs, a)
    assert EvalConfig().decoder == "prefix"
    assert tok.decode(VocabularySearch(["a", "b"], tok, beam=8).search(log_probs)) == "a"
    flashlight = VocabularySearch(["a", "b"], tok, beam=8, decoder="flashlight")
    assert tok.decode(flashlight.search(log_probs)) == "b"


def _lm_score(lm: WordBigram, seq, separator, word_of, weight, bonus):
    words, start = [], 0
    for i, token in enumerate(tuple(seq) + (separator,)):
        if token == separator:
            words.append(word_of[tuple(seq[start:i])])
            start = i + 1
    score, previous = 0.0, None
    for w in words + [END]:
        score += weight * lm.log_prob(previous, w) + (bonus if w != END else 0.0)
        previous = w
    return score


def _scorer(path, names: dict, weight: float, bonus: float = 0.0) -> WordScorer:
    words = sorted(names.values())
    lm, ids = lm_with_words(words, path)
    return WordScorer(lm, dict(names), dict(zip(words, ids)), weight, bonus)


@pytest.mark.parametrize("seed", range(6))
def test_search_with_the_training_bigram_is_exact_with_a_wide_beam(tmp_path, seed):
    rng = np.random.default_rng(seed)
    names = {w: "w" + "".join(map(str, w)) for w in WORDS}
    lm = WordBigram([["w1", "w31"], ["w31", "w2"], ["w1", "w31"]], vocabulary=names.values())
    path = tmp_path / "lm.arpa"
    path.write_text(lm.arpa())  # as RUN/lm.arpa is written; KenLM reads it back
    weight, bonus = 2.0, 0.5
    log_probs = np.log(rng.dirichlet(np.full(5, 0.6), size=7))
    scores = {s: labelling_log_prob(log_probs, s) + _lm_score(lm, s, 4, names, weight, bonus)
              for s in sequences(WORDS, 4, len(log_probs))}
    scores = {s: v for s, v in scores.items() if math.isfinite(v)}
    scorer = _scorer(path, names, weight, bonus)
    found = ctc_vocabulary_decode(log_probs, WordTrie(WORDS), 4, beam=10_000, lm=scorer)
    assert tuple(found) == max(scores, key=lambda s: (scores[s], s))
    for previous in (None, *names.values()):  # KenLM's scores are the bigram's (to the ARPA file's 7 digits)
        for word in (*names.values(), None):
            assert scorer.log_prob(() if previous is None else (previous,), word) == pytest.approx(
                lm.log_prob(previous, END if word is None else word), abs=1e-5)


def _arpa(trigram: bool) -> str:
    """a, b, c: after b the bigram prefers a; after `a b` the trigram (when there) prefers c."""
    backoff = "\t-0.1" if trigram else ""
    lines = ["\\data\\", "ngram 1=6", "ngram 2=4", *(["ngram 3=1"] if trigram else []), "",
             "\\1-grams:", "-99\t<s>\t-0.3", "-0.6\t</s>", "-2.0\t<unk>", "-0.5\ta\t-0.3", "-0.5\tb\t-0.3",
             "-0.5\tc\t-0.3", "", "\\2-grams:", "-0.3\t<s> a", f"-0.3\ta b{backoff}", "-0.2\tb a", "-1.0\tb c", ""]
    if trigram:
        lines += ["\\3-grams:", "-0.05\ta b c", ""]
    return "\n".join(lines + ["\\end\\", ""])


def test_a_users_trigram_is_used_as_a_trigram(tmp_path):
    # frames: a, the separator, b, the separator, then a or c, equally likely
    names = {(1,): "a", (2,): "b", (3,): "c"}
    rows = [[0.05, 0.9, 0.02, 0.02, 0.01], [0.05, 0.01, 0.02, 0.02, 0.9], [0.05, 0.01, 0.9, 0.02, 0.02],
            [0.05, 0.01, 0.02, 0.02, 0.9], [0.08, 0.45, 0.01, 0.45, 0.01]]
    log_probs = np.log(np.array(rows))
    answers = {}
    for trigram in (False, True):
        path = tmp_path / f"lm{3 if trigram else 2}.arpa"
        path.write_text(_arpa(trigram))
        scorer = _scorer(path, names, weight=1.0)
        answers[trigram] = ctc_vocabulary_decode(log_probs, WordTrie(list(names)), 4, beam=16, lm=scorer)
    assert answers[False] == [1, 4, 2, 4, 1]  # the bigram: b a
    assert answers[True] == [1, 4, 2, 4, 3]  # the trigram: a b c


def test_a_bad_decoder_name_is_one_line():
    with pytest.raises(ConfigError, match=r"^eval.decoder: expected prefix or flashlight, got 'viterbi'$"):
        EvalConfig(decoder="viterbi")
