"""What the training loop takes: its typed config (`LoopConfig`) and the protocols of its task and
sampler (`Task`, `Sampler`), as fairseq2's `TrainUnit` states what a trainer needs of a unit.
`asrdist.run.learner` builds the config from `train.*`; benchmarks and tests build their own.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator, Literal, Protocol, runtime_checkable

import torch

from asrdist.checks import MAX_SLOWDOWN, check_field
from asrdist.errors import ConfigError

PRECISIONS = ("fp32", "bf16")
"""`train.precision`: the forward's arithmetic (weights, gradients and optimizer state stay fp32)."""
MAX_ACCUMULATE = 4096
"""`train.accumulate` at most: beyond it a micro-batch of any configured minibatch is empty."""



def check_arithmetic(accumulate: Any, precision: Any) -> None:
    """`train.accumulate` and `train.precision`, or one ConfigError line naming the key."""
    check_field("train.accumulate", accumulate, at_least=1, at_most=MAX_ACCUMULATE)
    if precision not in PRECISIONS:
        raise ConfigError(f"train.precision: expected one of {', '.join(PRECISIONS)}, got {precision!r}")


SamplerKind = Literal["frame", "chunk", "ctc"]
"""Frames with context (frame models), chunks of frames (recurrent models), whole utterances (CTC)."""


@dataclass
class StragglerConfig:
    ranks: list[int] = field(default_factory=list)
    """Learners made slow."""
    slowdown: float = 1.0
    """Each slow learner sleeps (slowdown - 1) x its own compute time after every step."""
    jitter: float = 0.0
    """Random mode: every learner sleeps uniform(0, jitter) x its compute time."""

    def __post_init__(self):
        if not isinstance(self.ranks, list):
            raise ConfigError(f"train.straggler.ranks: expected a list of learner ranks, got {self.ranks!r}")
        for rank in self.ranks:
            check_field("train.straggler.ranks", rank, at_least=0)
        if len(set(self.ranks)) != len(self.ranks):
            raise ConfigError(f"train.straggler.ranks: rank {next(r for r in self.ranks if self.ranks.count(r) > 1)} "
                              f"given twice, got {self.ranks}")
        check_field("train.straggler.slowdown", self.slowdown, float, at_least=1, at_most=MAX_SLOWDOWN)
        check_field("train.straggler.jitter", self.jitter, float, at_least=0, at_most=MAX_SLOWDOWN)


@dataclass(frozen=True)
class LoopConfig:
    """How `Trainer` runs its epochs. Every field but `progress` is the `train.*` key of its name."""

    epochs: int
    """Epochs to train (the job's, counted from the first start)."""
    max_steps: int = 0
    """Stop after this many steps in total (0 = no limit)."""
    log_every: int = 20
    """A metrics.jsonl record every this many steps."""
    checkpoint_every: int = 0
    """A checkpoint every this many steps as well (0 = at epoch ends only)."""
    checkpoint_minutes: float = 0.0
    """Lock-step strategies: a checkpoint about every this many minutes within an epoch (0 = none)."""
    validate_every_epochs: int = 1
    """Validate the consensus model every this many epochs (and after the last)."""
    validate_every: int = 0
    """Validate it every this many global minibatches within an epoch as well (0 = at epoch ends
    only): the consensus as at epoch ends, at the same points of the job on every learner."""
    emulate_compute_ms: float = 0.0
    """Replace forward/backward by a sleep and synthetic gradients (scaling benchmarks)."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    """Learners made slow after each step (emulated stragglers)."""
    nonfinite: str = "stop"
    """A NaN/inf loss or gradient: stop the run, or skip the minibatch on every learner of the step."""
    max_skips_in_a_row: int = 10
    """`skip`: this many non-finite minibatches in a row stop the run."""
    average_last: int = 1
    """The final model averages the models of the last this many epochs (1 = the last alone)."""
    accumulate: int = 1
    """Forward and backward of each minibatch in this many micro-batches (its rows split evenly),
    their gradients summed before the strategy's exchange: one step of the whole minibatch."""
    precision: str = "fp32"
    """fp32 | bf16: the forward under bf16 autocast (fp32 weights, gradients and optimizer state)."""
    progress: bool = True
    """A progress bar (or plain lines off a terminal) on rank 0."""

    def __post_init__(self):
        if (min(self.log_every, self.validate_every_epochs, self.average_last) < 1 or self.checkpoint_every < 0
                or self.max_steps < 0 or self.validate_every < 0):
            raise ConfigError("trainer: log_every, validate_every_epochs and average_last must be >= 1, "
                              "checkpoint_every, max_steps and validate_every >= 0")
        check_arithmetic(self.accumulate, self.precision)


@runtime_checkable
class Sampler(Protocol):
    """A learner's minibatches of one epoch, resumable mid-epoch (its state's `position`)."""

    def set_epoch(self, epoch: int) -> None: ...
    def __iter__(self) -> Iterator[Any]: ...
    def __len__(self) -> int: ...
    def state_dict(self) -> dict: ...
    def load_state_dict(self, state: dict) -> None: ...


@runtime_checkable
class Task(Protocol):
    """What a learner trains (`asrdist.run.task.SpeechTask`, or a benchmark's in
    `asrdist.train.synthetic`): its model, a batch's loss and sample count, its kind of sampler."""

    model: torch.nn.Module
    kind: SamplerKind
    """The kind of minibatches its samplers give (and of model that takes them)."""
    local_batch: int
    """This learner's minibatch size at the configured global one (frames, chunks, or max frames)."""
    sampler: Sampler
    """This learner's sampler at `local_batch`."""
    validate: Callable[[torch.nn.Module], dict] | None
    """model -> validation metrics (rank 0, epoch ends); None: the task does not validate."""

    @property
    def samples_per_step(self) -> int:
        """Nominal samples (frames) in one of this learner's minibatches, the same on every learner."""
        ...

    def loss(self, model: torch.nn.Module, batch: Any) -> tuple[torch.Tensor, int]:
        """(mean loss over `batch`, samples in it)."""
        ...

    def sampler_for(self, local_batch: int, rank: int | None = None, world_size: int | None = None) -> Sampler:
        """A fresh sampler at `local_batch`; `rank=0, world_size=1`: the whole corpus in one order."""
        ...
