"""`asrdist corpus synth`: a multi-speaker synthetic English corpus with exact phone alignments.

Steps, all deterministic from the seed (never from `--jobs` or scheduling):
1. Speakers: every (voice, rate, pitch) combination of the synthesizer, shuffled, with each voice
   used once before any is used twice; about one speaker per 25 utterances, at least three.
2. Splits by speaker: ~10% test, ~10% valid (at least one each), the rest train.
3. Utterance i: sentence i of the grammar (`textsource`), spoken by speaker i mod S.
4. Synthesize (espeak-ng via its C API, or flite), map its phones onto `PhoneTable`, resample to
   16 kHz, pad 50-250 ms of silence at each end, optionally add white noise at `--noise-snr` dB.
5. Frame labels: frame t (10 ms shift, snip_edges=False) gets the phone under its centre sample
   t*160+80; there are exactly `num_frames(len(samples), 16000)` of them.

Output (built under a temporary name, renamed when complete): OUT/phones.txt, OUT/summary.json,
OUT/{train,valid,test}/ Kaldi data directories with wav/<utt>.wav inside each split.
"""
from __future__ import annotations

import contextlib
import itertools
import math
import multiprocessing
import os
import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from asrdist.corpus import espeak, flite
from asrdist.corpus.phones import PhoneTable
from asrdist.corpus.textsource import sentence
from asrdist.errors import ConfigError, DataError
from asrdist.io.atomic import atomic_dir, interrupts_left_to_parent, write_json_atomic
from asrdist.io.audio import frame_shift_samples, num_frames, resample, write_wav
from asrdist.io.kaldi_dir import Utterance, write_data_dir

SAMPLE_RATE = 16000
SPLITS = ("train", "valid", "test")
UTTERANCES_PER_SPEAKER = 25
PAD_SECONDS = (0.05, 0.25)

ESPEAK_VARIANTS = tuple(f"m{i}" for i in range(1, 8)) + tuple(f"f{i}" for i in range(1, 5)) + (
    "klatt", "klatt2", "klatt3", "klatt4")
ESPEAK_RATES = (130, 150, 170, 190, 210)
ESPEAK_PITCHES = (30, 40, 50, 60, 70)
FLITE_STRETCHES = (0.85, 0.95, 1.05, 1.15, 1.3)


@dataclass(frozen=True)
class Speaker:
    id: str
    voice: espeak.EspeakVoice | flite.FliteVoice
    split: str = "train"


@dataclass(frozen=True)
class Job:
    """Everything one worker needs to make one utterance."""

    index: int
    utt_id: str
    speaker: Speaker
    words: str
    spoken: str
    seed: int
    noise_snr: float | None
    root: Path
    """The corpus directory being built; the audio goes to root/<split>/wav/<utt_id>.wav."""


@dataclass
class Result:
    utt_id: str
    speaker: Speaker
    words: str
    duration: float = 0.0
    alignment: np.ndarray | None = None
    error: str | None = None


def all_speakers(synthesizer: str) -> list[Speaker]:
    """Every speaker a synthesizer can make; ids sort like their utterances (Kaldi order)."""
    if synthesizer == "espeak":
        return [Speaker(f"es-{v}-r{r:03d}-p{p:02d}", espeak.EspeakVoice(v, r, p))
                for v, r, p in itertools.product(ESPEAK_VARIANTS, ESPEAK_RATES, ESPEAK_PITCHES)]
    if synthesizer == "flite":
        return [Speaker(f"fl-{v}-s{round(s * 100):03d}", flite.FliteVoice(v, s))
                for v, s in itertools.product(flite.VOICES, FLITE_STRETCHES)]
    raise ConfigError(f"--synthesizer: unknown synthesizer '{synthesizer}' (espeak or flite)")


def _voice_name(speaker: Speaker) -> str:
    return speaker.voice.variant if isinstance(speaker.voice, espeak.EspeakVoice) else speaker.voice.name


