"""What a strategy module declares besides its class: one `StrategyDescriptor`, the record
`parallel.STRATEGIES` lists. It names the class (which owns its config type and whether it goes
on without lost learners: `Strategy.survival`), the strategy's traffic model as the simulator
replays it, and that model's shape: `LockStep`, `Pipelined` or `Pairwise`. The simulator
(`asrdist.sim.engine`) picks its process from the shape, never from the name.
"""
from __future__ import annotations

import enum
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Callable, Mapping

if TYPE_CHECKING:
    from asrdist.parallel.base import Strategy
    from asrdist.parallel.comm import Transfer


class Survival(enum.Enum):
    """Whether a strategy goes on without lost learners when the launcher supervises each one."""

    NONE = "none"
    """A lost learner fails the job, naming it."""
    LEARNERS = "learners"
    """It goes on without a learner that died or hung (adpsgd)."""
    NODES = "nodes"
    """It goes on without a node that lost a learner, when the job has several nodes (hierarchical)."""


@dataclass(frozen=True)
class SimJob:
    """What the simulator tells a strategy of the job it replays."""

    shapes: list[tuple[int, ...]]
    """Parameter shapes (float32)."""
    learners: int
    per_node: int
    local_batch: int
    """Frames per learner per minibatch."""
    averaged_values: int
    """Values one learner contributes to an average (parameters and averaged optimizer state)."""
    synchronous: bool = False
    """Replay the synchronous phase of a strategy that has one (`StrategyDescriptor.synchronous_epochs`)."""

    @property
    def values(self) -> int:
        return sum(math.prod(s) for s in self.shapes)


@dataclass(frozen=True)
class LockStep:
    """Every learner takes the same steps together: per step, `buckets` of collectives launched as
    backward produces them (`overlap`) or after it; every `average_every` minibatches, the
    collectives of an `average` and its arithmetic over `SimJob.averaged_values`."""

    buckets: list[list[Transfer]] = field(default_factory=list)
    overlap: bool = False
    average: list[Transfer] = field(default_factory=list)
    average_every: int = 0


@dataclass(frozen=True)
class Pipelined:
    """A per-step exchange whose coding (`SimSpec.quantize_cost`) is pipelined over `chunks` with
    its collectives; `double_buffering` moves step t's exchange behind step t + 1's compute.
    Collectives of group "node" surround the exchange (before and after it)."""

    transfers: Callable[[int], list[Transfer]]
    """Rank -> one step's collectives as that learner sends them."""
    double_buffering: bool
    chunks: int
    node_span: int = 0
    """Learners per node whose column shards one exchange spans (0: a flat exchange)."""


@dataclass(frozen=True)
class Pairwise:
    """Participants (learners, or nodes of `unit` learners moving in lock step) claim minibatches
    from one job-wide pool and an active one averages with a partner (`topology.partner` under
    `pattern`, `seed`) after each step, one message each way (`exchange`, `answer`). A node first
    runs `node_buckets` (as `LockStep.buckets`, `overlap`) and ends with its leader's `broadcast`."""

    exchange: Transfer
    answer: Transfer
    pattern: str
    seed: int
    delay_by_one: bool = False
    unit: int = 1
    node_buckets: list[list[Transfer]] = field(default_factory=list)
    broadcast: Transfer | None = None
    overlap: bool = False


Shape = LockStep | Pipelined | Pairwise


@dataclass(frozen=True)
class StrategyDescriptor:
    """One strategy, as everything outside its module sees it (`parallel.STRATEGIES`)."""

    strategy_class: type[Strategy]
    shape: type[LockStep] | type[Pipelined] | type[Pairwise]
    """The simulated shape (the type `simulated` returns for a job of several learners)."""
    simulated: Callable[[Any, SimJob], Shape]
    """(config, job) -> the traffic of one step (and period), from the strategy's own byte accounting."""
    advised: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)
    """Variants `asrdist simulate` ranks without --strategy: variant name -> config settings."""
    synchronous_epochs: Callable[[Any], int] | None = None
    """config -> the epochs of a synchronous phase that starts the job (hybrid), simulated apart."""
    codes_alone: bool = False
    """A lone learner still codes its gradient (onebit): simulated as a job of one, not as `single`."""

    @property
    def name(self) -> str:
        return self.strategy_class.name

    @property
    def config_class(self) -> type | None:
        return self.strategy_class.config_class

    @property
    def moves_by_node(self) -> bool:
        return self.strategy_class.moves_by_node

    @property
    def asynchronous(self) -> bool:
        """Its learners (or nodes) never wait for all the others inside an epoch."""
        return self.shape is Pairwise

    def survives_lost_learners(self, learners: int, group_size: int, nodes: int) -> bool:
        """Whether a job of `learners` (nodes of `group_size`) on `nodes` emulated hosts goes on
        without a lost learner: only on one machine, one process per learner under asrdist's own
        supervision; every other job fails fast naming it."""
        survival = self.strategy_class.survival
        if nodes != 1 or survival is Survival.NONE:
            return False
        return survival is Survival.LEARNERS or 0 < group_size < learners

    def sim_shape(self, config: Any, job: SimJob) -> Shape:
        """The shape of `job`: a lone learner communicates nothing unless `codes_alone`."""
        if job.learners == 1 and not self.codes_alone:
            return LockStep()
        return self.simulated(config, job)
