"""flite as a second, unseen synthesizer: voices awb, rms and slt with their printed phone end times.

`flite -voice NAME -psdur` prints every segment as `phone:end_seconds`; a segment starts where the
previous one ends. The voices kal and kal16 are left out: their printed timings do not match their
audio. Speaking rate is flite's `duration_stretch` feature (>1 is slower).

Phone mapping, flite (CMU US phone set) -> ARPAbet 39 (stress dropped):

    pau h# brk -> sil    ax -> ah    axr -> er    dx (flap) -> t    nx -> n    hv -> hh
    el -> l    em -> m    en -> n    the other 39 phones map to themselves
"""
from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from dataclasses import dataclass

import numpy as np

from asrdist.corpus.phones import ARPABET, SILENCE
from asrdist.errors import DataError
from asrdist.io.audio import read_wav

FLITE_BINARY = "flite"
INSTALL_HINT = "install the Debian package flite (apt-get install flite)"
VOICES = ("awb", "rms", "slt")
END_TOLERANCE_SECONDS = 0.03

FLITE_TO_ARPABET: dict[str, str] = {
    **{p: p for p in ARPABET},
    "pau": SILENCE, "h#": SILENCE, "brk": SILENCE,
    "ax": "ah", "axr": "er", "dx": "t", "nx": "n", "hv": "hh", "el": "l", "em": "m", "en": "n",
}


@dataclass(frozen=True)
class FliteVoice:
    """One flite speaker: a voice at a duration stretch (speaking rate)."""

    name: str
    stretch: float


def flite_path() -> str:
    """The flite executable; DataError with what to install when it is missing."""
    path = shutil.which(FLITE_BINARY)
    if path is None:
        raise DataError(f"flite executable '{FLITE_BINARY}' not found: {INSTALL_HINT}")
    return path


def synthesize(text: str, voice: FliteVoice, where: str) -> tuple[np.ndarray, int, list[tuple[str, float]]]:
    """Run flite once: (int16 samples, sample rate, [(flite phone, end time in seconds)])."""
    if voice.name not in VOICES:
        raise DataError(f"{where}: flite voice '{voice.name}' is not one of {', '.join(VOICES)}")
    fd, wav = tempfile.mkstemp(prefix="asrdist-flite-", suffix=".wav")
    os.close(fd)
    try:
        proc = subprocess.run(
            [flite_path(), "-voice", voice.name, "--setf", f"duration_stretch={voice.stretch}",
             "-psdur", "-t", text, "-o", wav],
            capture_output=True, text=True, timeout=120)
        if proc.returncode != 0:
            detail = (proc.stderr.strip().splitlines() or ["no message"])[-1]
            raise DataError(f"{where}: flite failed (exit {proc.returncode}): {detail}")
        samples, rate = read_wav(wav, where=where)
    finally:
        os.unlink(wav)
    return samples, rate, parse_psdur(proc.stdout, where)


def parse_psdur(output: str, where: str) -> list[tuple[str, float]]:
    """Parse `-psdur` output ("phone:end phone:end ..."); end times must not decrease."""
    phones: list[tuple[str, float]] = []
    for token in output.split():
        name, sep, end = token.rpartition(":")
        try:
            t = float(end)
        except ValueError:
            t = -1.0
        if not sep or not name or t < 0:
            raise DataError(f"{where}: cannot parse flite segment '{token}'")
        if phones and t < phones[-1][1]:
            raise DataError(f"{where}: flite segment '{token}' ends before the previous one")
        phones.append((name, t))
    if not phones:
        raise DataError(f"{where}: flite printed no segments")
    return phones


def phone_segments(phones: list[tuple[str, float]], num_samples: int, sample_rate: int,
                   where: str) -> list[tuple[str, int, int]]:
    """ARPAbet (phone, start, end) sample segments covering [0, num_samples).

    flite's last end time differs from the audio length by a few ms (the last segment is
    stretched or cut to the audio's end); more than `END_TOLERANCE_SECONDS` means the timings
    cannot be trusted (as with kal) and is a DataError.
    """
    gap = abs(phones[-1][1] * sample_rate - num_samples) / sample_rate
    if gap > END_TOLERANCE_SECONDS:
        raise DataError(f"{where}: flite phone times end {phones[-1][1]:.3f} s but the audio lasts "
                        f"{num_samples / sample_rate:.3f} s")
    segments: list[tuple[str, int, int]] = []
    start = 0
    for k, (name, end_seconds) in enumerate(phones):
        try:
            arpa = FLITE_TO_ARPABET[name]
        except KeyError:
            raise DataError(f"{where}: flite phone '{name}' has no ARPAbet mapping") from None
        end = num_samples if k == len(phones) - 1 else min(int(round(end_seconds * sample_rate)), num_samples)
        if end > start:
            segments.append((arpa, start, end))
            start = end
    return segments
