"""CTC search through flashlight-text's beam-search decoders (wav2letter: Collobert et al. 2016,
Pratap et al. 2019): words of a lexicon with a word n-gram (`LexiconDecoder`), or tokens alone
with a token n-gram (`LexiconFreeDecoder`). KenLM (Heafield 2011) reads ARPA or binary models.
1. The model's [T, V] log-probs get two more columns, END and BREAK (a copy of the blank), a
   frame before the utterance on which only the word separator (a character model's space) may
   be emitted, and one after it on which only END or BREAK may be, so every hypothesis can finish
   its last word (and with END words end only there: one word per utterance).
2. The lexicon is a trie of every word's token sequences, each led by the separator: a word ends
   on its last token or on a BREAK after it (so that token may last several frames), and between
   words the trie's root emits only blanks, so every separator the model says starts a word (as
   in asrdist's prefix search, `asrdist.eval.prefixsearch`). Leaves carry the word's unigram
   score, smeared to every node by max (look-ahead).
3. Per frame each hypothesis (trie node, LM state, last token) extends by the children of its
   node, stays (blank, or its last token), and on reaching a word adds lm_weight x ln P(word |
   history) + word_bonus; equal hypotheses keep the best (Viterbi); the `beam` best survive.
4. At the end lm_weight x ln P(</s> | history) is added; the best hypothesis with a word wins.
   When none has a word (a narrow beam filled by hypotheses that are still inside words: an
   undertrained model's blanks), the utterance is searched again with a beam RETRY_WIDER times
   as wide and no threshold.
`eval.decoder: flashlight`; against the prefix search (the default):
docs/evaluation.md#the-lexicon-search-evallexdecoderpy.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import os
import sys
from pathlib import Path
from typing import Sequence

import numpy as np
from flashlight.lib.text.decoder import (
    CriterionType,
    LexiconDecoder,
    LexiconDecoderOptions,
    LexiconFreeDecoder,
    LexiconFreeDecoderOptions,
    SmearingMode,
    Trie,
    ZeroLM,
)
from flashlight.lib.text.decoder.kenlm import KenLM
from flashlight.lib.text.dictionary import Dictionary

from asrdist.errors import DataError

FLOOR = -1e5
"""Stands for log 0 in the emissions (flashlight adds and compares floats: no -inf)."""
BEAM_THRESHOLD = 50.0
"""Hypotheses more than this (nats) below the frame's best are dropped."""
RETRY_WIDER = 16
LN10 = math.log(10)  # KenLM scores in log10; eval.lm_weight weighs natural logs


@contextlib.contextmanager
def _quiet_stderr():
    """KenLM prints a progress bar on the C stderr while it loads: hidden."""
    sys.stderr.flush()
    saved = os.dup(2)
    try:
        with open(os.devnull, "w") as null:
            os.dup2(null.fileno(), 2)
            yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)


def load_kenlm(path: Path, dictionary, where: str = "eval.lm"):
    """flashlight's KenLM over `dictionary`'s entries; a DataError in one line when it cannot be read."""
    if not Path(path).is_file():
        raise DataError(f"{where}: {path}: language model not found (an ARPA or KenLM binary file)")
    try:
        with _quiet_stderr():
            return KenLM(str(path), dictionary)
    except RuntimeError as exc:
        why = [line for line in str(exc).splitlines() if line.strip()]
        raise DataError(f"{where}: {path}: not an ARPA or KenLM binary language model "
                        f"(KenLM: {why[-1] if why else 'unreadable'})") from None


def _dictionary(entries: Sequence[str]):
    d = Dictionary()
    for entry in entries:
        d.add_entry(entry)
    return d


