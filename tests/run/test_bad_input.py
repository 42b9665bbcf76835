"""Bad input, bad resumes and full disks, one table (issue 12): every case must exit non-zero with
one line on stderr, `asrdist: error: ...`, naming the thing, and leave nothing half-written.

Run the table: `.venv/bin/python -m pytest -q tests/run/test_bad_input.py`. Almost every case fails
before a learner starts (in-process `asrdist.cli.main`); three real one-learner runs on a tiny
corpus give a checkpointed run to resume, a run that diverges and a run whose disk fills up.
"""
from __future__ import annotations

import json
import os
import shutil
import wave
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import numpy as np
import pytest
import torch
import yaml

from asrdist.cli import main
from asrdist.io.audio import read_wav
from asrdist.io.kaldi_dir import read_alignments, write_alignments
from asrdist.errors import DataError
from asrdist.features.store import FeatureStore
from asrdist.train import checkpoint as ckpt
from tests.support.corpus_fixture import RECIPE, TINY, tiny_run_with_checkpoints, tone_corpus_with_features
from tests.support.full_disk import fill_disk



# ------------------------------------------------------------------ fixtures and helpers

@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    """A tiny tone corpus with features: 2 training speakers x 6 utterances."""
    return tone_corpus_with_features(tmp_path_factory.mktemp("bad") / "corpus")


@pytest.fixture(scope="module")
def trained(corpus, tmp_path_factory) -> Path:
    """A finished one-learner run with checkpoints at steps 2 and 4 (latest: step 4)."""
    return tiny_run_with_checkpoints(corpus, tmp_path_factory.mktemp("trained") / "run")


def snapshot(path: Path) -> dict[str, tuple[int, int]]:
    """Every file (with its size and modification time) and directory under `path`."""
    if not path.exists():
        return {}
    return {str(p.relative_to(path)): (0, 0) if p.is_dir() else (p.stat().st_size, p.stat().st_mtime_ns)
            for p in path.rglob("*")}


def copy_data(src: Path, dst: Path, ignore=None) -> Path:
    """Copy a corpus or split; its tables name audio and alignments by absolute path, so they are
    pointed at the copy (a case that damages the copy's audio must not damage the fixture's)."""
    shutil.copytree(src, dst, ignore=ignore)
    for table in list(dst.rglob("wav.scp")) + list(dst.rglob("alignment.scp")):
        table.write_text(table.read_text().replace(str(src), str(dst)))
    return dst


def error_line(capsys) -> str:
    """The one error line on stderr (a terminal's progress bars, `...%|###|`, and the notes a
    command gives before it fails aside)."""
    lines = [line.split("\r")[-1] for line in capsys.readouterr().err.splitlines()]
    lines = [line for line in lines if line.strip() and "%|" not in line and not line.startswith("[asrdist] note:")]
    assert len(lines) == 1 and lines[0].startswith("asrdist: error: "), lines
    return lines[0]


def write_stereo(path: Path, seconds: float = 0.5, rate: int = 16000) -> None:
    """Make `path` a 2-channel WAV: channel 1 its audio (if any), channel 0 noise."""
    if path.is_file():
        samples, rate = read_wav(path)
    else:
        samples = np.zeros(int(seconds * rate), dtype=np.int16)
    noise = np.random.default_rng(0).normal(0, 2000, len(samples)).astype("<i2")
    samples = np.stack([noise, samples.astype("<i2")], axis=1)
    with wave.open(str(path), "wb") as w:
        w.setnchannels(2)
        w.setsampwidth(2)
        w.setframerate(rate)
        w.writeframes(samples.tobytes())


def kaldi_dir(tmp: Path, corpus: Path, ids: list[str], wav: Callable[[int], Path]) -> Path:
    """A plain Kaldi data directory of `ids`, utterance i's audio at `wav(i)`."""
    src = tmp / "kaldi"
    src.mkdir()
    (src / "wav.scp").write_text("".join(f"{u} {wav(i)}\n" for i, u in enumerate(ids)))
    (src / "text").write_text("".join(f"{u} a b\n" for u in ids))
    (src / "utt2spk").write_text("".join(f"{u} spk\n" for u in ids))
    return src


