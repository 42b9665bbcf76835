"""Finished runs of a comparison without training: run directories in the format `asrdist train`
writes (config.yaml resolved as `asrdist compare` resolves it, summary.json, metrics.jsonl), with
made-up figures, so tests of the report cost no training."""
from __future__ import annotations

import json
from pathlib import Path

import yaml

from asrdist.compare.recipes import recipes_for
from asrdist.compare.runs import resolve_all
from tests.support.paths import ROOT

CONFIG = ROOT / "configs" / "default.yaml"
TINY = ["model.hidden_dim=32", "model.hidden_layers=1", "data.batch_size=64", "train.epochs=2"]
FIGURES = {  # strategy -> (PER after epochs 1 and 2, frames/s, bytes sent, compute seconds per frame)
    "single": ((0.30, 0.20), 1000.0, 0, 0.8e-3),  # steps of 1e-3 s per frame: 0.2e-3 s outside compute
    "sync": ((0.32, 0.21), 1500.0, 40_000_000, 1.2e-3),
    "ddp": ((0.32, 0.21), 1480.0, 40_000_000, 1.2e-3),
    "onebit": ((0.33, 0.22), 1800.0, 2_000_000, 1.2e-3),
    "adpsgd": ((0.31, 0.20), 2500.0, 9_000_000, 1.1e-3),
}


def make_corpus(path: Path) -> Path:
    """Enough of a corpus for `asrdist compare`'s checks before training (nothing reads it here)."""
    (path / "train").mkdir(parents=True)
    return path


def fabricate_runs(out: Path, corpus: Path, strategies: list[str], learners: int = 2,
                   overrides: list[str] = TINY, same_recipe: bool = False) -> dict[str, Path]:
    """Epoch e's validation at wall second (e + 1) x frames / fps / 2, the final one at frames / fps + 1."""
    configs = resolve_all(CONFIG, strategies, learners, corpus, overrides,
                          recipes=recipes_for(strategies, same_recipe))
    runs = {}
    for name, cfg in configs.items():
        run, n = out / name, cfg.train.learners
        run.mkdir(parents=True)
        (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        pers, fps, sent, spf = FIGURES[name]
        frames = 20_000
        per_learner = [{"rank": r, "steps": 100, "frames": frames // n, "train_seconds": frames / fps,
                        "compute_seconds": spf * frames / n, "bytes_sent": sent // n,
                        "comm_seconds": 0.5 * (n > 1), "wait_seconds": 0.25 * (n > 1)} for r in range(n)]
        history = [{"epoch": e, "train_loss": 0.5, "wall_seconds": (e + 1) * frames / fps / 2, "valid_loss": 0.6,
                    "frame_accuracy": 0.8, "per": per} for e, per in enumerate(pers)]
        summary = {"strategy": name, "learners": n, "cores": 2, "threads_per_learner": max(1, 2 // n),
                   "model": "dnn", "parameters": 10_000, "epochs": 2, "steps": 100, "train_frames": frames,
                   "frames_per_second": fps, "wall_seconds": frames / fps + 1.0,
                   "final": {"train_loss": 0.5, "valid_loss": 0.6, "frame_accuracy": 0.8, "per": pers[-1]},
                   "comm": {"bytes_sent": sent, "comm_seconds": 0.5 * (n > 1), "wait_seconds": 0.25 * (n > 1),
                            "per_learner": per_learner},
                   "history": history}
        (run / "summary.json").write_text(json.dumps(summary))
        records = [{"kind": "train", "step": 25, "seconds": 1.0, "epoch": 0, "loss": 1.0}]
        records += [{"kind": "epoch", "step": 50 * (e + 1), "seconds": h["wall_seconds"], **h} for e, h in
                    enumerate(history)]
        (run / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in records))
        runs[name] = run
    return runs
