"""WAVE files byte by byte, as the tools that write them do (io/test_audio_reader.py,
eval/test_eval_output.py): a `fmt ` chunk (plain or WAVE_FORMAT_EXTENSIBLE) and the whole file."""
from __future__ import annotations

import struct

RATE = 8000
PCM_GUID = struct.pack("<IHH", 1, 0, 0x10) + bytes.fromhex("800000aa00389b71")
FLOAT_GUID = struct.pack("<IHH", 3, 0, 0x10) + bytes.fromhex("800000aa00389b71")


def fmt_chunk(tag: int = 1, channels: int = 1, rate: int = RATE, bits: int = 16, guid: bytes | None = None) -> bytes:
    """A `fmt ` chunk's body; with `guid`, WAVE_FORMAT_EXTENSIBLE carrying it."""
    block = channels * bits // 8
    body = struct.pack("<HHIIHH", 0xFFFE if guid else tag, channels, rate, (rate * block) & 0xFFFFFFFF, block, bits)
    if guid:
        body += struct.pack("<HHI", 22, bits, 4 if channels == 1 else 3) + guid
    return body


def wav_bytes(data: bytes, fmt: bytes | None = None, data_size: int | None = None, riff_size: int | None = None,
              magic: bytes = b"RIFF", before_data: bytes = b"", after_data: bytes = b"") -> bytes:
    """A WAVE file: `fmt` (16-bit PCM mono at RATE by default), chunks `before_data`, the data chunk
    (its header saying `data_size`, default the true size) and `after_data`."""
    fmt = fmt_chunk() if fmt is None else fmt
    body = (b"WAVE" + b"fmt " + struct.pack("<I", len(fmt)) + fmt + before_data + b"data"
            + struct.pack("<I", len(data) if data_size is None else data_size) + data + after_data)
    return magic + struct.pack("<I", len(body) if riff_size is None else riff_size) + body
