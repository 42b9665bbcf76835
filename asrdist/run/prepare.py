"""Run preparation, done once before learners start: features, targets, priors, phone bigram.

Everything here is a deterministic function of the corpus and the config, saved to
RUN_DIR/targets.pt so every learner (and `asrdist eval`) reads the same label mapping.
"""
from __future__ import annotations

import contextlib
import sys
from pathlib import Path
from typing import Any

import numpy as np

from asrdist.config import RunConfig
from asrdist.io.kaldi_dir import read_alignments, read_data_dir
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import ConfigError, DataError
from asrdist.io.atomic import save_torch_atomic

SPLITS = ("train", "valid", "test")
CTC_TARGETS = ("phones", "chars")


def check_corpus(corpus: Path) -> None:
    """Up front, before anything is written: `corpus` is a corpus and holds the splits training
    reads (train, and valid for the end of every epoch)."""
    if (corpus / "wav.scp").is_file():
        raise DataError(f"{corpus}: one split directory (wav.scp inside), not a corpus; build a corpus with "
                        f"`asrdist corpus import-kaldi SRC OUT --split train` (a valid set is carved off by "
                        f"speaker) or from a directory holding train / dev / test")
    if not corpus.is_dir():
        raise DataError(f"{corpus}: corpus directory not found")
    if not (corpus / "train" / "wav.scp").is_file():
        raise DataError(f"{corpus}: not a corpus directory (no train/ inside); build one with `asrdist corpus "
                        f"synth|fsdd|import-kaldi|import-lhotse ...`")
    if not (corpus / "valid" / "wav.scp").is_file():
        raise DataError(f"{corpus}: no valid/ split, which training evaluates at every epoch end; import the "
                        f"corpus again with `asrdist corpus import-kaldi` or `import-lhotse` (without a dev set "
                        f"they carve one off the training speakers, --valid-speakers N) or add a valid/ Kaldi "
                        f"data directory")


def feature_mismatch(split: Path, cfg: RunConfig, sample_rate: int | None = None) -> str | None:
    """Why the features in `split` are not the recipe's (None when they are): missing, other
    settings, another sample rate than `sample_rate` (a model's; default: the audio's own), or
    stale (the split's utterances or audio changed since extraction). Imported Kaldi features (no
    `num_mel_bins` recorded) are taken as they are, as long as they still cover the split."""
    from asrdist.features.store import FeatureStore, has_features, source_change

    if not has_features(split):
        return "it has none"
    store = FeatureStore(split)
    meta = store.meta
    if meta.get("num_mel_bins") is None:
        _check_imported(split, store)
        return None
    have = (meta["num_mel_bins"], meta.get("cmvn"))
    if have != (cfg.data.num_mel_bins, cfg.data.cmvn):
        return f"its features have num_mel_bins={have[0]}, cmvn={have[1]}"
    return _rate_mismatch(meta, sample_rate) or source_change(split, store)


def _rate_mismatch(meta: dict, sample_rate: int | None) -> str | None:
    """Features at another rate than the model's (or, for training, than the audio's own) are
    other features: filterbanks of 8 and 16 kHz audio span other frequencies."""
    rate = meta.get("sample_rate")
    audio_rate = meta.get("audio_sample_rate", rate)
    want = sample_rate or audio_rate
    if rate == want:
        return None
    if audio_rate != rate:
        return f"its features are of {audio_rate} Hz audio resampled to {rate} Hz, not {want} Hz"
    return f"its features are of {rate} Hz audio, not {want} Hz"


def _check_imported(split: Path, store) -> None:
    """Imported features cannot be re-extracted the way they were made: a split that changed
    since its import is an error rather than training or scoring only the old utterances."""
    from asrdist.features.store import source_change

    why = source_change(split, store)
    if why:
        corpus = split.parent if (split.parent / "train" / "wav.scp").is_file() else split
        raise DataError(f"{split}: its imported features no longer fit the split ({why}); import the corpus "
                        f"again, or extract features with `asrdist features {corpus} --overwrite`")


def recorded_choices(data: Path) -> tuple[int | None, bool]:
    """(channel, skip_bad): what the user chose when extracting the corpus' features (`asrdist
    features DATA --channel K --skip-bad`, kept in each split's meta.json), so re-extracting with a
    recipe's settings reads the same channel of multi-channel audio and again skips the audio that
    cannot be read; (None, False) when no store records them."""
    from asrdist.features.extract import find_splits
    from asrdist.features.store import FeatureStore, has_features

    channel, skip_bad = None, False
    for split in find_splits(data).values():
        if has_features(split):
            meta = FeatureStore(split).meta
            recorded = meta.get("channel")
            if channel is None and isinstance(recorded, int) and not isinstance(recorded, bool):
                channel = recorded
            skip_bad = skip_bad or meta.get("skip_bad") is True or bool(meta.get("skipped"))
    return channel, skip_bad


