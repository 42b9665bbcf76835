"""CTC prefix beam search over a word trie (`eval.decoder: prefix`, the default): hypotheses made
only of vocabulary words, each scored by the CTC posterior of its labelling, the sum over all its
alignments (Graves et al. 2006; prefix search as in Hannun et al. 2014), plus a word LM:
1. a prefix extends only by a child of its trie node, or by the word separator at a word's end;
2. per frame prefixes stay or extend, equal ones merge (their probabilities add), the `beam` best
   survive (plus the best ending on a whole word);
3. a word LM (`WordScorer`: KenLM through flashlight-text, any n-gram order) adds
   lm_weight x ln P(word | history) + word_bonus as the separator after a word is taken, and at
   the end the last word's and the end's score;
4. the most probable prefix ending on a whole word wins.
The steps in full: docs/evaluation.md#the-prefix-search-evalprefixsearchpy."""
from __future__ import annotations

import math
from typing import Sequence

import numpy as np

from asrdist.errors import DataError

NEG_INF = -math.inf
LN10 = math.log(10)  # KenLM scores in log10; eval.lm_weight weighs natural logs
CACHE_LIMIT = 200_000
"""LM states and scores kept between utterances, at most (then the caches start again)."""


class WordTrie:
    """Token sequences of the vocabulary words; node 0 is the root."""

    def __init__(self, words: Sequence[Sequence[int]]):
        self.children: list[dict[int, int]] = [{}]
        self.word_end: list[bool] = [False]
        for word in words:
            if not word:
                continue
            node = 0
            for token in word:
                nxt = self.children[node].get(int(token))
                if nxt is None:
                    nxt = len(self.children)
                    self.children[node][int(token)] = nxt
                    self.children.append({})
                    self.word_end.append(False)
                node = nxt
            self.word_end[node] = True
        if len(self.children) == 1:
            raise DataError("vocabulary: no words to decode with")


def _logadd(a: float, b: float) -> float:
    if a == NEG_INF:
        return b
    if b == NEG_INF:
        return a
    return max(a, b) + math.log1p(math.exp(-abs(a - b)))


def ctc_vocabulary_decode(log_probs: np.ndarray, trie: WordTrie, separator: int | None,
                          beam: int = 8, blank: int = 0, one_word: bool = False, lm=None) -> list[int]:
    """The most probable token sequence made of trie words joined by `separator` (None: words
    simply follow each other, as phones do; `one_word`: exactly one word) among the `beam`
    prefixes kept per frame. `lm` (`WordScorer`, needs a separator or `one_word`) adds its score
    of each word a prefix completes (at the separator) and, at the end, of its last word and the end."""
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if log_probs.ndim != 2:
        raise DataError(f"ctc decode: expected [time, vocab] log-probs, got shape {log_probs.shape}")
    if beam < 1:
        raise DataError(f"ctc decode: beam must be >= 1, got {beam}")
    # tokens -> [log P(ends in blank), log P(ends in last token), trie nodes]. Without a separator
    # one token sequence may split into words in several ways: its nodes are a set (one paths' sum).
    beams: dict[tuple[int, ...], list] = {(): [0.0, NEG_INF, frozenset([0])]}
    for frame in log_probs.tolist():
        new: dict[tuple[int, ...], list] = {}

        def add(tokens, blank_part: float, token_part: float, nodes: frozenset) -> None:
            slot = new.setdefault(tokens, [NEG_INF, NEG_INF, nodes])
            slot[0] = _logadd(slot[0], blank_part)
            slot[1] = _logadd(slot[1], token_part)

        for tokens, (p_blank, p_token, nodes) in beams.items():
            total = _logadd(p_blank, p_token)
            last = tokens[-1] if tokens else None
            add(tokens, total + frame[blank], p_token + frame[last] if last is not None else NEG_INF, nodes)
            moves: dict[int, set[int]] = {}
            for node in nodes:
                for token, child in trie.children[node].items():
                    moves.setdefault(token, set()).add(child)
                if trie.word_end[node] and not one_word:
                    for token, child in ({separator: 0} if separator is not None else trie.children[0]).items():
                        moves.setdefault(token, set()).add(child)
            for token, children in moves.items():
                # The last token again is a new occurrence only after a blank.
                source = p_blank if token == last else total
                if lm is not None and token == separator:
                    source += lm.completed(tokens, separator)
                add(tokens + (token,), NEG_INF, source + frame[token], frozenset(children))
        ranked = sorted(new.items(), key=lambda kv: (-_logadd(kv[1][0], kv[1][1]), kv[0]))
        kept = ranked[:beam]
        if not any(_ends_word(trie, v[2]) for _, v in kept):
            # The best whole-word prefix stays too, so a narrow beam still ends on words.
            kept += [kv for kv in ranked[beam:] if _ends_word(trie, kv[1][2])][:1]
        beams = {tokens: v for tokens, v in kept if _logadd(v[0], v[1]) > NEG_INF}
        if not beams:
            return []
    finished = [(_logadd(v[0], v[1]) + (lm.ended(tokens, separator) if lm is not None else 0.0), tokens)
                for tokens, v in beams.items() if _ends_word(trie, v[2])]
    return list(max(finished)[1]) if finished else []


