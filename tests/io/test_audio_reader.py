"""The WAV reader on the WAVs real tools write: 8/24/32-bit PCM, A-law and mu-law, WAVE_FORMAT_EXTENSIBLE,
IEEE float, streamed headers (sizes a pipe leaves), RF64; FLAC and Ogg through libsndfile; and its
one-line refusals of what it does not read (ADPCM, AIFF, MP3, implausible sample rates, FIFOs and
devices) or what is damaged (truncated WAV or FLAC) instead of calling a valid file "corrupt"."""
from __future__ import annotations

import os
import struct
from pathlib import Path

import numpy as np
import pytest

from asrdist.io.audio import read_wav, read_wav_format, write_wav
from asrdist.errors import DataError
from tests.support.wav_files import FLOAT_GUID, PCM_GUID, RATE, fmt_chunk, wav_bytes

def tone(n: int = 800) -> np.ndarray:
    return (8000 * np.sin(np.arange(n) * 0.07)).astype(np.int16)


def write(tmp_path: Path, name: str, blob: bytes) -> Path:
    path = tmp_path / name
    path.write_bytes(blob)
    return path


# -- formats that are valid and read -----------------------------------------------------------

def test_extensible_pcm_reads_as_plain_pcm(tmp_path):
    x = tone()
    path = write(tmp_path, "ext.wav", wav_bytes(x.tobytes(), fmt_chunk(guid=PCM_GUID)))
    samples, rate = read_wav(path)
    assert rate == RATE and samples.dtype == np.int16
    np.testing.assert_array_equal(samples, x)
    assert read_wav_format(path).rate == RATE


@pytest.mark.parametrize("bits,guid", [(32, None), (64, None), (32, FLOAT_GUID)])
def test_ieee_float_is_scaled_to_the_int16_range(tmp_path, bits, guid):
    x = tone()
    values = np.concatenate([x / 32768.0, [1.5, -1.5]]).astype("<f4" if bits == 32 else "<f8")
    path = write(tmp_path, "float.wav", wav_bytes(values.tobytes(), fmt_chunk(3, bits=bits, guid=guid)))
    samples, _ = read_wav(path)
    np.testing.assert_array_equal(samples[:-2], x)  # exactly the 16-bit audio it came from
    assert list(samples[-2:]) == [32767, -32768]  # beyond full scale: clipped


def test_float_with_nan_is_refused(tmp_path):
    values = np.array([0.1, np.nan, 0.2], dtype="<f4")
    path = write(tmp_path, "nan.wav", wav_bytes(values.tobytes(), fmt_chunk(3, bits=32)))
    with pytest.raises(DataError, match=r"nan.wav: non-finite sample .* at sample 1"):
        read_wav(path)


@pytest.mark.parametrize("data_size,riff_size", [(0xFFFFFFFF, 0xFFFFFFFF), (0xFFFFFFFF, 100), (0, 0), (0, 36)])
def test_a_streamed_header_reads_the_samples_present(tmp_path, data_size, riff_size):
    """sox/ffmpeg into a pipe leave 0xFFFFFFFF; Python's wave module leaves 0 (and RIFF size 36)."""
    x = tone(501)
    path = write(tmp_path, "stream.wav", wav_bytes(x.tobytes() + b"\x01", data_size=data_size, riff_size=riff_size))
    samples, _ = read_wav(path)
    np.testing.assert_array_equal(samples, x)  # the half sample at the end is dropped


def test_an_empty_data_chunk_with_chunks_after_it_is_empty_not_streamed(tmp_path):
    path = write(tmp_path, "empty.wav", wav_bytes(b"", after_data=b"LIST" + struct.pack("<I", 4) + b"INFO"))
    with pytest.raises(DataError, match="empty audio in empty.wav"):
        read_wav(path)


def test_a_short_data_chunk_is_still_truncated(tmp_path):
    path = write(tmp_path, "cut.wav", wav_bytes(tone(500).tobytes(), data_size=2000))
    with pytest.raises(DataError, match=r"truncated WAV file cut.wav \(header says 1000 samples, found 500\)"):
        read_wav(path)


def test_chunks_before_data_and_odd_sizes_are_skipped(tmp_path):
    x = tone()
    junk = b"LIST" + struct.pack("<I", 3) + b"abc\0" + b"fact" + struct.pack("<I", 4) + struct.pack("<I", len(x))
    samples, _ = read_wav(write(tmp_path, "chunks.wav", wav_bytes(x.tobytes(), before_data=junk)))
    np.testing.assert_array_equal(samples, x)


