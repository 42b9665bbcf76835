"""`asrdist decode RUN WAV...` (or `--scp wav.scp`): transcribe audio files with a run's model.

The audio goes through the run's own front end (audio at a higher rate resampled to the training
rate, with a note; at a lower one refused, file by file; the recipe's fbank and CMVN); CTC
models are searched greedily or by prefix beam (`eval.beam`), hybrid models by `asrdist eval`'s
phone-loop Viterbi; the model computes on `--device` (the GPU where there is one), the searches
on the CPU. Output is Kaldi's `utt text`. By default every file is its
own unknown speaker (`cmvn.SpeakerPrior` tops up its statistics); files known to share a speaker
(`speakers`: `--same-speaker`, `--utt2spk`) are decoded as `asrdist eval` decodes a speaker.
Details: docs/evaluation.md#decode-audio-files-asrdist-decode."""
from __future__ import annotations

import os
import re
import sys
from pathlib import Path
from typing import Iterator, Sequence

import numpy as np
import torch
from tqdm import tqdm

from asrdist.errors import ConfigError, DataError
from asrdist.eval.adapt import RecipeAdaptation
from asrdist.eval.recognize import recognize
from asrdist.eval.vocabulary import vocabulary_search
from asrdist.features.frontend import features_of, front_end, normalize, raw_features
from asrdist.io.atomic import write_text_atomic
from asrdist.io.audio import AUDIO_SUFFIXES, check_audio_path
from asrdist.corpus.kaldi_tables import resolve_path
from asrdist.io.kaldi_dir import COMMAND_PIPE, read_table, wav_entry_kind
from asrdist.run import evaluate as run_evaluate
from asrdist.run.evaluate import command_line_overrides


def utterance_ids(wavs: Sequence[Path]) -> list[str]:
    """One id per file, unique, without whitespace (in `utt text` the first space ends the id):
    the file's name without its audio suffix (.wav, .flac, .mp3, ...: AUDIO_SUFFIXES); when two
    names collide, every id is the file's path relative to the files' common directory, without the
    suffix (d1/x, d2/x), so ids stay readable and stable; files that then differ only in their
    suffix keep it (x.flac, x.ogg); any id still taken (one file given twice, names equal once
    whitespace became '_') gets -2, -3, ..."""
    stems = [_stem(Path(w).name) for w in wavs]
    if len(set(stems)) < len(stems):
        paths = [Path(os.path.abspath(w)) for w in wavs]
        root = Path(os.path.commonpath([p.parent for p in paths]))
        names = [p.relative_to(root).as_posix() for p in paths]
        stems = [_stem(name) for name in names]
        suffixed: dict[str, set[str]] = {}
        for stem, name in zip(stems, names):
            suffixed.setdefault(stem, set()).add(name)
        stems = [name if len(suffixed[stem]) > 1 else stem for stem, name in zip(stems, names)]
    return _numbered([re.sub(r"\s", "_", stem) for stem in stems])


def _stem(name: str) -> str:
    suffix = next((s for s in AUDIO_SUFFIXES if name.lower().endswith(s) and len(name) > len(s)), "")
    return name[:len(name) - len(suffix)]


def _numbered(ids: list[str]) -> list[str]:
    """`ids` with each repeat of an id made unique by a -2, -3, ... suffix."""
    out: list[str] = []
    used: set[str] = set()
    for uid in ids:
        new, n = uid, 1
        while new in used:
            n += 1
            new = f"{uid}-{n}"
        used.add(new)
        out.append(new)
    return out


def transcribe(run_dir: Path, wavs: list[Path], speakers: Sequence[str] | None = None, channel: int | None = None,
               eval_overrides: dict | None = None, ids: Sequence[str] | None = None,
               device: str | torch.device | None = None) -> Iterator[tuple[str, Path, str | None, DataError | None]]:
    """(utt, wav, text, None) per file in the order given, or (utt, wav, None, why) for a file whose
    audio cannot be decoded (unreadable, shorter than one frame): one bad file among many should not
    cost the others. Every path is checked (exists, a regular file) before the model loads.
    `eval_overrides` replace the run's `eval` settings (`load_run_model`: the vocabulary, speaker
    adaptation). `speakers` (one label per file) groups the files by speaker, decoded as `asrdist
    eval` decodes one (module docstring); then every file is read before the first line comes.
    `channel`: the channel read of multi-channel files. `ids`: the files' utterance ids (a wav.scp's);
    default: `utterance_ids`. `device`: where the model computes (`load_run_model`)."""
    for wav in wavs:
        check_audio_path(wav)
    model, cfg, targets, input_dim = run_evaluate.load_run_model(run_dir, eval_overrides, device)
    front = front_end(run_dir, cfg, targets.features)
    if front["num_mel_bins"] != input_dim:
        raise DataError(f"{run_dir}: the model expects {input_dim} inputs, its front end gives {front['num_mel_bins']}")
    constrained = vocabulary_search(cfg, targets) if model.kind == "ctc" else None
    ids = list(ids) if ids is not None else utterance_ids(wavs)
    if speakers is None and front["cmvn"] == "speaker" and len(wavs) > 1:
        print("[asrdist] note: each file is normalised as its own speaker (the run uses speaker CMVN); files "
              "that share a speaker decode better with --same-speaker or --utt2spk", file=sys.stderr, flush=True)
    noted: set[int] = set()  # the rates resampled from, each said once
    if speakers is None:
        for utt, wav in zip(ids, wavs):
            try:
                feats = features_of(Path(wav), front, channel, noted)
            except DataError as exc:
                yield utt, Path(wav), None, exc
                continue
            yield utt, Path(wav), recognize(model, feats, targets, cfg, constrained), None
        return
    texts = _by_speaker(model, cfg, targets, front, constrained, [Path(w) for w in wavs], list(speakers), channel,
                        noted)
    for utt, wav, text in zip(ids, wavs, texts):
        yield (utt, Path(wav), None, text) if isinstance(text, DataError) else (utt, Path(wav), text, None)


