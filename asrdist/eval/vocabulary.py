"""Word-constrained CTC decoding: hypotheses made only of vocabulary words (`eval.vocabulary`).

The vocabulary is the training transcripts' words (`train`), a word list or lexicon file, or off
(`none`). The search is CTC prefix beam search whose prefixes walk a trie of the words' tokens:
1. a prefix extends only by a child of its trie node, or by the word separator at a word's end;
2. per frame prefixes stay or extend, equal ones merge, the `beam` best survive (plus the best
   ending on a whole word);
3. the most probable prefix ending on a whole word wins.
A phone model's hypothesis is read back as the fewest words whose pronunciations make it. The
steps in full: docs/evaluation.md#the-word-constrained-search-evalvocabularypy."""
from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Sequence

import numpy as np

from asrdist.corpus.lexicon import LEXICON_NAME, Lexicon, normalize_word
from asrdist.corpus.phones import SILENCE, PhoneTable
from asrdist.data.targets import Targets
from asrdist.errors import DataError
from asrdist.eval.wordlm import END, WordBigram
from asrdist.io.kaldi_dir import read_data_dir

NEG_INF = -math.inf
OFF, TRAIN = "none", "train"


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


class WordScorer:
    """Word bigram scores for the search, on token sequences: `weight` x log P(word | previous) +
    `bonus` per completed word, and `weight` x log P(end | last word) at the end
    (`asrdist.eval.wordlm`)."""

    def __init__(self, bigram, word_of: dict[tuple[int, ...], str], weight: float, bonus: float = 0.0):
        self.bigram, self.word_of, self.weight, self.bonus = bigram, word_of, weight, bonus

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

    def completed(self, tokens: tuple[int, ...], separator: int) -> float:
        """The score of the word `tokens` end in (a separator comes next)."""
        words = self._words(tokens, separator)
        previous = words[-2] if len(words) > 1 else None
        return self.weight * self.bigram.log_prob(previous, words[-1]) + self.bonus

    def ended(self, tokens: tuple[int, ...], separator: int | None) -> float:
        """The score of a finished hypothesis' last word (not yet scored) and of its end."""
        words = self._words(tokens, separator)
        if not words:
            return 0.0
        last = self.completed(tokens, separator) if separator is not None else (
            self.weight * self.bigram.log_prob(None, words[-1]) + self.bonus)
        return last + self.weight * self.bigram.log_prob(words[-1], END)


def _ends_word(trie: WordTrie, nodes: frozenset) -> bool:
    return any(trie.word_end[n] for n in nodes)


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
    """Constrained search for one run: `search(log_probs)` -> token ids (character models)."""

    lm: "WordScorer | None" = None
    """The word bigram (`use_bigram`), None without one (and for phone models)."""

    def __init__(self, words: Sequence[str], tokenizer, beam: int, where: str = "eval.vocabulary"):
        self.tokenizer = tokenizer
        self.spellings: dict[str, list[tuple[int, ...]]] = {}  # word (normalised) -> its token sequences
        unusable = 0
        for word in words:
            text = tokenizer.normalize(word)
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
        self.trie = WordTrie(sorted(encoded))
        # A model that never saw a space (isolated-word training) says one word per utterance.
        self.separator = tokenizer.symbols.index(" ") + 1 if " " in tokenizer.symbols else None
        self.one_word = self.separator is None
        self.beam = max(1, beam)

    def use_bigram(self, transcripts: Sequence[Sequence[str]], weight: float, bonus: float) -> None:
        """Score hypotheses with a word bigram of `transcripts` (the training split's) too."""
        word_of = {spelled[0]: word for word, spelled in self.spellings.items()}
        known = set(self.spellings)
        sentences = [[self.word_key(w) for w in words] for words in transcripts]
        # a sentence with a word outside the vocabulary is cut there (its pairs across it unknown)
        pieces = []
        for words in sentences:
            piece: list[str] = []
            for w in words + [None]:
                if w is not None and w in known:
                    piece.append(w)
                elif piece:
                    pieces.append(piece)
                    piece = []
        self.lm = WordScorer(WordBigram(pieces, known), word_of, weight, bonus)

    def search(self, log_probs: np.ndarray) -> list[int]:
        return ctc_vocabulary_decode(log_probs, self.trie, self.separator, beam=self.beam, one_word=self.one_word,
                                     lm=self.lm)

    def word_key(self, word: str) -> str:
        """`word` of a transcript as `spellings` names it."""
        return self.tokenizer.normalize(word)