# ------------------------------------------------------------------ the table

@dataclass
class Case:
    """`setup(tmp, corpus, trained) -> argv`; the error line must contain every string of `names`;
    `watch(tmp)` is what must be left exactly as it was (default: all of tmp)."""

    setup: Callable[[Path, Path, Path], list[str]]
    names: tuple[str, ...]
    watch: Callable[[Path], Path] = lambda tmp: tmp


def _copy_run(tmp: Path, trained: Path) -> Path:
    run = tmp / "run"
    shutil.copytree(trained, run)
    return run


def _resume(change: Callable[[Path], None], *argv: str):
    def setup(tmp, corpus, trained):
        run = _copy_run(tmp, trained)
        change(run)
        return ["train", RECIPE, "--resume", str(run), "--no-progress", *argv]
    return setup


def _as_two_learners(run: Path) -> None:
    """The run as a 2-learner sync run would have left it."""
    tree = yaml.safe_load((run / "config.yaml").read_text())
    tree["train"]["learners"], tree["strategy"] = 2, {"name": "sync"}
    (run / "config.yaml").write_text(yaml.safe_dump(tree))
    for step in ("step-00000002", "step-00000004"):
        shutil.copy(run / "checkpoints" / step / "rank-0.pt", run / "checkpoints" / step / "rank-1.pt")


def _half_written_after_a_broken_one(run: Path) -> None:
    """2 learners: step 4's rank-0.pt truncated, and a step 6 of which only rank 1 was written."""
    _as_two_learners(run)
    first = run / "checkpoints" / "step-00000004" / "rank-0.pt"
    first.write_bytes(first.read_bytes()[:3000])
    (run / "checkpoints" / "step-00000006").mkdir()
    shutil.copy(run / "checkpoints" / "step-00000004" / "rank-1.pt", run / "checkpoints" / "step-00000006" / "rank-1.pt")


def _misshapen_checkpoint(run: Path) -> None:
    state = torch.load(_latest_file(run), weights_only=False)
    name = next(iter(state["model"]))
    state["model"][name] = torch.zeros(3)
    torch.save(state, _latest_file(run))


def _latest_file(run: Path) -> Path:
    return ckpt.latest_step_dir(run) / "rank-0.pt"


def _fresh(*argv: str):
    """A new run on a corpus that does not exist: config errors must come before anything is read."""
    def setup(tmp, corpus, trained):
        return ["train", RECIPE, *argv, "--data", str(tmp / "no-corpus"), "--out", str(tmp / "out"), "--no-progress"]
    return setup


def _damaged(change: Callable[[Path], None], command: str = "train"):
    """`asrdist train` (or `features`) on a copy of the corpus changed by `change`."""
    def setup(tmp, corpus, trained):
        copy = copy_data(corpus, tmp / "corpus")
        change(copy)
        if command == "features":
            return ["features", str(copy), "--jobs", "1"]
        return ["train", RECIPE, *TINY, "--data", str(copy), "--out", str(tmp / "out")]
    return setup


def _edit_index(change: Callable[[list[list[str]]], None]):
    def edit(corpus: Path) -> None:
        index = corpus / "train" / "feats" / "index.tsv"
        rows = [line.split("\t") for line in index.read_text().splitlines()]
        change(rows)
        index.write_text("".join("\t".join(r) + "\n" for r in rows))
    return edit


def _overlap(rows):  # the second utterance of shard 0 starts inside the first one's rows
    rows[1][2] = str(int(rows[1][2]) - 3)


def _other_rows(rows):  # two utterances' offsets swapped: each now reads (part of) the other's rows
    rows[0][2], rows[1][2] = rows[1][2], rows[0][2]


def _foreign_phone_id(corpus: Path) -> None:
    split = corpus / "train"
    alignments = read_alignments(split)
    first = sorted(alignments)[0]
    alignments[first] = alignments[first].copy()
    alignments[first][3] = 99
    write_alignments(split, alignments)