def test_rf64_reads_its_data_size_from_ds64(tmp_path):
    x = tone()
    ds64 = b"ds64" + struct.pack("<I", 28) + struct.pack("<QQQI", 0, x.nbytes, x.size, 0)
    blob = wav_bytes(x.tobytes() + b"tail", magic=b"RF64", riff_size=0xFFFFFFFF, data_size=0xFFFFFFFF)
    blob = blob[:12] + ds64 + blob[12:]  # ds64 comes first, right after WAVE
    samples, _ = read_wav(write(tmp_path, "big.wav", blob))
    np.testing.assert_array_equal(samples, x)


def test_plain_pcm_and_a_mono_channel_request_read_as_before(tmp_path):
    x = tone()
    write_wav(tmp_path / "plain.wav", x, RATE)
    samples, rate = read_wav(tmp_path / "plain.wav", expected_rate=RATE, channel=3)  # mono: read as it is
    np.testing.assert_array_equal(samples, x)
    stereo = np.stack([x, -x], axis=1)
    path = write(tmp_path, "st.wav", wav_bytes(stereo.astype("<i2").tobytes(), fmt_chunk(channels=2)))
    np.testing.assert_array_equal(read_wav(path, channel=1)[0], -x)


# -- refused, in one line naming the file ------------------------------------------------------

@pytest.mark.parametrize("tag,name", [(2, "MS ADPCM"), (0x11, "IMA ADPCM"), (0x1234, "format tag 4660")])
def test_other_encodings_are_unsupported_not_corrupt(tmp_path, tag, name):
    path = write(tmp_path, "law.wav", wav_bytes(bytes(100), fmt_chunk(tag, bits=8)))
    with pytest.raises(DataError) as info:
        read_wav(path)
    message = str(info.value)
    assert f"law.wav: unsupported encoding ({name}); convert it to 16-bit PCM" in message
    assert "corrupt" not in message and "\n" not in message


