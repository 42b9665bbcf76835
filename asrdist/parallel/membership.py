"""Which learners of a decentralized job are still alive, as every survivor agrees (DESIGN.md §8).

1. Whoever notices a loss (a dead process, a closed connection, no answer within the timeout)
   writes `lost/<rank>` into the job's c10d store (in the launcher: it outlives every loss);
   a survivor skips the lost learners it knows of, nothing is negotiated per step.
2. `agree(tag)`: a store barrier until every learner has arrived at `tag` or been reported lost;
   the first survivor to decide fixes the member list (compare-and-set), all build one gloo group.
3. `collective(fn)` runs `fn(group, members)`; when a member dies inside it, agree again and rerun.
Details and store keys: docs/reliability.md#how-survivors-agree-parallelmembershippy."""
from __future__ import annotations

import json
import threading
import time
from contextlib import contextmanager
from datetime import timedelta
from typing import Any, Callable, Iterator, TypeVar

from asrdist.errors import CommError, TrainingError
from asrdist.parallel.groups import survivors_group

T = TypeVar("T")

POLL_S = 0.02
"""How often a learner waiting in `agree` looks at the store (polling a store, not a peer)."""


AGREE_MARGIN_S = 5.0
"""Beyond twice the timeout, how long `agree` waits for a learner that neither arrives nor is lost."""


def survival_wait(timeout: timedelta) -> timedelta:
    """How long a survivor may wait for a peer that itself waits out a hung learner: the timeout,
    the watchdog's report and the launcher's kill, with margin (`agree` waits as long)."""
    return 2 * timeout + timedelta(seconds=AGREE_MARGIN_S)


def progress_key(rank: int) -> str:
    return f"progress/{rank}"


def lost_key(rank: int) -> str:
    return f"lost/{rank}"


def last_step(store, rank: int) -> int | None:
    """The last step `rank` reported finishing (None: it never finished one)."""
    key = progress_key(rank)
    return int(store.get(key)) if store.check([key]) else None


def report_lost(store, rank: int, reason: str, by: str, step: int | None = None) -> dict:
    """Record `rank` as lost, unless someone did already; the record that stands."""
    record = {"rank": rank, "step": last_step(store, rank) if step is None else step, "reason": reason, "by": by}
    return json.loads(store.compare_set(lost_key(rank), "", json.dumps(record)))


