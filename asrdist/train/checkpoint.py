"""Atomic, per-learner checkpoints with exact resume.

`RUN_DIR/checkpoints/TAG/rank-R.pt` per learner (TAG `step-N` for lock-step strategies, `epoch-E`
for the others) and `checkpoints/latest`, a pointer moved atomically by the learner that writes a
checkpoint's last file; everything fsynced first, so `latest` always names a complete checkpoint.
A survivors' checkpoint lists its `members`; a resume gives each lost rank a survivor's file.
Details: docs/reliability.md#checkpoint-files-traincheckpointpy."""
from __future__ import annotations

import json
import pickle
import random
import shutil
import zipfile
from pathlib import Path
from typing import Any

import numpy as np
import torch

from asrdist.errors import TrainingError
from asrdist.io.atomic import save_torch_atomic, write_text_atomic
from asrdist.io.atomic import write_json_atomic as save_json_atomic
from asrdist.io.torch_data import foreign_globals, load_data, refusal
from asrdist.train.state import write_state

KEEP_LAST = 2
CHECKPOINTS_DIR = "checkpoints"
"""Where a run directory holds its checkpoints; LATEST_NAME in it points at the latest."""
LATEST_NAME = "latest"


def rng_state(device: torch.device | None = None) -> dict[str, Any]:
    """The generators a learner draws from: CPU torch, numpy, Python, and the CUDA generator of
    `device` when the learner computes there (its dropout masks come from it). Tensors and plain
    values only (numpy's key as a tensor), so that a checkpoint loads as data (`load_data`)."""
    kind, key, position, has_gauss, gauss = np.random.get_state(legacy=True)
    numpy_state = (str(kind), torch.from_numpy(key.astype(np.int64)), int(position), int(has_gauss), float(gauss))
    state = {"torch": torch.get_rng_state(), "numpy": numpy_state, "python": random.getstate()}
    if device is not None and device.type == "cuda":
        state["cuda"] = torch.cuda.get_rng_state(device)
    return state


def set_rng_state(state: dict[str, Any], device: torch.device | None = None) -> None:
    """Restore `rng_state`'s generators. A CUDA state goes to `device` when that is a GPU; a learner
    restoring on the CPU has no CUDA generator to draw from, so a GPU's state is not needed there."""
    torch.set_rng_state(state["torch"])
    kind, key, *rest = state["numpy"]  # key: a tensor, or a numpy array in a checkpoint of an older asrdist
    np.random.set_state((kind, np.asarray(key, dtype=np.uint32), *rest))
    random.setstate(state["python"])
    if "cuda" in state and device is not None and device.type == "cuda":
        torch.cuda.set_rng_state(state["cuda"], device)


