"""`hierarchical`: H-ADPSGD (IBM, Interspeech 2019), DESIGN.md §5.6, and `hybrid` (IBM ICASSP 2019).

The learners of a node (`train.group_size`) form one "super learner"; the super learners run ADPSGD
in its order (`adpsgd`: x_{k+1} = W_k x_k − η g(x̂_k), or g(x_{k−1}) with delay-by-one):
1. every learner computes its gradient; `sync` allreduces it inside the node (same step for all);
2. the node's leader averages with another leader (`adpsgd`; passives answer while their node computes);
3. every learner steps; the leader's parameters (W_k x_k − η g) are broadcast inside the node.
Nodes move at their own pace (`moves_by_node`); `finalize` averages the leaders and broadcasts.
A lost learner takes its node with it; the other nodes go on (`NodeMembership`).
`hybrid`: the first `sync_epochs` epochs allreduce over all learners, then ADPSGD between nodes.
Details: docs/strategies.md#hierarchical-h-adpsgd-and-hybrid-parallelhierarchicalpy."""
from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass, fields, replace
from typing import Callable, ContextManager

import torch

from asrdist.checks import check_field
from asrdist.errors import TrainingError
from asrdist.parallel import comm, sync
from asrdist.parallel.adpsgd import AdpsgdConfig, AdpsgdStrategy, HeldGradient, exchange_traffic, flat_parameters
from asrdist.parallel.base import LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.consensus import average_into, consensus_distance
from asrdist.parallel.descriptor import LockStep, Pairwise, SimJob, StrategyDescriptor, Survival
from asrdist.parallel.groups import exchange_group
from asrdist.parallel.membership import NodeMembership
from asrdist.parallel.sync import SyncConfig, SyncStrategy
from asrdist.parallel.topology import is_active


@dataclass
class HierarchicalConfig(AdpsgdConfig):
    """The ADPSGD settings between nodes (every field of `AdpsgdConfig`); inside a node: sync."""

    def adpsgd(self) -> AdpsgdConfig:
        """The config of the ADPSGD between the nodes' leaders: every `AdpsgdConfig` field as set here."""
        return AdpsgdConfig(**{f.name: getattr(self, f.name) for f in fields(AdpsgdConfig) if f.init})