class Membership:
    """One learner's view of who is lost, and the agreed survivors at the job's sync points.

    With `group_size` g > 1 (hierarchical: the g learners of a node allreduce every step, so a node
    lives or dies whole) the survivors are the learners of the nodes that lost nobody."""

    def __init__(self, store, rank: int, world_size: int, timeout: timedelta, group_size: int = 1):
        self.store, self.rank, self.world_size, self.timeout = store, rank, world_size, timeout
        self.group_size = group_size
        self.lost: dict[int, dict] = {}
        """rank -> its lost record, as this learner knows it."""
        self.members: list[int] = list(range(world_size))
        """The survivors agreed at the last sync point (every learner before the first)."""
        self._group: Any = None
        self._group_failed = False
        """The last collective failed on the agreed group: its links are closed, the next agreement builds another."""
        self._syncs = 0
        self._lock = threading.Lock()  # a communication thread reports losses too

    def report(self, rank: int, reason: str) -> None:
        """This learner found `rank` gone (a failed or timed-out exchange)."""
        if rank not in self.lost:
            record = report_lost(self.store, rank, reason, by=f"rank {self.rank}")
            with self._lock:
                self.lost.setdefault(rank, record)

    def is_lost(self, rank: int) -> bool:
        return rank in self.lost

    def lost_ranks(self) -> frozenset[int]:
        with self._lock:
            return frozenset(self.lost)

    def _node(self, rank: int) -> range:
        first = rank - rank % self.group_size
        return range(first, first + self.group_size)

    def node_lost(self, rank: int) -> bool:
        """Whether `rank`'s node lost any learner (the rank itself for groups of one)."""
        return any(r in self.lost for r in self._node(rank))

    def _node_loss(self, rank: int) -> str | None:
        """Why `rank` is no survivor though not lost itself: another learner of its node is."""
        gone = [r for r in self._node(rank) if r != rank and r in self.lost]
        return f"its node lost rank {gone[0]}" if gone else None

    def refresh(self) -> None:
        """Learn of every loss reported so far (by the launcher or by any peer)."""
        for r in range(self.world_size):
            if r not in self.lost and self.store.check([lost_key(r)]):
                record = json.loads(self.store.get(lost_key(r)))
                with self._lock:
                    self.lost.setdefault(r, record)

    def agree(self) -> list[int]:
        """Wait until every learner reached this sync point or is lost; the agreed survivors."""
        self._syncs += 1
        prefix = f"sync/{self._syncs}/"
        self.store.set(f"{prefix}{self.rank}", "1")
        # a learner still blocked on a hung partner is freed after the timeout, the watchdog and the
        # launcher's kill: give it that before declaring it hung itself
        wait = survival_wait(self.timeout).total_seconds()
        deadline = time.monotonic() + wait
        while True:
            self.refresh()
            waiting = [r for r in range(self.world_size)
                       if not self.node_lost(r) and not self.store.check([f"{prefix}{r}"])]
            if not waiting:
                break
            if time.monotonic() > deadline:
                for r in waiting:
                    self.report(r, f"hung: reached no sync point within {wait:g} s")
                break
            time.sleep(POLL_S)
        candidate = [r for r in range(self.world_size) if not self.node_lost(r)]
        members = json.loads(self.store.compare_set(f"{prefix}members", "", json.dumps(candidate)))
        if self.rank not in members:
            why = self._node_loss(self.rank) or self.lost.get(self.rank, {}).get("reason", "late")
            raise TrainingError(f"rank {self.rank}: its peers went on without it (declared lost: {why})")
        self.refresh()
        for r in sorted(set(range(self.world_size)) - set(members)):
            # its node lost another learner, or another survivor decided without waiting for it;
            # recorded in the store, so that the launcher stops it should it still run (e.g. hung)
            self.report(r, self._node_loss(r) or "lost: reached no sync point in time")
        if members != self.members or self._group_failed:
            self.members, self._group_failed = members, True  # until it is built
            self._group = survivors_group(members, self.timeout)
            self._group_failed = False
        return members

    def collective(self, fn: Callable[[Any, list[int]], T], whole: Any = None) -> T:
        """`fn(group, members)` over the survivors agreed here (`whole`, the group of every learner,
        while nobody is lost); agreed again and run again, over a fresh group, when it fails."""
        for attempt in range(1, self.world_size + 1):
            try:
                members = self.agree()
                return fn(self._group or whole, members)
            except CommError:
                self._group_failed = True
                if attempt == self.world_size or self.members == [self.rank]:  # nobody else to blame
                    raise
        raise AssertionError("unreachable")

    @property
    def group(self) -> Any:
        """The process group of the agreed survivors (None = the whole world)."""
        return self._group

    def lost_learners(self) -> list[dict]:
        """[{"rank", "step", "reason"}, ...] of every lost learner, by rank, as the store has them
        now: the launcher replaces a peer's inference by how the process ended once it sees it."""
        with self._lock:
            lost = sorted(self.lost)
        records = {}
        for r in lost:
            try:
                records[r] = json.loads(self.store.get(lost_key(r)))
            except Exception:  # the store is gone (a job ending): what this learner knew
                records[r] = self.lost[r]
        return [{k: records[r][k] for k in ("rank", "step", "reason")} for r in lost]


class NodeMembership:
    """The node leaders' view of a job's `Membership` (hierarchical's ADPSGD between nodes): rank k
    here is node k, whose leader is job rank k x group_size; a node is lost when any of its
    learners is. Agreement and groups stay with the job's membership (every learner takes part)."""

    def __init__(self, job: Membership):
        self.job = job

    def report(self, node: int, reason: str) -> None:
        self.job.report(node * self.job.group_size, reason)

    def is_lost(self, node: int) -> bool:
        return self.job.node_lost(node * self.job.group_size)

    def lost_ranks(self) -> frozenset[int]:
        return frozenset(r // self.job.group_size for r in self.job.lost_ranks())

    def refresh(self) -> None:
        self.job.refresh()


class Watchdog:
    """Deadlines of the point-to-point waits in flight on a group without a timeout (adpsgd's
    exchanges). A wait past its deadline gets its peer reported lost as hung; the launcher
    then stops that process, which closes its connections and ends the wait with an error."""

    def __init__(self, membership: Membership, timeout: timedelta, name: str = "watchdog"):
        self._membership, self._timeout = membership, timeout
        self._due: dict[object, tuple[int, float]] = {}
        self._lock = threading.Lock()
        threading.Thread(target=self._run, name=name, daemon=True).start()

    @contextmanager
    def watching(self, rank: int) -> Iterator[None]:
        token = object()
        with self._lock:
            self._due[token] = (rank, time.monotonic() + self._timeout.total_seconds())
        try:
            yield
        finally:
            with self._lock:
                del self._due[token]

    def _run(self) -> None:
        reason = f"hung: no answer to an exchange within {self._timeout.total_seconds():g} s"
        while True:
            time.sleep(min(0.5, self._timeout.total_seconds() / 4))  # a clock, not synchronisation
            now = time.monotonic()
            with self._lock:
                overdue = {rank for rank, due in self._due.values() if now > due}
            for rank in overdue:
                self._membership.report(rank, reason)
