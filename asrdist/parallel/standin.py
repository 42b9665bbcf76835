"""A strategy driven through the trainer's own hooks on a stand-in model: parameters of the
shapes a benchmark needs and nothing else. `setup` is the strategy's own (collective: every
learner of `ctx` builds its stand-in at the same point), and one gradient exchange is exactly the
trainer's: gradients in p.grad, then `after_backward()`."""
from __future__ import annotations

from typing import Sequence

import torch

from asrdist.optim.light import SGD
from asrdist.parallel.base import LearnerContext, Strategy


class StandInModel(torch.nn.Module):
    """One float32 parameter per shape, in that order (`model.parameters()` order)."""

    def __init__(self, shapes: Sequence[Sequence[int]], device: torch.device):
        super().__init__()
        self.weights = torch.nn.ParameterList(
            torch.nn.Parameter(torch.zeros(tuple(s), device=device)) for s in shapes)


class StandIn:
    """`strategy` set up on a `StandInModel` of `shapes` with a plain SGD optimizer (which
    nothing here steps)."""

    def __init__(self, strategy: Strategy, shapes: Sequence[Sequence[int]], ctx: LearnerContext):
        self.strategy = strategy
        self.model = StandInModel(shapes, ctx.device)
        self.params = list(self.model.parameters())
        self.optimizer = SGD(self.params, lr=0.0)
        strategy.setup(self.model, self.optimizer, ctx)

    def set_gradients(self, grads: Sequence[torch.Tensor]) -> None:
        """What backward leaves after the trainer's zero_grad: a fresh p.grad holding each
        gradient (copies: a strategy may write its result into p.grad)."""
        if len(grads) != len(self.params):
            raise ValueError(f"stand-in: {len(grads)} gradients for {len(self.params)} parameters")
        for p, g in zip(self.params, grads):
            p.grad = g.detach().to(p.device, p.dtype, copy=True)

    def after_backward(self) -> list[torch.Tensor]:
        """One gradient exchange through the strategy's hook; the gradients it leaves in p.grad."""
        self.strategy.after_backward()
        return [p.grad for p in self.params]
