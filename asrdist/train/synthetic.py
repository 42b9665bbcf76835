"""Tasks for benchmarks: what `build_learner` needs from a task (`asrdist.train.loop.Task`), without a corpus.

`FrameTask` wraps a given frame model and sampler (`bench trainer`). `SyntheticTask` makes its
own minibatches of a fixed number of frames: empty ones under the trainer's compute emulation
(`bench scaling`), or one fixed random batch for timing real steps (`bench ngsgd`). Neither
validates, and every learner sees the same minibatches.
"""
from __future__ import annotations

from typing import Any, Iterator

import torch

from asrdist.data.batch import Batch
from asrdist.errors import ConfigError
from asrdist.models.objectives import frame_cross_entropy


def random_frames(frames: int, input_dim: int, num_classes: int, seed: int = 0) -> Batch:
    """`frames` random spliced inputs with random class targets, from their own generator (the
    global RNG, and so the models built after, is untouched)."""
    gen = torch.Generator().manual_seed(seed)
    inputs = torch.randn(frames, input_dim, generator=gen)
    targets = torch.randint(0, num_classes, (frames,), generator=gen)
    return Batch(inputs=inputs, targets=targets, num_frames=frames)


class SyntheticSampler:
    """`steps` minibatches of `batch_size` frames per epoch: `batch` every time, or, without one,
    empty tensors (compute emulation never reads them). The Trainer's sampler protocol."""

    def __init__(self, batch_size: int, steps: int, batch: Batch | None = None):
        if batch is not None and batch.num_frames != batch_size:
            raise ValueError(f"SyntheticSampler: batch has {batch.num_frames} frames, not {batch_size}")
        self.batch_size, self.steps, self.batch = batch_size, steps, batch
        self._epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.steps):
            yield self.batch if self.batch is not None else Batch(
                inputs=torch.empty(0), targets=torch.empty(0, dtype=torch.int64), num_frames=self.batch_size)

    def __len__(self) -> int:
        return self.steps

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "position": 0}

    def load_state_dict(self, state: dict) -> None:
        self._epoch = int(state["epoch"])


class FrameTask:
    """A frame model (dnn, swbd) trained with frame cross-entropy on a given sampler, no validation.

    The sampler serves every rank, at its own minibatch size only (`sampler.batch_size` frames).
    """

    kind = "frame"
    validate = None

    def __init__(self, model: torch.nn.Module, sampler: Any):
        self.model, self.sampler = model, sampler
        self.local_batch = int(sampler.batch_size)

    @property
    def samples_per_step(self) -> int:
        return self.local_batch

    def sampler_for(self, local_batch: int, rank: int | None = None, world_size: int | None = None):
        if local_batch != self.local_batch:
            raise ConfigError(f"{type(self).__name__}: its sampler has minibatches of {self.local_batch} frames, "
                              f"not {local_batch}")
        return self.sampler

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        batch = batch.to(next(model.parameters()).device)
        loss, _ = frame_cross_entropy(model(batch.inputs), batch.targets)
        return loss, batch.num_frames


class SyntheticTask(FrameTask):
    """`steps` synthetic minibatches of `local_batch` frames per epoch for a frame model (its
    `input_dim` and `num_classes` give the shapes): with `emulate`, empty ones and a `loss` that
    refuses to run; otherwise one fixed random batch (`seed`), so every timed step does the same work.
    """

    def __init__(self, model: torch.nn.Module, local_batch: int, steps: int, *, emulate: bool = False,
                 seed: int = 0):
        self.steps, self.emulate, self.seed = steps, emulate, seed
        super().__init__(model, self._sampler(model, local_batch))

    @property
    def batch(self) -> Batch | None:
        """The fixed minibatch, to time `Trainer.train_step` on it directly (None under emulation)."""
        return self.sampler.batch

    def _sampler(self, model: torch.nn.Module, local_batch: int) -> SyntheticSampler:
        batch = None if self.emulate else random_frames(local_batch, model.input_dim, model.num_classes, self.seed)
        return SyntheticSampler(local_batch, self.steps, batch)

    def sampler_for(self, local_batch: int, rank: int | None = None, world_size: int | None = None):
        """A fresh sampler of `local_batch`-frame minibatches, the same on every rank."""
        return self._sampler(self.model, local_batch)

    def loss(self, model: torch.nn.Module, batch: Batch) -> tuple[torch.Tensor, int]:
        if self.emulate:
            raise RuntimeError("synthetic task: the loss is never computed (compute emulation is on)")
        return super().loss(model, batch)
