"""The strategy interface: how the one trainer talks to every data-parallel algorithm.

The trainer calls, per minibatch:

    loss.backward()
    strategy.after_backward()      # gradient communication (p.grad may be replaced)
    optimizer.step(); optimizer.zero_grad()
    strategy.after_step()          # parameter communication (averaging, gossip)

and at the end `strategy.finalize()` which leaves the consensus model in `model`. A strategy knows
nothing of speech: it sees a `torch.nn.Module`, its optimizer and a `LearnerContext`.
"""
from __future__ import annotations

import time
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from datetime import timedelta
from typing import Any, Iterator

import torch


@dataclass
class CommCounters:
    """Per-learner communication cost. `bytes_sent` counts payload bytes this learner puts on the
    wire (for an allreduce of S bytes over n learners, ring cost 2·S·(n−1)/n)."""

    bytes_sent: int = 0
    comm_seconds: float = 0.0
    """Wall time inside communication calls (including waiting)."""
    wait_seconds: float = 0.0
    """Part of comm_seconds spent blocked on peers (barriers, partner not ready)."""
    exchanges: int = 0

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


@dataclass(frozen=True)
class LearnerContext:
    """Who this learner is. Rank and world size are explicit; nothing below reads os.environ."""

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    timeout: timedelta = timedelta(seconds=120)
    seed: int = 0

    @property
    def distributed(self) -> bool:
        return self.world_size > 1


class Strategy:
    """Base class: the single-learner behaviour (no communication)."""

    name = "single"
    config_class: type | None = None
    """The strategy's typed config: `__init__` takes an instance (None = its defaults) and refuses
    anything else."""

    def __init__(self, config: Any = None):
        if self.config_class is not None:
            config = self.config_class() if config is None else config
            if not isinstance(config, self.config_class):
                from asrdist.errors import ConfigError

                raise ConfigError(f"strategy {self.name}: expected a config of type {self.config_class.__name__}, "
                                  f"got {type(config).__name__}")
        self.config = config
        self.counters = CommCounters()
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.ctx = LearnerContext()

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        self.model, self.optimizer, self.ctx = model, optimizer, ctx

    def note_samples(self, n: int) -> None:
        """Called once per minibatch with the frames this learner just trained on."""

    def note_loss(self, loss: float) -> None:
        """Called once per minibatch with this learner's minibatch loss."""

    def after_backward(self) -> None:
        """Called after loss.backward(), before optimizer.step()."""

    def after_step(self) -> None:
        """Called after optimizer.step()."""

    def finalize(self) -> None:
        """Leave the consensus model in self.model (all learners end identical)."""

    def lr_scale(self) -> float:
        """Factor the trainer applies to the configured learning rate (averaging uses n)."""
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"counters": self.counters.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = state.get("counters")
        if c:
            self.counters = CommCounters(**c)

    @contextmanager
    def timed_comm(self, waiting: bool = False) -> Iterator[None]:
        """Account the wall time of a communication block to comm_seconds (and wait_seconds)."""
        t0 = time.perf_counter()
        try:
            yield
        finally:
            dt = time.perf_counter() - t0
            self.counters.comm_seconds += dt
            if waiting:
                self.counters.wait_seconds += dt


def parameters_with_grad(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
