"""The strategy interface: how the one trainer talks to every data-parallel algorithm.

Per minibatch the trainer calls `loss.backward()` (each micro-batch but the last inside
`no_sync()`), `after_backward()` (gradient communication),
`apply_update(step_fn)` (the one place parameters change), `after_step()` (parameter
communication) and `should_stop()`; it wraps every read or write of the learner's state in
`with strategy.paused():`, and ends with `close(error)`, then `finalize()` after a success.
`lockstep` says whether every learner takes the same steps (per-learner samplers, exact resume)
or epochs belong to the job. A strategy knows nothing of speech.
Details: docs/strategies.md#the-strategy-interface-parallelbasepy."""
from __future__ import annotations

import threading
from contextlib import contextmanager
from dataclasses import dataclass, field, fields, replace
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable, Iterator, TypeVar

import torch
import torch.distributed as dist

from asrdist.errors import ConfigError
from asrdist.parallel.descriptor import Survival

if TYPE_CHECKING:
    from asrdist.parallel.membership import Membership

T = TypeVar("T")

DEFAULT_TIMEOUT_SECONDS = 180.0
"""The one default timeout: of every collective (`train.timeout_seconds`, a `LearnerContext`'s),
of learners joining a job, and of a job of learner functions (`run_learners`)."""


@dataclass
class CommCounters:
    """Per-learner communication cost. `bytes_sent` counts payload bytes this learner puts on the
    wire (for an allreduce of S bytes over n learners, ring cost 2·S·(n−1)/n).

    A training thread and a communication thread (adpsgd's answers, onebit's exchanges) count into
    the same counters: every update goes through `add`, under the counters' lock, and `as_dict`
    reads them under it."""

    bytes_sent: int = 0
    comm_seconds: float = 0.0
    """Wall time inside communication calls (including waiting)."""
    wait_seconds: float = 0.0
    """Part of comm_seconds spent blocked on peers (barriers, partner not ready)."""
    exchanges: int = 0
    """Gradient exchanges (collective strategies) or pairwise averagings (adpsgd)."""
    answer_seconds: float = 0.0
    """Seconds a communication thread spent answering partners (adpsgd's passive learners)."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False, compare=False)

    def add(self, *, bytes_sent: int = 0, comm_seconds: float = 0.0, wait_seconds: float = 0.0,
            exchanges: int = 0, answer_seconds: float = 0.0) -> None:
        """Count one communication (any thread)."""
        with self._lock:
            self.bytes_sent += bytes_sent
            self.comm_seconds += comm_seconds
            self.wait_seconds += wait_seconds
            self.exchanges += exchanges
            self.answer_seconds += answer_seconds

    def as_dict(self) -> dict[str, Any]:
        with self._lock:
            return {f.name: getattr(self, f.name) for f in fields(self) if f.init}

    def __getstate__(self) -> dict[str, Any]:  # pickled and copied without the lock
        return self.as_dict()

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state, _lock=threading.Lock())

    def load(self, values: dict[str, Any]) -> None:
        """Take the counts of a checkpoint (`as_dict`), in place: strategies composed of others share
        one set of counters."""
        with self._lock:
            for f in fields(self):
                if f.init:
                    setattr(self, f.name, values.get(f.name, f.default))


@dataclass(frozen=True)
class LearnerContext:
    """Who this learner is. Rank and world size are explicit; nothing below reads the process environment.

    `group` is the process group a strategy works on (None: the whole world), and `rank` /
    `world_size` are this learner's place in it; `on_group(g)` gives the context of a strategy
    working inside `g` (e.g. sync inside a node). `groups` holds the job's groups and `store` the
    job's c10d store, built once per job by `asrdist.cluster.process_group.start_learner` (the
    groups by `asrdist.parallel.groups`).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    local_world_size: int = 1
    device: torch.device = field(default_factory=lambda: torch.device("cpu"))
    timeout: timedelta = timedelta(seconds=DEFAULT_TIMEOUT_SECONDS)
    seed: int = 0
    group: Any = None
    groups: Any = None
    """`asrdist.parallel.groups.ProcessGroups` (world, node, leaders) or None for one learner."""
    store: Any = None
    """The job's c10d store (keys under asrdist/), for coordination without a collective."""
    group_size: int = 1
    """Learners per node group."""
    samples_per_step: int = 0
    """This learner's nominal samples per minibatch (the same on every learner; 0 = unknown): lets a
    strategy count progress identically on every learner when actual minibatches differ (CTC)."""
    survive_lost: bool = False
    """The launcher supervises every learner on its own and the job goes on without lost ones
    (adpsgd): a strategy that can may then skip a peer that died or hung instead of failing."""
    job_rank: int = -1
    """This learner's rank in the whole job (= rank unless `on_group` narrowed the context)."""
    job_world_size: int = -1

    def __post_init__(self):
        if self.job_rank < 0:
            object.__setattr__(self, "job_rank", self.rank)
        if self.job_world_size < 0:
            object.__setattr__(self, "job_world_size", self.world_size)

    @property
    def distributed(self) -> bool:
        return self.world_size > 1

    def on_group(self, group: Any) -> "LearnerContext":
        """The context of a strategy that communicates inside `group` only."""
        return replace(self, group=group, rank=dist.get_rank(group), world_size=dist.get_world_size(group))


