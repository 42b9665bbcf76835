"""`asrdist features DATA`: fbank + CMVN for every split of a corpus (or one split) into its store.

Steps: (1) read every split and pick the corpus' sample rate (the rate most recordings have;
others are errors naming the utterance), resampling to another rate when asked (a model's, for
`asrdist eval`); (2) compute raw fbank in `jobs` processes, in sorted order, straight into each
split's new store (`SPLIT/feats` built under a temporary name); check each utterance against its
alignment (at most one edge frame apart, see `asrdist.features.store`); (3) accumulate CMVN
statistics (global: the train split, or the single split given; speaker: each speaker's own,
topped up from the train split's speakers for a speaker under a second: `cmvn.SpeakerPrior`),
then normalize the shards in place; (4) rename every split's store into place together, so a
failure anywhere leaves no new store behind. Each store's `meta.json` records the channel read
and what the features came from (`asrdist.features.store.source_record`), so later runs
re-extract the same way, and notice a split that changed since.
"""
from __future__ import annotations

import contextlib
import json
import os
import sys
import time
from collections import Counter
from multiprocessing import get_context
from pathlib import Path

import numpy as np
from tqdm import tqdm

from asrdist.errors import ConfigError, DataError
from asrdist.features import store as feature_store
from asrdist.features.cmvn import MODES, CmvnStats, Normalizer, SpeakerPrior
from asrdist.features.fbank import check_mel_bins, compute_fbank, fbank_options
from asrdist.io.atomic import atomic_dir, interrupts_left_to_parent, output_errors
from asrdist.io.audio import frame_shift_samples, read_wav, read_wav_format, resample
from asrdist.io.kaldi_dir import DataDir, read_data_dir

ALIGNMENT_TOLERANCE_FRAMES = 1
CMVN_SOURCE_SPLIT = "train"


def find_splits(data: Path) -> dict[str, Path]:
    """{name: dir}: the split dirs of a corpus (train first), or {data.name: data} for one split."""
    if (data / "wav.scp").is_file():
        return {data.name: data}
    if not data.is_dir():
        raise DataError(f"{data}: corpus or data directory not found")
    subdirs = sorted(d for d in data.iterdir() if d.is_dir() and (d / "wav.scp").is_file())
    if not subdirs:
        raise DataError(f"{data}: neither a split directory (wav.scp) nor a corpus (train/, valid/, test/)")
    subdirs.sort(key=lambda d: d.name != CMVN_SOURCE_SPLIT)
    return {d.name: d for d in subdirs}


def _header(path: Path) -> tuple[int, int] | None:
    """(sample rate, channels) of a WAV file's header, None for what is no readable WAV."""
    try:
        fmt = read_wav_format(path)
    except DataError:  # read_wav reports it, naming the utterance, when the file is read
        return None
    return fmt.rate, fmt.channels


def _headers(dirs: dict[str, DataDir]) -> dict[Path, tuple[str, str, tuple[int, int] | None]]:
    """{audio file: (split's wav.scp, first utterance, header)}, each file once."""
    out: dict[Path, tuple[str, str, tuple[int, int] | None]] = {}
    for d in dirs.values():
        for utt_id in d.utt_ids:
            path = d.wav_path(d.utterances[utt_id])
            if path not in out:
                out[path] = (str(d.path / "wav.scp"), utt_id, _header(path))
    return out


def _common_rate(dirs: dict[str, DataDir], headers: dict) -> int:
    rates = Counter(h[0] for _, _, h in headers.values() if h and h[0])
    if not rates:
        raise DataError(f"{next(iter(dirs.values())).path}: no readable audio")
    return rates.most_common(1)[0][0]


def _check_channels(headers: dict, data: Path) -> None:
    """Multi-channel audio with no channel chosen fails before any work, with the command that
    picks one: `asrdist features DATA --channel K` records it in the store, where `asrdist train`,
    `eval` and `align` (which have no --channel) find it when they re-extract."""
    for path, (scp, utt_id, header) in headers.items():
        if header and header[1] > 1:
            raise DataError(f"{scp}: utterance {utt_id}: {path.name} has {header[1]} channels; pick one with "
                            f"`asrdist features {data} --channel K --overwrite` (K in 0..{header[1] - 1}), "
                            f"which later runs reuse")


