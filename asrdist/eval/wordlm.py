"""The word bigram of the training transcripts, written as an ARPA file (`RUN/lm.arpa`) that the
lexicon search (`asrdist.eval.lexdecoder`, KenLM) reads as it reads a user's language model.

Interpolated absolute discounting (Ney, Essen and Kneser 1994), fitted to the training split's
transcripts only:
1. a seen pair (v, w) keeps its count less D = 0.5: P(w | v) = max(c(v, w) - D, 0) / c(v) + a(v) P(w),
   with a(v) = D x (the number of words seen after v) / c(v);
2. the unigram P(w) is add-one smoothed over the words, the end </s> and <unk> (any word the
   transcripts never had), so no vocabulary word is ruled out;
3. in ARPA form a seen pair is listed with that probability and a(v) is v's back-off weight, so a
   back-off model reads exactly the interpolated one (log10 throughout, as ARPA files are).
"""
from __future__ import annotations

import math
from collections import Counter
from pathlib import Path
from typing import Hashable, Iterable, Sequence

from asrdist.io.atomic import write_text_atomic

START, END, UNKNOWN = "<s>", "</s>", "<unk>"
DISCOUNT = 0.5
LM_NAME = "lm.arpa"
"""The training transcripts' bigram in a run directory (`eval.lm: train`)."""


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
        self.unseen = 1 / total
        """The unigram probability of a word the transcripts never had (ARPA's <unk>)."""
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

    def backoff(self, previous: Hashable | None) -> float:
        """ln a(previous): the weight of the unigram for a pair never seen (0 for a context never seen)."""
        previous = START if previous is None else previous
        seen = self.context[previous]
        return math.log(self.discount * self.followers[previous] / seen) if seen else 0.0

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

    def arpa(self) -> str:
        """The bigram as an ARPA file's text; the words must be strings without white space."""
        log10 = 1 / math.log(10)
        words = sorted(w for w in self.vocabulary if w != END)
        uni_lines = [f"{-99:.1f}\t{START}\t{self.backoff(None) * log10:.7f}"]
        uni_lines.append(f"{math.log(self.unigram[END]) * log10:.7f}\t{END}")
        # <unk>: one more add-one share, as a vocabulary word the transcripts never had gets
        uni_lines.append(f"{math.log(self.unseen) * log10:.7f}\t{UNKNOWN}")
        for w in words:
            uni_lines.append(f"{math.log(self.unigram[w]) * log10:.7f}\t{w}\t{self.backoff(w) * log10:.7f}")
        bi_lines = [f"{self.log_prob(None if a == START else a, b) * log10:.7f}\t{a} {b}"
                    for (a, b) in sorted(self.pairs) if b in self.vocabulary and (a == START or a in self.vocabulary)]
        return "\n".join(["\\data\\", f"ngram 1={len(uni_lines)}", f"ngram 2={len(bi_lines)}", "",
                          "\\1-grams:", *uni_lines, "", "\\2-grams:", *bi_lines, "", "\\end\\", ""])


def write_training_lm(path: Path, transcripts: Sequence[Sequence[str]]) -> Path:
    """`path` := the ARPA file of the bigram of `transcripts` (their words as given), atomically."""
    words = {w for t in transcripts for w in t}
    write_text_atomic(path, WordBigram(transcripts, words).arpa())
    return path
