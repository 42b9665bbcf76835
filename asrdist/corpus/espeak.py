"""espeak-ng through libespeak-ng's C API (ctypes), with phoneme events at exact sample positions.

Every phoneme's `espeakEVENT_PHONEME` event carries the sample where it starts, so the alignment
is exact; each utterance is synthesized in a child forked from a freshly initialized library, so
the same text gives the same audio whatever ran before. espeak's en-us mnemonics map to ARPAbet
by `ESPEAK_TO_ARPABET` (a compound splits its duration 60/40). Why, and the mapping as a table:
docs/data.md#espeak-ngs-exact-alignments-corpusespeakpy."""
from __future__ import annotations

import ctypes
import os
import pickle
from dataclasses import dataclass

import numpy as np

from asrdist.corpus.phones import SILENCE
from asrdist.errors import DataError

LIBRARY = "libespeak-ng.so.1"
INSTALL_HINT = "install the Debian packages espeak-ng and libespeak-ng1 (apt-get install espeak-ng libespeak-ng1)"

# speak_lib.h constants (API revision 12).
_AUDIO_OUTPUT_SYNCHRONOUS = 2
_INITIALIZE_PHONEME_EVENTS = 0x0001
_EVENT_LIST_TERMINATED = 0
_EVENT_PHONEME = 7
_POS_CHARACTER = 1
_CHARS_UTF8 = 1
_PARAM_RATE = 1
_PARAM_PITCH = 3
_EE_OK = 0

COMPOUND_FIRST_SHARE = 0.6
PAUSES = frozenset({"_", "_:", "_::", "_!", "_|", "_;_", "_^_", "||"})
ESPEAK_TO_ARPABET: dict[str, tuple[str, ...]] = {
    **{p: (SILENCE,) for p in PAUSES},
    "3": ("er",), "3:": ("er",),
    "@": ("ah",), "@2": ("ah",), "@5": ("ah",), "@#": ("ah",), "@-": ("ah",), "a#": ("ah",), "V": ("ah",),
    "a": ("ae",), "aa": ("ae",), "a2": ("ae",), "a#2": ("ae",),
    "A:": ("aa",), "0": ("aa",), "0#": ("aa",), "02": ("aa",), "O2": ("aa",), "A#": ("aa",), "A~": ("aa",),
    "O": ("ao",), "O:": ("ao",), "o:": ("ao",), "O~": ("ao",),
    "E": ("eh",), "E#": ("eh",), "E2": ("eh",), "e#": ("eh",),
    "I": ("ih",), "I2": ("ih",), "I#": ("ih",), "I2#": ("ih",),
    "i": ("iy",), "i:": ("iy",), "U": ("uh",), "u:": ("uw",),
    "aU": ("aw",), "oU": ("ow",), "oU#": ("ow",), "aI": ("ay",), "eI": ("ey",), "e:": ("ey",), "OI": ("oy",),
    "A@": ("aa", "r"), "O@": ("ao", "r"), "o@": ("ao", "r"), "e@": ("eh", "r"), "i@3": ("ih", "r"),
    "IR": ("ih", "r"), "VR": ("ah", "r"), "U@": ("uh", "r"), "i@": ("iy", "ah"),
    "aI@": ("ay", "er"), "aI3": ("ay", "er"), "aU@": ("aw", "er"), "@L": ("ah", "l"),
    **{p: (p,) for p in "p b t d k g f v s z m n l r w".split()},
    "T": ("th",), "D": ("dh",), "S": ("sh",), "Z": ("zh",), "h": ("hh",), "N": ("ng",), "j": ("y",),
    "tS": ("ch",), "dZ": ("jh",),
    "t#": ("t",), "t2": ("t",), "?": ("t",), "d#": ("d",), "z#": ("z",), "z/2": ("z",),
    "l/": ("l",), "l/2": ("l",), "r-": ("r",), "r/": ("r",), "w#": ("w",), "n-": ("n",), "m-": ("m",),
    ";": (),
}


@dataclass(frozen=True)
class EspeakVoice:
    """One synthetic speaker: an en-us voice variant at a speaking rate (wpm) and base pitch (0-100)."""

    variant: str
    rate: int
    pitch: int

    @property
    def name(self) -> str:
        return f"en-us+{self.variant}"


