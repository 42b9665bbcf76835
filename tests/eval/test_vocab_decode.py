"""Word-constrained CTC decoding (`eval.vocabulary`) against a brute-force reference: every word
sequence the vocabulary allows, scored by its summed CTC path probability (torch's ctc_loss)."""
from __future__ import annotations

import math

import numpy as np
import pytest

from asrdist.config import load_config
from asrdist.data.targets import CharTokenizer
from asrdist.errors import ConfigError, DataError
from asrdist.eval.vocabulary import VocabularySearch, WordTrie, ctc_vocabulary_decode, vocabulary_words
from tests.support.ctc_reference import labelling_log_prob, sequences


def _brute_force(log_probs, words, separator):
    scores = {seq: labelling_log_prob(log_probs, seq) for seq in sequences(words, separator, len(log_probs))}
    scores = {s: v for s, v in scores.items() if math.isfinite(v)}
    best = max(scores, key=lambda s: (scores[s], s))
    return best, scores


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("separator", [4, None])
def test_exact_with_a_wide_beam_against_brute_force(seed, separator):
    rng = np.random.default_rng(seed)
    # tokens 1..3 are letters, 4 the separator (a space); words share prefixes and repeat letters
    words = [(1,), (1, 2), (2, 2, 3), (3, 1), (2,)]
    vocab = 5 if separator is not None else 4
    log_probs = np.log(rng.dirichlet(np.full(vocab, 0.6), size=7))
    best, scores = _brute_force(log_probs, words, separator)
    found = ctc_vocabulary_decode(log_probs, WordTrie(words), separator, beam=10_000)
    assert tuple(found) == best
    narrow = ctc_vocabulary_decode(log_probs, WordTrie(words), separator, beam=2)
    assert tuple(narrow) in scores  # a narrow beam may miss the best, never leave the vocabulary or end empty
    single = ctc_vocabulary_decode(log_probs, WordTrie(words), None, beam=10_000, one_word=True)
    assert tuple(single) == max(words, key=lambda w: (labelling_log_prob(log_probs, w), w))


def test_isolated_words_pick_the_most_likely_word_not_the_greedy_spelling():
    tok = CharTokenizer(list("eintorw"))  # isolated-word training: no space, one word per utterance
    search = VocabularySearch(["one", "two", "nine"], tok, beam=8)
    # frames spell "tne" greedily (not a word); "one" sums more probability than "two" or "nine"
    ids = {c: tok.encode(c)[0] for c in "eintorw"}
    frames = []
    for best, runner_up in (("t", "o"), ("n", "w"), ("e", "o")):
        row = np.full(tok.vocab_size, 0.01)
        row[ids[best]], row[ids[runner_up]] = 0.5, 0.4
        frames.append(row / row.sum())
    log_probs = np.log(np.array(frames))
    assert tok.decode(search.search(log_probs)) in {"one", "two", "nine"}
    totals = {w: labelling_log_prob(log_probs, tok.encode(w)) for w in ("one", "two", "nine")}
    assert tok.decode(search.search(log_probs)) == max(totals, key=totals.get)


def test_word_lists_lexicons_and_their_errors(tmp_path):
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text(";;; comment\nONE  W AH N\nTWO T UW\nTWO(2) T UH\ncafé k\n\n")
    assert vocabulary_words(str(lexicon), None) == ["ONE", "TWO", "café"]
    tok = CharTokenizer(list(" enotw"))
    search = VocabularySearch(vocabulary_words(str(lexicon), None), tok, beam=4)
    assert search.num_words == 2  # ONE, TWO lowercased; café has a character the model never saw
    with pytest.raises(DataError, match="not found"):
        vocabulary_words(str(tmp_path / "missing.txt"), None)
    with pytest.raises(DataError, match="transcripts"):
        vocabulary_words("train", tmp_path)
    with pytest.raises(DataError, match="none of its"):
        VocabularySearch(["xyz"], tok, beam=4)
    with pytest.raises(ConfigError, match="eval.vocabulary"):
        load_config(None, ["eval.vocabulary=" + str(tmp_path / "missing.txt")])
    with pytest.raises(ConfigError, match="for CTC models"):
        load_config(None, ["eval.vocabulary=train", "data.targets=monophone"])
