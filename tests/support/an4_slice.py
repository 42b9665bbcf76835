"""A slice of the shared AN4 recordings for end-to-end tests: a copy of the AN4 directory's script
(`make_kaldi_dir.sh`) and of its list, keeping the first `per_speaker` utterances of the chosen
speakers, with the audio linked from the shared directory (nothing copied)."""
from __future__ import annotations

import shutil
from pathlib import Path
from typing import Collection

from tests.support.paths import AN4


def an4_slice(here: Path, speakers: Collection[str] | int, per_speaker: int) -> Path:
    """HERE, made as the AN4 directory with its list cut to `speakers` (names, or a count: the
    list's first that many) and each one's first `per_speaker` utterances; returns HERE."""
    here.mkdir(parents=True)
    shutil.copy(AN4 / "make_kaldi_dir.sh", here)
    (here / "audio").symlink_to(AN4 / "audio")
    kept, count = [], {}
    for line in (AN4 / "train.list").read_text(encoding="utf-8").splitlines():
        speaker = line.split("\t")[1]
        chosen = len(count) < speakers if isinstance(speakers, int) else speaker in speakers
        if speaker not in count and not chosen:
            continue
        count[speaker] = count.get(speaker, 0) + 1
        if count[speaker] <= per_speaker:
            kept.append(line)
    (here / "train.list").write_text("".join(line + "\n" for line in kept), encoding="utf-8")
    return here