@dataclass
class Synthesis:
    samples: np.ndarray
    """int16 audio at `sample_rate`."""
    sample_rate: int
    phonemes: list[tuple[str, int]]
    """(espeak mnemonic, start sample) in time order."""


class _EventId(ctypes.Union):
    _fields_ = [("number", ctypes.c_int), ("name", ctypes.c_char_p), ("string", ctypes.c_char * 8)]


class _Event(ctypes.Structure):
    _fields_ = [("type", ctypes.c_int), ("unique_identifier", ctypes.c_uint),
                ("text_position", ctypes.c_int), ("length", ctypes.c_int),
                ("audio_position", ctypes.c_int), ("sample", ctypes.c_int),
                ("user_data", ctypes.c_void_p), ("id", _EventId)]


_CALLBACK = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.POINTER(ctypes.c_short), ctypes.c_int,
                             ctypes.POINTER(_Event))


def load_library() -> ctypes.CDLL:
    """Load libespeak-ng; DataError with what to install when it is missing."""
    try:
        return ctypes.CDLL(LIBRARY)
    except OSError:
        raise DataError(f"espeak-ng C library {LIBRARY} not found: {INSTALL_HINT}") from None


class Espeak:
    """One initialized libespeak-ng per process; every synthesis runs in a fresh forked child."""

    def __init__(self) -> None:
        self._lib = load_library()
        self._lib.espeak_TextToPhonemes.restype = ctypes.c_char_p
        self._lib.espeak_TextToPhonemes.argtypes = [ctypes.POINTER(ctypes.c_void_p), ctypes.c_int, ctypes.c_int]
        self.sample_rate = self._lib.espeak_Initialize(_AUDIO_OUTPUT_SYNCHRONOUS, 0, None,
                                                       _INITIALIZE_PHONEME_EVENTS)
        if self.sample_rate <= 0:
            raise DataError(f"espeak-ng: initialization failed (no espeak-ng-data?): {INSTALL_HINT}")
        self._chunks: list[bytes] = []
        self._phonemes: list[tuple[str, int]] = []
        self._callback = _CALLBACK(self._on_audio)  # kept referenced: the library holds the pointer
        self._lib.espeak_SetSynthCallback(self._callback)

    def _on_audio(self, wav, num_samples, events) -> int:
        if wav and num_samples > 0:
            self._chunks.append(ctypes.string_at(wav, 2 * num_samples))
        i = 0
        while events[i].type != _EVENT_LIST_TERMINATED:
            if events[i].type == _EVENT_PHONEME:
                self._phonemes.append((events[i].id.string.decode("utf-8", "replace"), events[i].sample))
            i += 1
        return 0

    def _set_voice(self, voice: EspeakVoice) -> None:
        if self._lib.espeak_SetVoiceByName(voice.name.encode()) != _EE_OK:
            raise DataError(f"espeak-ng: voice '{voice.name}' not found")
        self._lib.espeak_SetParameter(_PARAM_RATE, voice.rate, 0)
        self._lib.espeak_SetParameter(_PARAM_PITCH, voice.pitch, 0)

    def _synthesize_here(self, text: str, voice: EspeakVoice) -> Synthesis:
        self._set_voice(voice)
        data = text.encode("utf-8")
        self._chunks, self._phonemes = [], []
        rc = self._lib.espeak_Synth(data, len(data) + 1, 0, _POS_CHARACTER, 0, _CHARS_UTF8, None, None)
        if rc != _EE_OK:
            raise DataError(f"espeak-ng: synthesis failed (error {rc}) for '{text}'")
        samples = np.frombuffer(b"".join(self._chunks), dtype=np.int16).copy()
        return Synthesis(samples, self.sample_rate, list(self._phonemes))

    def _phonemes_here(self, text: str, voice: EspeakVoice) -> list[str]:
        self._set_voice(voice)
        buf = ctypes.create_string_buffer(text.encode("utf-8"))
        ptr = ctypes.c_void_p(ctypes.addressof(buf))
        mode = ord(" ") << 8  # separator between phoneme names
        out: list[str] = []
        while ptr.value:
            clause = self._lib.espeak_TextToPhonemes(ctypes.byref(ptr), _CHARS_UTF8, mode)
            # Stress marks are not phonemes: the synthesizer never reports them as events.
            out += [p.lstrip("',") for p in clause.decode("utf-8").split()]
        return [p for p in out if p]

    def synthesize(self, text: str, voice: EspeakVoice) -> Synthesis:
        """Audio and phoneme start samples of `text`, from the library's pristine state."""
        return _in_fresh_child(self._synthesize_here, text, voice)

    def text_to_phonemes(self, text: str, voice: EspeakVoice) -> list[str]:
        """espeak's own phoneme string for `text` (espeak_TextToPhonemes), stress marks removed."""
        return _in_fresh_child(self._phonemes_here, text, voice)