class PronouncedSearch(VocabularySearch):
    """Constrained search for a phone CTC model: hypotheses are the vocabulary words'
    pronunciations (a lexicon's, silence left out) one after another, and `words(tokens)` reads a
    hypothesis back as words. `one_word`: exactly one word per utterance (isolated-word training)."""

    def __init__(self, lexicon, words: Sequence[str], beam: int, one_word: bool = False,
                 where: str = "eval.vocabulary"):
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
        self.num_words = len(set(self.word_of.values()))
        self.trie = WordTrie(sorted(self.word_of))
        self.separator, self.one_word, self.beam = None, one_word, max(1, beam)

    def word_key(self, word: str) -> str:
        return normalize_word(word)

    def words(self, tokens: Sequence[int]) -> list[str]:
        """The fewest vocabulary words whose pronunciations spell `tokens` in order ([] if none do)."""
        tokens = [int(t) for t in tokens]
        best: list[list[str] | None] = [[]] + [None] * len(tokens)
        for start in range(len(tokens)):
            if best[start] is None:
                continue
            node = 0
            for end in range(start, len(tokens)):
                node = self.trie.children[node].get(tokens[end])
                if node is None:
                    break
                if self.trie.word_end[node]:
                    candidate = best[start] + [self.word_of[tuple(tokens[start:end + 1])]]
                    if best[end + 1] is None or len(candidate) < len(best[end + 1]):
                        best[end + 1] = candidate
        return best[-1] or []


def vocabulary_search(cfg, targets: Targets) -> VocabularySearch | None:
    """The run's constrained search per `cfg.eval.vocabulary`, or None (unconstrained): words
    spelled with a character model's characters, or pronounced with a phone model's phones through
    a lexicon (`train`: the corpus lexicon's entries of the training words; PATH: a lexicon file)."""
    spec = cfg.eval.vocabulary
    if spec == OFF:
        return None
    where = f"eval.vocabulary={spec}"
    train_dir = Path(cfg.data.corpus) / "train"
    if targets.kind == "phones":
        if cfg.eval.lm_weight > 0 or cfg.eval.word_bonus != 0:
            raise DataError("eval.lm_weight / eval.word_bonus: the word bigram is for character CTC models "
                            "(this run has data.targets=phones); set them to 0")
        return _pronounced_search(spec, targets, train_dir, cfg.eval.beam, where)
    if targets.kind != "chars":
        raise DataError(f"{where}: word-constrained decoding needs a CTC model (this run has "
                        f"data.targets={targets.kind}); use eval.vocabulary=none")
    search = VocabularySearch(vocabulary_words(spec, train_dir), targets.tokenizer, cfg.eval.beam, where=where)
    if cfg.eval.lm_weight > 0 or cfg.eval.word_bonus != 0:
        search.use_bigram(training_transcripts(train_dir), cfg.eval.lm_weight, cfg.eval.word_bonus)
    return search


def _pronounced_search(spec: str, targets: Targets, train_dir: Path, beam: int, where: str) -> PronouncedSearch:
    table = PhoneTable(targets.phones)
    path = train_dir.parent / LEXICON_NAME if spec == TRAIN else Path(spec)
    if spec == TRAIN and not path.is_file():
        raise DataError(f"{where}: a phone model's words are pronounced by the corpus lexicon ({path}), "
                        "which is missing; give a lexicon file (eval.vocabulary=PATH or --vocabulary PATH)")
    try:
        lexicon = Lexicon.read(path, table)
    except DataError as exc:
        raise DataError(f"{where}: a phone model needs a lexicon (each word with its phones): {exc}") from None
    # The training transcripts, read once: the words (with `train`) and, as for characters, whether
    # the model was trained on isolated words and so says one word per utterance.
    transcripts = training_transcripts(train_dir) if spec == TRAIN or (train_dir / "text").is_file() else None
    words = sorted({w for t in transcripts for w in t}) if spec == TRAIN else list(lexicon.entries)
    one_word = transcripts is not None and all(len(t) <= 1 for t in transcripts)
    return PronouncedSearch(lexicon, words, beam, one_word=one_word, where=where)