def _longer_alignment(corpus: Path) -> None:
    split = corpus / "train"
    alignments = read_alignments(split)
    first = sorted(alignments)[0]
    alignments[first] = np.concatenate([alignments[first], np.zeros(7, dtype=np.int32)])
    write_alignments(split, alignments)


def _truncate_shard(corpus: Path) -> None:
    shard = corpus / "train" / "feats" / "shard-00000.f32"
    shard.write_bytes(shard.read_bytes()[:-40 * 4 * 5])


def _raw_split(change: Callable[[Path], None], *flags: str):
    """`asrdist features` on a copy of the training split without features, changed by `change`."""
    def setup(tmp, corpus, trained):
        split = copy_data(corpus / "train", tmp / "split", ignore=shutil.ignore_patterns("feats"))
        change(split)
        return ["features", str(split), "--jobs", "1", *flags]
    return setup


def _first_wav(split: Path) -> Path:
    return Path(sorted((split / "wav.scp").read_text().split("\n")[0].split()[1:])[0])


def _stereo_import(tmp, corpus, trained):
    write_stereo(tmp / "stereo.wav")
    src = kaldi_dir(tmp, corpus, ["u1"], lambda i: tmp / "stereo.wav")
    return ["corpus", "import-kaldi", str(src), str(tmp / "imported")]


def _spaced_ids(tmp, corpus, trained):
    wavs = sorted((corpus / "train" / "wav").glob("*.wav"))
    src = kaldi_dir(tmp, corpus, ["spk2 000", "spk2-001"], lambda i: wavs[i])
    return ["corpus", "import-kaldi", str(src), str(tmp / "imported")]


def _out_is_a_directory(command: str):
    """`asrdist decode` / `eval` with --out an existing directory: refused before the model loads."""
    def setup(tmp, corpus, trained):
        (tmp / "d1").mkdir()
        wav = sorted((corpus / "test" / "wav").glob("*.wav"))[0]
        if command == "decode":
            return ["decode", str(trained), str(wav), "--out", str(tmp / "d1")]
        return ["eval", str(trained), "--data", str(corpus), "--out", str(tmp / "d1")]
    return setup


def _rate_zero_decode(tmp, corpus, trained):
    """A good file and one whose header says 0 Hz: the good one is decoded, the bad one named."""
    good = sorted((corpus / "test" / "wav").glob("*.wav"))[0]
    blob = bytearray(good.read_bytes())
    blob[24:28] = bytes(4)  # the fmt chunk's sample rate
    (tmp / "rate0.wav").write_bytes(bytes(blob))
    return ["decode", str(trained), str(good), str(tmp / "rate0.wav")]