def lm_with_words(words: Sequence[str], path: Path, where: str = "eval.lm") -> tuple:
    """(KenLM, each word's index in its dictionary): a word as the LM spells it when the LM knows it
    only upper- or lower-case (LibriSpeech's models are upper-case), else as given (<unk> to the LM)."""
    variants = list(dict.fromkeys(v for w in words for v in (w, w.upper(), w.lower())))
    lm = load_kenlm(path, _dictionary(variants + ["<asrdist-no-such-word>"]), where)
    start = lm.start(False)
    unknown = lm.score(start, len(variants))[1]
    index = {v: i for i, v in enumerate(variants)}
    ids, unseen = [], 0
    for w in words:
        known = [v for v in (w, w.upper(), w.lower()) if lm.score(start, index[v])[1] != unknown]
        ids.append(index[known[0]] if known else index[w])
        unseen += not known
    if unseen > len(words) / 2:
        print(f"asrdist: note: {where}: {path}: {unseen} of {len(words)} vocabulary words are not in the "
              f"language model (scored as its <unk>)", file=sys.stderr)
    return lm, ids


class LexiconSearch:
    """Words of `spellings` (word -> its token sequences) under a word LM (`lm` an ARPA / KenLM
    binary path, None: none). `separator`: the token between words (a character model's space),
    None: words follow each other (phones) or, with `one_word`, exactly one word per utterance."""

    def __init__(self, spellings: dict[str, Sequence[Sequence[int]]], num_tokens: int, separator: int | None,
                 beam: int, lm: Path | None = None, lm_weight: float = 0.0, word_bonus: float = 0.0,
                 one_word: bool = False, blank: int = 0, beam_threshold: float = BEAM_THRESHOLD,
                 where: str = "eval.lm"):
        if beam < 1:
            raise DataError(f"ctc decode: beam must be >= 1, got {beam}")
        self.words_list = sorted(spellings)
        self.spellings = {w: [tuple(int(t) for t in s) for s in spellings[w]] for w in self.words_list}
        self.num_tokens, self.blank, self.separator = num_tokens, blank, separator
        self.end, self.brk = num_tokens, num_tokens + 1  # the END and BREAK columns
        self.one_word = one_word and separator is None
        self.sil = self.end  # the root emits nothing but blanks: no separator without a word
        # a word begins with the separator (the first one on a frame put before the utterance) and
        # ends on its last token or on a BREAK after it; one word per utterance ends on END
        lead = (separator,) if separator is not None else ()
        tails = [(self.end,)] if self.one_word else [(), (self.brk,)]
        if lm is not None:
            self.lm, ids = lm_with_words(self.words_list, lm, where)
        else:
            self.lm, ids = ZeroLM(), list(range(len(self.words_list)))
        self.word_of = {i: w for i, w in zip(ids, self.words_list)}
        start = self.lm.start(False)
        trie = Trie(num_tokens + 2, self.sil)
        for i, word in zip(ids, self.words_list):
            unigram = self.lm.score(start, i)[1]
            for spelled, tail in itertools.product(spellings[word], tails):
                trie.insert(list(lead) + [int(t) for t in spelled] + list(tail), i, unigram)
        trie.smear(SmearingMode.MAX)
        options = LexiconDecoderOptions(beam_size=beam, beam_size_token=num_tokens + 2,
                                        beam_threshold=beam_threshold, lm_weight=lm_weight * LN10,
                                        word_score=word_bonus, unk_score=-math.inf, sil_score=0.0,
                                        log_add=False, criterion_type=CriterionType.CTC)
        self.trie = trie  # the decoder keeps a reference only
        self.decoder = LexiconDecoder(options, trie, self.lm, self.sil, blank, -1, [], False)
        wide = LexiconDecoderOptions(beam_size=beam * RETRY_WIDER, beam_size_token=num_tokens + 2,
                                     beam_threshold=1e30, lm_weight=lm_weight * LN10, word_score=word_bonus,
                                     unk_score=-math.inf, sil_score=0.0, log_add=False,
                                     criterion_type=CriterionType.CTC)
        self.wide = LexiconDecoder(wide, trie, self.lm, self.sil, blank, -1, [], False)

    def emissions(self, log_probs: np.ndarray) -> np.ndarray:
        """[T + 1 (+ 1), V + 2]: the log-probs and the END and BREAK columns; a first frame of the
        separator alone (when there is one) and a last one of END or BREAK alone."""
        log_probs = np.asarray(log_probs)
        if log_probs.ndim != 2 or log_probs.shape[1] != self.num_tokens:
            raise DataError(f"ctc decode: expected [time, {self.num_tokens}] log-probs, got shape {log_probs.shape}")
        first = int(self.separator is not None)
        out = np.full((first + log_probs.shape[0] + 1, self.num_tokens + 2), FLOOR, dtype=np.float32)
        out[first:-1, :-2] = np.maximum(log_probs, FLOOR)
        if first:
            out[0, self.separator] = 0.0
        if not self.one_word:
            out[first:-1, self.brk] = out[first:-1, self.blank]
            out[-1, self.brk] = 0.0
        out[-1, self.end] = 0.0
        return out

    def decode(self, log_probs: np.ndarray) -> tuple[list[int], list[str]]:
        """(tokens, words) of the best hypothesis with at least one word; ([], []) when none has."""
        em = self.emissions(log_probs)
        for decoder in (self.decoder, self.wide):
            for result in decoder.decode(em.ctypes.data, em.shape[0], em.shape[1]):
                words = [self.word_of[i] for i in result.words if i >= 0]
                tokens = self._tokens(result.tokens)
                if words and self._spells(tokens, words):
                    return tokens, words
        return [], []

    def _spells(self, tokens: list[int], words: list[str]) -> bool:
        """Whether `tokens` are `words` spelled one after another (with the separator between them).
        flashlight ends on a hypothesis still inside a word when no hypothesis of the beam is between
        words: its tokens carry the start of a word it never read."""
        sep = () if self.separator is None else (self.separator,)

        def rest(at: int, i: int) -> bool:
            if i == len(words):
                return at == len(tokens)
            lead = sep if i else ()
            return any(tuple(tokens[at:at + len(lead) + len(s)]) == lead + tuple(s)
                       and rest(at + len(lead) + len(s), i + 1) for s in self.spellings[words[i]])
        return rest(0, 0)

    def _tokens(self, path: Sequence[int]) -> list[int]:
        """A frame path's labelling: repeats merged, blank, END and BREAK dropped, the first separator too."""
        tokens = [t for t, _ in itertools.groupby(path) if t not in (self.blank, self.end, self.brk, -1)]
        return tokens[1:] if self.separator is not None and tokens and tokens[0] == self.separator else tokens


