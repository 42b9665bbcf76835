"""Delay-by-one's stable step (docs/strategies.md#delay-by-ones-stable-step), two measurements:

  theory                      the largest stable lr·h of torch's SGD on a quadratic of curvature h,
                              with g(x_k) and with g(x_{k-1}), Nesterov and heavy ball;
  single CORPUS RUN LR [FRAMES] [EPOCHS]
                              one learner stepping with g(x_{k-1}) (adpsgd's `HeldGradient`, through
                              `Trainer.train_step`) on an asrdist corpus with features, at the
                              e2e test's recipe; prints the final validation figures as JSON.
RUN is a run directory of that corpus (its targets.pt). `--plain` steps with g(x_k) instead."""
from __future__ import annotations

import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import torch

from asrdist.config import load_config
from asrdist.optim.build import build_optimizer
from asrdist.optim.max_change import clip_change
from asrdist.parallel.adpsgd import HeldGradient
from asrdist.parallel.base import LearnerContext, Strategy, parameters_with_grad
from asrdist.run.prepare import load_targets
from asrdist.run.task import SpeechTask
from asrdist.train.loop import LoopConfig
from asrdist.train.trainer import Trainer, TrainerHooks

TINY = ["model.hidden_dim=64", "model.hidden_layers=2", "optim.warmup_steps=0", "optim.anneal_after_epoch=null"]


def spectral_radius(lr_h: float, momentum: float, delayed: bool, nesterov: bool) -> float:
    """State (x_k, x_{k-1}, lr·v): v ← μv + g, x ← x − lr(g + μv) (Nesterov) or x − lr·v; g = h x."""
    g = lr_h * (np.array([0.0, 1, 0]) if delayed else np.array([1.0, 0, 0]))
    v = momentum * np.array([0.0, 0, 1]) + g
    x = np.array([1.0, 0, 0]) - (g + momentum * v if nesterov else v)
    return float(max(abs(np.linalg.eigvals(np.stack([x, [1.0, 0, 0], v])))))


def largest_stable(momentum: float, delayed: bool, nesterov: bool) -> float:
    grid = np.linspace(1e-3, 5.0, 5000)
    return float(max(a for a in grid if spectral_radius(a, momentum, delayed, nesterov) < 1.0))


class DelayedSingle(Strategy):
    """One learner that steps with the previous step's gradient, as adpsgd's delay-by-one does."""

    def setup(self, model, optimizer, ctx):
        super().setup(model, optimizer, ctx)
        self._held = HeldGradient()

    def apply_update(self, step_fn):
        if self._held.swap(parameters_with_grad(self.model)):
            step_fn()


def single(corpus: str, run: str, lr: float, frames: int = 42, epochs: int = 2, plain: bool = False) -> dict:
    cfg = load_config("configs/default.yaml", [*TINY, f"data.batch_size={frames}", f"optim.lr={lr}",
                                               f"data.corpus={corpus}"])
    torch.manual_seed(cfg.seed)
    task = SpeechTask(cfg, load_targets(Path(run)), 0, 1)
    model, ctx = task.model, LearnerContext()
    optimizer = build_optimizer(cfg.optim, model.parameters())
    strategy = Strategy() if plain else DelayedSingle()
    strategy.setup(model, optimizer, ctx)
    hooks = TrainerHooks(loss_fn=task.loss, lr_at=lambda step, epoch: lr,
                         before_optimizer_step=lambda rate: clip_change(model, rate))
    trainer = Trainer(model, optimizer, strategy, None, hooks, ctx, tempfile.gettempdir(),
                      LoopConfig(epochs=epochs, progress=False))
    for epoch in range(epochs):
        task.sampler.set_epoch(epoch)
        for batch in task.sampler:
            trainer.train_step(batch)
            trainer.state.step += 1
            trainer.state.schedule_step += 1
    figures = task.validate(model)
    return {"lr": lr, "frames": frames, "epochs": epochs, "delayed": not plain,
            **{k: round(figures[k], 4) for k in ("per", "frame_accuracy", "valid_loss")}}


def main(argv: list[str]) -> None:
    plain = "--plain" in argv
    argv = [a for a in argv if a != "--plain"]
    if argv[:1] == ["theory"]:
        for nesterov in (True, False):
            for mu in (0.0, 0.5, 0.9):
                print(f"{'nesterov' if nesterov else 'heavy ball'} mu={mu}: g(x_k) {largest_stable(mu, False, nesterov):.2f}"
                      f"  g(x_k-1) {largest_stable(mu, True, nesterov):.2f}")
    elif argv[:1] == ["single"] and 4 <= len(argv) <= 6:
        corpus, run, lr, *rest = argv[1:]
        print(json.dumps(single(corpus, run, float(lr), *map(int, rest), plain=plain)))
    else:
        sys.exit("usage: delay_by_one_stability.py theory | single CORPUS RUN LR [FRAMES] [EPOCHS] [--plain]")


if __name__ == "__main__":
    main(sys.argv[1:])