CASES: dict[str, Case] = {
    # --- resume: refused before the run directory is touched
    "resume: a bad override": Case(_resume(lambda run: None, "train.log_every=0"), ("train.log_every",)),
    "resume: changed model shape": Case(_resume(lambda run: None, "model.hidden_dim=128"),
                                        ("model.hidden_dim", "was trained with 16")),
    "resume: changed sampler batch": Case(_resume(lambda run: None, "data.batch_size=64"), ("data.batch_size",)),
    "resume: changed strategy": Case(_resume(lambda run: None, "--strategy", "averaging"), ("strategy.name",)),
    "resume: 1 -> 2 learners": Case(_resume(lambda run: None, "--learners", "2", "--strategy", "sync"),
                                    ("train.learners", "--learners 1")),
    "resume: 2 -> 1 learners": Case(_resume(_as_two_learners, "--learners", "1"),
                                    ("train.learners", "--learners 2")),
    "resume: truncated checkpoint": Case(
        _resume(lambda run: _latest_file(run).write_bytes(_latest_file(run).read_bytes()[:3000])),
        ("step-00000004/rank-0.pt", "truncated", "echo step-00000002 >")),
    "resume: empty checkpoint": Case(_resume(lambda run: _latest_file(run).write_bytes(b"")),
                                     ("step-00000004/rank-0.pt", "empty", "echo step-00000002 >")),
    "resume: a learner's file missing": Case(
        _resume(lambda run: (_as_two_learners(run), (_latest_file(run).parent / "rank-1.pt").unlink()), "--learners", "2"),
        ("step-00000004/rank-1.pt: checkpoint file missing", "echo step-00000002 >")),
    "resume: the newer checkpoint is half written": Case(
        _resume(_half_written_after_a_broken_one, "--learners", "2"),
        ("step-00000004/rank-0.pt", "truncated", "before it with `echo step-00000002 >")),
    "resume: latest pointing at a half-written one": Case(
        _resume(lambda run: (_half_written_after_a_broken_one(run),
                             (run / "checkpoints" / "latest").write_text("step-00000006\n")), "--learners", "2"),
        ("step-00000006/rank-0.pt: checkpoint file missing", "echo step-00000002 >")),
    "resume: a readable checkpoint of something else": Case(
        _resume(lambda run: torch.save({}, _latest_file(run)), "train.max_steps=6"),
        ("step-00000004/rank-0.pt: not this run's checkpoint (no 'model' entry)", "echo step-00000002 >")),
    "resume: a file of another checkpoint": Case(  # copied by hand: its learners would wait for each other
        _resume(lambda run: shutil.copy(run / "checkpoints" / "step-00000002" / "rank-0.pt", _latest_file(run)),
                "train.max_steps=6"),
        ("step-00000004/rank-0.pt: holds step-00000002, not step-00000004: a file of another checkpoint",
         "echo step-00000002 >")),
    "resume: a checkpoint with a misshapen tensor": Case(
        _resume(_misshapen_checkpoint, "train.max_steps=6"),
        ("step-00000004/rank-0.pt: not this run's checkpoint", "size mismatch")),
    "resume: truncated targets.pt": Case(
        _resume(lambda run: (run / "targets.pt").write_bytes((run / "targets.pt").read_bytes()[:10]), "train.max_steps=6"),
        ("targets.pt: not a readable targets file",)),
    "resume: latest lost": Case(_resume(lambda run: (run / "checkpoints" / "latest").unlink()),
                                ("checkpoints/latest: missing", "complete checkpoint with `echo step-00000004 >")),
    "resume: empty latest": Case(_resume(lambda run: (run / "checkpoints" / "latest").write_text("")),
                                 ("checkpoints/latest", "empty", "step-00000002, step-00000004")),
    "resume: latest names no checkpoint": Case(
        _resume(lambda run: (run / "checkpoints" / "latest").write_text("step-00000099\n")),
        ("checkpoints/latest", "step-00000099")),
    # --- config: refused before anything is read or made
    "config: train.log_every=0": Case(_fresh("train.log_every=0"), ("train.log_every", ">= 1")),
    "config: train.validate_every_epochs=0": Case(_fresh("train.validate_every_epochs=0"),
                                                  ("train.validate_every_epochs", ">= 1")),
    "config: train.threads=-1": Case(_fresh("train.threads=-1"), ("train.threads", ">= 0")),
    "config: train.timeout_seconds=-5": Case(_fresh("train.timeout_seconds=-5"), ("train.timeout_seconds", "> 0")),
    "config: train.max_steps=-3": Case(_fresh("train.max_steps=-3"), ("train.max_steps", ">= 0")),
    "config: train.checkpoint_every=-1": Case(_fresh("train.checkpoint_every=-1"), ("train.checkpoint_every", ">= 0")),
    "config: seed=-1": Case(_fresh("seed=-1"), ("seed", ">= 0")),
    "config: data.num_mel_bins=9": Case(_fresh("data.num_mel_bins=9"), ("data.num_mel_bins", ">= 10 and <= 128")),
    "config: batch not divisible by learners": Case(_fresh("data.batch_size=255", "--learners", "2",
                                                           "--strategy", "sync"), ("data.batch_size", "multiple")),
    "config: train.straggler.slowdown=0.5": Case(_fresh("train.straggler.slowdown=0.5"),
                                                 ("train.straggler.slowdown", ">= 1")),
    "config: straggler rank beyond the learners": Case(_fresh("train.straggler.ranks=[3]", "--learners", "2",
                                                              "--strategy", "sync"), ("train.straggler.ranks",)),
    "config: --learners 2 --strategy single": Case(_fresh("--learners", "2", "--strategy", "single"),
                                                   ("train.learners", "exactly 1 learner")),
    "config: restarts for adpsgd": Case(_fresh("train.max_restarts=1", "--learners", "2", "--strategy", "adpsgd"),
                                        ("train.max_restarts", "adpsgd goes on without a lost learner")),
    "config: restarts for hierarchical nodes": Case(
        _fresh("train.max_restarts=1", "train.group_size=2", "--learners", "4", "--strategy", "hierarchical"),
        ("train.max_restarts", "hierarchical goes on without a lost learner")),
    "config: auto batch size with 3 learners": Case(_fresh("--learners", "3", "--strategy", "onebit",
                                                           "data.batch_size=192", "strategy.auto_batch_size=true"),
                                                    ("strategy.auto_batch_size",)),
    # --- data: the store and the corpus check themselves before a run directory exists
    "data: index rows overlap": Case(_damaged(_edit_index(_overlap)), ("index.tsv", "overlap")),
    "data: index offsets point at other rows": Case(_damaged(_edit_index(_other_rows)), ("index.tsv", "utterance")),
    "data: shard shorter than its index": Case(_damaged(_truncate_shard), ("shard-00000.f32",)),
    "data: missing meta.json (features)": Case(_damaged(lambda c: (c / "train/feats/meta.json").unlink(), "features"),
                                               ("train/feats/meta.json: missing", "--overwrite")),
    "data: frames do not match alignments": Case(_damaged(_longer_alignment), ("alignment.scp", "utterance spk2-000")),
    "data: a phone id outside the phone table": Case(
        _damaged(_foreign_phone_id), ("train/alignment.scp: utterance", "phone id 99 is outside the corpus' phone table")),
    "data: stereo WAV (features)": Case(_raw_split(lambda s: write_stereo(_first_wav(s))),
                                        ("2 channels", "--channel K")),
    "data: channel out of range": Case(_raw_split(lambda s: write_stereo(_first_wav(s)), "--channel", "2"),
                                       ("channel 2", "has 2")),
    "data: stereo WAV (import-kaldi)": Case(_stereo_import, ("utterance u1", "2 channels")),
    "data: empty WAV": Case(_raw_split(lambda s: _first_wav(s).write_bytes(b"")), ("corrupt WAV", "empty file")),
    "data: WAV cut inside its header": Case(_raw_split(lambda s: _first_wav(s).write_bytes(b"RIFF\0\0\0\0WAVEfmt ")),
                                            ("corrupt WAV",)),
    "data: utterance id with a space": Case(_spaced_ids, ("utterance spk2", "space")),
    "decode: WAV header says 0 Hz": Case(_rate_zero_decode, ("rate0.wav", "implausible sample rate 0 Hz",
                                                             "1 of 2 files not decoded")),
    # --- output paths: checked before the work, nothing (no NAME.hyp.txt) left behind
    "decode: --out is a directory": Case(_out_is_a_directory("decode"), ("d1: output file is an existing directory",)),
    "eval: --out is a directory": Case(_out_is_a_directory("eval"), ("d1: output file is an existing directory",)),
    # --- paths that do not exist: named as such, not as a missing file inside them
    "eval: no such run directory": Case(lambda tmp, corpus, trained: ["eval", str(tmp / "nowhere"), "--data",
                                                                      str(corpus)],
                                        ("nowhere: run directory not found",)),
    "train: no such corpus (says how to make one)": Case(
        _fresh(), ("no-corpus: corpus directory not found; make it with `asrdist corpus synth ",
                   "/no-corpus` (the synthetic corpus configs/default.yaml trains on)")),
    "align: no such corpus": Case(lambda tmp, corpus, trained: ["align", str(trained), "--data", str(tmp / "nowhere")],
                                  ("nowhere: corpus or data directory not found",)),
}