class LexiconFreeSearch:
    """Tokens alone under a token LM (an ARPA / KenLM binary whose words are the model's tokens,
    `token_names`: characters with `|` for the space, or phone symbols)."""

    def __init__(self, token_names: Sequence[str], beam: int, lm: Path, lm_weight: float, blank: int = 0,
                 separator: int | None = None, beam_threshold: float = BEAM_THRESHOLD, where: str = "eval.lm"):
        if beam < 1:
            raise DataError(f"ctc decode: beam must be >= 1, got {beam}")
        self.num_tokens, self.blank = len(token_names), blank
        self.lm = load_kenlm(lm, _dictionary(list(token_names)), where)
        options = LexiconFreeDecoderOptions(beam_size=beam, beam_size_token=len(token_names),
                                            beam_threshold=beam_threshold, lm_weight=lm_weight * LN10,
                                            sil_score=0.0, log_add=False, criterion_type=CriterionType.CTC)
        sil = separator if separator is not None else blank
        self.decoder = LexiconFreeDecoder(options, self.lm, sil, blank, [])

    def decode(self, log_probs: np.ndarray) -> list[int]:
        em = np.ascontiguousarray(np.maximum(np.asarray(log_probs), FLOOR), dtype=np.float32)
        if em.ndim != 2 or em.shape[1] != self.num_tokens:
            raise DataError(f"ctc decode: expected [time, {self.num_tokens}] log-probs, got shape {em.shape}")
        results = self.decoder.decode(em.ctypes.data, em.shape[0], em.shape[1])
        if not results:
            return []
        return [t for t, _ in itertools.groupby(results[0].tokens) if t not in (self.blank, -1)]