def _ends_word(trie: WordTrie, nodes: frozenset) -> bool:
    return any(trie.word_end[n] for n in nodes)


class WordScorer:
    """A word LM's scores for the search, on token sequences: `weight` x ln P(word | history) +
    `bonus` per completed word, and `weight` x ln P(end | history) at the end. `lm`: flashlight-text's
    KenLM (`lexdecoder.lm_with_words`; None: the bonus alone), `word_of`: a word's token sequence ->
    the word, `index`: the word -> its index in the LM's dictionary. States and scores are cached
    by word history."""

    def __init__(self, lm, word_of: dict[tuple[int, ...], str], index: dict[str, int], weight: float,
                 bonus: float = 0.0):
        self.lm, self.word_of, self.index, self.weight, self.bonus = lm, word_of, index, weight, bonus
        self._reset()

    def _reset(self) -> None:
        self._states: dict[tuple[str, ...], object] = {(): self.lm.start(False)} if self.lm is not None else {}
        self._scores: dict[tuple, float] = {}

    def _state(self, history: tuple[str, ...]):
        state = self._states.get(history)
        if state is None:
            state = self._states[history] = self.lm.score(self._state(history[:-1]), self.index[history[-1]])[0]
        return state

    def log_prob(self, history: Sequence[str], word: str | None) -> float:
        """ln P(word | history) (word None: the end) by the LM."""
        if len(self._scores) > CACHE_LIMIT or len(self._states) > CACHE_LIMIT:
            self._reset()
        key = (tuple(history), word)
        value = self._scores.get(key)
        if value is None:
            state = self._state(key[0])
            if word is None:
                value = self.lm.finish(state)[1] * LN10
            else:
                after, score = self.lm.score(state, self.index[word])
                self._states.setdefault(key[0] + (word,), after)
                value = score * LN10
            self._scores[key] = value
        return value

    def _words(self, tokens: tuple[int, ...], separator: int | None) -> list[str]:
        if separator is None:  # one word per utterance
            return [self.word_of[tokens]] if tokens else []
        words, start = [], 0
        for i, token in enumerate(tokens + (separator,)):
            if token == separator:
                if i > start:
                    words.append(self.word_of[tokens[start:i]])
                start = i + 1
        return words

    def _word_score(self, words: list[str]) -> float:
        lm = self.weight * self.log_prob(words[:-1], words[-1]) if self.lm is not None else 0.0
        return lm + self.bonus

    def completed(self, tokens: tuple[int, ...], separator: int) -> float:
        """The score of the word `tokens` end in (a separator comes next)."""
        return self._word_score(self._words(tokens, separator))

    def ended(self, tokens: tuple[int, ...], separator: int | None) -> float:
        """The score of a finished hypothesis' last word (not yet scored) and of its end."""
        words = self._words(tokens, separator)
        if not words:
            return 0.0
        end = self.weight * self.log_prob(words, None) if self.lm is not None else 0.0
        return self._word_score(words) + end
