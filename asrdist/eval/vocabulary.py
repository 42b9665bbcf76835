"""Word-constrained CTC decoding: hypotheses made only of vocabulary words (`eval.vocabulary`),
optionally under a word language model (`eval.lm`, `eval.lm_weight`).

The vocabulary is the training transcripts' words (`train`), a word list or lexicon file, or, with
`eval.lexicon PATH`, that lexicon's words. This module builds each word's token sequences (a
character model's spelling, a phone model's pronunciations) and hands them to the search
`eval.decoder` names: `prefix` (`asrdist.eval.prefixsearch`, the sum over alignments, the default)
or `flashlight` (flashlight-text's lexicon decoder, `asrdist.eval.lexdecoder`, the best alignment):
1. the words' token sequences, from the model's characters or a lexicon's phones;
2. the language model: `eval.lm` (ARPA or KenLM binary), or the training transcripts' bigram
   (`train`: RUN/lm.arpa, written at training time; rebuilt from the transcripts for older runs);
3. per utterance the decoder's best word sequence, read back as tokens (and words).
Details: docs/evaluation.md#the-word-constrained-search-evalvocabularypy."""
from __future__ import annotations

import atexit
import os
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import numpy as np

from asrdist.corpus.lexicon import LEXICON_NAME, Lexicon, normalize_word
from asrdist.corpus.phones import SILENCE, PhoneTable
from asrdist.data.targets import Targets
from asrdist.errors import DataError
from asrdist.eval.prefixsearch import WordScorer, WordTrie, ctc_vocabulary_decode
from asrdist.eval.wordlm import write_training_lm
from asrdist.io.kaldi_dir import read_data_dir

if TYPE_CHECKING:
    from asrdist.eval.lexdecoder import LexiconSearch

OFF, TRAIN = "none", "train"
PREFIX, FLASHLIGHT = "prefix", "flashlight"


def vocabulary_words(spec: str, train_dir: Path | None) -> list[str]:
    """The words of `spec`: `train` = the words of `train_dir`'s transcripts, else a file whose
    lines start with a word (a word list, or a Kaldi / CMU lexicon: `word(2)` counts as `word`)."""
    if spec == TRAIN:
        return sorted({w for words in training_transcripts(train_dir) for w in words})
    path = Path(spec)
    if not path.is_file():
        raise DataError(f"eval.vocabulary: {path}: word list not found (or use train / none)")
    words = set()
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        fields = line.split()
        if fields and not fields[0].startswith((";;;", "#")):
            word = fields[0]
            if word.endswith(")") and "(" in word[1:]:  # CMU's alternative pronunciations: WORD(2)
                word = word[:word.index("(", 1)]
            words.add(word)
    if not words:
        raise DataError(f"eval.vocabulary: {path}: no words in the file")
    return sorted(words)


def training_transcripts(train_dir: Path | None) -> list[list[str]]:
    """The words of each transcript of the training split `train_dir`; a DataError when they are gone."""
    if train_dir is None or not (Path(train_dir) / "text").is_file():
        raise DataError(f"eval.vocabulary=train: the run's training transcripts ({train_dir}/text) are gone; "
                        "give a word list instead (eval.vocabulary=PATH or --vocabulary PATH)")
    data = read_data_dir(Path(train_dir))
    return [(u.text or "").split() for u in data.utterances.values()]