@pytest.mark.parametrize("name", list(CASES))
def test_bad_input_is_one_line_and_writes_nothing(name, corpus, trained, tmp_path, capsys):
    case = CASES[name]
    argv = case.setup(tmp_path, corpus, trained)
    capsys.readouterr()
    before = snapshot(case.watch(tmp_path))
    assert main(argv) != 0
    line = error_line(capsys)
    for text in case.names:
        assert text in line, (text, line)
    assert snapshot(case.watch(tmp_path)) == before


# ------------------------------------------------------------------ cases that need a second look

def test_a_store_without_meta_json_says_so(corpus, tmp_path):
    copy_data(corpus / "train", tmp_path / "train")
    (tmp_path / "train" / "feats" / "meta.json").unlink()
    with pytest.raises(DataError, match=r"train/feats/meta.json: missing"):
        FeatureStore(tmp_path / "train")


def test_stereo_audio_is_read_with_channel(corpus, tmp_path, capsys):
    argv = _raw_split(lambda s: write_stereo(_first_wav(s)), "--channel", "1")(tmp_path, corpus, None)
    assert main(argv) == 0
    meta = yaml.safe_load((tmp_path / "split" / "feats" / "meta.json").read_text())
    assert meta["channel"] == 1 and meta["num_utterances"] == 12


