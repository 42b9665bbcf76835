"""Learners that move alike, simulated once: without jitter and shared cores, the learners of a
lock-step strategy differ only by being a straggler or sharing a node or a rail with one, so one
learner of each kind stands for the others, in its node's and rail's collectives too (with the
same figures as simulating each: tests/sim/test_sim_inputs.py). Nodes that exchange pairwise
(hierarchical, hybrid) are each simulated: its leader and one other learner."""
from __future__ import annotations

from asrdist.parallel.descriptor import LockStep, Pairwise
from asrdist.sim.spec import SimSpec, sim_shape


def simulated_learners(spec: SimSpec) -> int:
    """Learners `simulate(spec)` runs one by one (`alike_learners`)."""
    alike = alike_learners(spec)
    return spec.cluster.learners if alike is None else len(alike)


def alike_learners(spec: SimSpec) -> list[int] | None:
    """The ranks simulated, in rank order, or None: every learner is (see the module docstring)."""
    kinds = _kinds(spec)
    if kinds is None:
        return None
    per_node = spec.cluster.per_node
    return [k * per_node + j for k in sorted(set(kinds[0].values())) for j in sorted(set(kinds[1].values()))]


def stand_ins(spec: SimSpec) -> list[int]:
    """Rank -> the rank simulated in its place (`alike_learners`)."""
    c = spec.cluster
    nodes, positions = _kinds(spec) or ({}, {})
    return [nodes.get(k, k) * c.per_node + positions.get(j, j) for k in range(c.nodes) for j in range(c.per_node)]


def _kinds(spec: SimSpec) -> tuple[dict[int, int], dict[int, int]] | None:
    """Node -> the node simulated in its place, and the same for positions in a node; None:
    every learner is simulated."""
    c, shape = spec.cluster, sim_shape(spec)
    lockstep = isinstance(shape, LockStep)
    by_node = isinstance(shape, Pairwise) and shape.unit > 1 and c.per_node > 1
    if spec.jitter or c.shared_cores or not (lockstep or by_node):
        return None
    slow = [r for r in spec.slowdown if 0 <= r < c.learners]
    nodes = set(range(c.nodes)) if by_node else {r // c.per_node for r in slow}
    positions = {r % c.per_node for r in slow} | ({0} if by_node else set())
    return _stand_in(nodes, c.nodes), _stand_in(positions, c.per_node)


def _stand_in(special: set[int], count: int) -> dict[int, int]:
    """Each index of range(count) -> itself if special, else the first one not special."""
    other = next((i for i in range(count) if i not in special), None)
    return {i: i if i in special else other for i in range(count)}