_ENGINE: Espeak | None = None


def engine() -> Espeak:
    """The process's espeak-ng (initialized on first use)."""
    global _ENGINE
    if _ENGINE is None:
        _ENGINE = Espeak()
    return _ENGINE


def _in_fresh_child(fn, *args):
    """Run fn(*args) in a forked child and return its (pickled) result; re-raise its DataError."""
    read_fd, write_fd = os.pipe()
    pid = os.fork()
    if pid == 0:  # child: never return into the caller's stack
        status = 0
        try:
            os.close(read_fd)
            try:
                payload = pickle.dumps(("ok", fn(*args)))
            except DataError as exc:
                payload = pickle.dumps(("error", str(exc)))
            except BaseException as exc:  # a bug, not bad data: the parent re-raises it as such
                payload = pickle.dumps(("crash", f"espeak-ng child: {type(exc).__name__}: {exc}"))
            with os.fdopen(write_fd, "wb") as f:
                f.write(payload)
        except BaseException:
            status = 1
        finally:
            os._exit(status)
    os.close(write_fd)
    with os.fdopen(read_fd, "rb") as f:
        payload = f.read()
    _, status = os.waitpid(pid, 0)
    if not payload:
        raise DataError(f"espeak-ng: synthesis process died (status {status})")
    kind, value = pickle.loads(payload)
    if kind == "error":
        raise DataError(value)
    if kind == "crash":
        raise RuntimeError(value)
    return value


def phone_segments(phonemes: list[tuple[str, int]], num_samples: int, where: str) -> list[tuple[str, int, int]]:
    """ARPAbet (phone, start, end) segments covering [0, num_samples) from espeak phoneme events.

    Audio before the first event is silence; each phoneme lasts until the next event; compounds
    are split 60/40; a linking glide extends the phone before it. espeak folds some post-vocalic
    consonants into the vowel's formant glide and reports them with zero length (the l of
    "wheels", "twelve", "school"): such a phone takes the last 40% of the vowel before it.
    An unmapped mnemonic is a DataError naming `where` and the phoneme.
    """
    segments: list[tuple[str, int, int]] = []
    first = phonemes[0][1] if phonemes else num_samples
    if first > 0:
        segments.append((SILENCE, 0, min(first, num_samples)))
    for k, (name, start) in enumerate(phonemes):
        end = phonemes[k + 1][1] if k + 1 < len(phonemes) else num_samples
        start, end = min(start, num_samples), min(max(end, start), num_samples)
        try:
            arpa = ESPEAK_TO_ARPABET[name]
        except KeyError:
            raise DataError(f"{where}: espeak phoneme '{name}' has no ARPAbet mapping") from None
        if not arpa:
            if segments and end > start:
                phone, seg_start, _ = segments.pop()
                segments.append((phone, seg_start, end))
        elif end <= start:
            if arpa != (SILENCE,) and segments and segments[-1][0] != SILENCE:
                phone, seg_start, seg_end = segments.pop()
                split = seg_start + int(round(COMPOUND_FIRST_SHARE * (seg_end - seg_start)))
                segments += [(phone, seg_start, split), (arpa[-1], split, seg_end)]
        elif len(arpa) == 1:
            segments.append((arpa[0], start, end))
        else:
            split = start + int(round(COMPOUND_FIRST_SHARE * (end - start)))
            segments += [(arpa[0], start, split), (arpa[1], split, end)]
    return segments