def choose_speakers(synthesizer: str, seed: int, num_utterances: int) -> list[Speaker]:
    """Speakers for a corpus, each with its split; deterministic from the seed."""
    if num_utterances < len(SPLITS):
        raise ConfigError(f"--utterances: need at least {len(SPLITS)} (one speaker per split), got {num_utterances}")
    pool = all_speakers(synthesizer)
    count = min(len(pool), num_utterances, max(len(SPLITS), round(num_utterances / UTTERANCES_PER_SPEAKER)))
    rng = np.random.default_rng([seed, 0x5BEA])
    shuffled = [pool[i] for i in rng.permutation(len(pool))]
    # Rank each speaker by how many of its voice's speakers come before it, so the first `count`
    # use every voice once before any voice twice.
    seen: dict[str, int] = {}
    ranks = []
    for spk in shuffled:
        name = _voice_name(spk)
        ranks.append(seen.get(name, 0))
        seen[name] = ranks[-1] + 1
    chosen = [spk for _, spk in sorted(zip(ranks, shuffled), key=lambda x: x[0])][:count]
    n_test = max(1, round(0.1 * count))
    n_valid = max(1, round(0.1 * count))
    splits = ["test"] * n_test + ["valid"] * n_valid + ["train"] * (count - n_test - n_valid)
    order = rng.permutation(count)
    return [Speaker(chosen[i].id, chosen[i].voice, split) for i, split in zip(order, splits)]


def plan(speakers: list[Speaker], seed: int, num_utterances: int, noise_snr: float | None,
         root: Path) -> list[Job]:
    """The utterances of a corpus: sentence i spoken by speaker i mod S."""
    jobs = []
    for i in range(num_utterances):
        spk = speakers[i % len(speakers)]
        words, spoken = sentence(seed, i)
        jobs.append(Job(i, f"{spk.id}-{i:06d}", spk, words, spoken, seed, noise_snr, root))
    return jobs


def frame_alignment(segments: list[tuple[str, int, int]], num_samples: int, table: PhoneTable,
                    where: str) -> np.ndarray:
    """One phone id per 10 ms frame: the phone under each frame's centre sample."""
    labels = np.full(num_samples, table.silence_id, dtype=np.int32)
    for phone, start, end in segments:
        labels[start:end] = table.id(phone, where)
    shift = frame_shift_samples(SAMPLE_RATE)
    centres = np.arange(num_frames(num_samples, SAMPLE_RATE)) * shift + shift // 2
    return labels[np.minimum(centres, num_samples - 1)]


def add_white_noise(samples: np.ndarray, snr_db: float, signal_power: float,
                    rng: np.random.Generator) -> np.ndarray:
    """Gaussian white noise `snr_db` below `signal_power` (mean square); returns int16."""
    x = samples.astype(np.float64)
    noise = rng.standard_normal(x.size) * np.sqrt(signal_power / 10.0 ** (snr_db / 10.0))
    return np.clip(np.round(x + noise), -32768, 32767).astype(np.int16)


def _synthesize(job: Job) -> tuple[np.ndarray, int, list[tuple[str, int, int]]]:
    """Raw audio, its rate and ARPAbet segments in samples of that rate."""
    voice = job.speaker.voice
    if isinstance(voice, espeak.EspeakVoice):
        out = espeak.engine().synthesize(job.spoken, voice)
        segments = espeak.phone_segments(out.phonemes, len(out.samples), job.utt_id)
        return out.samples, out.sample_rate, segments
    samples, rate, phones = flite.synthesize(job.spoken, voice, job.utt_id)
    return samples, rate, flite.phone_segments(phones, len(samples), rate, job.utt_id)


def render(job: Job) -> tuple[np.ndarray, list[tuple[str, int, int]]]:
    """16 kHz int16 audio of one utterance and its ARPAbet segments in samples of that audio."""
    samples, rate, segments = _synthesize(job)
    if samples.size == 0:
        raise DataError(f"{job.utt_id}: synthesizer produced no audio")
    speech = resample(samples, rate, SAMPLE_RATE)
    scale = SAMPLE_RATE / rate
    rng = np.random.default_rng([job.seed, job.index, 0xA0D1])
    before, after = (int(rng.uniform(*PAD_SECONDS) * SAMPLE_RATE) for _ in range(2))
    audio = np.concatenate([np.zeros(before, np.int16), speech, np.zeros(after, np.int16)])
    segments = [(p, before + int(round(s * scale)), before + int(round(e * scale))) for p, s, e in segments]
    if job.noise_snr is not None:
        power = float(np.mean(speech.astype(np.float64) ** 2))
        audio = add_white_noise(audio, job.noise_snr, power, rng)
    return audio, segments


def make_utterance(job: Job) -> Result:
    """Render, align and write one utterance; a DataError is returned in the result, not raised."""
    result = Result(job.utt_id, job.speaker, job.words)
    try:
        audio, segments = render(job)
        alignment = frame_alignment(segments, len(audio), PhoneTable(), job.utt_id)
        if not np.any(alignment != PhoneTable().silence_id):
            raise DataError(f"{job.utt_id}: alignment is silence only")
        wav_dir = job.root / job.speaker.split / "wav"
        wav_dir.mkdir(parents=True, exist_ok=True)
        write_wav(wav_dir / f"{job.utt_id}.wav", audio, SAMPLE_RATE)
        result.alignment, result.duration = alignment, len(audio) / SAMPLE_RATE
    except DataError as exc:
        result.error = str(exc)
    return result


