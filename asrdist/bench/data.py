"""`asrdist bench data`: how fast features are made and how fast samplers supply them, one core.

- `fbank_x_realtime`: seconds of audio turned into 40-bin log-mel features per second of compute
  (kaldi-native-fbank), on the FSDD recordings resampled to 16 kHz, or on a corpus' audio with
  `--data`. Best of three passes.
- `sampler_frames_per_second`: frames a `FrameSampler` (context 5, batch 256, 40-dim) delivers as
  torch batches, reading a memory-mapped `FeatureStore` written to a temporary directory with
  random features. The chunk and CTC samplers are timed the same way, for comparison.
"""
from __future__ import annotations

import argparse
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from asrdist.checks import cli_number
from asrdist.corpus.fsdd import find_recordings, resolve_source
from asrdist.data.samplers import ChunkSampler, FrameSampler, UtteranceBatchSampler
from asrdist.errors import DataError
from asrdist.features.fbank import compute_fbank, fbank_options
from asrdist.features.store import FeatureStore, FeatureStoreWriter
from asrdist.io.audio import read_wav, resample
from asrdist.io.kaldi_dir import read_data_dir

DIM = 40
MIN_UTTERANCES = 16
"""The chunk sampler's batch (64 chunks of 21 frames) from utterances of at least 100 frames."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--data", type=Path, default=None,
                        help="corpus or split directory whose audio to time (default: FSDD recordings)")
    parser.add_argument("--utterances", type=cli_number(int, at_least=MIN_UTTERANCES), default=2000,
                        help=f"utterances (100-500 frames each) in the sampler's temporary store (at least "
                             f"{MIN_UTTERANCES}: one batch of 64 chunks of 21 frames)")
    parser.add_argument("--epochs", type=cli_number(int, at_least=1), default=3, help="sampler epochs timed")


def run(args) -> dict:
    torch.set_num_threads(1)
    fbank = _fbank_speed(args.data)
    samplers = _sampler_speed(args.utterances, args.epochs)
    frame = samplers["frames"]
    return {
        "fbank_x_realtime": fbank["fbank_x_realtime"],
        "sampler_frames_per_second": frame["frames_per_second"],
        "threads": 1,
        "frames": frame["frames"],
        "seconds": frame["seconds"],
        "chunk_sampler_frames_per_second": samplers["chunks"]["frames_per_second"],
        "utterance_sampler_frames_per_second": samplers["utterances"]["frames_per_second"],
        "fbank": fbank,
        "samplers": samplers,
    }


def _fbank_speed(data: Path | None) -> dict:

    if data is None:
        result = measure_speed(None, num_mel_bins=DIM, sample_rate=16000)
        result["audio"] = "FSDD recordings resampled to 16 kHz"
        native = measure_speed(None, num_mel_bins=DIM)
        result["fbank_x_realtime_native_8khz"] = native["fbank_x_realtime"]
        return result
    if not data.is_dir():
        raise DataError(f"--data {data}: {'no such directory' if not data.exists() else 'not a directory'} "
                        f"(give a corpus, a split or an FSDD recordings directory)")
    splits = [data] if (data / "wav.scp").is_file() else sorted(p for p in data.iterdir() if (p / "wav.scp").is_file())
    if not splits:  # not a corpus: an FSDD checkout
        result = measure_speed(data, num_mel_bins=DIM)
        result["audio"] = f"FSDD recordings in {data}"
        return result
    return _time_corpus_audio(splits)


def _time_corpus_audio(splits: list[Path], repeats: int = 3) -> dict:
    audio = []
    for split in splits:
        data = read_data_dir(split, require_text=False)
        for utt in data.utterances.values():
            if utt.segment is not None:
                raise DataError(f"{split}: segmented recordings are not supported by bench data")
            audio.append(read_wav(data.wav_path(utt), where=f"{split}: utterance {utt.utt_id}"))
    opts = {sr: fbank_options(sr, DIM) for _, sr in audio}
    best = float("inf")
    for _ in range(repeats):
        start = time.perf_counter()
        for samples, sr in audio:
            compute_fbank(samples, sr, DIM, opts[sr])
        best = min(best, time.perf_counter() - start)
    audio_seconds = sum(len(s) / sr for s, sr in audio)
    return {"fbank_x_realtime": audio_seconds / best, "audio_seconds": audio_seconds, "compute_seconds": best,
            "files": len(audio), "sample_rates": sorted(opts), "num_mel_bins": DIM,
            "audio": f"corpus {', '.join(str(s) for s in splits)}"}


def _sampler_speed(num_utterances: int, epochs: int) -> dict:
    rng = np.random.default_rng(0)
    with tempfile.TemporaryDirectory(prefix="asrdist-bench-data-") as tmp:
        writer = FeatureStoreWriter(Path(tmp) / "feats", DIM)
        labels, tokens = {}, {}
        for i in range(num_utterances):
            n = int(rng.integers(100, 501))
            utt = f"utt{i:06d}"
            writer.add(utt, rng.standard_normal((n, DIM), dtype=np.float32))
            labels[utt] = rng.integers(0, 40, n).astype(np.int32)
            tokens[utt] = rng.integers(1, 40, n // 8).tolist()
        writer.close({"num_mel_bins": DIM, "cmvn": "none"})
        store = FeatureStore(Path(tmp) / "feats")
        samplers = {
            "frames": FrameSampler(store, labels, batch_size=256, context=5, seed=0, window_utterances=64),
            "chunks": ChunkSampler(store, labels, batch_size=64, chunk=21, seed=0),
            "utterances": UtteranceBatchSampler(store, tokens, max_frames=8000, seed=0),
        }
        result = {name: _time_sampler(s, epochs) for name, s in samplers.items()}
        result["store"] = {"kind": "FeatureStore (memory-mapped, temporary directory)",
                           "utterances": len(store), "frames": store.total_frames, "dim": DIM}
        result["frames"].update(context=5, batch_size=256, window_utterances=64)
        result["chunks"].update(chunk=21, batch_size=64)
        result["utterances"].update(max_frames=8000)
        return result


def _time_sampler(sampler, epochs: int) -> dict:
    frames, start = 0, time.perf_counter()
    for epoch in range(epochs):
        sampler.set_epoch(epoch)
        for batch in sampler:
            frames += batch.num_frames
    seconds = time.perf_counter() - start
    return {"frames_per_second": frames / seconds, "frames": frames, "seconds": seconds, "epochs": epochs}


def measure_speed(source: str | Path | None = None, num_mel_bins: int = 40, sample_rate: int | None = None,
                  max_files: int = 300, repeats: int = 3) -> dict:
    """Fbank speed on FSDD recordings, one core: audio seconds processed per compute second.

    Reads up to `max_files` recordings (sorted names, so runs compare), resampled to
    `sample_rate` if given (16000 = the synthetic corpus' rate), then times
    `compute_fbank` alone over all of them `repeats` times and keeps the fastest pass
    (the least disturbed by other processes). Returns the JSON-ready figures; the headline
    is `fbank_x_realtime`. Run it in a process whose torch/BLAS threads are set to 1.
    """
    recordings = find_recordings(resolve_source(source))[:max_files]
    if not recordings:
        raise DataError(f"{source}: no FSDD recordings found")
    audio = [read_wav(r.path) for r in recordings]
    if sample_rate:
        audio = [(resample(samples, sr, sample_rate), sample_rate) for samples, sr in audio]
    audio_seconds = sum(len(s) / sr for s, sr in audio)
    opts = {sr: fbank_options(sr, num_mel_bins) for _, sr in audio}
    best = float("inf")
    for _ in range(max(1, repeats)):
        start = time.perf_counter()
        for samples, sr in audio:
            compute_fbank(samples, sr, num_mel_bins, opts[sr])
        best = min(best, time.perf_counter() - start)
    return {
        "fbank_x_realtime": audio_seconds / best,
        "audio_seconds": audio_seconds,
        "compute_seconds": best,
        "files": len(audio),
        "sample_rates": sorted(opts),
        "num_mel_bins": num_mel_bins,
    }
