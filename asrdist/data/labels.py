"""All label code: a split's alignments (checked against the phone table), its frame labels
(monophones or tied states), its CTC token sequences (phones from alignments or the lexicon,
characters from transcripts), and the check that CTC utterances are long enough for their labels."""
from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

from asrdist.corpus.lexicon import lexicon_phone_tokens
from asrdist.corpus.phones import PhoneTable
from asrdist.data.targets import Targets, phone_tokens
from asrdist.errors import DataError
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_alignments, read_data_dir

CTC_TARGETS = ("phones", "chars")


def split_alignments(split_dir: Path, num_phones: int | None = None) -> dict[str, np.ndarray]:
    if not (split_dir / "alignment.scp").is_file():
        raise DataError(f"{split_dir}: no alignment.scp; frame-level targets need alignments "
                        f"(use a CTC model, data.targets=phones|chars, for unaligned corpora)")
    return checked_alignments(split_dir, num_phones)


def check_alignment_ids(corpus: Path, targets: str) -> None:
    """Up front, for targets read from alignments: every phone id of the train and valid
    alignments is in the corpus' phone table."""
    if targets not in ("monophone", "tied", "phones") or not (corpus / "phones.txt").is_file():
        return
    num_phones = len(PhoneTable.read(corpus / "phones.txt").symbols)
    for split in (corpus / "train", corpus / "valid"):
        if (split / "alignment.scp").is_file():
            checked_alignments(split, num_phones)


def checked_alignments(split_dir: Path, num_phones: int | None) -> dict[str, np.ndarray]:
    """The split's alignments, every phone id within the phone table of `num_phones` (when given)."""
    alignments = read_alignments(split_dir)
    for utt, a in alignments.items() if num_phones is not None else ():
        if a.size and (a.min() < 0 or a.max() >= num_phones):
            bad = int(a.min()) if a.min() < 0 else int(a.max())
            raise DataError(f"{split_dir / 'alignment.scp'}: utterance {utt}: phone id {bad} is outside the "
                            f"corpus' phone table (0..{num_phones - 1}); the alignment is another table's")
    return alignments


def frame_labels(split_dir: Path, targets: Targets,
                 alignments: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per-utterance frame labels (monophones, or tied states) for a split with alignments."""
    if alignments is None:
        alignments = split_alignments(split_dir, len(targets.phones))
    tied = targets.tied
    if tied is None:
        return alignments
    return {u: tied.map(a) for u, a in alignments.items()}


def phone_sequences(alignments: dict[str, np.ndarray], silence_id: int) -> dict[str, list[int]]:
    return {u: phone_tokens(a, silence_id) for u, a in alignments.items()}


def ctc_tokens(split_dir: Path, targets: Targets, data=None) -> dict[str, list[int]]:
    """Per-utterance token ids (blank = 0 is never a target). `data`: the split's `DataDir`, when
    the caller has read it already (targets from transcripts read it otherwise)."""
    if targets.kind == "phones":
        if not (split_dir / "alignment.scp").is_file():
            tokens = lexicon_phone_tokens(split_dir, data, targets.phones)
            if tokens is None:
                raise DataError(f"{split_dir}: phone CTC targets need alignment.scp or a lexicon (SPLIT/lexicon.txt or "
                                f"CORPUS/lexicon.txt, `asrdist corpus import-kaldi ... --lexicon FILE`); or use "
                                f"data.targets=chars")
            return tokens
        return phone_sequences(checked_alignments(split_dir, len(targets.phones)), targets.silence_id)
    return char_tokens(split_dir, targets.tokenizer, data)


def note_short_utterances(split_dir: Path, targets: Targets, subsample: int) -> int:
    """CTC must emit each label on a frame of its own (a blank between two equal ones): an
    utterance with fewer output frames has no path, its loss is zeroed and it teaches nothing.
    Says how many of the split's utterances are so (one note); returns the count."""
    store = FeatureStore(split_dir)
    short = []
    tokens = ctc_tokens(split_dir, targets)
    for utt, ids in tokens.items():
        if utt in store:
            frames = -(-store.num_frames(utt) // subsample)
            needed = len(ids) + sum(1 for a, b in zip(ids, ids[1:]) if a == b)
            if frames < needed:
                short.append((utt, frames, needed))
    if short:
        utt, frames, needed = short[0]
        print(f"[asrdist] note: {split_dir}: {len(short)} of {len(tokens)} utterance(s) are too short for their "
              f"transcripts (e.g. {utt}: {frames} output frame(s) for {needed} CTC labels and blanks); they have no CTC "
              f"path, so their loss is zero and they teach nothing", file=sys.stderr, flush=True)
    return len(short)


_noted_unseen: set[str] = set()


def char_tokens(split_dir: Path, tok, data=None) -> dict[str, list[int]]:
    """Character targets of a split's utterances. An utterance with a character the training
    transcripts never had (a test set's 'é' or '!') has no target: it is left out here (the loss)
    and scored from its text by `asrdist.eval.evaluate` (where the model, which cannot say the
    character, makes an error), with one note per split and process. A split where every
    utterance has one is refused: it is no text this model was trained for. `data`: as ctc_tokens."""
    data = data if data is not None else read_data_dir(split_dir)
    tokens, unseen, left = {}, set(), []
    for u in data.utt_ids:
        chars = tok.unseen(data.utterances[u].text)
        if chars:
            unseen |= chars
            left.append(u)
        else:
            tokens[u] = tok.encode(data.utterances[u].text)
    if left:
        shown = " ".join(repr(c) for c in sorted(unseen)[:20]) + (" ..." if len(unseen) > 20 else "")
        if not tokens:
            raise DataError(f"{split_dir / 'text'}: every utterance holds characters the training transcripts "
                            f"never had ({shown}): is this text in the model's language and spelling?")
        if str(split_dir) not in _noted_unseen:
            _noted_unseen.add(str(split_dir))
            print(f"[asrdist] note: {split_dir / 'text'}: {len(left)} of {len(data.utt_ids)} utterance(s) hold "
                  f"characters the training transcripts never had ({shown}; e.g. utterance {left[0]}): scored, "
                  f"those characters counting as errors, but left out of the loss", file=sys.stderr, flush=True)
    return tokens