class VocabularySearch:
    """Constrained search for one run: `search(log_probs)` -> token ids (character models).
    `spellings`: word (normalised) -> its token sequences; `lexicon`: a lexicon file's spellings
    (`read_spellings`) that replace a word's own letters."""

    lm: "Path | None" = None
    """The word language model the search weighs (`use_lm`), None without one."""

    def __init__(self, words: Sequence[str], tokenizer, beam: int, where: str = "eval.vocabulary",
                 lexicon: dict[str, list[tuple[int, ...]]] | None = None, decoder: str = PREFIX):
        self.tokenizer, self.decoder_name = tokenizer, decoder
        self.spellings: dict[str, list[tuple[int, ...]]] = {}
        unusable = 0
        for word in words:
            text = tokenizer.normalize(word)
            if lexicon and text in lexicon:
                self.spellings[text] = lexicon[text]
                continue
            try:
                ids = tokenizer.encode(text)
            except DataError:
                unusable += 1
                continue
            if ids and " " not in text:
                self.spellings[text] = [tuple(ids)]
        encoded = {ids for spelled in self.spellings.values() for ids in spelled}
        if not encoded:
            raise DataError(f"{where}: none of its {len(words)} words can be spelled with the model's characters")
        if unusable:
            print(f"asrdist: note: {where}: {unusable} of {len(words)} words use characters the model never "
                  f"saw; left out", file=sys.stderr)
        self.num_words = len(encoded)
        self.word_of = {}
        for word in sorted(self.spellings):
            for ids in self.spellings[word]:
                self.word_of.setdefault(tuple(ids), word)  # homographs: the first word in order
        # A model that never saw a space (isolated-word training) says one word per utterance.
        self.separator = tokenizer.symbols.index(" ") + 1 if " " in tokenizer.symbols else None
        self.one_word = self.separator is None
        self.num_tokens = tokenizer.vocab_size
        self.beam = max(1, beam)
        self.lm_weight, self.word_bonus = 0.0, 0.0
        self._decoder: LexiconSearch | None = None
        self._scorer: WordScorer | None = None
        self._trie: WordTrie | None = None
        self._read: dict[tuple[int, ...], list[str]] = {}

    def use_lm(self, path: Path | None, weight: float, bonus: float) -> None:
        """Weigh the word LM at `path` (None: none) by `weight` and add `bonus` per word."""
        self.lm, self.lm_weight, self.word_bonus = path, weight, bonus
        self._decoder = self._scorer = None

    @property
    def scorer(self) -> WordScorer | None:
        """The prefix search's word LM scorer, None without LM and bonus."""
        if self._scorer is None and (self.lm is not None or self.word_bonus != 0):
            # flashlight-text (0.1-0.3 s to import) only where a word LM is read: every learner
            # imports this module for its run's final evaluation
            from asrdist.eval.lexdecoder import lm_with_words
            words = sorted(self.spellings)
            lm, ids = lm_with_words(words, self.lm) if self.lm is not None else (None, range(len(words)))
            self._scorer = WordScorer(lm, self.word_of, dict(zip(words, ids)), self.lm_weight, self.word_bonus)
        return self._scorer

    @property
    def decoder(self) -> LexiconSearch:
        if self._decoder is None:
            # flashlight-text only where its decoder runs (see `scorer`)
            from asrdist.eval.lexdecoder import LexiconSearch
            self._decoder = LexiconSearch(self.spellings, self.num_tokens, self.separator, self.beam,
                                          lm=self.lm, lm_weight=self.lm_weight, word_bonus=self.word_bonus,
                                          one_word=self.one_word)
        return self._decoder

    def search(self, log_probs: np.ndarray) -> list[int]:
        if self.decoder_name == PREFIX:
            if self._trie is None:
                self._trie = WordTrie(sorted(self.word_of))
            return ctc_vocabulary_decode(log_probs, self._trie, self.separator, beam=self.beam,
                                         one_word=self.one_word, lm=self.scorer)
        tokens, words = self.decoder.decode(log_probs)
        self._read[tuple(tokens)] = words
        return tokens

    def word_key(self, word: str) -> str:
        """`word` of a transcript as `spellings` names it."""
        return self.tokenizer.normalize(word)


