"""The word bigram of the training transcripts as an ARPA file (asrdist.eval.wordlm) and the
lexicon decoder's use of a word LM (asrdist.eval.lexdecoder): the file is valid (KenLM loads it
and gives the bigram's probabilities), the search is exact against brute force (every word
sequence scored by its best CTC path plus the LM), and bad LM / lexicon paths fail in one line."""
from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest

from asrdist.config import EvalConfig
from asrdist.errors import ConfigError, DataError
from asrdist.eval.decode import ctc_greedy_decode
from asrdist.eval.lexdecoder import LexiconSearch, load_kenlm
from asrdist.eval.wordlm import END, WordBigram, write_training_lm
from tests.support.ctc_reference import following_words_best_paths

TRANSCRIPTS = [["a", "b"], ["a", "b"], ["a", "c"], ["b"]]


def test_bigram_is_a_distribution_in_every_context_and_prefers_what_it_saw():
    lm = WordBigram(TRANSCRIPTS, vocabulary=["a", "b", "c", "d"])
    for previous in (None, "a", "b", "c", "d"):  # d never seen: its unigram row
        total = sum(math.exp(lm.log_prob(previous, w)) for w in ("a", "b", "c", "d", END))
        assert total == pytest.approx(1.0)
    assert lm.log_prob("a", "b") > lm.log_prob("a", "c") > lm.log_prob("a", "d") > -math.inf
    assert lm.log_prob(None, "a") > lm.log_prob(None, "c")
    assert lm.perplexity([["a", "b"]]) < lm.perplexity([["b", "a"]])


def test_the_arpa_file_is_valid_and_is_the_bigram(tmp_path):
    from flashlight.lib.text.dictionary import Dictionary

    path = write_training_lm(tmp_path / "lm.arpa", TRANSCRIPTS)
    words = ["a", "b", "c", "never-seen"]
    d = Dictionary()
    for w in words:
        d.add_entry(w)
    kenlm = load_kenlm(path, d)  # flashlight's KenLM reads it
    bigram = WordBigram(TRANSCRIPTS, vocabulary=["a", "b", "c"])
    for previous in (None, "a", "b", "c"):
        state = kenlm.start(False)
        if previous is not None:
            state, _ = kenlm.score(state, words.index(previous))
        for i, w in enumerate(words[:3]):
            assert kenlm.score(state, i)[1] * math.log(10) == pytest.approx(bigram.log_prob(previous, w), abs=1e-5)
        assert kenlm.finish(state)[1] * math.log(10) == pytest.approx(bigram.log_prob(previous, END), abs=1e-5)
    # a word the transcripts never had: the unigram share of one unseen word (after the start's back-off)
    unseen = kenlm.score(kenlm.start(False), 3)[1] * math.log(10)
    assert unseen == pytest.approx(math.log(bigram.unseen) + bigram.backoff(None), abs=1e-5)


def _lm_score(lm: WordBigram, words, weight, bonus):
    score, previous = 0.0, None
    for w in list(words) + [END]:
        score += weight * lm.log_prob(previous, w) + (bonus if w != END else 0.0)
        previous = w
    return score


@pytest.mark.parametrize("seed", range(6))
def test_search_with_the_lm_is_exact_with_a_wide_beam(tmp_path, seed):
    rng = np.random.default_rng(seed)
    words = [(1,), (1, 2), (2, 2, 3), (3, 1), (2,)]
    names = {w: "w" + "".join(map(str, w)) for w in words}
    separator = 4
    transcripts = [["w1", "w31"], ["w31", "w2"], ["w1", "w31"], ["w12", "w223", "w2"]]
    lm = WordBigram(transcripts, vocabulary=names.values())
    path = write_training_lm(tmp_path / "lm.arpa", transcripts)
    weight, bonus = 2.0, 0.5
    log_probs = np.log(rng.dirichlet(np.full(5, 0.6), size=7))
    search = LexiconSearch({n: [w] for w, n in names.items()}, 5, separator, beam=10_000, lm=path,
                           lm_weight=weight, word_bonus=bonus, beam_threshold=1e4)
    acoustic = following_words_best_paths(search, log_probs, words)
    scores = {seq: a + _lm_score(lm, [names[w] for w in _split(seq, separator)], weight, bonus)
              for seq, a in acoustic.items()}
    found, said = search.decode(log_probs)
    assert [names[w] for w in _split(tuple(found), separator)] == said
    assert scores[tuple(found)] == pytest.approx(max(scores.values()), abs=1e-3)