@pytest.mark.parametrize("guid", [None, PCM_GUID])
def test_wider_and_narrower_pcm_is_read_as_16_bits(tmp_path, guid):
    x = tone().astype(np.int64)
    x[:4] = [-32768, 32767, -1, 0]
    deep = x * 256 + np.array([0, 127, 128, -128] * (len(x) // 4))  # 24-bit values around each 16-bit step
    b24 = np.stack([deep & 0xFF, (deep >> 8) & 0xFF, (deep >> 16) & 0xFF], axis=1).astype(np.uint8).tobytes()
    got = read_wav(write(tmp_path, "d24.wav", wav_bytes(b24, fmt_chunk(bits=24, guid=guid))))[0]
    expected = np.clip(np.floor((deep + 128) / 256), -32768, 32767)  # nearest 16-bit step, halves up
    np.testing.assert_array_equal(got, expected)
    np.testing.assert_array_equal(got[4:][deep[4:] % 256 == 0], x[4:][deep[4:] % 256 == 0])
    b32 = (x * 65536).astype("<i4").tobytes()
    np.testing.assert_array_equal(read_wav(write(tmp_path, "d32.wav", wav_bytes(b32, fmt_chunk(bits=32, guid=guid))))[0], x)
    u8 = np.array([0, 128, 255, 1], dtype=np.uint8)  # unsigned: 128 is silence
    np.testing.assert_array_equal(read_wav(write(tmp_path, "d8.wav", wav_bytes(u8.tobytes(), fmt_chunk(bits=8, guid=guid))))[0],
                                  [-32768, 0, 32512, -32512])
    stereo = np.stack([x[4:], -x[4:]], axis=1) * 65536  # frames of two 32-bit samples
    path = write(tmp_path, "st32.wav", wav_bytes(stereo.astype("<i4").tobytes(), fmt_chunk(channels=2, bits=32)))
    np.testing.assert_array_equal(read_wav(path, channel=1)[0], -x[4:])


@pytest.mark.parametrize("tag,name", [(7, "ulaw2lin"), (6, "alaw2lin")])
def test_g711_is_expanded_as_audioop_does(tmp_path, tag, name):
    audioop = pytest.importorskip("audioop")  # the standard library's G.711 (Python <= 3.12)
    codes = bytes(range(256)) * 2
    got = read_wav(write(tmp_path, "law.wav", wav_bytes(codes, fmt_chunk(tag, bits=8))))[0]
    np.testing.assert_array_equal(got, np.frombuffer(getattr(audioop, name)(codes, 2), dtype="<i2"))
    assert read_wav_format(tmp_path / "law.wav").rate == RATE


@pytest.mark.parametrize("tag,bits,says", [(1, 12, "12-bit PCM audio, expected 8, 16, 24 or 32 bits"),
                                           (7, 16, "16-bit mu-law, expected 8 bits"),
                                           (3, 16, "16-bit IEEE float")])
def test_odd_widths_name_themselves(tmp_path, tag, bits, says):
    path = write(tmp_path, "odd.wav", wav_bytes(bytes(300), fmt_chunk(tag, bits=bits)))
    with pytest.raises(DataError, match=f"odd.wav: .*{says}"):
        read_wav(path)


@pytest.mark.parametrize("head,kind", [(b"\0\0\0\x20ftypM4A ", "MP4/M4A"), (b"\x1aE\xdf\xa3\x9fB\x86\x81", "Matroska/WebM"),
                                       (b"\xff\xf1\x50\x80", "AAC \\(ADTS\\)"), (b"FORM\0\0\0\x22MIDI", "IFF b'MIDI'")])
def test_containers_not_read_are_named_with_a_conversion(tmp_path, head, kind):
    path = write(tmp_path, "a.wav", head + bytes(64))
    with pytest.raises(DataError, match=rf"a.wav: {kind} audio, which asrdist does not read; convert it to WAV"):
        read_wav(path)


@pytest.mark.parametrize("rate", [0, 1, 999, 384001, 4_000_000_000])
def test_implausible_sample_rates_are_refused_naming_the_file(tmp_path, rate):
    path = write(tmp_path, "odd rate.wav", wav_bytes(tone().tobytes(), fmt_chunk(rate=rate)))
    with pytest.raises(DataError, match=rf"odd rate.wav: implausible sample rate {rate} Hz in the header"):
        read_wav(path)
    with pytest.raises(DataError, match="implausible sample rate"):
        read_wav_format(path)


@pytest.mark.parametrize("rate", [1000, 384000])
def test_the_plausible_range_is_inclusive(tmp_path, rate):
    path = write(tmp_path, "edge.wav", wav_bytes(tone().tobytes(), fmt_chunk(rate=rate)))
    assert read_wav(path)[1] == rate


def test_fifos_devices_and_directories_are_not_regular_files(tmp_path):
    fifo = tmp_path / "pipe.wav"
    os.mkfifo(fifo)
    for path, kind in ((fifo, "a FIFO"), (Path("/dev/null"), "a character device"), (tmp_path, "a directory")):
        with pytest.raises(DataError, match=rf"{path}: not a regular file \({kind}"):
            read_wav(path)
    with pytest.raises(DataError, match=r"utt u1: .*pipe.wav: not a regular file"):
        read_wav(fifo, where="utt u1")
    with pytest.raises(DataError, match="nothing.wav: audio file not found"):
        read_wav(tmp_path / "nothing.wav")


@pytest.mark.parametrize("blob,reason", [
    (b"", "empty file, 0 bytes"),
    (b"RIFF\0\0\0\0WAVEfmt ", "the file ends inside its header"),
    (b"RIFF\x10\0\0\0WAVEjunk", "the file ends inside its header"),
    (b"JUNKJUNKJUNK", "file does not start with RIFF id"),
    (wav_bytes(b"")[:36] + b"LIST\4\0\0\0abcd", "no data chunk"),
])
def test_damaged_files_are_corrupt(tmp_path, blob, reason):
    path = write(tmp_path, "bad.wav", blob)
    with pytest.raises(DataError, match=rf"corrupt WAV file bad.wav \({reason}"):
        read_wav(path)


def test_rf64_shorter_than_its_ds64_size_is_truncated(tmp_path):
    x = tone()
    ds64 = b"ds64" + struct.pack("<I", 28) + struct.pack("<QQQI", 0, 4 * x.nbytes, x.size, 0)
    blob = wav_bytes(x.tobytes(), magic=b"RF64", riff_size=0xFFFFFFFF, data_size=0xFFFFFFFF)
    with pytest.raises(DataError, match=r"truncated WAV file big.wav \(header says 3200 samples, found 800\)"):
        read_wav(write(tmp_path, "big.wav", blob[:12] + ds64 + blob[12:]))


# -- FLAC, Ogg and the other libsndfile containers ----------------------------------------------------------

def _flac(tmp_path, name, samples, rate=RATE, subtype="PCM_16", fmt="FLAC"):
    soundfile = pytest.importorskip("soundfile")
    path = tmp_path / name
    soundfile.write(path, samples, rate, subtype=subtype, format=fmt)
    return path


def test_flac_is_read_as_the_wav_it_was_made_from(tmp_path):
    x = tone()
    got, rate = read_wav(_flac(tmp_path, "a.flac", x))
    np.testing.assert_array_equal(got, x)  # lossless
    assert rate == RATE and read_wav_format(tmp_path / "a.flac").rate == RATE
    deep = _flac(tmp_path, "d.flac", x.astype(np.int32) * 65536, subtype="PCM_24")  # int32 full scale
    np.testing.assert_array_equal(read_wav(deep)[0], x)
    assert read_wav_format(deep).bits == 24
    stereo = _flac(tmp_path, "st.flac", np.stack([x, -x], axis=1))
    np.testing.assert_array_equal(read_wav(stereo, channel=1)[0], -x)
    with pytest.raises(DataError, match="st.flac has 2 channels; pick one with --channel K"):
        read_wav(stereo)
    with pytest.raises(DataError, match="sample rate 8000 Hz, expected 16000 Hz"):
        read_wav(deep, expected_rate=16000)


def test_ogg_vorbis_is_read(tmp_path):
    x = tone(8000)
    got, rate = read_wav(_flac(tmp_path, "a.ogg", x, subtype="VORBIS", fmt="OGG"))
    assert rate == RATE and abs(len(got) - len(x)) <= 64
    assert np.corrcoef(got[:len(x)].astype(float), x[:len(got)].astype(float))[0, 1] > 0.9  # lossy, but the tone


@pytest.mark.parametrize("cut", ["half", "garbled", "header only"])
def test_damaged_flac_is_one_line(tmp_path, cut):
    blob = _flac(tmp_path, "a.flac", tone(4000)).read_bytes()
    damaged = {"half": blob[:len(blob) // 2], "garbled": blob[:200] + bytes(300) + blob[500:],
               "header only": blob[:42]}[cut]
    path = write(tmp_path, "bad.flac", damaged)
    with pytest.raises(DataError) as info:
        read_wav(path)
    message = str(info.value)
    assert "bad.flac" in message and ("corrupt FLAC file" in message or "truncated FLAC file" in message)
    assert "\n" not in message


@pytest.mark.parametrize("fmt,subtype,name", [("AIFF", "PCM_16", "a.aiff"), ("AIFF", "ULAW", "a.aifc"),
                                              ("NIST", "PCM_16", "timit.WAV"), ("NIST", "ULAW", "a.sph"),
                                              ("AU", "PCM_16", "a.au"), ("CAF", "PCM_16", "a.caf")])
def test_lossless_libsndfile_containers_are_read_by_content(tmp_path, fmt, subtype, name):
    """TIMIT's `.WAV` files are NIST SPHERE: the first bytes decide, not the name."""
    x = tone(4000)
    path = _flac(tmp_path, name, x, subtype=subtype, fmt=fmt)
    got, rate = read_wav(path)
    assert rate == RATE and read_wav_format(path).rate == RATE
    if subtype == "PCM_16":
        np.testing.assert_array_equal(got, x)
    else:  # mu-law keeps about 14 bits near zero, fewer at the peaks
        assert np.corrcoef(got.astype(float), x.astype(float))[0, 1] > 0.999


@pytest.mark.parametrize("id3", [False, True])
def test_mp3_is_read_with_or_without_an_id3_tag(tmp_path, id3):
    x = tone(8000)
    path = _flac(tmp_path, "a.mp3", x, subtype="MPEG_LAYER_III", fmt="MP3")
    if id3:  # an ID3v2.4 tag of 20 bytes (size is syncsafe), as taggers put in front of the frames
        path.write_bytes(b"ID3\x04\0\0\0\0\0\x14" + b"TIT2\0\0\0\x0a\0\0\0digits\0\0\0" + path.read_bytes())
    got, rate = read_wav(path)
    assert rate == RATE and read_wav_format(path).rate == RATE and abs(len(got) - len(x)) <= 2048
    lag = int(np.argmax(np.correlate(got[:2000].astype(float), x[:1000].astype(float), "valid")))
    assert np.corrcoef(got[lag:lag + 6000].astype(float), x[:6000].astype(float))[0, 1] > 0.9  # lossy, the tone


def test_shorten_compressed_sphere_is_refused_with_the_command_that_decompresses_it(tmp_path):
    header = (b"NIST_1A\n   1024\nsample_count -i 4000\nsample_rate -i 16000\nchannel_count -i 1\n"
              b"sample_n_bytes -i 2\nsample_coding -s26 pcm,embedded-shorten-v2.00\nend_head\n")
    path = write(tmp_path, "wsj.wv1", header.ljust(1024, b" ") + bytes(500))
    for read in (read_wav, read_wav_format):
        with pytest.raises(DataError, match=r"wsj.wv1: NIST SPHERE compressed with shorten, .*sph2pipe -f wav IN"):
            read(path)


def test_junk_names_the_formats_it_could_have_been(tmp_path):
    with pytest.raises(DataError, match="does not start with RIFF id, nor with the mark of FLAC, Ogg, MP3"):
        read_wav(write(tmp_path, "notes.wav", b"these are my notes, not audio"))
