"""A tiny, learnable corpus for trainer tests: each phone is a tone at its own frequency.

Built in well under a second, with exact alignments, speakers (pitch offsets) and the standard
asrdist layout, so tests of the trainer and strategies need neither espeak-ng nor flite.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np

from asrdist.io.audio import num_frames, write_wav
from asrdist.io.kaldi_dir import Utterance, write_data_dir
from asrdist.corpus.phones import PHONES, PhoneTable
from tests.support.paths import DEFAULT_RECIPE

RATE = 16000
TONE_PHONES = list(range(1, 9))  # 8 phones + silence


def _utterance(rng: np.random.Generator, speaker_shift: float) -> tuple[np.ndarray, np.ndarray, list[int]]:
    phones = [int(p) for p in rng.choice(TONE_PHONES, size=int(rng.integers(3, 6)))]
    segments = [(0, int(rng.integers(5, 12)))]
    for p in phones:
        segments.append((p, int(rng.integers(6, 15))))
    segments.append((0, int(rng.integers(5, 12))))
    shift = RATE // 100
    audio = []
    labels = []
    for p, frames in segments:
        n = frames * shift
        t = np.arange(n) / RATE
        if p == 0:
            x = rng.normal(0, 30, n)
        else:
            f = 250.0 * p * speaker_shift
            x = 4000 * np.sin(2 * np.pi * f * t) + 2000 * np.sin(2 * np.pi * 2.1 * f * t) + rng.normal(0, 100, n)
        audio.append(x)
        labels.extend([p] * frames)
    samples = np.concatenate(audio)
    labels = np.asarray(labels, dtype=np.int32)[: num_frames(len(samples), RATE)]
    return samples, labels, phones


def make_tone_corpus(out: Path, utterances_per_speaker: int = 12, speakers: int = 6, seed: int = 0) -> Path:
    out = Path(out)
    rng = np.random.default_rng(seed)
    out.mkdir(parents=True, exist_ok=True)
    PhoneTable().write(out / "phones.txt")
    split_of = {0: "test", 1: "valid"}
    by_split: dict[str, list[Utterance]] = {"train": [], "valid": [], "test": []}
    for s in range(speakers):
        split = split_of.get(s, "train")
        spk = f"spk{s}"
        shift = 1.0 + 0.03 * s
        for i in range(utterances_per_speaker):
            samples, labels, phones = _utterance(rng, shift)
            utt = f"{spk}-{i:03d}"
            wav_dir = out / split / "wav"
            wav_dir.mkdir(parents=True, exist_ok=True)
            write_wav(wav_dir / f"{utt}.wav", samples, RATE)
            text = " ".join(PHONES[p] for p in phones)
            by_split[split].append(Utterance(utt, spk, f"wav/{utt}.wav", text, len(samples) / RATE, labels))
    for split, utts in by_split.items():
        write_data_dir(out / split, utts)
    return out


RECIPE = str(DEFAULT_RECIPE)
TINY = ["data.batch_size=128", "model.hidden_dim=16", "model.hidden_layers=1", "optim.warmup_steps=0",
        "optim.anneal_after_epoch=null", "train.log_every=1", "train.threads=1", "--epochs", "1", "--no-progress"]
"""A one-learner run of RECIPE small enough for a test: a one-layer net of 16 units, one epoch."""


def tone_corpus_with_features(out: Path) -> Path:
    """A tiny tone corpus (2 training speakers x 6 utterances) with its features extracted."""
    from asrdist.cli import main  # here: the corpus alone needs no command line

    path = make_tone_corpus(out, utterances_per_speaker=6, speakers=4)
    assert main(["features", str(path), "--jobs", "1"]) == 0
    return path


def tiny_run_with_checkpoints(corpus: Path, run: Path) -> Path:
    """A finished TINY run on `corpus` with checkpoints at steps 2 and 4 (the latest at 4)."""
    from asrdist.cli import main  # as above
    from asrdist.train.checkpoint import latest_step_dir

    assert main(["train", RECIPE, *TINY, "train.checkpoint_every=2", "train.max_steps=4", "--data", str(corpus),
                 "--out", str(run)]) == 0
    assert latest_step_dir(run).name == "step-00000004"
    return run