class Strategy:
    """Base class: the single-learner behaviour (no communication)."""

    name = "single"
    lockstep = True
    """Every learner takes the same steps in the same order (see the module docstring)."""
    moves_by_node = False
    """Not lock-step across nodes but lock-step inside one (hierarchical): job-wide epochs hand
    out one minibatch per node member at a time."""
    config_class: type | None = None
    """The strategy's typed config: `__init__` takes an instance (None = its defaults) and refuses
    anything else."""
    rising_loss_advice: str | None = None
    """What to try when the training loss rises over an epoch (the trainer warns with it); None = no warning."""
    survival = Survival.NONE
    """Whether it goes on without lost learners when the job does (`ctx.survive_lost`): it then
    starts a `membership` at setup (`start_membership`)."""

    def __init__(self, config: Any = None, *, counters: CommCounters | None = None):
        """`counters`: count into these (a strategy composed of others shares its own with them)."""
        if self.config_class is not None:
            config = self.config_class() if config is None else config
            if not isinstance(config, self.config_class):
                raise ConfigError(f"strategy {self.name}: expected a config of type {self.config_class.__name__}, "
                                  f"got {type(config).__name__}")
        self.config = config
        self.counters = CommCounters() if counters is None else counters
        self.model: torch.nn.Module | None = None
        self.optimizer: torch.optim.Optimizer | None = None
        self.ctx = LearnerContext()
        self.membership: Membership | None = None
        """Who is lost, as this learner's strategy sees it (None: every learner is needed; fail fast)."""

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        self.model, self.optimizer, self.ctx = model, optimizer, ctx

    def note_samples(self, n: int) -> None:
        """Called once per minibatch with the frames this learner just trained on."""

    def note_loss(self, loss: float) -> None:
        """Called once per minibatch with this learner's minibatch loss (finite), after
        `after_backward` and before `apply_update`."""

    def after_backward(self) -> None:
        """Called after loss.backward(), before optimizer.step()."""

    def forward_module(self, model: torch.nn.Module) -> torch.nn.Module:
        """The module the trainer runs `model`'s forward through: `model` itself, or a wrapper
        of it whose forward the strategy needs to see (torch DDP's)."""
        return model

    @contextmanager
    def no_sync(self) -> Iterator[None]:
        """Backward passes inside this block only add into p.grad, exchanging nothing: every
        micro-batch of a step but its last (`train.accumulate`), as DDP's `no_sync`. A strategy
        that exchanges during backward (sync's hooks) holds that back here; the others exchange in
        after_backward / after_step only, which the trainer calls once per step."""
        yield

    def after_step(self) -> None:
        """Called after optimizer.step()."""

    def discard_step(self) -> None:
        """The trainer dropped this step's update (a non-finite loss or gradient, `train.nonfinite:
        skip`): forget whatever of it the strategy kept (e.g. onebit's quantization residual).
        after_step still follows."""

    def start_epoch(self, epoch: int) -> None:
        """Called on every learner at the start of every epoch (a strategy may change phase)."""

    @property
    def lockstep_now(self) -> bool:
        """Whether the current epoch runs in lock step (job-wide epochs then hand every node the
        same number of minibatches); `lockstep` unless a strategy changes phase."""
        return self.lockstep

    def apply_update(self, step_fn: Callable[[], None]) -> None:
        """Change the parameters: run `step_fn` (max-change, optimizer step, zero_grad). A strategy
        with a communication thread holds its lock here or swaps in averaged parameters."""
        step_fn()

    @contextmanager
    def paused(self) -> Iterator[None]:
        """No communication touches the parameters inside this block (checkpoint, snapshot,
        restore, validation)."""
        yield

    def should_stop(self) -> bool:
        """True ends training after this minibatch (e.g. the strategy's partners are gone)."""
        return False

    def close(self, error: BaseException | None = None) -> None:
        """Stop communication threads now; called once from the trainer's `finally`, `error` is
        the exception that ends training (None on success). Must not raise."""

    def finalize(self) -> None:
        """Leave the consensus model in self.model; every learner calls it after training. A
        strategy may keep answering partners until every learner is done, then leaves the average."""

    def epoch_end_metrics(self) -> dict[str, float]:
        """Called on every learner at every epoch end and every validation within an epoch
        (`train.validate_every`), inside `paused()`; may use collectives.
        Its values go into the epoch's record in metrics.jsonl (e.g. adpsgd's consensus distance)."""
        return {}

    def gossip(self) -> dict | None:
        """A gossiping strategy's record of this start (`asrdist.run.gossip`): {"learners", "pattern",
        "seed", "exchanges": [(wall time, active, passive), ...] it started}, positions on its ring;
        None for a strategy that does not gossip."""
        return None

    def start_membership(self, ctx: LearnerContext) -> None:
        """Join the job's record of lost learners when this strategy survives losses (`survival`)
        and the job does (`ctx.survive_lost`, a store); a node's learners are lost together
        (`Survival.NODES`)."""
        if self.survival is Survival.NONE or not ctx.survive_lost or ctx.store is None:
            return
        from asrdist.parallel.membership import Membership  # (it imports comm, which imports this module)

        group_size = ctx.group_size if self.survival is Survival.NODES else 1
        self.membership = Membership(ctx.store, ctx.rank, ctx.world_size, ctx.timeout, group_size=group_size)

    def survivors(self) -> tuple[Any, list[int]]:
        """(process group, job ranks) of the learners the consensus model is taken over, as
        agreed at the last epoch end or `finalize`: every learner, unless the strategy goes on
        without lost learners (its `membership`)."""
        group, size = self.consensus_scope()
        if self.membership is None:
            return group, list(range(size))
        return self.membership.group or group, list(self.membership.members)

    def among_survivors(self, fn: Callable[[Any, list[int]], T]) -> T:
        """`fn(group, job ranks)`: a collective over the survivors (`survivors()`). A strategy that
        goes on without lost learners agrees on them first, and should one die or hang inside
        `fn`, agrees again without it and runs `fn` once more (`Membership.collective`)."""
        if self.membership is None:
            return fn(*self.survivors())
        return self.membership.collective(fn, self.consensus_scope()[0])

    def consensus_scope(self) -> tuple[Any, int]:
        """(process group, learners) the consensus model is taken over when none is lost: the job."""
        return (self.ctx.groups.world if self.ctx.groups is not None else None), self.ctx.job_world_size

    def lost_learners(self) -> list[dict[str, Any]]:
        """[{"rank", "step", "reason"}] of the learners training went on without."""
        return [] if self.membership is None else self.membership.lost_learners()

    def wants_batch_search(self) -> bool:
        """Run CNTK's automatic minibatch-size search at epoch starts (onebit's auto_batch_size)."""
        return False

    def lr_scale(self) -> float:
        """Factor the trainer applies to the configured learning rate (averaging uses n)."""
        return 1.0

    def state_dict(self) -> dict[str, Any]:
        return {"counters": self.counters.as_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        c = state.get("counters")
        if c:
            self.counters.load(c)


def parameters_with_grad(model: torch.nn.Module) -> list[torch.nn.Parameter]:
    return [p for p in model.parameters() if p.requires_grad]