POOL_MIN_AUDIO_HOURS = 0.5
"""`--jobs 0` (all cores) extracts a split in worker processes only from this much audio up (utt2dur):
spawning each worker costs about 0.6 s of CPU, more than the features of a small split. Measured
(2026-11-29, 2 cores, idle): 1,000 tone utterances (9 min of audio) took 1.5-1.7 s of wall and CPU in
this process, 1.8-1.9 s of wall and 2.9-3.3 s of CPU with a pool of 2; fbank costs about 1.4 ms of
CPU per second of audio, so 30 min is some 2.5 s of work, where 2 workers start to save time."""
POOL_MIN_UTTERANCES = 2000
"""The same rule where utt2dur gives no durations."""


def worth_a_pool(d: DataDir) -> bool:
    """Whether split `d` is large enough for `--jobs 0` to extract it in worker processes."""
    if any(u.duration > 0 for u in d.utterances.values()):
        return d.hours >= POOL_MIN_AUDIO_HOURS
    return len(d.utterances) >= POOL_MIN_UTTERANCES


def _check_jobs(jobs) -> None:
    """--jobs counts worker processes: 0 means all cores, a negative count means nothing."""
    if isinstance(jobs, bool) or not isinstance(jobs, int) or jobs < 0:
        raise ConfigError(f"--jobs: expected an integer >= 0 (0: all cores), got {jobs!r}")


def _tasks(name: str, d: DataDir, rate: int, num_mel_bins: int, channel: int | None = None,
           feature_rate: int | None = None) -> list[tuple]:
    """One task per audio file: (path, wav.scp path, rate, bins, [(utt_id, start_s, end_s) ...], channel,
    feature rate): the audio is read at `rate` and resampled to `feature_rate` (default: `rate`)."""
    by_file: dict[Path, list[tuple]] = {}
    for utt_id in d.utt_ids:
        u = d.utterances[utt_id]
        seg = (u.segment.start, u.segment.end) if u.segment else (None, None)
        by_file.setdefault(d.wav_path(u), []).append((utt_id, *seg))
    return [(str(path), str(d.path / "wav.scp"), rate, num_mel_bins, utts, channel, feature_rate or rate)
            for path, utts in by_file.items()]


def _compute(task: tuple) -> list[tuple[str, np.ndarray | None, str | None, float]]:
    """Worker: [(utt_id, feats or None, error or None, audio_seconds)] for one audio file."""
    path, scp, audio_rate, num_mel_bins, utts, channel, rate = task
    if len(utts) == 1:
        label = f"{scp}: utterance {utts[0][0]}"
    else:
        label = f"{scp}: recording {Path(path).name} (utterances {utts[0][0]}..{utts[-1][0]})"
    try:
        samples, _ = read_wav(path, expected_rate=audio_rate, where=label, channel=channel)
    except DataError as exc:
        return [(utt_id, None, str(exc), 0.0) for utt_id, _, _ in utts]
    samples = resample(samples, audio_rate, rate)  # the model's rate, as `asrdist decode` does
    opts = fbank_options(rate, num_mel_bins)
    out = []
    for utt_id, start, end in utts:
        where = f"{scp}: utterance {utt_id}"
        piece = samples
        if start is not None:
            first, last = int(round(start * rate)), len(samples) if end < 0 else int(round(end * rate))
            if last > len(samples) + frame_shift_samples(rate) or first >= min(last, len(samples)):
                out.append((utt_id, None, f"{where}: segment {start:.3f}-{end:.3f} s outside the "
                                          f"recording ({len(samples) / rate:.3f} s)", 0.0))
                continue
            piece = samples[first:last]
        try:
            out.append((utt_id, compute_fbank(piece, rate, num_mel_bins, opts), None, len(piece) / rate))
        except DataError as exc:
            out.append((utt_id, None, f"{where}: {exc}", 0.0))
    return out