def ensure_features(data: Path, cfg: RunConfig, progress: bool = True, check: bool = True,
                    sample_rate: int | None = None) -> None:
    """Features with the recipe's settings in every split of corpus `data` (or in split `data`):
    extracted when missing, re-extracted (and said so) when made with other settings, at another
    rate than `sample_rate` (a model's; audio is then resampled, as `asrdist decode` does), or
    from a split that changed since. Training or decoding on another CMVN, filterbank size or
    rate, or on yesterday's utterance list, would otherwise quietly mean something else. The
    channel the corpus' stores recorded is read again."""
    from asrdist.features.extract import extract_features, find_splits
    from asrdist.features.store import hold_for_reading, rewriting

    if check:
        check_corpus(data)
    splits = find_splits(data)
    for path in splits.values():  # this command reads them: no other rewrites them until it ends
        hold_for_reading(path)
    why = {name: feature_mismatch(path, cfg, sample_rate) for name, path in splits.items()}
    stale = {name: reason for name, reason in why.items() if reason}
    if not stale:
        return
    stored = _stored_settings(splits.values())
    asked = f"data.num_mel_bins={cfg.data.num_mel_bins} data.cmvn={cfg.data.cmvn}"
    keep = f"; or give this recipe the stored settings ({stored})" if stored and stored != asked else ""
    hint = f"run this recipe when that command has ended{keep}"
    channel, skip_bad = recorded_choices(data)
    said = "; ".join(f"{name}: {reason}" for name, reason in stale.items())
    rate = f", sample_rate={sample_rate}" if sample_rate else ""
    picked = f", channel {channel}" if channel is not None else ""
    skipping = ", skipping unreadable audio as before (--skip-bad)" if skip_bad else ""
    with contextlib.ExitStack() as held:
        for path in splits.values():  # refused before a word is said while another command reads them
            held.enter_context(rewriting(path, hint))
        print(f"[asrdist] {data}: extracting features with the recipe's num_mel_bins={cfg.data.num_mel_bins}, "
              f"cmvn={cfg.data.cmvn}{rate}{picked}{skipping} ({said})", flush=True)
        extract_features(data, num_mel_bins=cfg.data.num_mel_bins, cmvn=cfg.data.cmvn, overwrite=True,
                         progress=progress, mel_bins_key="data.num_mel_bins", channel=channel,
                         sample_rate=sample_rate, skip_bad=skip_bad, busy_hint=hint)
    _drop_augmented(splits.values())


def _stored_settings(splits) -> str:
    """The recipe keys that would match the features stored now (`data.num_mel_bins=40 data.cmvn=global`)."""
    from asrdist.features.store import FeatureStore, has_features

    for split in splits:
        if has_features(split):
            try:
                meta = FeatureStore(split).meta
            except Exception:  # a damaged store: nothing to keep
                return ""
            return f"data.num_mel_bins={meta.get('num_mel_bins')} data.cmvn={meta.get('cmvn')}"
    return ""


def _drop_augmented(splits) -> None:
    """Augmented copies (`asrdist.features.augment`) are made from a split's audio and normalized with
    its features' statistics, and are reused while they exist: after a re-extraction they are of
    the old utterances and statistics, so they go, to be made again from the new features."""
    import shutil

    from asrdist.features.augment import AUGMENTED_DIR

    for split in splits:
        if (split / AUGMENTED_DIR).is_dir():
            shutil.rmtree(split / AUGMENTED_DIR)


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


def frame_labels(split_dir: Path, targets: dict[str, Any],
                 alignments: dict[str, np.ndarray] | None = None) -> dict[str, np.ndarray]:
    """Per-utterance frame labels (monophones, or tied states) for a split with alignments."""
    if alignments is None:
        alignments = split_alignments(split_dir, len(targets["phones"]))
    tied = targets.get("tied")
    if tied is None:
        return alignments
    return {u: tied.map(a) for u, a in alignments.items()}


def phone_sequences(alignments: dict[str, np.ndarray], silence_id: int) -> dict[str, list[int]]:
    from asrdist.data.targets import phone_tokens

    return {u: phone_tokens(a, silence_id) for u, a in alignments.items()}