def _by_speaker(model, cfg, targets, front, constrained, wavs: list[Path], speakers: list[str],
                channel: int | None = None, noted: set[int] | None = None) -> list:
    """Each file's text (or the DataError that kept it from being decoded), speaker by speaker."""

    out: list = [None] * len(wavs)
    raw: dict[int, np.ndarray] = {}
    for i, wav in enumerate(tqdm(wavs, desc="features", unit="file", disable=None, leave=False)):
        try:
            raw[i] = raw_features(wav, front, channel, noted)
        except DataError as exc:
            out[i] = exc
    adapts = model.kind == "ctc" and cfg.eval.adapt_rounds > 0
    adaptation = RecipeAdaptation(model, cfg, constrained) if adapts else None
    groups: dict[str, list[int]] = {}
    for i in raw:
        groups.setdefault(speakers[i], []).append(i)
    for speaker, members in tqdm(list(groups.items()), desc="decoding", unit="speaker", disable=None, leave=False):
        feats = normalize([raw[i] for i in members], front)
        transform = adaptation.fit(speaker, [torch.from_numpy(f) for f in feats]) if adaptation else None
        for i, f in zip(members, feats):
            out[i] = recognize(model, f, targets, cfg, constrained, transform)
    if adaptation is not None:
        adaptation.finish()
    return out


def read_wav_scp(path: Path) -> tuple[list[str], list[Path]]:
    """(utterance ids, audio files) of a Kaldi wav.scp of plain paths, in its order (a relative path
    from the file's directory, else from the current one, as `corpus import-kaldi` reads them). A
    command pipe or an archive entry is one DataError line: import such a directory instead."""
    if path.exists() and not path.is_file():
        raise DataError(f"{path}: not a regular file")
    table = read_table(path)
    if not table:
        raise DataError(f"{path}: no utterances")
    for utt, entry in table.items():
        kind = wav_entry_kind(entry)
        if kind is not None:
            what = "a command pipe" if kind == COMMAND_PIPE else "a Kaldi archive entry"
            shown = entry.strip()[:40] + ("..." if len(entry.strip()) > 40 else "")
            raise DataError(f"{path}: utterance {utt}: {what} ('{shown}'); decode --scp reads audio files only: "
                            f"import the directory with `asrdist corpus import-kaldi DIR OUT` (which runs the "
                            f"commands) and score OUT with `asrdist eval --data OUT`")
        if not entry.strip():
            raise DataError(f"{path}: utterance {utt}: no audio path")
    return list(table), [resolve_path(path.parent, entry.strip()) for entry in table.values()]


def read_utt2spk(path: Path, utts: Sequence[str]) -> list[str]:
    """The speaker of each of `utts` from a Kaldi utt2spk file (`utt speaker` lines, read as the
    corpus reads its tables; lines for other utterances are allowed). One DataError line for a
    missing file, a duplicate, a line without one speaker, or an utterance the file leaves out."""
    if path.exists() and not path.is_file():
        raise DataError(f"{path}: not a regular file")
    table = read_table(path)
    missing = [u for u in utts if u not in table]
    if missing:
        more = f" and {len(missing) - 1} more" if len(missing) > 1 else ""
        raise DataError(f"{path}: no speaker for utterance '{missing[0]}'{more} (ids as `asrdist decode` "
                        f"names the files: see --help)")
    for u in utts:
        if len(table[u].split()) != 1:
            raise DataError(f"{path}: utterance '{u}': expected one speaker, got '{table[u]}'")
    return [table[u] for u in utts]


def decode_command(args) -> int:
    """Print each file's line as it is decoded; --out gets them all, written only when every file
    decoded (a non-zero exit leaves no output file behind). Bad files: one error line at the end."""
    if args.scp is not None:
        ids, wavs = read_wav_scp(args.scp)
    else:
        ids, wavs = utterance_ids(args.wavs), list(args.wavs)
    speakers = None
    if args.utt2spk is not None:
        speakers = read_utt2spk(args.utt2spk, ids)
    elif args.same_speaker:
        speakers = ["speaker"] * len(wavs)
    elif args.adapt_rounds or args.adapt_word_balance:
        option = "--adapt-rounds" if args.adapt_rounds else "--adapt-word-balance"
        raise ConfigError(f"{option}: adaptation needs files that share a speaker: add --same-speaker or --utt2spk")
    lines, failed = [], []
    for utt, wav, text, error in transcribe(args.run_dir, wavs, speakers=speakers, channel=args.channel,
                                            eval_overrides=command_line_overrides(args), ids=ids,
                                            device=args.device):
        if error is not None:
            failed.append((wav, error))
            continue
        lines.append(f"{utt} {text}".rstrip() + "\n")
        print(lines[-1], end="", flush=True)
    if failed:
        raise DataError(_failure_line(failed, len(wavs), args.out))
    if args.out is not None:
        write_text_atomic(args.out, "".join(lines))
    return 0


def _failure_line(failed: list[tuple[Path, DataError]], total: int, out: Path | None) -> str:
    """The first bad file's reason, then how many failed and which others (a few names)."""
    others = [str(wav) for wav, _ in failed[1:]]
    also = f" (also {', '.join(others[:3])}{' ...' if len(others) > 3 else ''})" if others else ""
    unwritten = f"; {out} not written" if out is not None else ""
    count = f"; {len(failed)} of {total} files not decoded" if total > 1 else ""
    return f"{failed[0][1]}{count}{also}{unwritten}"
