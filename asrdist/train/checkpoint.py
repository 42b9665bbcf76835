"""Atomic, per-learner checkpoints with exact resume.

Layout: RUN_DIR/checkpoints/step-00000120/rank-0.pt (one file per learner: its model, optimizer,
strategy residuals, sampler position and RNG states) and RUN_DIR/checkpoints/latest, a one-line
pointer rewritten atomically only after every learner has written its file. A crash at any moment
therefore leaves `latest` pointing at a complete checkpoint.
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


def checkpoint_dir(run_dir: Path, step: int) -> Path:
    return run_dir / "checkpoints" / f"step-{step:08d}"


def save_learner(run_dir: Path, step: int, rank: int, state: dict[str, Any]) -> None:
    d = checkpoint_dir(run_dir, step)
    d.mkdir(parents=True, exist_ok=True)
    with atomic_path(d / f"rank-{rank}.pt") as tmp:
        torch.save(state, tmp)


def publish(run_dir: Path, step: int, world_size: int) -> None:
    """Point `latest` at step (call on rank 0 after all learners saved); prune old checkpoints."""
    d = checkpoint_dir(run_dir, step)
    missing = [r for r in range(world_size) if not (d / f"rank-{r}.pt").is_file()]
    if missing:
        raise TrainingError(f"{d}: checkpoint of rank {missing[0]} missing")
    write_text_atomic(run_dir / "checkpoints" / "latest", d.name + "\n")
    old = sorted(p for p in (run_dir / "checkpoints").glob("step-*") if p.is_dir() and p != d)
    for p in old[:-(KEEP_LAST - 1)] if KEEP_LAST > 1 else old:
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