class PronouncedSearch(VocabularySearch):
    """Constrained search for a phone CTC model: hypotheses are the vocabulary words'
    pronunciations (a lexicon's, silence left out) one after another, and `words(tokens)` reads a
    hypothesis back as the words the search found. `one_word`: exactly one word per utterance
    (isolated-word training)."""

    def __init__(self, lexicon, words: Sequence[str], beam: int, one_word: bool = False,
                 where: str = "eval.vocabulary", decoder: str = PREFIX):
        self.decoder_name = decoder
        silence = lexicon.table.silence_id if SILENCE in lexicon.table else None
        self.word_of: dict[tuple[int, ...], str] = {}
        missing = 0
        for word in sorted({normalize_word(w) for w in words}):
            if word not in lexicon:
                missing += 1
                continue
            for pron in lexicon.pronunciations(word):
                pron = tuple(p for p in pron if p != silence)
                if pron:
                    self.word_of.setdefault(pron, word)  # homophones: the first word in order
        self.spellings = {}
        for pron, word in self.word_of.items():
            self.spellings.setdefault(word, []).append(pron)
        source = f" ({lexicon.source})" if lexicon.source else ""
        if not self.word_of:
            raise DataError(f"{where}: none of its {len(words)} words is in the lexicon{source}")
        if missing:
            print(f"asrdist: note: {where}: {missing} of {len(words)} words have no pronunciation in the "
                  f"lexicon{source}; left out", file=sys.stderr)
        self.num_words = len(self.spellings)
        self.num_tokens = len(lexicon.table)
        self.separator, self.one_word, self.beam = None, one_word, max(1, beam)
        self.lm_weight, self.word_bonus = 0.0, 0.0
        self._decoder, self._scorer, self._trie, self._read = None, None, None, {}

    def word_key(self, word: str) -> str:
        return normalize_word(word)

    def words(self, tokens: Sequence[int]) -> list[str]:
        """The words the search read `tokens` (one of its hypotheses) as; other tokens: the fewest
        vocabulary words whose pronunciations spell them in order ([] if none do)."""
        tokens = tuple(int(t) for t in tokens)
        if tokens in self._read:
            return list(self._read[tokens])
        longest = max(map(len, self.word_of))
        best: list[list[str] | None] = [[]] + [None] * len(tokens)
        for start in range(len(tokens)):
            if best[start] is None:
                continue
            for end in range(start + 1, min(len(tokens), start + longest) + 1):
                word = self.word_of.get(tokens[start:end])
                if word is not None and (best[end] is None or len(best[start]) + 1 < len(best[end])):
                    best[end] = best[start] + [word]
        return best[-1] or []


class TokenLMSearch:
    """A character model's free search under a token LM (`eval.lm` whose words are the model's
    characters, `|` for the space): flashlight-text's lexicon-free decoder."""

    one_word = False

    def __init__(self, tokenizer, beam: int, lm: Path, weight: float):
        # flashlight-text only where its decoder runs (see `VocabularySearch.scorer`)
        from asrdist.eval.lexdecoder import LexiconFreeSearch
        names = ["<blank>"] + ["|" if c == " " else c for c in tokenizer.symbols]
        separator = tokenizer.symbols.index(" ") + 1 if " " in tokenizer.symbols else None
        self.decoder = LexiconFreeSearch(names, max(1, beam), lm, weight, separator=separator)

    def search(self, log_probs: np.ndarray) -> list[int]:
        return self.decoder.decode(log_probs)


def read_spellings(path: Path, tokenizer, where: str = "eval.lexicon") -> dict[str, list[tuple[int, ...]]]:
    """A character model's lexicon: `word  c h a r s [|]` lines (flashlight's form; `|` is the space
    and ends a word) -> {word: its spellings as token ids}; a DataError naming a line that does not fit."""
    out: dict[str, list[tuple[int, ...]]] = {}
    for number, line in enumerate(path.read_text(encoding="utf-8", errors="replace").splitlines(), 1):
        fields = line.split()
        if not fields or fields[0].startswith((";;;", "#")):
            continue
        letters = [f for f in fields[1:] if f != "|"] or list(fields[0])
        if any(len(f) != 1 for f in letters):
            raise DataError(f"{where}: {path}: line {number}: a character model's lexicon spells each word in "
                            f"single characters (word  c h a r s |), got {' '.join(fields[1:])!r}")
        try:
            ids = tuple(tokenizer.encode(tokenizer.normalize("".join(letters))))
        except DataError:
            continue  # characters the model never saw: left out as for words
        out.setdefault(tokenizer.normalize(fields[0]), []).append(ids)
    if not out:
        raise DataError(f"{where}: {path}: no word spelled with the model's characters")
    return out


def training_lm_sentences(train_dir: Path, targets: Targets) -> list[list[str]]:
    """The training transcripts' words as the search names them (the LM's words)."""
    key = targets.tokenizer.normalize if targets.kind == "chars" else normalize_word
    return [[key(w) for w in words] for words in training_transcripts(train_dir)]


_BUILT: dict[tuple, Path] = {}


def training_lm(train_dir: Path, targets: Targets) -> Path:
    """The training transcripts' bigram as an ARPA file, for a run directory without `lm.arpa`
    (runs trained before it was written, validation during training): a temporary file per process."""
    text = Path(train_dir) / "text"
    stamp = (str(text.resolve()), text.stat().st_mtime_ns if text.is_file() else 0, targets.kind)
    if stamp not in _BUILT or not _BUILT[stamp].is_file():
        handle, name = tempfile.mkstemp(prefix="asrdist-lm-", suffix=".arpa")
        os.close(handle)
        atexit.register(lambda: Path(name).unlink(missing_ok=True))
        _BUILT[stamp] = write_training_lm(Path(name), training_lm_sentences(train_dir, targets))
    return _BUILT[stamp]