@contextlib.contextmanager
def _results(jobs: list[Job], workers: int):
    """Results in completion order. Workers are spawned, so each starts with a pristine espeak;
    leaving the block terminates and joins them, so none writes after a failure's clean-up."""
    if workers <= 1:
        yield map(make_utterance, jobs)
        return
    with interrupts_left_to_parent():
        pool = multiprocessing.get_context("spawn").Pool(workers)
    with pool:
        yield pool.imap_unordered(make_utterance, jobs, chunksize=4)


def check_synthesizer(synthesizer: str) -> None:
    """Fail early, with what to install, when the synthesizer is missing."""
    if synthesizer == "espeak":
        espeak.load_library()
    elif synthesizer == "flite":
        flite.flite_path()
    else:
        all_speakers(synthesizer)  # raises ConfigError


def build_corpus(out: Path, utterances: int, seed: int = 0, synthesizer: str = "espeak", jobs: int = 0,
                 noise_snr: float | None = None, skip_bad: bool = False, overwrite: bool = False,
                 progress: bool = True) -> dict:
    """Build the corpus at `out` and return its summary (also written to out/summary.json).

    With jobs != 1 the workers are spawned processes: a script calling this needs the usual
    `if __name__ == "__main__":` guard.
    """
    if jobs < 0:
        raise ConfigError(f"--jobs: must be >= 0, got {jobs}")
    if noise_snr is not None and not math.isfinite(noise_snr):
        raise ConfigError(f"--noise-snr: must be a finite number of dB, got {noise_snr}")
    speakers = choose_speakers(synthesizer, seed, utterances)
    check_synthesizer(synthesizer)
    workers = min(jobs or os.cpu_count() or 1, utterances)
    with atomic_dir(out, overwrite=overwrite) as root:
        work = plan(speakers, seed, utterances, noise_snr, root)
        done: list[Result] = []
        skipped = 0
        bar = tqdm(total=len(work), desc=f"synth ({synthesizer})", unit="utt", file=sys.stderr,
                   disable=not progress, mininterval=0.5)
        with bar, _results(work, workers) as results:
            for res in results:
                bar.update(1)
                if res.error is None:
                    done.append(res)
                elif skip_bad:
                    skipped += 1
                else:
                    raise DataError(res.error)
        summary = {"synthesizer": synthesizer, "seed": seed, "sample_rate": SAMPLE_RATE,
                   "utterances": len(done), "speakers": len({r.speaker.id for r in done}),
                   "hours": round(sum(r.duration for r in done) / 3600, 4), "skipped": skipped,
                   "splits": {split: _write_split(root / split, [r for r in done if r.speaker.split == split],
                                                  skipped, Path(out) / split) for split in SPLITS}}
        PhoneTable().write(root / "phones.txt")
        write_json_atomic(root / "summary.json", summary)
    return summary


def _write_split(path: Path, results: list[Result], skipped: int, final: Path) -> dict:
    """Write one split's Kaldi directory (its audio is already there); return its summary."""
    if not results:
        raise DataError(f"{path}: no utterances left in this split ({skipped} skipped)")
    results = sorted(results, key=lambda r: r.utt_id)
    write_data_dir(path, [Utterance(r.utt_id, r.speaker.id, f"wav/{r.utt_id}.wav", r.words, r.duration,
                                    r.alignment) for r in results], final_dir=final)
    table = PhoneTable()
    counts = np.bincount(np.concatenate([r.alignment for r in results]), minlength=len(table))
    return {"utterances": len(results), "speakers": len({r.speaker.id for r in results}),
            "hours": round(sum(r.duration for r in results) / 3600, 4),
            "phones": {table.symbol(i): int(c) for i, c in enumerate(counts)}}


def synth_command(args) -> int:
    """CLI entry: `asrdist corpus synth OUT ...`; prints a one-line summary."""
    summary = build_corpus(args.out, args.utterances, seed=args.seed, synthesizer=args.synthesizer,
                           jobs=args.jobs, noise_snr=args.noise_snr, skip_bad=args.skip_bad,
                           overwrite=args.overwrite)
    splits = ", ".join(f"{s} {v['utterances']} utt / {v['speakers']} spk" for s, v in summary["splits"].items())
    print(f"{args.out}: {summary['utterances']} utterances, {summary['hours']:.3f} h, "
          f"{summary['skipped']} skipped ({splits})")
    return 0
