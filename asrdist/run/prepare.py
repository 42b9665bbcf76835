"""Run preparation, done once before learners start: features, targets, priors, phone bigram.

Everything here is a deterministic function of the corpus and the config, saved to
RUN_DIR/targets.pt so every learner (and `asrdist eval`) reads the same label mapping.
"""
from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import numpy as np

from asrdist.config import RunConfig
from asrdist.corpus.phones import PhoneTable
from asrdist.data.labels import (
    CTC_TARGETS,
    frame_labels,
    phone_sequences,
    split_alignments,
)
from asrdist.data.targets import CharTokenizer, Targets, TiedStates, label_priors
from asrdist.errors import ConfigError, DataError, Stopped
from asrdist.data.bigram import PhoneBigram
from asrdist.features.augment import AUGMENTED_DIR
from asrdist.features.extract import extract_features, find_splits
from asrdist.features.frontend import feature_record
from asrdist.features.store import (
    FeatureStore,
    has_features,
    hold_for_reading,
    rewriting,
    source_change,
)
from asrdist.io.atomic import save_torch_atomic
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.run.rundir import TARGETS_NAME, read_torch_file

SPLITS = ("train", "valid", "test")


def check_corpus(corpus: Path) -> None:
    """Up front, before anything is written: `corpus` is a corpus and holds the splits training
    reads (train, and valid for the end of every epoch)."""
    if (corpus / "wav.scp").is_file():
        raise DataError(f"{corpus}: one split directory (wav.scp inside), not a corpus; build a corpus with "
                        f"`asrdist corpus import-kaldi SRC OUT --split train` (a valid set is carved off by "
                        f"speaker) or from a directory holding train / dev / test")
    if not corpus.is_dir():
        raise DataError(f"{corpus}: corpus directory not found; make it with `asrdist corpus synth {corpus}` (the "
                        f"synthetic corpus configs/default.yaml trains on) or `asrdist corpus fsdd|import-kaldi|"
                        f"import-lhotse ... {corpus}`, or give another with --data CORPUS")
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
    for split in splits:
        if has_features(split):
            try:
                meta = FeatureStore(split).meta
            except Stopped:  # a stop signal came meanwhile: the command stops (not a damaged input)
                raise
            except Exception:  # a damaged store: nothing to keep
                return ""
            return f"data.num_mel_bins={meta.get('num_mel_bins')} data.cmvn={meta.get('cmvn')}"
    return ""


def _drop_augmented(splits) -> None:
    """Augmented copies (`asrdist.features.augment`) are made from a split's audio and normalized with
    its features' statistics, and are reused while they exist: after a re-extraction they are of
    the old utterances and statistics, so they go, to be made again from the new features."""
    for split in splits:
        if (split / AUGMENTED_DIR).is_dir():
            shutil.rmtree(split / AUGMENTED_DIR)


def build_targets(corpus: Path, cfg: RunConfig, model_kind: str) -> Targets:
    """Fit the label side of the run on the training split."""
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
    train = corpus / "train"
    out = Targets(kind=kind, phones=list(phones.symbols), silence_id=phones.silence_id, num_classes=0,
                  features=feature_record(train))  # `asrdist decode` rebuilds the front end from it
    if kind in ("monophone", "tied"):
        alignments = split_alignments(train, len(phones))
        if kind == "tied":
            out.tied = TiedStates.fit(alignments, len(phones), cfg.data.tied_states,
                                      context_independent=[phones.silence_id])
            out.num_classes = out.tied.num_classes
            out.class_to_phone = np.asarray(out.tied.class_to_phone)
        else:
            out.num_classes = len(phones)
            out.class_to_phone = np.arange(len(phones))
        labels = frame_labels(train, out, alignments)
        out.priors = label_priors(list(labels.values()), out.num_classes)
        seqs = list(phone_sequences(alignments, phones.silence_id).values())
        out.bigram = PhoneBigram.fit(seqs, len(phones), smoothing=cfg.eval.bigram_smoothing)
    elif kind == "phones":
        out.num_classes = len(phones)  # token id = phone id; id 0 (sil) doubles as the CTC blank
    else:
        data = read_data_dir(train)
        out.tokenizer = CharTokenizer.fit([u.text for u in data.utterances.values()])
        out.num_classes = out.tokenizer.vocab_size
    return out


def save_targets(run_dir: Path, targets: Targets) -> None:
    save_torch_atomic(run_dir / TARGETS_NAME, targets.to_blob())


def load_targets(run_dir: Path) -> Targets:
    path = run_dir / TARGETS_NAME
    if not path.is_file():
        raise DataError(f"{path}: missing; is {run_dir} an asrdist run directory?")
    blob = read_torch_file(path, "targets file")
    if not isinstance(blob, dict):
        raise DataError(f"{path}: not an asrdist targets file (a {type(blob).__name__})")
    return Targets.from_blob(blob, str(path))
