"""A word bigram language model of the training transcripts, for the vocabulary search.

`eval.lm_weight` > 0 (a character CTC model decoding with `eval.vocabulary`) adds
lm_weight x log P(word | previous word) + `eval.word_bonus` to a hypothesis at each word it
completes, and log P(end | last word) when it ends (shallow fusion, as CTC decoders in Kaldi-free
toolkits add an n-gram: ESPnet, icefall). The bigram is fitted to the training split's transcripts
only, with interpolated absolute discounting (Ney, Essen and Kneser 1994): a seen pair keeps its
count less D = 0.5, and what is taken off goes to every word by its unigram probability, itself
add-one smoothed over the vocabulary, so a vocabulary word the transcripts never had still gets
a (small) probability and nothing is ruled out.
"""
from __future__ import annotations

import math
from collections import Counter
from typing import Hashable, Iterable, Sequence

START, END = "<s>", "</s>"
DISCOUNT = 0.5


class WordBigram:
    """log P(word | previous) over a fixed vocabulary (plus END); `previous` None is the start."""

    def __init__(self, sentences: Iterable[Sequence[Hashable]], vocabulary: Iterable[Hashable],
                 discount: float = DISCOUNT):
        self.vocabulary = set(vocabulary) | {END}
        pairs: Counter = Counter()
        unigrams: Counter = Counter()
        for words in sentences:
            seq = [START] + [w for w in words] + [END]
            unigrams.update(seq[1:])
            pairs.update(zip(seq[:-1], seq[1:]))
        self.discount = discount
        total = sum(unigrams[w] for w in self.vocabulary) + len(self.vocabulary)
        self.unigram = {w: (unigrams[w] + 1) / total for w in self.vocabulary}
        self.pairs = pairs
        self.context = Counter()
        self.followers = Counter()
        for (a, b), n in pairs.items():
            if b in self.vocabulary:
                self.context[a] += n
                self.followers[a] += 1
        self._cache: dict[tuple, float] = {}

    def log_prob(self, previous: Hashable | None, word: Hashable) -> float:
        previous = START if previous is None else previous
        key = (previous, word)
        cached = self._cache.get(key)
        if cached is not None:
            return cached
        uni = self.unigram.get(word)
        if uni is None:
            raise KeyError(f"word bigram: {word!r} is not in the vocabulary")
        seen = self.context[previous]
        if seen == 0:
            p = uni
        else:
            p = (max(self.pairs[key] - self.discount, 0.0) / seen
                 + self.discount * self.followers[previous] / seen * uni)
        self._cache[key] = value = math.log(p)
        return value

    def perplexity(self, sentences: Iterable[Sequence[Hashable]]) -> float:
        """Per-word perplexity (END counted), the words outside the vocabulary skipped."""
        total, count = 0.0, 0
        for words in sentences:
            previous = None
            for w in list(words) + [END]:
                if w not in self.vocabulary:
                    previous = None
                    continue
                total += self.log_prob(previous, w)
                count += 1
                previous = w
        return math.exp(-total / max(count, 1))
