"""WAV input/output with strict checks, resampling, and the frame-count rule every stage shares.

Frame rule: features use a 25 ms window, 10 ms shift and Kaldi's `snip_edges=False`, so an
utterance of N samples at rate sr has `num_frames(N, sr) = (N + shift // 2) // shift` frames with
shift = sr // 100. Alignments are written with exactly this length.
"""
from __future__ import annotations

import stat
import struct
import wave
from dataclasses import dataclass
from math import gcd
from pathlib import Path

import numpy as np
import soundfile

from asrdist.errors import DataError


def frame_shift_samples(sample_rate: int) -> int:
    return sample_rate // 100


def num_frames(num_samples: int, sample_rate: int) -> int:
    shift = frame_shift_samples(sample_rate)
    return (num_samples + shift // 2) // shift


# Format tags of the WAVE `fmt ` chunk (mmreg.h); EXTENSIBLE carries the real one in a sub-format GUID.
WAVE_FORMAT_PCM = 0x0001
WAVE_FORMAT_IEEE_FLOAT = 0x0003
WAVE_FORMAT_ALAW = 0x0006
WAVE_FORMAT_MULAW = 0x0007
WAVE_FORMAT_EXTENSIBLE = 0xFFFE
_GUID_TAIL = bytes.fromhex("000000001000800000aa00389b71")  # KSDATAFORMAT_SUBTYPE_* after its 2-byte tag
_ENCODING_NAMES = {WAVE_FORMAT_ALAW: "A-law", WAVE_FORMAT_MULAW: "mu-law", 0x0002: "MS ADPCM",
                   0x0011: "IMA ADPCM", 0x0055: "MP3"}
# Files asrdist cannot read, by their first bytes: named, so the user knows what to convert.
_CONVERT_OTHER = "convert it to WAV (e.g. `ffmpeg -i IN -ac 1 OUT.wav`)"
_RIFF_IDS = (b"RIFF", b"RF64", b"BW64")  # RF64/BW64: RIFF whose 32-bit sizes are in a `ds64` chunk
# Sample rates a header may plausibly hold: below 1 kHz no speech band is left and 384 kHz is the
# highest rate audio interfaces record; anything else is a damaged or mis-written header, which
# resampling would turn into minutes of nonsense (or a crash, for 0 Hz).
MIN_SAMPLE_RATE, MAX_SAMPLE_RATE = 1000, 384000
# The data size a writer that cannot seek back (sox or ffmpeg into a pipe) leaves in the header.
_STREAMED = 0xFFFFFFFF
_CONVERT = "convert it to 16-bit PCM WAV (e.g. `sox IN -e signed-integer -b 16 OUT.wav`)"


@dataclass(frozen=True)
class WavFormat:
    """What a `fmt ` chunk says, EXTENSIBLE resolved: `encoding` is PCM or IEEE float."""

    encoding: int
    channels: int
    rate: int
    bits: int

    @property
    def frame_bytes(self) -> int:
        return self.channels * self.bits // 8


def check_audio_path(path: str | Path, label: str = "") -> Path:
    """`path` as a Path when it is an existing regular file; else one DataError naming it: a FIFO,
    a device or a directory would block, read nothing or fail later with a less clear reason."""
    path = Path(path)
    where = _named(label, str(path)) if label else str(path)
    if not path.exists():
        if any(c.isspace() for c in str(path)):
            raise DataError(f"{label or path}: audio file not found: '{path}' has a space; in Kaldi tables the "
                            f"first space ends the utterance id, so neither ids nor audio paths may contain spaces")
        raise DataError(f"{where}: audio file not found")
    if not path.is_file():
        raise DataError(f"{where}: not a regular file ({file_kind(path)}); give a WAV file")
    return path


def file_kind(path: Path) -> str:
    """'a directory', 'a FIFO (named pipe)', ...: what a path that is no regular file is."""
    mode = path.stat().st_mode
    for test, kind in ((stat.S_ISDIR, "a directory"), (stat.S_ISFIFO, "a FIFO (named pipe)"),
                       (stat.S_ISCHR, "a character device"), (stat.S_ISBLK, "a block device"),
                       (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return kind
    return "a special file"


def read_wav(path: str | Path, expected_rate: int | None = None, where: str = "",
             channel: int | None = None) -> tuple[np.ndarray, int]:
    """Read a WAV (or, through libsndfile, a FLAC, Ogg, MP3, AIFF, NIST SPHERE, AU or CAF file: told
    by its first bytes, `_sndfile_kind`) as int16 samples: 8, 16, 24 or 32-bit
    PCM, A-law, mu-law or IEEE float (brought to the int16 range every stage expects:
    `_decode_samples`), plain or WAVE_FORMAT_EXTENSIBLE, RIFF or RF64, with sizes as a
    pipe leaves them (the samples present are read). Multi-channel audio needs `channel` (0-based;
    mono audio is read as it is): asrdist never mixes or drops channels unasked. Raises DataError
    naming `where` (or the file) and why."""
    path = check_audio_path(path, where)
    label = where or str(path)
    try:
        blob = memoryview(path.read_bytes())
    except OSError as exc:
        raise DataError(f"{label}: cannot read {path}: {exc.strerror or exc}") from None
    kind = _sndfile_kind(blob)
    if kind is not None:
        samples, fmt = _read_sndfile(path, label, kind, blob)
    else:
        fmt, data = _parse_wav(blob, label, path.name)
        samples = _decode_samples(fmt, data, label, path.name)
    samples = pick_channel(samples, channel, label, path.name)
    if samples.size == 0:
        raise DataError(f"{label}: empty audio in {path.name}")
    if expected_rate is not None and fmt.rate != expected_rate:
        raise DataError(f"{label}: sample rate {fmt.rate} Hz, expected {expected_rate} Hz")
    return np.ascontiguousarray(samples, dtype=np.int16), fmt.rate


def pick_channel(samples: np.ndarray, channel: int | None, label: str, name: str) -> np.ndarray:
    """Channel `channel` of [frames, channels] samples of the file `name`; mono audio as it is. More
    channels with none chosen, or a channel the file lacks, is one DataError naming `label`."""
    channels = samples.shape[1]
    if channels > 1:
        if channel is not None and not 0 <= channel < channels:
            raise DataError(f"{label}: channel {channel} asked for, {name} has {channels} "
                            f"(channels 0..{channels - 1})")
        if channel is None:
            raise DataError(f"{label}: {name} has {channels} channels; pick one with --channel K "
                            f"(0..{channels - 1})")
    return samples[:, channel if channels > 1 else 0]


def read_wav_format(path: str | Path, where: str = "") -> WavFormat:
    """The format of a WAV file from its first 1 MiB (where the `fmt ` chunk is), checked as
    `read_wav` checks it, without reading the samples: a corpus' sample rate, say."""
    path = check_audio_path(path, where)
    try:
        with open(path, "rb") as f:
            head = memoryview(f.read(1 << 20))
    except OSError as exc:
        raise DataError(f"{where or path}: cannot read {path}: {exc.strerror or exc}") from None
    kind = _sndfile_kind(head)
    if kind is not None:
        return _sndfile_format(_sound_info(path, where or str(path), kind, head), path, where or str(path), kind)
    return _parse_wav(head, where or str(path), path.name, need_data=False)[0]


# Containers read through libsndfile (the `soundfile` package), told by their first bytes, not
# their names (TIMIT's `.WAV` files are NIST SPHERE): lossless FLAC (as LibriSpeech ships), Ogg
# (Vorbis, Opus), MPEG audio (MP3, as Common Voice ships), AIFF / AIFF-C, NIST SPHERE (TIMIT, WSJ,
# Switchboard), Sun/NeXT AU and Apple CAF. Decoded to int16 as libsndfile scales them.
_SNDFILE_NAMES = "FLAC, Ogg, MP3, AIFF, NIST SPHERE, AU or CAF"
READABLE = f"WAV, {_SNDFILE_NAMES}"
"""The audio containers `read_wav` reads, for messages."""
AUDIO_SUFFIXES = (".wav", ".flac", ".ogg", ".opus", ".mp3", ".aif", ".aiff", ".aifc", ".sph", ".au", ".caf")
"""The usual file name suffixes of those containers (names only: `read_wav` goes by content)."""
_SIMPLE_MAGIC = {b"fLaC": "FLAC", b"OggS": "Ogg", b"ID3": "MP3", b"NIST_1A": "NIST SPHERE",
                 b".snd": "Sun/NeXT AU", b"caff": "CAF"}


def _sndfile_kind(head) -> str | None:
    """The libsndfile container `head` (a file's first bytes) starts, or None (then it must be
    RIFF WAVE). Containers nothing here reads are refused naming themselves (`_unreadable_kind`)."""
    head = bytes(head[:12])
    kind = next((k for magic, k in _SIMPLE_MAGIC.items() if head.startswith(magic)), None)
    if kind is not None:
        return kind
    if head[:4] == b"FORM" and head[8:12] in (b"AIFF", b"AIFC"):
        return "AIFF"
    # an MPEG audio frame header without an ID3 tag: 11 sync bits, then layer bits 01-11 (I-III);
    # layer bits 00 after the sync are AAC's ADTS (`_unreadable_kind`)
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xE0 == 0xE0 and head[1] & 0x06:
        return "MP3"
    return None


def _unreadable_kind(head: bytes) -> str | None:
    """The name of a container libsndfile does not read, from its first bytes: a phone's M4A, a
    browser's WebM, raw AAC."""
    if head[4:8] == b"ftyp":
        return "MP4/M4A"
    if head[:4] == b"\x1aE\xdf\xa3":
        return "Matroska/WebM"
    if len(head) >= 2 and head[0] == 0xFF and head[1] & 0xF6 == 0xF0:
        return "AAC (ADTS)"
    if head[:4] == b"FORM":
        return f"IFF {head[8:12]!r}"
    return None


def _check_sphere(head, path: Path, label: str) -> None:
    """SPHERE files compressed with shorten (as LDC distributes WSJ) are beyond libsndfile: `head`,
    the file's first bytes, holds the 1024-byte header that says so."""
    header = bytes(head[:1024])
    if b"shorten" in header or b"wavpack" in header:
        raise DataError(f"{_named(label, path.name)}: NIST SPHERE compressed with "
                        f"{'shorten' if b'shorten' in header else 'wavpack'}, which asrdist does not decode; "
                        f"decompress it (`sph2pipe -f wav IN OUT.wav`, or `sph2pipe -f wav IN |` in wav.scp)")


def _sound_info(path: Path, label: str, kind: str, head):
    """libsndfile's header of a file of container `kind` (its `soundfile.info`); `head`: the
    file's first bytes, as read to tell its kind."""
    if kind == "NIST SPHERE":
        _check_sphere(head, path, label)

    try:
        return soundfile.info(str(path))
    except (RuntimeError, soundfile.SoundFileError) as exc:
        raise _corrupt_sndfile(label, path.name, kind, exc) from None


def _sndfile_format(info, path: Path, label: str, kind: str) -> WavFormat:
    """The format a libsndfile header (`_sound_info`) gives, checked as a WAV header is."""
    if not MIN_SAMPLE_RATE <= info.samplerate <= MAX_SAMPLE_RATE:
        raise DataError(f"{_named(label, path.name)}: implausible sample rate {info.samplerate} Hz in the header "
                        f"(expected {MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz); the header is damaged or mis-written")
    if info.channels == 0:
        raise _corrupt_sndfile(label, path.name, kind, "0 channels")
    bits = {"PCM_S8": 8, "PCM_U8": 8, "PCM_24": 24, "PCM_32": 32}.get(info.subtype, 16)
    return WavFormat(WAVE_FORMAT_PCM, info.channels, info.samplerate, bits)


def _read_sndfile(path: Path, label: str, kind: str, head) -> tuple[np.ndarray, WavFormat]:
    """([frames, channels] int16, format) of a libsndfile container (`_sndfile_kind`); a file
    that ends early or fails to decode is one DataError line, as a truncated WAV is. (An MP3's
    length in the header is libsndfile's estimate where the encoder wrote none: not checked.)"""
    info = _sound_info(path, label, kind, head)
    fmt = _sndfile_format(info, path, label, kind)
    try:
        samples, _ = soundfile.read(str(path), dtype="int16", always_2d=True)
    except (RuntimeError, soundfile.SoundFileError) as exc:
        raise _corrupt_sndfile(label, path.name, kind, exc) from None
    if kind != "MP3" and info.frames > 0 and len(samples) != info.frames:
        raise DataError(f"{label}: truncated {kind} file {path.name} (header says {info.frames} samples, "
                        f"decoded {len(samples)})")
    return samples, fmt


def _corrupt_sndfile(label: str, name: str, kind: str, reason) -> DataError:
    return DataError(f"{label}: corrupt {kind} file {name} ({str(reason).strip() or type(reason).__name__})")


def _named(label: str, name: str) -> str:
    """`label`, followed by the file's name where it does not already hold it (an utterance's label)."""
    return label if name in label else f"{label}: {name}"


def _corrupt(label: str, name: str, reason: str) -> DataError:
    return DataError(f"{label}: corrupt WAV file {name} ({reason})")


def _parse_wav(blob: memoryview, label: str, name: str,
               need_data: bool = True) -> tuple[WavFormat, memoryview | None]:
    """(format, the data chunk's whole sample frames) of a RIFF/RF64 WAVE file's bytes; with
    `need_data` off, (format, None) as soon as the format is known."""
    _check_container(blob, label, name)
    fmt, ds64_data_size = None, None
    for chunk_id, start, size in _chunks(blob, label, name):
        if chunk_id == b"ds64" and bytes(blob[:4]) != b"RIFF" and size >= 16 and start + 16 <= len(blob):
            ds64_data_size = struct.unpack_from("<Q", blob, start + 8)[0]
        elif chunk_id == b"fmt ":
            if start + size > len(blob):
                raise _corrupt(label, name, f"the fmt chunk runs past the end of the file ({len(blob)} bytes)")
            fmt = _parse_fmt(blob[start:start + size], label, name)
            if not need_data:
                return fmt, None
        elif chunk_id == b"data":
            if fmt is None:
                raise _corrupt(label, name, "the data chunk comes before the fmt chunk")
            if size == _STREAMED and ds64_data_size is not None:
                size = ds64_data_size
            return fmt, _data_frames(blob, start, size, fmt, label, name)
    raise _corrupt(label, name, "no fmt chunk" if fmt is None else "no data chunk")


def _data_frames(blob: memoryview, start: int, size: int, fmt: WavFormat, label: str, name: str) -> memoryview:
    """The whole sample frames of the data chunk at `start` whose header says `size`: all bytes
    to the end of the file for a streamed header, else `size` bytes, which must be there."""
    if _streamed(blob, start, size):
        size = len(blob) - start
    if start + size > len(blob):
        raise DataError(f"{label}: truncated WAV file {name} (header says {size // fmt.frame_bytes} "
                        f"samples, found {(len(blob) - start) // fmt.frame_bytes})")
    size -= size % fmt.frame_bytes  # a streamed file may stop inside a frame
    return blob[start:start + size]


def _streamed(blob: memoryview, data_start: int, size: int) -> bool:
    """Whether the data size is a placeholder a writer that could not seek back left: 0xFFFFFFFF
    (sox, ffmpeg), or 0 with a RIFF size that is a placeholder too or ends before the samples
    (Python's wave module) -- a real empty data chunk has a RIFF size that covers the file."""
    if size == _STREAMED:
        return True
    riff_size = struct.unpack_from("<I", blob, 4)[0]
    return size == 0 and (riff_size in (0, _STREAMED) or 8 + riff_size <= data_start)


def _check_container(blob: memoryview, label: str, name: str) -> None:
    """Refuse what is not RIFF/RF64 WAVE, naming the format where the first bytes tell it."""
    if len(blob) == 0:
        raise _corrupt(label, name, "empty file, 0 bytes")
    head = bytes(blob[:12])
    other = _unreadable_kind(head)
    if other is not None:
        raise DataError(f"{_named(label, name)}: {other} audio, which asrdist does not read; {_CONVERT_OTHER}")
    if head[:4] not in _RIFF_IDS:
        raise _corrupt(label, name, f"file does not start with RIFF id, nor with the mark of {_SNDFILE_NAMES}")
    if len(head) < 12:
        raise _corrupt(label, name, f"the file ends inside its header, after {len(blob)} bytes")
    if head[8:12] != b"WAVE":
        raise DataError(f"{_named(label, name)}: not a WAV file (a RIFF {head[8:12]!r} file); {_CONVERT}")


def _chunks(blob: memoryview, label: str, name: str):
    """(id, start of its body, size from its header) of each chunk after `WAVE`, in file order."""
    offset = 12
    while offset < len(blob):
        if offset + 8 > len(blob):
            raise _corrupt(label, name, f"the file ends inside its header, after {len(blob)} bytes")
        chunk_id = bytes(blob[offset:offset + 4])
        size = struct.unpack_from("<I", blob, offset + 4)[0]
        yield chunk_id, offset + 8, size
        offset += 8 + size + (size & 1)  # chunks are padded to even sizes


def _parse_fmt(body: memoryview, label: str, name: str) -> WavFormat:
    """The `fmt ` chunk, checked: an encoding asrdist reads and a plausible sample rate."""
    if len(body) < 16:
        raise _corrupt(label, name, f"fmt chunk of {len(body)} bytes, expected at least 16")
    tag, channels, rate, _, _, bits = struct.unpack_from("<HHIIHH", body)
    if tag == WAVE_FORMAT_EXTENSIBLE:
        if len(body) < 40:
            raise _corrupt(label, name, f"WAVE_FORMAT_EXTENSIBLE fmt chunk of {len(body)} bytes, expected 40")
        guid = bytes(body[24:40])
        if guid[2:] != _GUID_TAIL:
            raise DataError(f"{_named(label, name)}: unsupported encoding (sub-format GUID {guid.hex()}); {_CONVERT}")
        tag = struct.unpack_from("<H", guid)[0]
    if channels == 0:
        raise _corrupt(label, name, "0 channels")
    if not MIN_SAMPLE_RATE <= rate <= MAX_SAMPLE_RATE:
        raise DataError(f"{_named(label, name)}: implausible sample rate {rate} Hz in the header (expected "
                        f"{MIN_SAMPLE_RATE}..{MAX_SAMPLE_RATE} Hz); the header is damaged or mis-written")
    _check_encoding(tag, bits, label, name)
    return WavFormat(tag, channels, rate, bits)


PCM_BITS = (8, 16, 24, 32)


def _check_encoding(tag: int, bits: int, label: str, name: str) -> None:
    if tag == WAVE_FORMAT_PCM and bits not in PCM_BITS:
        raise DataError(f"{_named(label, name)}: {bits}-bit PCM audio, expected 8, 16, 24 or 32 bits; {_CONVERT}")
    if tag == WAVE_FORMAT_IEEE_FLOAT and bits not in (32, 64):
        raise DataError(f"{_named(label, name)}: unsupported encoding ({bits}-bit IEEE float); {_CONVERT}")
    if tag in (WAVE_FORMAT_ALAW, WAVE_FORMAT_MULAW) and bits != 8:
        raise DataError(f"{_named(label, name)}: unsupported encoding ({bits}-bit {_ENCODING_NAMES[tag]}, "
                        f"expected 8 bits); {_CONVERT}")
    if tag not in (WAVE_FORMAT_PCM, WAVE_FORMAT_IEEE_FLOAT, WAVE_FORMAT_ALAW, WAVE_FORMAT_MULAW):
        encoding = _ENCODING_NAMES.get(tag, f"format tag {tag}")
        raise DataError(f"{_named(label, name)}: unsupported encoding ({encoding}); {_CONVERT}")


def _decode_samples(fmt: WavFormat, data: memoryview, label: str, name: str) -> np.ndarray:
    """[frames, channels] int16. Other PCM widths are brought to 16 bits (8-bit: unsigned, shifted
    up; 24 and 32-bit: rounded to the nearest 16-bit step, clipped), A-law and mu-law expanded by
    G.711's rules; float audio (full scale +-1.0) is scaled by 32768 and clipped, as Kaldi-style
    front ends scale it: the features then match those of the same audio in 16 bits."""
    if fmt.encoding == WAVE_FORMAT_PCM:
        return _pcm_to_int16(data, fmt.bits).reshape(-1, fmt.channels)
    if fmt.encoding == WAVE_FORMAT_MULAW:
        return _G711_MULAW[np.frombuffer(data, dtype=np.uint8)].reshape(-1, fmt.channels)
    if fmt.encoding == WAVE_FORMAT_ALAW:
        return _G711_ALAW[np.frombuffer(data, dtype=np.uint8)].reshape(-1, fmt.channels)
    values = np.frombuffer(data, dtype="<f4" if fmt.bits == 32 else "<f8")
    if not np.isfinite(values).all():
        index = int(np.flatnonzero(~np.isfinite(values))[0]) // fmt.channels
        raise DataError(f"{_named(label, name)}: non-finite sample (NaN or inf) at sample {index}")
    scaled = np.clip(np.round(values.astype(np.float64) * 32768.0), -32768, 32767)
    return scaled.astype(np.int16).reshape(-1, fmt.channels)


def _pcm_to_int16(data: memoryview, bits: int) -> np.ndarray:
    """Little-endian PCM samples of `bits` bits as int16 (the top 16 bits, rounded)."""
    if bits == 16:
        return np.frombuffer(data, dtype="<i2")
    if bits == 8:  # unsigned, 128 is silence
        return ((np.frombuffer(data, dtype=np.uint8).astype(np.int16) - 128) * 256).astype(np.int16)
    if bits == 24:
        b = np.frombuffer(data, dtype=np.uint8).reshape(-1, 3).astype(np.int32)
        values = b[:, 0] | (b[:, 1] << 8) | (b[:, 2] << 16)
        values = np.where(values >= 1 << 23, values - (1 << 24), values)
        step = 256
    else:
        values = np.frombuffer(data, dtype="<i4").astype(np.int64)
        step = 65536
    return np.clip(np.floor_divide(values + step // 2, step), -32768, 32767).astype(np.int16)


def _g711_tables() -> tuple[np.ndarray, np.ndarray]:
    """int16 values of the 256 mu-law and A-law codes (ITU-T G.711, as sox and audioop expand them)."""
    codes = np.arange(256)
    u = ~codes & 0xFF
    exponent, mantissa = (u >> 4) & 7, u & 0x0F
    magnitude = (((mantissa << 3) + 0x84) << exponent) - 0x84
    mulaw = np.where(u & 0x80, -magnitude, magnitude)
    a = codes ^ 0x55
    exponent, mantissa = (a >> 4) & 7, a & 0x0F
    magnitude = np.where(exponent == 0, (mantissa << 4) + 8, ((mantissa << 4) + 0x108) << np.maximum(exponent - 1, 0))
    alaw = np.where(a & 0x80, magnitude, -magnitude)
    return mulaw.astype(np.int16), alaw.astype(np.int16)


_G711_MULAW, _G711_ALAW = _g711_tables()


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
    from scipy.signal import resample_poly  # here, not at the top: scipy.signal is seconds of start-up in every process that imports audio (every learner), and few resample

    g = gcd(rate_in, rate_out)
    out = resample_poly(samples.astype(np.float64), rate_out // g, rate_in // g)
    if samples.dtype == np.int16:
        return np.clip(np.round(out), -32768, 32767).astype(np.int16)
    return out.astype(samples.dtype)
