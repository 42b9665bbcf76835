"""A tiny classifier and its per-rank data, for the averaging strategies' reference tests."""
from __future__ import annotations

import torch

BATCH = 8


def tiny_model(seed: int) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(5, 6), torch.nn.Tanh(), torch.nn.Linear(6, 3))


def tiny_batch(rank: int, step: int):
    """Learner `rank`'s minibatch of step `step`: BATCH inputs of 5 features, labels of 3 classes."""
    gen = torch.Generator().manual_seed(1000 * rank + step)
    return torch.randn(BATCH, 5, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen)
