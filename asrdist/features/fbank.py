"""Log-mel filterbank features with kaldi-native-fbank, and a measure of their speed.

Settings every asrdist feature shares: 25 ms Povey window, 10 ms shift, `snip_edges=False`
(so an utterance of N samples gives `asrdist.io.audio.num_frames(N, sr)` frames, the rule
alignments follow), dither 0 (features are deterministic), mel bins from 20 Hz up to the
Nyquist frequency of the audio's own rate (4 kHz for 8 kHz FSDD, 8 kHz for 16 kHz speech).
Samples are fed on the int16 scale, as Kaldi does, so log energies match Kaldi's `compute-fbank-feats`.
"""
from __future__ import annotations

import kaldi_native_fbank as knf
import numpy as np

from asrdist.checks import check_field
from asrdist.errors import ConfigError, DataError
from asrdist.io.audio import num_frames

FRAME_LENGTH_MS = 25.0
FRAME_SHIFT_MS = 10.0
LOW_FREQ_HZ = 20.0
MIN_MEL_BINS, MAX_MEL_BINS = 10, 128
"""The filterbank sizes asrdist accepts (Kaldi's default is 23; 40 and 80 are common for neural
models); the audio's rate may allow fewer (check_mel_bins)."""


def fbank_options(sample_rate: int, num_mel_bins: int = 40) -> knf.FbankOptions:
    opts = knf.FbankOptions()
    opts.frame_opts.samp_freq = float(sample_rate)
    opts.frame_opts.frame_length_ms = FRAME_LENGTH_MS
    opts.frame_opts.frame_shift_ms = FRAME_SHIFT_MS
    opts.frame_opts.dither = 0.0
    opts.frame_opts.snip_edges = False
    opts.mel_opts.num_bins = num_mel_bins
    opts.mel_opts.low_freq = LOW_FREQ_HZ
    opts.mel_opts.high_freq = 0.0  # 0 = the Nyquist frequency of `sample_rate`
    return opts


def check_mel_bins(num_mel_bins: int, sample_rate: int, key: str = "num_mel_bins") -> None:
    """A one-line ConfigError when `num_mel_bins` is out of range, or so many that some mel filters
    of `sample_rate` audio cover no FFT bin (they would give constant features)."""
    check_field(key, num_mel_bins, at_least=MIN_MEL_BINS, at_most=MAX_MEL_BINS)
    empty = _empty_filters(num_mel_bins, sample_rate)
    if empty:
        fits = next(n for n in range(num_mel_bins - 1, 0, -1) if not _empty_filters(n, sample_rate))
        raise ConfigError(f"{key}: {num_mel_bins} mel filters leave {empty} of them empty at {sample_rate} Hz "
                          f"(each needs at least one FFT bin); use at most {fits}")


def _empty_filters(num_mel_bins: int, sample_rate: int) -> int:
    opts = fbank_options(sample_rate, num_mel_bins)
    weights = np.asarray(knf.MelBanks(opts.mel_opts, opts.frame_opts).get_matrix())
    return int((weights.sum(axis=1) == 0).sum())


def compute_fbank(samples: np.ndarray, sample_rate: int, num_mel_bins: int = 40,
                  opts: knf.FbankOptions | None = None) -> np.ndarray:
    """Log-mel filterbank of int16 (or int16-scaled float) samples: float32 [frames, num_mel_bins]."""
    opts = opts or fbank_options(sample_rate, num_mel_bins)
    expected = num_frames(len(samples), sample_rate)
    if expected == 0:
        raise DataError(f"audio too short for one frame ({len(samples)} samples at {sample_rate} Hz)")
    computer = knf.OnlineFbank(opts)
    computer.accept_waveform(float(sample_rate), np.asarray(samples, dtype=np.float32))
    computer.input_finished()
    count = computer.num_frames_ready
    if count != expected:  # a kaldi-native-fbank change would silently break every alignment
        raise DataError(f"fbank gave {count} frames for {len(samples)} samples, expected {expected}")
    feats = np.empty((count, opts.mel_opts.num_bins), dtype=np.float32)
    for i in range(count):
        feats[i] = computer.get_frame(i)
    return feats