def step_traffic(shapes, world_size: int, group_size: int, rank: int, *, synchronous: bool = False,
                 overlap_inner: bool = True) -> list[comm.Transfer]:
    """One step of learner `rank` as it sends it (float32 parameters of `shapes`): the
    synchronous phase's allreduce over all learners (hybrid), or the allreduce inside the node,
    an active leader's exchange with another node's leader (`adpsgd.exchange_traffic`; a passive
    leader's answers come with its partners' exchanges) and the leader's broadcast to its node."""
    if synchronous:
        return [t for bucket in sync.exchange_traffic(shapes, world_size, group_size, SyncConfig(overlap=False))
                for t in bucket]
    numel = sum(int(torch.Size(s).numel()) for s in shapes)
    out = [t for bucket in sync.exchange_traffic(shapes, group_size, group_size, SyncConfig(overlap=overlap_inner),
                                                 group="node") for t in bucket]
    nodes, leader = world_size // group_size, rank % group_size == 0
    if nodes > 1 and leader and is_active(rank // group_size, nodes):
        out.append(exchange_traffic(numel)["exchange"])
    if group_size > 1:
        out.append(comm.Transfer("broadcast", "node", group_size, numel * 4 * (group_size - 1) if leader else 0, numel))
    return out


class HierarchicalStrategy(Strategy):
    name = "hierarchical"
    config_class = HierarchicalConfig
    lockstep = False
    moves_by_node = True
    overlap_inner = True
    survival = Survival.NODES

    def __init__(self, config: HierarchicalConfig | None = None):
        super().__init__(config)
        self.inner = SyncStrategy(SyncConfig(overlap=self.overlap_inner), counters=self.counters)
        self.outer: AdpsgdStrategy | None = None
        """The ADPSGD between nodes, on a node's leader (built at setup, from `config.adpsgd()`)."""
        self._flat: torch.Tensor | None = None
        self._held: HeldGradient | None = None
        """delay-by-one on a node's other learners: they step with g(x_{k−1}) as their leader does."""

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        groups = ctx.groups
        if ctx.distributed and groups is None:
            raise TrainingError(f"hierarchical: rank {ctx.rank} has no process groups (start_learner builds them)")
        inner = ctx.on_group(groups.node) if ctx.distributed else ctx
        if ctx.distributed and groups.node_timeout is not None:  # the node waits for its leader's exchanges
            inner = replace(inner, timeout=groups.node_timeout)
        self.inner.setup(model, optimizer, inner)
        nodes = ctx.world_size // ctx.group_size if ctx.distributed else 1
        self.leader = ctx.rank % ctx.group_size == 0
        if nodes > 1:
            self.start_membership(ctx)
        if nodes > 1:  # every rank creates the exchange group; leaders alone use it
            group = exchange_group(None, ctx.timeout, across=(ctx.rank, ctx.world_size, ctx.group_size))
            if self.leader:  # the node's membership, if any, decides who is lost
                nodes_lost = None if self.membership is None else NodeMembership(self.membership)
                self.outer = AdpsgdStrategy(self.config.adpsgd(), counters=self.counters, exchange_group=group,
                                            membership=nodes_lost)
                self.outer.setup(model, optimizer, ctx.on_group(groups.leaders))
                self._flat = self.outer.flat
        if self._flat is None:
            self._flat = flat_parameters(model)
        if nodes > 1 and not self.leader and self.config.delay_by_one:
            self._held = HeldGradient()

    def gossip(self) -> dict | None:
        """The leaders' exchanges, positions on the ring of nodes (None on the other learners)."""
        return None if self.outer is None else self.outer.gossip()

    # -- the trainer's hooks ---------------------------------------------------------------
    def note_samples(self, n: int) -> None:
        self.inner.note_samples(n)

    def note_loss(self, loss: float) -> None:
        self.inner.note_loss(loss)

    def no_sync(self) -> ContextManager[None]:
        return self.inner.no_sync()  # the node's sync holds its hooks back

    def after_backward(self) -> None:
        self.inner.after_backward()  # the node's g(x̂_k)
        if self.outer is not None:  # then the leader averages (plain ADPSGD's order)
            self.outer.after_backward()

    def apply_update(self, step_fn: Callable[[], None]) -> None:
        """The leader's step is adpsgd's; the others take the same one (with delay-by-one the held
        gradient), which the leader's broadcast then replaces by W_k x_k − η g."""
        if self.outer is not None:
            self.outer.apply_update(step_fn)
        elif self._held is None or self._held.swap(parameters_with_grad(self.model)):
            step_fn()

    def after_step(self) -> None:
        if self.outer is not None:
            self.outer.after_step()
        self._share_leaders_parameters()

    def paused(self) -> ContextManager[None]:
        return nullcontext() if self.outer is None else self.outer.paused()

    def epoch_end_metrics(self) -> dict:
        return {"consensus_distance": self.among_survivors(lambda group, members: consensus_distance(
            self.model, world_size=len(members), group=group, timeout=self.ctx.timeout))}

    def close(self, error: BaseException | None = None) -> None:
        if self.outer is not None:
            self.outer.close(error)

    def finalize(self) -> None:
        if self.membership is None:
            if self.outer is not None:
                self.outer.finalize()
            self._share_leaders_parameters()
            return
        # going on without lost nodes: the leaders end their exchanges, every survivor agrees, the
        # passive leaders hear the live actives' goodbyes, each node takes its leader's parameters
        # and the survivors average (a node's learners are equal: the mean of the leaders)
        if self.outer is not None:
            self.outer.end_exchanges()

        def average(group, members):
            if self.outer is not None:
                self.outer.await_goodbyes(sorted({r // self.ctx.group_size for r in members}))
            self._share_leaders_parameters()
            with torch.no_grad():
                average_into(self.model, self.counters, group=group, timeout=self.ctx.timeout)
        self.among_survivors(average)

    def state_dict(self) -> dict:
        state = super().state_dict()
        if self.outer is not None:
            state["outer"] = self.outer.state_dict()
        return state

    def load_state_dict(self, state: dict) -> None:
        if self.outer is not None and "outer" in state:
            self.outer.load_state_dict(state["outer"])
        super().load_state_dict(state)  # the counters last: the learner's own, which inner and outer share

    def _share_leaders_parameters(self) -> None:
        """Every member takes its leader's parameters (after the leader's exchange)."""
        if not self.ctx.distributed or self.ctx.group_size == 1:
            return
        # on the leader, the answering thread must not write while the node reads
        with self.outer.parameter_lock if self.outer is not None else nullcontext():
            comm.broadcast(self._flat, 0, self.counters, group=self.ctx.groups.node,
                           timeout=self.ctx.groups.node_timeout or self.ctx.timeout)


@dataclass
class HybridConfig(HierarchicalConfig):
    sync_epochs: int = 1
    """Epochs (from the first) with synchronous allreduce between nodes; ADPSGD after them."""

    def __post_init__(self):
        super().__post_init__()
        check_field("strategy.sync_epochs", self.sync_epochs, at_least=0)


class HybridStrategy(HierarchicalStrategy):
    name = "hybrid"
    config_class = HybridConfig
    survival = Survival.NONE  # its synchronous epochs allreduce over every learner
    overlap_inner = False  # two syncs share the parameters: neither registers gradient hooks

    def __init__(self, config: HybridConfig | None = None):
        super().__init__(config)
        self.everyone = SyncStrategy(SyncConfig(overlap=False), counters=self.counters)
        self._synchronous = True

    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        self.everyone.setup(model, optimizer, ctx)  # all learners, hierarchical across nodes
        super().setup(model, optimizer, ctx)

    def start_epoch(self, epoch: int) -> None:
        self._synchronous = epoch < self.config.sync_epochs

    @property
    def lockstep_now(self) -> bool:
        return self._synchronous

    def after_backward(self) -> None:
        if self._synchronous:
            self.everyone.after_backward()
        else:
            super().after_backward()

    def apply_update(self, step_fn: Callable[[], None]) -> None:
        if self._synchronous:  # the same step everywhere, now (never delay-by-one's held gradient)
            step_fn()
        else:
            super().apply_update(step_fn)

    def after_step(self) -> None:
        if not self._synchronous:  # the synchronous phase leaves every learner identical
            super().after_step()

    def state_dict(self) -> dict:
        return {**super().state_dict(), "synchronous": self._synchronous}


def _between_nodes(config: HierarchicalConfig, job: SimJob, overlap_inner: bool) -> Pairwise:
    """Nodes of `job.per_node` learners: sync inside, ADPSGD between leaders, the leader's broadcast."""
    traffic = exchange_traffic(job.values)
    node_buckets, broadcast = [], None
    if job.per_node > 1:
        node_buckets = sync.exchange_traffic(job.shapes, job.per_node, job.per_node, SyncConfig(overlap=overlap_inner),
                                             group="node")
        broadcast = next(t for t in step_traffic(job.shapes, job.learners, job.per_node, 0) if t.kind == "broadcast")
    return Pairwise(traffic["exchange"], traffic["answer"], config.pattern, config.seed, config.delay_by_one,
                    unit=job.per_node, node_buckets=node_buckets, broadcast=broadcast, overlap=overlap_inner)


def _hybrid(config: HybridConfig, job: SimJob) -> LockStep | Pairwise:
    if job.synchronous:
        return LockStep(sync.exchange_traffic(job.shapes, job.learners, job.per_node, SyncConfig(overlap=False)))
    return _between_nodes(config, job, HybridStrategy.overlap_inner)


HIERARCHICAL = StrategyDescriptor(
    HierarchicalStrategy, Pairwise, lambda config, job: _between_nodes(config, job, HierarchicalStrategy.overlap_inner),
    advised={"hierarchical": {}})
HYBRID = StrategyDescriptor(HybridStrategy, Pairwise, _hybrid, advised={"hybrid": {"sync_epochs": 1}},
                            synchronous_epochs=lambda config: config.sync_epochs)