def test_a_refused_resume_leaves_the_run_resumable_and_stale_temporaries_go(trained, tmp_path, capsys):
    run = _copy_run(tmp_path, trained)
    original = (run / "config.yaml").read_bytes()
    assert main(["train", RECIPE, "--resume", str(run), "model.hidden_dim=128", "--no-progress"]) != 0
    stale = [run / "checkpoints" / "step-00000004" / ".rank-0.pt.x1.tmp", run / "checkpoints" / ".latest.x2.tmp",
             run / ".model.pt.x3.tmp"]
    for path in stale:
        path.write_bytes(b"half")
    assert main(["train", RECIPE, "--resume", str(run), "train.max_steps=6", "--no-progress"]) == 0
    assert not any(p.exists() for p in stale)
    assert (run / "config.yaml").read_bytes() == original
    record = (run / "config-resume-1.yaml").read_text()
    assert record.startswith("# asrdist train --resume: train.max_steps=6\n")
    assert yaml.safe_load(record)["train"]["max_steps"] == 6 and not (run / "config-resume-2.yaml").exists()
    assert ckpt.latest_step_dir(run).name > "step-00000004"  # it trained on from the checkpoint


def test_a_fresh_run_that_fails_removes_what_it_made(corpus, tmp_path, capsys):
    """A run diverging at its first steps leaves no config.yaml, env.json, targets.pt, tensorboard/."""
    out = tmp_path / "out"
    assert main(["train", RECIPE, *TINY, "optim.lr=1e30", "optim.max_change=false", "--data", str(corpus), "--out", str(out)]) != 0
    assert "loss is" in error_line(capsys)
    assert not out.exists()


def test_full_disk_at_a_checkpoint_keeps_the_last_one(corpus, tmp_path, monkeypatch, capsys):
    run = tmp_path / "run"
    fill_disk(monkeypatch, run, only="step-00000004")
    assert main(["train", RECIPE, *TINY, "train.checkpoint_every=2", "train.max_steps=6", "--data", str(corpus),
                 "--out", str(run)]) != 0
    line = error_line(capsys)
    assert "step-00000004/rank-0.pt: cannot write: No space left on device" in line and "--resume" in line
    monkeypatch.undo()
    assert ckpt.check_resumable(run, 1).name == "step-00000002"
    assert torch.load(run / "checkpoints/step-00000002/rank-0.pt", weights_only=False)["loop"]["step"] == 2
    assert not list(run.rglob("*.tmp"))


