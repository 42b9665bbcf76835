"""Test fixture: a few real FSDD recordings (spoken digits) as Kaldi data directories."""
from __future__ import annotations

import shutil
from pathlib import Path
from tests.support.paths import FSDD

WORDS = ("zero", "one", "two", "three", "four", "five", "six", "seven", "eight", "nine")


def copy_recordings(audio: Path, speakers, digits=(0, 1, 2), takes=(0, 1)) -> list[tuple[str, str, int, Path]]:
    """Copy FSDD files to `audio`; [(utt_id, speaker, digit, path)]."""
    audio.mkdir(parents=True, exist_ok=True)
    out = []
    for spk in speakers:
        for digit in digits:
            for take in takes:
                utt = f"{spk}-{digit}-{take}"
                path = audio / f"{utt}.wav"
                shutil.copy(FSDD / f"{digit}_{spk}_{take}.wav", path)
                out.append((utt, spk, digit, path))
    return out


def make_kaldi_tree(root: Path, train=("george", "jackson", "nicolas"), test=("theo",), dev=(),
                    names=("train", "test", "dev")) -> Path:
    """root/kaldi/{train,test[,dev]} with wav.scp paths relative to each data dir (../../audio)."""
    src = root / "kaldi"
    src.mkdir(parents=True)
    for speakers, name in zip((train, test, dev), names):
        if speakers:
            utts = copy_recordings(root / "audio", speakers)
            d = src / name
            d.mkdir()
            rows = sorted(utts)
            for file, lines in (("wav.scp", [f"{u} ../../audio/{p.name}" for u, _, _, p in rows]),
                                ("text", [f"{u} {WORDS[g]}" for u, _, g, _ in rows]),
                                ("utt2spk", [f"{u} {s}" for u, s, _, _ in rows])):
                (d / file).write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return src