def _run_tasks(tasks: list[tuple], jobs: int, progress: bool, desc: str):
    """Yield worker results in task order, from a process pool unless jobs == 1."""
    total = sum(len(t[4]) for t in tasks)
    # the bar goes when the split is done, or when it fails: an error is one line, with no bars above it
    bar = tqdm(total=total, desc=desc, unit="utt", disable=None if progress else True, file=sys.stderr, leave=False)
    with contextlib.ExitStack() as stack:
        stack.callback(bar.close)
        if jobs > 1 and len(tasks) > 1:
            # spawned, not forked: a fork copies this process's locks but not the threads that hold
            # them (tqdm's monitor, torch's pools), and a worker stuck on one hung the pool's shutdown
            with interrupts_left_to_parent():
                pool = stack.enter_context(get_context("spawn").Pool(min(jobs, len(tasks))))
            results = pool.imap(_compute, tasks, chunksize=max(1, min(16, len(tasks) // (4 * jobs))))
        else:
            results = map(_compute, tasks)
        for result in results:
            bar.update(len(result))
            yield from result


def _extract_split(name: str, d: DataDir, tmp: Path, tasks: list[tuple], jobs: int, skip_bad: bool,
                   progress: bool, speaker_stats: dict[str, CmvnStats],
                   num_mel_bins: int) -> tuple[feature_store.FeatureStoreWriter, list[str], float]:
    """Raw fbank of one split into a new store at `tmp`; returns (writer, skipped, audio seconds)."""
    writer = feature_store.FeatureStoreWriter(tmp, num_mel_bins)
    skipped: list[str] = []
    audio_seconds = 0.0
    scp = d.path / "alignment.scp"
    # closed at once on an error (not when the traceback goes): its bar is gone before the error line
    with contextlib.closing(_run_tasks(tasks, jobs, progress, f"fbank {name}")) as results:
        for utt_id, feats, error, seconds in results:
            alignment = d.utterances[utt_id].alignment
            if error is None and alignment is not None:
                if abs(len(alignment) - len(feats)) > ALIGNMENT_TOLERANCE_FRAMES:
                    error = (f"{scp}: utterance {utt_id}: alignment has {len(alignment)} frames, features "
                             f"{len(feats)} (tolerance {ALIGNMENT_TOLERANCE_FRAMES})")
            if error is not None:
                if not skip_bad:
                    raise DataError(error)
                skipped.append(error)
                print(f"asrdist: skipped: {error}", file=sys.stderr)
                continue
            writer.add(utt_id, feats)
            speaker = d.utterances[utt_id].speaker
            speaker_stats.setdefault(speaker, CmvnStats(num_mel_bins)).accumulate(feats)
            audio_seconds += seconds
    if not len(writer):
        raise DataError(f"{d.path}: no usable utterances")
    return writer, skipped, audio_seconds


def extract_features(data: Path, num_mel_bins: int = 40, cmvn: str = "global", jobs: int = 0,
                     export_kaldi: bool = False, skip_bad: bool = False, overwrite: bool = False,
                     progress: bool = True, channel: int | None = None, mel_bins_key: str = "num_mel_bins",
                     sample_rate: int | None = None, busy_hint: str = "") -> dict:
    """Extract features for a corpus (all splits) or one split directory; returns the summary.
    `channel` picks one channel of multi-channel audio (an error without it); `mel_bins_key` is how
    an error names `num_mel_bins` (the flag or the config key that set it); `sample_rate` is the
    rate the features are computed at (default: the corpus' own; other audio is resampled)."""
    if cmvn not in MODES:
        raise ConfigError(f"cmvn: unknown mode '{cmvn}' (expected {', '.join(MODES)})")
    _check_jobs(jobs)
    data = Path(data)
    split_paths = find_splits(data)
    if channel is not None and (isinstance(channel, bool) or not isinstance(channel, int) or channel < 0):
        raise ConfigError(f"--channel: expected an integer >= 0, got {channel!r}")
    for path in split_paths.values():
        damaged = None if overwrite else feature_store.damaged_store(path)
        if damaged:
            raise DataError(f"{damaged}; rebuild it with `asrdist features {data} --overwrite`")
    if cmvn == "global" and len(split_paths) > 1 and CMVN_SOURCE_SPLIT not in split_paths:
        raise DataError(f"{data}: global CMVN needs a '{CMVN_SOURCE_SPLIT}' split for its statistics")
    auto = jobs == 0
    jobs = jobs or os.cpu_count() or 1
    started = time.perf_counter()
    dirs = {name: read_data_dir(path, require_text=False) for name, path in split_paths.items()}
    for name, d in dirs.items():
        if not d.utterances:
            raise DataError(f"{d.path}: no utterances")
        if cmvn == "speaker" and 1 < len(d.utterances) == len({u.speaker for u in d.utterances.values()}):
            print(f"asrdist: note: {d.path}: every speaker has one utterance (utt2spk names no speakers?), so "
                  f"speaker CMVN normalises each utterance by its own statistics (under a second: topped up with "
                  f"the training speakers'), which costs accuracy; "
                  f"give each utterance its speaker in utt2spk where known", file=sys.stderr)
    headers = _headers(dirs)
    audio_rate = _common_rate(dirs, headers)
    if channel is None and not skip_bad:
        _check_channels(headers, data)
    rate = sample_rate or audio_rate
    check_mel_bins(num_mel_bins, rate, mel_bins_key)
    sources = {name: feature_store.source_record(path) for name, path in split_paths.items()}
    summary_splits: dict[str, dict] = {}
    with contextlib.ExitStack() as stack:
        for path in split_paths.values():  # never under another command that reads them (`busy_hint`: else what)
            stack.enter_context(feature_store.rewriting(path, busy_hint))
        tmps = {name: stack.enter_context(atomic_dir(path / feature_store.FEATS_DIR, overwrite=overwrite))
                for name, path in split_paths.items()}
        built, used_jobs = {}, 1
        for name, d in dirs.items():
            stats: dict[str, CmvnStats] = {}
            tasks = _tasks(name, d, audio_rate, num_mel_bins, channel, rate)
            split_jobs = jobs if not auto or worth_a_pool(d) else 1
            used_jobs = max(used_jobs, split_jobs)
            with output_errors(split_paths[name] / feature_store.FEATS_DIR):  # names the split, not its temporary
                writer, skipped, seconds = _extract_split(name, d, tmps[name], tasks, split_jobs, skip_bad,
                                                          progress, stats, num_mel_bins)
            built[name] = (writer, stats, skipped, seconds)
        source = CMVN_SOURCE_SPLIT if len(dirs) > 1 else next(iter(dirs))
        global_stats = CmvnStats(num_mel_bins)
        for spk_stats in built[source][1].values():
            global_stats.merge(spk_stats)
        # a speaker too short for its own statistics borrows the training speakers' (cmvn.SpeakerPrior)
        prior = SpeakerPrior.of(list(built[source][1].values())) if cmvn == "speaker" else None
        for name, (writer, stats, skipped, seconds) in built.items():
            with output_errors(split_paths[name] / feature_store.FEATS_DIR):
                normalizer = Normalizer(cmvn, {None: global_stats} if cmvn == "global" else stats, prior)
                speaker_of = {u: dirs[name].utterances[u].speaker for u in dirs[name].utterances}
                if cmvn != "none":
                    writer.normalize(lambda utt, x, n=normalizer, s=speaker_of: n(x, s[utt]))
                normalizer.save(tmps[name] / "cmvn.json", source=source if cmvn == "global" else name)
                meta = writer.close({
                    "num_mel_bins": num_mel_bins, "cmvn": cmvn, "sample_rate": rate,
                    "audio_sample_rate": audio_rate, "frame_shift": 0.01,
                    "audio_seconds": round(seconds, 3), "channel": channel, "source": sources[name],
                    "skip_bad": skip_bad, "skipped": len(skipped), "skipped_utterances": skipped})
                if export_kaldi:
                    feature_store.export_kaldi(feature_store.FeatureStore(tmps[name]), tmps[name],
                                               final_dir=split_paths[name] / feature_store.FEATS_DIR)
                summary_splits[name] = {"utterances": meta["num_utterances"], "frames": meta["total_frames"],
                                        "audio_seconds": round(seconds, 3), "skipped": len(skipped)}
    elapsed = time.perf_counter() - started
    audio = sum(s["audio_seconds"] for s in summary_splits.values())
    return {
        "data": str(data), "num_mel_bins": num_mel_bins, "cmvn": cmvn, "sample_rate": rate,
        "audio_sample_rate": audio_rate, "jobs": used_jobs,
        "utterances": sum(s["utterances"] for s in summary_splits.values()),
        "frames": sum(s["frames"] for s in summary_splits.values()),
        "audio_seconds": round(audio, 3), "skipped": sum(s["skipped"] for s in summary_splits.values()),
        "seconds": round(elapsed, 3), "x_realtime": round(audio / elapsed, 1) if elapsed else None,
        "splits": summary_splits,
    }


def features_command(args) -> int:
    summary = extract_features(args.data, num_mel_bins=args.num_mel_bins, cmvn=args.cmvn,
                               jobs=args.jobs, export_kaldi=args.export_kaldi, skip_bad=args.skip_bad,
                               overwrite=args.overwrite, channel=args.channel, mel_bins_key="--num-mel-bins")
    print(json.dumps(summary, indent=2))
    return 0