def step_tag(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_dir(run_dir: Path, tag: str | int) -> Path:
    return run_dir / CHECKPOINTS_DIR / (step_tag(tag) if isinstance(tag, int) else tag)


def save_learner(run_dir: Path, tag: str | int, rank: int, state: dict[str, Any]) -> None:
    save_torch_atomic(checkpoint_dir(run_dir, tag) / f"rank-{rank}.pt", state)


MEMBERS_NAME = "members.json"


def publish(run_dir: Path, tag: str | int, world_size: int, members: list[int] | None = None,
            group_size: int = 1, progress: dict | None = None) -> None:
    """Point `latest` at the checkpoint `tag` (once every learner of `members`, default all
    `world_size`, saved it); prune older ones. Checkpoints newer than `tag` (a faster learner's next
    one) are left alone. A checkpoint of some members records them in members.json first.
    `progress` ({epoch, epochs}) goes into the run's state record."""
    d = checkpoint_dir(run_dir, tag)
    writers = list(range(world_size)) if members is None else sorted(members)
    missing = [r for r in writers if not (d / f"rank-{r}.pt").is_file()]
    if missing:
        raise TrainingError(f"{d}: checkpoint of rank {missing[0]} missing")
    if len(writers) < world_size:
        for r in set(range(world_size)) - set(writers):  # what a lost learner left half-written here
            for stale in d.glob(f".rank-{r}.pt.*.tmp"):
                stale.unlink(missing_ok=True)
        save_json_atomic(d / MEMBERS_NAME, {"learners": world_size, "members": writers, "group_size": group_size,
                                            "lost": sorted(set(range(world_size)) - set(writers))})
    write_text_atomic(run_dir / CHECKPOINTS_DIR / LATEST_NAME, d.name + "\n")
    write_state(run_dir, "checkpointed", checkpoint=d.name, **(progress or {}))
    kind = d.name.split("-")[0]
    older = sorted(p for p in (run_dir / CHECKPOINTS_DIR).glob(f"{kind}-*") if p.is_dir() and p.name < d.name)
    for p in older[:max(0, len(older) - (KEEP_LAST - 1))]:
        shutil.rmtree(p, ignore_errors=True)


def latest_step_dir(run_dir: Path) -> Path | None:
    """The checkpoint `latest` points at; None when the run has none. A `latest` that is empty or
    names no checkpoint directory is a TrainingError saying what to do."""
    pointer = run_dir / CHECKPOINTS_DIR / LATEST_NAME
    if not pointer.is_file():
        return None
    name = pointer.read_text(errors="replace").strip()
    d = run_dir / CHECKPOINTS_DIR / name
    if not name or "/" in name or not d.is_dir():
        found = ", ".join(p.name for p in _checkpoint_dirs(run_dir)) or "none"
        what = "is empty" if not name else f"names {name!r}, which is not a checkpoint directory"
        raise TrainingError(f"{pointer}: {what} (checkpoints here: {found}); write the name of a complete "
                            f"checkpoint into it to resume from there, or start a new run with --out")
    return d


def _checkpoint_dirs(run_dir: Path) -> list[Path]:
    return sorted(p for p in (run_dir / CHECKPOINTS_DIR).glob("*-*") if p.is_dir())


def _file_problem(path: Path) -> str | None:
    """Why `path` cannot be a complete checkpoint file, or None. torch.save writes a zip archive
    whose directory is at its end, so a truncated file is found without reading it all."""
    if not path.is_file():
        return "missing"
    if path.stat().st_size == 0:
        return "empty (0 bytes)"
    if not zipfile.is_zipfile(path):
        return "truncated or corrupt (not a complete torch.save archive)"
    return None


def _learner_files(d: Path) -> list[int]:
    return sorted(int(p.stem.split("-")[1]) for p in d.glob("rank-*.pt") if p.stem.split("-")[1].isdigit())


def survivors_of(d: Path) -> dict | None:
    """members.json of a checkpoint written by survivors ({learners, members, group_size, lost}),
    None for a checkpoint of every learner (or a members.json that is not one)."""
    try:
        record = json.loads((d / MEMBERS_NAME).read_text())
    except (OSError, ValueError):
        return None
    members = record.get("members") if isinstance(record, dict) else None
    if not isinstance(members, list) or not members or not all(isinstance(r, int) for r in members):
        return None
    return record


def stand_in(rank: int, record: dict | None) -> int:
    """Whose file `rank` resumes from: its own, or, when it was lost, a survivor's in the same place
    of its node (groups of `group_size`: a node's learners hold equal models)."""
    if record is None or rank in record["members"]:
        return rank
    size = max(1, int(record.get("group_size") or 1))
    same_place = [m for m in record["members"] if m % size == rank % size] or record["members"]
    return same_place[(rank // size) % len(same_place)]


def _expected_files(d: Path, learners: int) -> list[int]:
    record = survivors_of(d)
    return list(range(learners)) if record is None else sorted(record["members"])


def complete_checkpoints(run_dir: Path) -> list[Path]:
    """The checkpoint directories holding a complete archive for every learner that wrote them."""
    found = []
    for d in _checkpoint_dirs(run_dir):
        expected = _expected_files(d, 1 + max(_learner_files(d), default=-1))
        if expected and all(_file_problem(d / f"rank-{r}.pt") is None for r in expected):
            found.append(d)
    return found


def check_resumable(run_dir: Path, learners: int) -> Path:
    """The checkpoint `learners` learners would resume from, checked cheaply (pointer, one file per
    learner and no more, each a complete archive naming no code) without loading it; else a
    TrainingError saying what to do. Writes nothing."""
    d = latest_step_dir(run_dir)
    if d is None:
        if _checkpoint_dirs(run_dir):  # `latest` itself was lost
            raise TrainingError(f"{run_dir / CHECKPOINTS_DIR / 'latest'}: missing; {resume_advice(run_dir, None, learners)}")
        raise TrainingError(f"{run_dir}: no checkpoint to resume from; `asrdist train --resume {run_dir}` trains "
                            f"it from the start")
    # the run's config fixes its learners (rundir.check_resume): other files mean a damaged checkpoint
    ranks = _learner_files(d)
    extra = [r for r in ranks if r >= learners]
    if extra:
        raise TrainingError(f"{d}: holds rank-{extra[0]}.pt, but the run has {learners} learner(s) "
                            f"(rank-0.pt..rank-{learners - 1}.pt); {resume_advice(run_dir, d, learners)}")
    for rank in _expected_files(d, learners):
        problem = _file_problem(d / f"rank-{rank}.pt")
        if problem:
            raise TrainingError(f"{d / f'rank-{rank}.pt'}: checkpoint file {problem}; {resume_advice(run_dir, d, learners)}")
    for rank in _expected_files(d, learners):  # refused here, before any learner starts to load it
        foreign = foreign_globals(d / f"rank-{rank}.pt")
        if foreign:
            raise TrainingError(refusal(d / f"rank-{rank}.pt", f"it names {foreign[0]}"))
    return d


def resume_advice(run_dir: Path, broken: Path | None, learners: int) -> str:
    """What to do about a checkpoint that cannot be loaded (`broken`; None: `latest` is lost):
    point `latest` at the newest complete checkpoint of `learners` files older than it."""
    pointer = run_dir / CHECKPOINTS_DIR / LATEST_NAME
    for d in reversed(_checkpoint_dirs(run_dir)):
        if broken is not None and (d.name.split("-")[0] != broken.name.split("-")[0] or d.name >= broken.name):
            continue  # only an older checkpoint of the same kind: a newer one is a half-written next one
        expected = _expected_files(d, learners)
        if _learner_files(d) == expected and all(_file_problem(d / f"rank-{r}.pt") is None for r in expected):
            before = "before it " if broken is not None else ""
            return f"resume from the complete checkpoint {before}with `echo {d.name} > {pointer}`"
    return "no complete checkpoint is left: start a new run with --out"


def remove_stale_temporaries(run_dir: Path, rank: int) -> None:
    """Delete what interrupted writes left behind: this learner's hidden checkpoint temporaries,
    and for rank 0 those of `latest` and of the run directory's own files."""
    stale = list((run_dir / CHECKPOINTS_DIR).glob(f"*/.rank-{rank}.pt.*.tmp"))
    if rank == 0:
        stale += list((run_dir / CHECKPOINTS_DIR).glob(".latest.*.tmp")) + list(run_dir.glob(".*.tmp"))
    for path in stale:
        if path.is_file():
            path.unlink(missing_ok=True)


def load_learner(run_dir: Path, rank: int, world_size: int) -> dict[str, Any]:
    remove_stale_temporaries(run_dir, rank)
    d = check_resumable(run_dir, world_size)
    path = d / f"rank-{stand_in(rank, survivors_of(d))}.pt"
    try:
        return load_data(path, TrainingError)
    except (RuntimeError, EOFError, OSError, pickle.UnpicklingError, zipfile.BadZipFile) as exc:
        reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise TrainingError(f"{path}: unreadable checkpoint file ({reason}); {resume_advice(run_dir, d, world_size)}") from None


def save_model(path: Path, model: torch.nn.Module, extra: dict[str, Any]) -> None:
    """The final (consensus) model plus what decoding needs, written atomically."""
    save_torch_atomic(path, {"model": model.state_dict(), **extra})