def ctc_tokens(split_dir: Path, targets: dict[str, Any], data=None) -> dict[str, list[int]]:
    """Per-utterance token ids (blank = 0 is never a target). `data`: the split's `DataDir`, when
    the caller has read it already (targets from transcripts read it otherwise)."""
    if targets["kind"] == "phones":
        if not (split_dir / "alignment.scp").is_file():
            from asrdist.corpus.lexicon import lexicon_phone_tokens

            tokens = lexicon_phone_tokens(split_dir, data)
            if tokens is None:
                raise DataError(f"{split_dir}: phone CTC targets need alignment.scp or a lexicon (CORPUS/lexicon.txt, "
                                f"`asrdist corpus import-kaldi ... --lexicon FILE`); or use data.targets=chars")
            return tokens
        return phone_sequences(checked_alignments(split_dir, len(targets["phones"])), targets["silence_id"])
    return char_tokens(split_dir, targets["tokenizer"], data)


def note_short_utterances(split_dir: Path, targets: dict[str, Any], subsample: int) -> int:
    """CTC must emit each label on a frame of its own (a blank between two equal ones): an
    utterance with fewer output frames has no path, its loss is zeroed and it teaches nothing.
    Says how many of the split's utterances are so (one note); returns the count."""
    from asrdist.features.store import FeatureStore

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


def build_targets(corpus: Path, cfg: RunConfig, model_kind: str) -> dict[str, Any]:
    """Fit the label side of the run on the training split."""
    from asrdist.data.targets import CharTokenizer, TiedStates, label_priors
    from asrdist.eval.decode import PhoneBigram
    from asrdist.features.frontend import feature_record

    kind = cfg.data.targets
    if (corpus / "phones.txt").is_file():
        phones = PhoneTable.read(corpus / "phones.txt")
    elif kind == "chars":
        phones = PhoneTable()  # character targets use no phone table
    else:
        raise DataError(f"{corpus / 'phones.txt'}: missing; data.targets={kind} needs the corpus' phone table "
                        f"(data.targets=chars does not)")
    if (model_kind == "ctc") != (kind in CTC_TARGETS):
        raise ConfigError(f"data.targets: '{kind}' does not fit model '{cfg.model.name}' "
                          f"({'phones or chars' if model_kind == 'ctc' else 'monophone or tied'} expected)")
    out: dict[str, Any] = {"kind": kind, "phones": list(phones.symbols), "silence_id": phones.silence_id}
    train = corpus / "train"
    out["features"] = feature_record(train)  # `asrdist decode` rebuilds the front end from it
    if kind in ("monophone", "tied"):
        alignments = split_alignments(train, len(phones))
        if kind == "tied":
            out["tied"] = TiedStates.fit(alignments, len(phones), cfg.data.tied_states,
                                         context_independent=[phones.silence_id])
            out["num_classes"] = out["tied"].num_classes
            out["class_to_phone"] = np.asarray(out["tied"].class_to_phone)
        else:
            out["num_classes"] = len(phones)
            out["class_to_phone"] = np.arange(len(phones))
        labels = frame_labels(train, out, alignments)
        out["priors"] = label_priors(list(labels.values()), out["num_classes"])
        seqs = list(phone_sequences(alignments, phones.silence_id).values())
        out["bigram"] = PhoneBigram.fit(seqs, len(phones), smoothing=cfg.eval.bigram_smoothing)
    elif kind == "phones":
        out["num_classes"] = len(phones)  # token id = phone id; id 0 (sil) doubles as the CTC blank
    else:
        data = read_data_dir(train)
        out["tokenizer"] = CharTokenizer.fit([u.text for u in data.utterances.values()])
        out["num_classes"] = out["tokenizer"].vocab_size
    return out


def save_targets(run_dir: Path, targets: dict[str, Any]) -> None:
    blob = dict(targets)
    if "tied" in blob:
        blob["tied"] = blob["tied"].to_dict()
    if "tokenizer" in blob:
        blob["tokenizer"] = blob["tokenizer"].to_dict()
    save_torch_atomic(run_dir / "targets.pt", blob)


def load_targets(run_dir: Path) -> dict[str, Any]:
    from asrdist.data.targets import CharTokenizer, TiedStates

    path = run_dir / "targets.pt"
    if not path.is_file():
        raise DataError(f"{path}: missing; is {run_dir} an asrdist run directory?")
    from asrdist.train.checkpoint import read_torch_file

    blob = read_torch_file(path, "targets file")
    if not isinstance(blob, dict):
        raise DataError(f"{path}: not an asrdist targets file (a {type(blob).__name__})")
    if isinstance(blob.get("tied"), dict):
        blob["tied"] = TiedStates.from_dict(blob["tied"])
    if isinstance(blob.get("tokenizer"), dict):
        blob["tokenizer"] = CharTokenizer.from_dict(blob["tokenizer"])
    return blob
