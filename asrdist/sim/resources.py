"""What the simulator's learners share and what moving bytes costs: lock-step meetings for
collectives (`Meet`), a machine's cores shared by the scheduler (`SharedCores`), and the time of
one collective (`transfer_seconds`).

A collective's time: the bytes this learner sends over the slowest link it crosses (a node's
card is shared by the node's learners that cross it at the same time) + one latency per
sequential message (ring allreduce 2(n-1), reduce-scatter / all-gather / all-to-all n-1,
broadcast log2 n, a pairwise exchange 2). In a pairwise exchange, a ring's steps and an
all-to-all, every member sends and receives at once, so each direction of a link keeps only its
`Link.duplex` share of the one-way rate (1 on a full-duplex link; measured on this machine's
emulated hosts and loopback, where both directions' copies share the cores).
"""
from __future__ import annotations

import math
from typing import Any

import simpy

from asrdist.parallel.comm import Transfer
from asrdist.sim.cluster import Cluster


class Meet:
    """Lock-step collectives: each member joins with its own duration; all leave together once
    the last has arrived and the longest duration has passed."""

    def __init__(self, env: simpy.Environment):
        self.env = env
        self._open: dict[Any, list] = {}

    def join(self, key: Any, size: int, duration: float) -> simpy.Event:
        event = self.env.event()
        waiting = self._open.setdefault(key, [])
        waiting.append((event, duration))
        if len(waiting) == size:
            del self._open[key]
            self.env.process(self._release(waiting))
        return event

    def _release(self, waiting):
        yield self.env.timeout(max(d for _, d in waiting))
        for event, _ in waiting:
            event.succeed()


class SharedCores:
    """A machine's cores as Linux's scheduler shares them among runnable threads: every job in
    progress advances at once, at min(1, cores / threads wanted by all jobs) of its full speed
    (processor sharing), rather than jobs queueing to run one after another. A job of `seconds`
    is work that takes `seconds` on its own `threads` cores."""

    def __init__(self, env: simpy.Environment, cores: int):
        self.env, self.cores = env, cores
        self._jobs: dict[simpy.Event, list[float]] = {}  # done event -> [seconds left, threads]
        self._since = 0.0
        self._version = 0

    def run(self, seconds: float, threads: int) -> simpy.Event:
        """An event that fires when `seconds` of work on `threads` threads is done."""
        done = self.env.event()
        self._advance()
        self._jobs[done] = [seconds, float(threads)]
        self._schedule()
        return done

    def _speed(self) -> float:
        wanted = sum(threads for _, threads in self._jobs.values())
        return min(1.0, self.cores / wanted) if wanted else 1.0

    def _advance(self) -> None:
        elapsed, self._since = self.env.now - self._since, self.env.now
        if elapsed > 0 and self._jobs:
            progress = elapsed * self._speed()
            for job in self._jobs.values():
                job[0] -= progress

    def _schedule(self) -> None:
        self._version += 1
        if self._jobs:
            first = max(min(left for left, _ in self._jobs.values()), 0.0)
            self.env.process(self._finish(first / self._speed(), self._version))

    def _finish(self, delay: float, version: int):
        yield self.env.timeout(delay)
        if version != self._version:  # a job came or went since: a later timer holds
            return
        self._advance()
        # the job this timer was set for ends now, whatever rounding left of it (at a large
        # simulated time a tiny remainder could never be advanced), and any that end with it
        first = min(left for left, _ in self._jobs.values())
        for done in [d for d, (left, _) in self._jobs.items() if left <= max(first, 0.0) + 1e-12]:
            del self._jobs[done]
            done.succeed()
        self._schedule()


_LATENCY_STEPS = {"allreduce": lambda n: 2 * (n - 1), "reduce_scatter": lambda n: n - 1,
                  "all_gather": lambda n: n - 1, "all_to_all": lambda n: n - 1,
                  "broadcast": lambda n: math.ceil(math.log2(max(n, 2))), "exchange": lambda n: 2,
                  "answer": lambda n: 0}
_BOTH_WAYS = {"allreduce", "reduce_scatter", "all_gather", "all_to_all"}
"""Collectives in which every member sends and receives at the same time (and a pair's exchange)."""


def latency_steps(t: Transfer) -> int:
    """The sequential messages of collective `t`: each pays the link's latency."""
    return _LATENCY_STEPS[t.kind](t.size)


def transfer_seconds(t: Transfer, cluster: Cluster, crosses_nodes: bool | None = None,
                     payload_bytes: int | None = None) -> float:
    """Time of one collective from one learner's bytes (see the module docstring). `crosses_nodes`
    and `payload_bytes` (the larger direction's bytes) for a pairwise exchange."""
    per_node, nodes, n = cluster.per_node, cluster.nodes, cluster.learners
    inside, between = cluster.inside, cluster.between
    messages = latency_steps(t)
    b = float(t.bytes_sent if payload_bytes is None else payload_bytes)
    both_ways = t.group == "pair" or t.kind in _BOTH_WAYS
    inside_rate = inside.bandwidth * (inside.duplex if both_ways else 1.0)
    between_rate = between.bandwidth * (between.duplex if both_ways else 1.0)
    if t.group == "pair" and not crosses_nodes:
        return b / inside_rate + messages * inside.latency
    if t.group == "node" or (t.group == "world" and nodes == 1):
        return b / inside_rate + messages * inside.latency
    if t.group == "rail":  # every local rank's rail crosses the node's card at once
        return per_node * b / between_rate + messages * between.latency
    if t.group == "pair":
        return b / between_rate + messages * between.latency
    # the whole world over several nodes
    if t.kind == "all_to_all":
        out_of_node = per_node * b * (n - per_node) / (n - 1)
        in_node = b * (per_node - 1) / (n - 1)
        wire = max(out_of_node / between_rate, in_node / inside_rate)
    else:  # rings in node order: one stream crosses each node's card
        wire = b / between_rate
    return wire + messages * between.latency