@pytest.mark.parametrize("command", ["features", "train", "synth"])
def test_full_disk_is_one_line_naming_the_output(command, corpus, tmp_path, monkeypatch, capsys):
    if command == "features":
        copy_data(corpus / "train", tmp_path / "split", ignore=shutil.ignore_patterns("feats"))
        argv, out = ["features", str(tmp_path / "split"), "--jobs", "1"], tmp_path / "split" / "feats"
    elif command == "train":
        out = tmp_path / "run"
        argv = ["train", RECIPE, *TINY, "--data", str(corpus), "--out", str(out)]
    else:
        if shutil.which("espeak-ng") is None:
            pytest.skip("espeak-ng is not installed")
        out = tmp_path / "synth"
        argv = ["corpus", "synth", str(out), "--utterances", "3", "--jobs", "1"]
    fill_disk(monkeypatch, tmp_path)
    assert main(argv) != 0
    line = error_line(capsys)
    assert str(out) in line and "cannot write: No space left on device" in line, line
    assert not out.exists() and not list(tmp_path.rglob("*.tmp"))


def test_checkpoint_files_are_fsynced_before_their_rename_and_before_latest_moves(tmp_path, monkeypatch):
    events = []
    real_fsync, real_replace = os.fsync, os.replace

    def fsync(fd):
        events.append(("fsync", Path(os.readlink(f"/proc/self/fd/{fd}")).name))
        real_fsync(fd)

    def replace(src, dst):
        events.append(("rename", Path(dst).name))
        real_replace(src, dst)

    monkeypatch.setattr(os, "fsync", fsync)
    monkeypatch.setattr(os, "replace", replace)
    ckpt.save_learner(tmp_path, 3, 0, {"x": torch.ones(2)})
    ckpt.publish(tmp_path, 3, 1)
    tmp_rank = next(name for kind, name in events if kind == "fsync")
    tmp_latest = [name for kind, name in events if kind == "fsync" and name.startswith(".latest.")][0]
    assert events[:6] == [("fsync", tmp_rank), ("rename", "rank-0.pt"), ("fsync", "step-00000003"),
                          ("fsync", tmp_latest), ("rename", "latest"), ("fsync", "checkpoints")]
    # then the run's state record names it (docs/reliability.md), written the same way
    assert [kind for kind, _ in events[6:]] == ["fsync", "rename", "fsync"] and events[7] == ("rename", "state.json")
    assert tmp_rank.startswith(".rank-0.pt.") and ckpt.latest_step_dir(tmp_path).name == "step-00000003"


def test_a_run_directory_a_failed_start_left_only_reports_in_can_take_a_new_run(tmp_path, capsys):
    """A multi-learner start that failed before its first checkpoint leaves its reports (launcher.log,
    failed-rank-K.txt): the same --out starts again, where it was refused as not empty."""
    from asrdist.errors import AsrdistError
    from asrdist.run.launch import check_new_run_dir

    run = tmp_path / "run"
    run.mkdir()
    (run / "launcher.log").write_text("")
    (run / "failed-rank-1.txt").write_text("learner rank 1: stopped by SIGINT\n")
    check_new_run_dir(run, tmp_path / "corpus")
    assert not any(run.iterdir())
    assert "a start that failed left only its reports (failed-rank-1.txt, launcher.log); removed" in \
        capsys.readouterr().err
    (run / "launcher.log").write_text("")
    (run / "notes.txt").write_text("mine")
    with pytest.raises(AsrdistError, match="run directory exists and is not empty"):
        check_new_run_dir(run, tmp_path / "corpus")
    assert (run / "notes.txt").read_text() == "mine" and (run / "launcher.log").exists()


def test_resuming_a_finished_run_trains_and_writes_nothing(trained, tmp_path, capsys):
    """A run that did what its config asks is left as it is (no config-resume-K.yaml, no new start
    in summary.json); more steps or epochs train on."""
    run = _copy_run(tmp_path, trained)
    before = snapshot(run)
    assert main(["train", RECIPE, "--resume", str(run), "--no-progress"]) == 0
    assert "already trained as far as this config asks" in capsys.readouterr().err
    assert snapshot(run) == before
    assert main(["train", RECIPE, "--resume", str(run), "--no-progress", "train.max_steps=6"]) == 0
    assert json.loads((run / "summary.json").read_text())["steps"] == 5  # the one epoch ends at step 5