def vocabulary_search(cfg, targets: Targets):
    """The run's constrained search per `cfg.eval` (vocabulary, lexicon, lm), or None (unconstrained):
    words spelled with a character model's characters (or by `eval.lexicon`), or pronounced with a
    phone model's phones through a lexicon (`eval.lexicon`; else with `train` the corpus lexicon's
    entries of the training words, with PATH that lexicon file); a character model without a
    vocabulary but with a token LM (`eval.lm` PATH, `eval.lm_weight` > 0) searches tokens under it."""
    ev = cfg.eval
    spec, lexicon_path = ev.vocabulary, getattr(ev, "lexicon", OFF)
    train_dir = Path(cfg.data.corpus) / "train"
    if spec == OFF and lexicon_path == OFF:
        if ev.lm_weight > 0 and targets.kind == "chars" and ev.lm != TRAIN:
            return TokenLMSearch(targets.tokenizer, ev.beam, Path(ev.lm), ev.lm_weight)
        return None
    where = f"eval.vocabulary={spec}" if spec != OFF else f"eval.lexicon={lexicon_path}"
    if targets.kind not in ("chars", "phones"):
        raise DataError(f"{where}: word-constrained decoding needs a CTC model (this run has "
                        f"data.targets={targets.kind}); use eval.vocabulary=none")
    if targets.kind == "phones":
        search = _pronounced_search(spec, lexicon_path, targets, train_dir, ev.beam, where, ev.decoder)
        if ev.decoder == PREFIX and not search.one_word and (ev.lm_weight > 0 or ev.word_bonus != 0):
            raise DataError("eval.decoder=prefix: a phone model's words follow each other without a separator, "
                            "which the prefix search cannot score with a word LM; use eval.decoder=flashlight "
                            "(--decoder flashlight) or eval.lm_weight=0 and eval.word_bonus=0")
    else:
        spellings = read_spellings(Path(lexicon_path), targets.tokenizer) if lexicon_path != OFF else None
        words = vocabulary_words(spec, train_dir) if spec != OFF else sorted(spellings)
        search = VocabularySearch(words, targets.tokenizer, ev.beam, where=where, lexicon=spellings,
                                  decoder=ev.decoder)
    if ev.lm_weight > 0:
        search.use_lm(training_lm(train_dir, targets) if ev.lm == TRAIN else Path(ev.lm), ev.lm_weight,
                      ev.word_bonus)
    elif ev.word_bonus != 0:
        search.use_lm(None, 0.0, ev.word_bonus)
    return search


def _pronounced_search(spec: str, lexicon_path: str, targets: Targets, train_dir: Path, beam: int,
                       where: str, decoder: str = PREFIX) -> PronouncedSearch:
    table = PhoneTable(targets.phones)
    if lexicon_path != OFF:
        path = Path(lexicon_path)
    else:
        path = train_dir.parent / LEXICON_NAME if spec == TRAIN else Path(spec)
    if lexicon_path == OFF and spec == TRAIN and not path.is_file():
        raise DataError(f"{where}: a phone model's words are pronounced by the corpus lexicon ({path}), "
                        "which is missing; give a lexicon file (eval.lexicon=PATH or --vocabulary PATH)")
    try:
        lexicon = Lexicon.read(path, table)
    except DataError as exc:
        raise DataError(f"{where}: a phone model needs a lexicon (each word with its phones): {exc}") from None
    # The training transcripts, read once: the words (with `train`) and, as for characters, whether
    # the model was trained on isolated words and so says one word per utterance.
    transcripts = training_transcripts(train_dir) if spec == TRAIN or (train_dir / "text").is_file() else None
    if spec == TRAIN:
        words = sorted({w for t in transcripts for w in t})
    elif spec != OFF and lexicon_path != OFF:
        words = vocabulary_words(spec, train_dir)
    else:
        words = list(lexicon.entries)
    one_word = transcripts is not None and all(len(t) <= 1 for t in transcripts)
    return PronouncedSearch(lexicon, words, beam, one_word=one_word, where=where, decoder=decoder)
