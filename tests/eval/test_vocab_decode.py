"""Word-constrained CTC decoding (`eval.vocabulary`, flashlight-text's lexicon decoder) against a
brute-force reference: every word sequence the vocabulary allows, scored by its most probable CTC
path (the decoder's Viterbi criterion; tests/support/ctc_reference.py says which paths)."""
from __future__ import annotations


import numpy as np
import pytest

from asrdist.config import load_config
from asrdist.data.targets import CharTokenizer
from asrdist.errors import ConfigError, DataError
from asrdist.eval.lexdecoder import LexiconSearch
from asrdist.eval.vocabulary import VocabularySearch, vocabulary_words
from tests.support.ctc_reference import (
    best_path_log_prob,
    following_words_best_paths,
    labelling_log_prob,
)


@pytest.mark.parametrize("seed", range(8))
@pytest.mark.parametrize("separator", [4, None])
def test_exact_with_a_wide_beam_against_brute_force(seed, separator):
    rng = np.random.default_rng(seed)
    # tokens 1..3 are letters, 4 the separator (a space); words share prefixes and repeat letters
    words = [(1,), (1, 2), (2, 2, 3), (3, 1), (2,)]
    spellings = {"w" + "".join(map(str, w)): [w] for w in words}
    vocab = 5 if separator is not None else 4
    log_probs = np.log(rng.dirichlet(np.full(vocab, 0.6), size=7 if separator is not None else 6))
    search = LexiconSearch(spellings, vocab, separator, beam=10_000, beam_threshold=1e4)
    scores = following_words_best_paths(search, log_probs, words)
    best = max(scores.values())
    found, said = search.decode(log_probs)
    assert scores[tuple(found)] == pytest.approx(best, abs=1e-4)
    if separator is not None:  # the words it read are the tokens it gives
        assert found == [t for i, w in enumerate(said) for t in (separator,) * (i > 0) + spellings[w][0]]
    for _ in range(20):  # flashlight breaks ties between equal hypotheses in memory order: try it often
        narrow, _ = LexiconSearch(spellings, vocab, separator, beam=2).decode(log_probs)
        assert tuple(narrow) in scores  # a narrow beam may miss the best, never leave the vocabulary or end empty
    single, said = LexiconSearch(spellings, vocab, None, beam=10_000, one_word=True,
                                 beam_threshold=1e4).decode(log_probs)
    assert len(said) == 1 and tuple(single) == spellings[said[0]][0]
    assert best_path_log_prob(log_probs, single) == pytest.approx(
        max(best_path_log_prob(log_probs, w) for w in words), abs=1e-4)


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


def test_a_character_lexicon_gives_the_words_and_their_spellings(tmp_path):
    from types import SimpleNamespace

    from asrdist.config import EvalConfig
    from asrdist.data.targets import Targets
    from asrdist.eval.vocabulary import read_spellings, vocabulary_search

    tok = CharTokenizer(list(" enotw"))
    lexicon = tmp_path / "chars.lex"
    lexicon.write_text("# flashlight's form\nONE o n e |\nTWO t w o |\nTOO t w o |\nNEW n e w\nCAFE c a f e |\n")
    assert read_spellings(lexicon, tok) == {"one": [tuple(tok.encode("one"))], "two": [tuple(tok.encode("two"))],
                                            "too": [tuple(tok.encode("two"))], "new": [tuple(tok.encode("new"))]}
    cfg = SimpleNamespace(eval=EvalConfig(lexicon=str(lexicon), beam=4), data=SimpleNamespace(corpus=str(tmp_path)))
    search = vocabulary_search(cfg, Targets(kind="chars", phones=[], silence_id=0, num_classes=tok.vocab_size,
                                                   tokenizer=tok))
    assert sorted(search.spellings) == ["new", "one", "too", "two"]  # no vocabulary: the lexicon's words
    phones = tmp_path / "phones.lex"
    phones.write_text("ONE w ah n\n")
    with pytest.raises(DataError, match=r"^eval.lexicon: .*phones.lex: line 1: a character model's lexicon spells"):
        read_spellings(phones, tok)
