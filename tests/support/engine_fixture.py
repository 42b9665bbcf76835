"""The engine tests' task (train/test_engine.py, and the strategy tests that run the engine on it): a
linear regression over fixed minibatches, one rank's sampler over them, its loss, and a Trainer on it."""
from __future__ import annotations

import torch
import torch.distributed as dist

from asrdist.data.batch import Batch
from asrdist.parallel.base import LearnerContext
from asrdist.train.loop import LoopConfig
from asrdist.train.trainer import Trainer, TrainerHooks


class ListOrder:
    """A one-rank sampler over `n` fixed minibatches of a linear-regression task."""

    world_size = 1

    def __init__(self, n: int, rows: int = 8, seed: int = 0):
        gen = torch.Generator().manual_seed(seed)
        self.batches = [Batch(inputs=torch.randn(rows, 4, generator=gen), targets=torch.randn(rows, 1, generator=gen),
                              num_frames=rows) for _ in range(n)]
        self._epoch, self._position = 0, 0

    def __len__(self):
        return len(self.batches)

    def batch_at(self, epoch, k):
        return self.batches[k]

    def set_epoch(self, epoch):
        if epoch != self._epoch:
            self._epoch, self._position = epoch, 0

    @property
    def epoch(self):
        return self._epoch

    def __iter__(self):
        for k in range(self._position, len(self)):
            self._position = k + 1
            if self._position == len(self):
                self._epoch, self._position = self._epoch + 1, 0
            yield self.batches[k]

    def state_dict(self):
        return {"epoch": self._epoch, "position": self._position, "config": {"n": len(self)}}

    def load_state_dict(self, state):
        self._epoch, self._position = state["epoch"], state["position"]


def mse_loss(model, batch):
    return torch.nn.functional.mse_loss(model(batch.inputs), batch.targets), batch.num_frames



def linear_model(strategy, ctx) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    """The tests' model (the same initial weights every time) and its optimizer, set up under `strategy`."""
    torch.manual_seed(0)
    model = torch.nn.Linear(4, 1)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    strategy.setup(model, opt, ctx)
    return model, opt


def linear_trainer(tmp_path, strategy, sampler, *, validate=None, loss=mse_loss, **kw):
    model, opt = linear_model(strategy, LearnerContext(store=dist.HashStore()))
    hooks = TrainerHooks(loss_fn=loss, validate_fn=validate, lr_at=lambda s, e: 0.01)
    return Trainer(model, opt, strategy, sampler, hooks, strategy.ctx, tmp_path, LoopConfig(progress=False, **kw))
