"""Atomic, per-learner checkpoints with exact resume.

Layout: RUN_DIR/checkpoints/TAG/rank-R.pt (one file per learner: its model, optimizer, strategy
state, sampler position and RNG states; TAG is step-00000120 for lock-step strategies, epoch-0003
for the others) and RUN_DIR/checkpoints/latest, a one-line pointer rewritten atomically by the
learner that writes the last file of a checkpoint (the job store counts them; no barrier). A crash
at any moment therefore leaves `latest` pointing at a complete checkpoint.
"""
from __future__ import annotations

import random
import shutil
from pathlib import Path
from typing import Any, Callable

import numpy as np
import torch

from asrdist.errors import TrainingError
from asrdist.utils.io import atomic_path, write_text_atomic

KEEP_LAST = 2


def rng_state() -> dict[str, Any]:
    return {"torch": torch.get_rng_state(), "numpy": np.random.get_state(), "python": random.getstate()}


def set_rng_state(state: dict[str, Any]) -> None:
    torch.set_rng_state(state["torch"])
    np.random.set_state(state["numpy"])
    random.setstate(state["python"])


def step_tag(step: int) -> str:
    return f"step-{step:08d}"


def checkpoint_dir(run_dir: Path, tag: str | int) -> Path:
    return run_dir / "checkpoints" / (step_tag(tag) if isinstance(tag, int) else tag)


def save_learner(run_dir: Path, tag: str | int, rank: int, state: dict[str, Any]) -> None:
    d = checkpoint_dir(run_dir, tag)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / f"rank-{rank}.pt") as tmp:
        torch.save(state, tmp)


def publish(run_dir: Path, tag: str | int, world_size: int) -> None:
    """Point `latest` at the checkpoint `tag` (once every learner saved it); prune older ones.
    Checkpoints newer than `tag` (a faster learner's next one) are left alone."""
    d = checkpoint_dir(run_dir, tag)
    missing = [r for r in range(world_size) if not (d / f"rank-{r}.pt").is_file()]
    if missing:
        raise TrainingError(f"{d}: checkpoint of rank {missing[0]} missing")
    write_text_atomic(run_dir / "checkpoints" / "latest", d.name + "\n")
    kind = d.name.split("-")[0]
    older = sorted(p for p in (run_dir / "checkpoints").glob(f"{kind}-*") if p.is_dir() and p.name < d.name)
    for p in older[:max(0, len(older) - (KEEP_LAST - 1))]:
        shutil.rmtree(p, ignore_errors=True)


def latest_step_dir(run_dir: Path) -> Path | None:
    pointer = run_dir / "checkpoints" / "latest"
    if not pointer.is_file():
        return None
    return run_dir / "checkpoints" / pointer.read_text().strip()


def load_learner(run_dir: Path, rank: int, world_size: int) -> dict[str, Any]:
    d = latest_step_dir(run_dir)
    if d is None:
        raise TrainingError(f"{run_dir}: no checkpoint to resume from")
    path = d / f"rank-{rank}.pt"
    if not path.is_file():
        raise TrainingError(f"{path}: missing (was the run made with {world_size} learners?)")
    return torch.load(path, map_location="cpu", weights_only=False)


def save_model(path: Path, model: torch.nn.Module, extra: dict[str, Any]) -> None:
    """The final (consensus) model plus what decoding needs, written atomically."""
    with atomic_path(path) as tmp:
        torch.save({"model": model.state_dict(), **extra}, tmp)


def load_model(path: Path, build: Callable[[dict], torch.nn.Module]) -> tuple[torch.nn.Module, dict]:
    blob = torch.load(path, map_location="cpu", weights_only=False)
    model = build(blob)
    model.load_state_dict(blob["model"])
    return model, blob