def _split(seq, separator):
    out, word = [], []
    for t in tuple(seq) + (separator,):
        if t == separator:
            out.append(tuple(word))
            word = []
        else:
            word.append(t)
    return out


def test_the_lexicon_and_the_lm_change_the_greedy_answer(tmp_path):
    # tokens: 1 = "o", 2 = "n", 3 = "e", 4 = "t", 5 = "w", 6 = space. Greedily the frames say "on tw"
    # ("o n" then "t w": neither is a word); the lexicon reads "one two" or "one too"... the
    # acoustics prefer "two" a little, the LM (the transcripts always say "one three") picks "three"
    o, n, e, t, w, sp = 1, 2, 3, 4, 5, 6
    spellings = {"one": [(o, n, e)], "two": [(t, w, o)], "tee": [(t, e, e)]}
    rows = [(o, 0.8), (n, 0.8), (e, 0.4), (sp, 0.9), (t, 0.9), (w, 0.45), (0, 0.5), (o, 0.45)]
    probs = np.full((len(rows), 7), 0.02)
    for i, (token, p) in enumerate(rows):
        probs[i, token] = p
    probs[5, 0] = 0.001  # frame 5: w 0.45, e 0.42 next best
    probs[5, e] = 0.42
    probs[7, e] = 0.44  # frame 7: o 0.45, e 0.44
    probs[2, 0] = 0.45  # frame 2: blank 0.45 above e 0.4 (greedy drops the e)
    log_probs = np.log(probs / probs.sum(1, keepdims=True))
    greedy = ctc_greedy_decode(log_probs)
    assert greedy[:3] == [o, n, sp]  # "on ...": not a word
    plain, said = LexiconSearch(spellings, 7, sp, beam=16).decode(log_probs)
    assert said == ["one", "two"] and plain == [o, n, e, sp, t, w, o]
    path = write_training_lm(tmp_path / "lm.arpa", [["one", "tee"]] * 8 + [["two"]])
    with_lm, said = LexiconSearch(spellings, 7, sp, beam=16, lm=path, lm_weight=1.0).decode(log_probs)
    assert said == ["one", "tee"] and with_lm == [o, n, e, sp, t, e, e]


def test_lm_and_lexicon_settings_are_checked(tmp_path):
    with pytest.raises(ConfigError, match="^eval.lm_weight: the word bigram scores vocabulary words"):
        EvalConfig(lm_weight=0.5)
    with pytest.raises(ConfigError, match="^eval.lm_weight:"):
        EvalConfig(lm_weight=-1.0, vocabulary="train")
    assert EvalConfig(lm_weight=0.5, vocabulary="train").lm_weight == 0.5
    missing = tmp_path / "missing.arpa"
    with pytest.raises(ConfigError, match=f"^eval.lm: {missing}: language model not found") as err:
        EvalConfig(lm=str(missing), vocabulary="train", lm_weight=0.5)
    assert "\n" not in str(err.value)
    with pytest.raises(ConfigError, match=f"^eval.lexicon: {missing}: lexicon not found") as err:
        EvalConfig(lexicon=str(missing))
    assert "\n" not in str(err.value)
    garbage = tmp_path / "garbage.arpa"
    garbage.write_text("this is not a language model\n")
    with pytest.raises(DataError, match=f"^eval.lm: {garbage}: not an ARPA or KenLM binary language model") as err:
        LexiconSearch({"a": [(1,)]}, 3, 2, beam=4, lm=Path(garbage), lm_weight=1.0)
    assert "\n" not in str(err.value)
