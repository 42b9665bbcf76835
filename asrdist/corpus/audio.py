"""WAV input/output with strict checks, resampling, and the frame-count rule every stage shares.

Frame rule: features use a 25 ms window, 10 ms shift and Kaldi's `snip_edges=False`, so an
utterance of N samples at rate sr has `num_frames(N, sr) = (N + shift // 2) // shift` frames with
shift = sr // 100. Alignments are written with exactly this length.
"""
from __future__ import annotations

import struct
import wave
from math import gcd
from pathlib import Path

import numpy as np

from asrdist.errors import DataError


def frame_shift_samples(sample_rate: int) -> int:
    return sample_rate // 100


def num_frames(num_samples: int, sample_rate: int) -> int:
    shift = frame_shift_samples(sample_rate)
    return (num_samples + shift // 2) // shift


def read_wav(path: str | Path, expected_rate: int | None = None, where: str = "",
             channel: int | None = None) -> tuple[np.ndarray, int]:
    """Read a 16-bit PCM WAV as int16 samples. Multi-channel audio needs `channel` (0-based; mono
    audio is read as it is): asrdist never mixes or drops channels unasked. Raises DataError naming
    `where` (or the file) and why."""
    path = Path(path)
    label = where or str(path)
    if not path.is_file():
        if any(c.isspace() for c in str(path)):
            raise DataError(f"{label}: audio file not found: '{path}' has a space; in Kaldi tables the first "
                            f"space ends the utterance id, so neither ids nor audio paths may contain spaces")
        raise DataError(f"{label}: audio file not found: {path}")
    try:
        with wave.open(str(path), "rb") as w:
            channels, width, rate, count = w.getnchannels(), w.getsampwidth(), w.getframerate(), w.getnframes()
            raw = w.readframes(count)
    except (wave.Error, EOFError, OSError, RuntimeError, ValueError, struct.error) as exc:
        raise DataError(f"{label}: corrupt WAV file {path.name} ({_corrupt_reason(path, exc)})") from None
    if width != 2:
        raise DataError(f"{label}: {8 * width}-bit audio, expected 16-bit PCM")
    if len(raw) < count * channels * width:
        raise DataError(f"{label}: truncated WAV file {path.name} "
                        f"(header says {count} samples, found {len(raw) // (channels * width)})")
    samples = np.frombuffer(raw, dtype="<i2")
    if channels > 1:
        if channel is not None and not 0 <= channel < channels:
            raise DataError(f"{label}: channel {channel} asked for, {path.name} has {channels} "
                            f"(channels 0..{channels - 1})")
        if channel is None:
            raise DataError(f"{label}: {path.name} has {channels} channels; pick one with --channel K "
                            f"(0..{channels - 1})")
        samples = samples.reshape(-1, channels)[:, channel]
    if samples.size == 0:
        raise DataError(f"{label}: empty audio in {path.name}")
    if expected_rate is not None and rate != expected_rate:
        raise DataError(f"{label}: sample rate {rate} Hz, expected {expected_rate} Hz")
    return np.ascontiguousarray(samples, dtype=np.int16), rate


def _corrupt_reason(path: Path, exc: BaseException) -> str:
    """The wave module's reason, or a real one where it gives none (EOFError() for a short file)."""
    if str(exc):
        return str(exc)
    size = path.stat().st_size
    if size == 0:
        return "empty file, 0 bytes"
    if isinstance(exc, EOFError):
        return f"the file ends inside its header, after {size} bytes"
    return f"{type(exc).__name__} after {size} bytes"


def write_wav(path: str | Path, samples: np.ndarray, sample_rate: int) -> None:
    samples = np.asarray(samples)
    if samples.dtype != np.int16:
        samples = np.clip(np.round(samples), -32768, 32767).astype(np.int16)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(1)
        w.setsampwidth(2)
        w.setframerate(sample_rate)
        w.writeframes(samples.astype("<i2").tobytes())


def resample(samples: np.ndarray, rate_in: int, rate_out: int) -> np.ndarray:
    """Polyphase resampling (scipy) of int16 or float audio; returns the input dtype."""
    if rate_in == rate_out:
        return samples
    from scipy.signal import resample_poly

    g = gcd(rate_in, rate_out)
    out = resample_poly(samples.astype(np.float64), rate_out // g, rate_in // g)
    if samples.dtype == np.int16:
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)
    return out.astype(samples.dtype)
