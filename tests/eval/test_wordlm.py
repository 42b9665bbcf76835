"""The word bigram of the training transcripts (asrdist.eval.wordlm) and its use in the vocabulary
search: exact against brute force (every word sequence scored by CTC plus the bigram)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asrdist.config import EvalConfig
from asrdist.errors import ConfigError
from asrdist.eval.vocabulary import WordScorer, WordTrie, ctc_vocabulary_decode
from asrdist.eval.wordlm import END, WordBigram
from tests.support.ctc_reference import labelling_log_prob, sequences


def test_bigram_is_a_distribution_in_every_context_and_prefers_what_it_saw():
    lm = WordBigram([["a", "b"], ["a", "b"], ["a", "c"], ["b"]], vocabulary=["a", "b", "c", "d"])
    for previous in (None, "a", "b", "c", "d"):  # d never seen: its unigram row
        total = sum(math.exp(lm.log_prob(previous, w)) for w in ("a", "b", "c", "d", END))
        assert total == pytest.approx(1.0)
    assert lm.log_prob("a", "b") > lm.log_prob("a", "c") > lm.log_prob("a", "d") > -math.inf
    assert lm.log_prob(None, "a") > lm.log_prob(None, "c")
    assert lm.perplexity([["a", "b"]]) < lm.perplexity([["b", "a"]])


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


@pytest.mark.parametrize("seed", range(6))
def test_search_with_the_bigram_is_exact_with_a_wide_beam(seed):
    rng = np.random.default_rng(seed)
    words = [(1,), (1, 2), (2, 2, 3), (3, 1), (2,)]
    names = {w: "w" + "".join(map(str, w)) for w in words}
    separator = 4
    lm = WordBigram([["w1", "w31"], ["w31", "w2"], ["w1", "w31"]], vocabulary=names.values())
    weight, bonus = 2.0, 0.5
    log_probs = np.log(rng.dirichlet(np.full(5, 0.6), size=7))
    scores = {seq: labelling_log_prob(log_probs, seq) + _lm_score(lm, seq, separator, names, weight, bonus)
              for seq in sequences(words, separator, len(log_probs))}
    scores = {s: v for s, v in scores.items() if math.isfinite(v)}
    best = max(scores, key=lambda s: (scores[s], s))
    scorer = WordScorer(lm, names, weight, bonus)
    found = ctc_vocabulary_decode(log_probs, WordTrie(words), separator, beam=10_000, lm=scorer)
    assert tuple(found) == best


def test_the_bigram_decides_between_words_the_acoustics_cannot_tell_apart():
    # frames: "1", the separator, then "2" a little likelier than "3": the bigram (1 -> 3) picks 3
    words = [(1,), (2,), (3,)]
    names = {(1,): "one", (2,): "two", (3,): "three"}
    rows = [[0.05, 0.9, 0.02, 0.02, 0.01], [0.05, 0.01, 0.02, 0.02, 0.9], [0.1, 0.0, 0.47, 0.43, 0.0]]
    log_probs = np.log(np.array(rows) + 1e-9)
    lm = WordBigram([["one", "three"]] * 5 + [["two"]], vocabulary=names.values())
    assert ctc_vocabulary_decode(log_probs, WordTrie(words), 4, beam=16) == [1, 4, 2]
    with_lm = ctc_vocabulary_decode(log_probs, WordTrie(words), 4, beam=16, lm=WordScorer(lm, names, 1.0))
    assert with_lm == [1, 4, 3]


def test_lm_settings_are_checked():
    with pytest.raises(ConfigError, match="^eval.lm_weight: the word bigram scores vocabulary words"):
        EvalConfig(lm_weight=0.5)
    with pytest.raises(ConfigError, match="^eval.lm_weight:"):
        EvalConfig(lm_weight=-1.0, vocabulary="train")
    assert EvalConfig(lm_weight=0.5, vocabulary="train").lm_weight == 0.5


def test_a_phone_model_refuses_the_word_bigram(tmp_path):
    from types import SimpleNamespace

    from asrdist.errors import DataError
    from asrdist.data.targets import Targets
    from asrdist.eval.vocabulary import vocabulary_search

    cfg = SimpleNamespace(eval=EvalConfig(vocabulary="train", lm_weight=0.5), data=SimpleNamespace(corpus=str(tmp_path)))
    with pytest.raises(DataError, match="^eval.lm_weight / eval.word_bonus: the word bigram is for character CTC"):
        vocabulary_search(cfg, Targets(kind="phones", phones=["sil", "a"], silence_id=0, num_classes=2))
