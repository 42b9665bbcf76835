"""`asrdist train` on the tone corpus in this process, small and fast: the end-to-end tests' run."""
from __future__ import annotations

from pathlib import Path

from asrdist.cli import main

FAST = ["train.log_every=5", "data.batch_size=256", "model.hidden_dim=64", "model.hidden_layers=2",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.checkpoint_minutes=0"]
"""configs/default.yaml shrunk: a 2 x 64 DNN, no warm-up or annealing, checkpoints at epoch ends."""


def train_on_tones(corpus: Path, out: Path, *extra: str, epochs: int) -> int:
    """`asrdist train configs/default.yaml` with FAST and `extra` overrides; its exit status."""
    return main(["train", "configs/default.yaml", *FAST, *extra, "--data", str(corpus), "--epochs", str(epochs),
                 "--out", str(out), "--no-progress"])
