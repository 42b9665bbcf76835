"""Epochs that belong to the job, not to each learner (for strategies that are not lock-step).

Every learner holds the same seeded order of the corpus's minibatches and claims the next
unclaimed one with the job store's atomic `add`, so a fast learner trains on more of them and the
epoch ends when the order is used up; the learning-rate clock follows the job. A group of g
learners claims g at once; in survival mode (`lost_ranks`) the units a lost learner held are
claimed again. How: docs/data.md#epochs-that-belong-to-the-job-datajob_samplerpy."""
from __future__ import annotations

import time
from datetime import timedelta
from typing import Any, Callable, Iterator

from asrdist.errors import ConfigError

POLL_S = 0.02
"""How often a learner done with an epoch's order looks at the store for lost learners' units."""


class JobEpochSampler:
    kind = "job"

    def __init__(self, order: Any, store: Any, learners: int, group_size: int = 1, rank: int = 0,
                 lost_ranks: Callable[[], list[int]] | None = None, wait_seconds: float = 60.0):
        if getattr(order, "world_size", 1) != 1:
            raise ConfigError("JobEpochSampler: the shared order must be a one-rank sampler")
        if learners < 1 or group_size < 1 or learners % group_size or not 0 <= rank < learners:
            raise ConfigError(f"JobEpochSampler: {learners} learners, groups of {group_size}, rank {rank}")
        self.order, self.store, self.learners = order, store, learners
        self.group_size, self.group, self.member = group_size, rank // group_size, rank % group_size
        self.lockstep = False
        """Hand every group the same minibatches in turn, no store (a strategy's synchronous phase)."""
        self._epoch = 0
        self.claimed = -1
        """Index of the minibatch this learner claimed last in the current epoch (-1: none yet)."""
        self.taken = 0
        """Minibatches this learner took in the current epoch."""
        self.last_taken = 0
        """Minibatches this learner took in the last epoch it finished."""
        self.lost_ranks = lost_ranks
        """() -> the job ranks lost so far (survival mode; None: no learner is ever left behind)."""
        self.wait_seconds = wait_seconds
        """Survival mode: how long a learner done with the epoch's order waits for the others to be
        done or lost (the job's `survival_wait`); then the epoch ends without the stragglers' units."""
        self.retrained = 0
        """Minibatches of lost learners this learner trained again in the current epoch."""
        self._unit: int | None = None
        """Survival mode: the unit this learner (its group) trains now, recorded finished at the next claim."""
        self.last_retrained = 0

    def __len__(self) -> int:
        """Minibatches in one job epoch (all learners together)."""
        return len(self.order)

    @property
    def steps_per_epoch(self) -> int:
        """Job epoch length in minibatches of the configured global size."""
        return max(1, len(self) // self.learners)

    @property
    def epoch(self) -> int:
        return self._epoch

    def set_epoch(self, epoch: int) -> None:
        if epoch < 0:
            raise ConfigError(f"JobEpochSampler: epoch must be >= 0, got {epoch}")
        if epoch != self._epoch:
            self._epoch, self.claimed, self.taken, self.retrained, self._unit = int(epoch), -1, 0, 0, None

    def claim(self, epoch: int) -> int:
        """The next unclaimed minibatch of `epoch` for this learner (>= len(self) once the epoch
        is used up)."""
        groups = self.learners // self.group_size
        if self.lockstep:  # group g takes units g, g + G, ...: the same count for every group
            units = len(self) // self.group_size
            if self.taken >= units // groups:
                return len(self)
            return (self.taken * groups + self.group) * self.group_size + self.member
        if self.lost_ranks is not None and self.member == 0 and self._unit is not None:
            # the last unit is finished: in the record that names every finished unit (a unit a
            # learner died holding, even one it claimed an instant before, is then found missing)
            self.store.append(f"epoch/{epoch}/done/{self.group * self.group_size}", f"{self._unit},")
        self._unit = None
        if self.group_size == 1:
            unit = self._next_unit(epoch)
        else:
            key = f"epoch/{epoch}/group-{self.group}/step-{self.taken}"
            if self.member == 0:
                self.store.set(key, str(self._next_unit(epoch)))
            elif self.lost_ranks is not None:  # the leader may wait out the others' last units first
                self.store.wait([key], timedelta(seconds=self.wait_seconds + 60))
            unit = int(self.store.get(key))
        units = len(self) // self.group_size
        if unit >= units and self.lost_ranks is not None and unit != self._END:
            self.retrained += 1
            unit -= units  # a lost learner's unit, trained again (see _next_unit)
        elif unit >= units:
            self._hold(epoch, -1)
            return len(self)
        self._hold(epoch, unit)
        self._unit = unit
        return unit * self.group_size + self.member

    _END = 1 << 62
    """The unit that ends an epoch once lost learners' units are claimed again too."""

    def _next_unit(self, epoch: int) -> int:
        """The group's next unit: the next of the epoch's order; once that is used up, in survival
        mode, a lost learner's unfinished unit u (given as units + u) that no other survivor took,
        else `_END`."""
        units = len(self) // self.group_size
        unit = int(self.store.add(f"epoch/{epoch}/claimed", 1)) - 1
        if unit < units or self.lost_ranks is None:
            return unit
        # the order is used up: until every other group is done with it too (or lost), take what a
        # lost learner held unfinished; a loss found only later would otherwise leave its unit untrained
        self._hold(epoch, -1)
        deadline = time.monotonic() + self.wait_seconds
        while True:
            lost = set(self.lost_ranks())  # one view for both questions: a loss seen only by the
            for left in self._lost_units(epoch, lost):  # second would end the wait with its unit untrained
                if int(self.store.add(f"epoch/{epoch}/retrain/{left}", 1)) == 1:
                    return units + left
            if self._others_done(epoch, lost):
                # nobody alive holds a unit now: one in no finished record was held by a lost
                # learner (its record may predate the claim)
                for left in self._missing_units(epoch):
                    if int(self.store.add(f"epoch/{epoch}/retrain/{left}", 1)) == 1:
                        return units + left
                return self._END
            if time.monotonic() > deadline:
                return self._END
            time.sleep(POLL_S)  # polling the job store, as `Membership.agree` does

    def _done_units(self, leader: int, epoch: int) -> list[int] | None:
        """The units the group of `leader` finished in `epoch`, in order (None: no record)."""
        key = f"epoch/{epoch}/done/{leader}"
        if not self.store.check([key]):
            return None
        return [int(u) for u in self.store.get(key).decode().split(",") if u]

    def _missing_units(self, epoch: int) -> list[int]:
        """The units of `epoch`'s order that no group has finished."""
        done: set[int] = set()
        for leader in range(0, self.learners, self.group_size):
            done.update(self._done_units(leader, epoch) or ())
        return sorted(set(range(len(self) // self.group_size)) - done)

    def _others_done(self, epoch: int, lost: set[int]) -> bool:
        """Whether every group that lost nobody (of `lost`) has its leader done with `epoch`'s order."""
        for leader in range(0, self.learners, self.group_size):
            if any(r in lost for r in range(leader, leader + self.group_size)):
                continue
            key = f"holding/{leader}"
            if not self.store.check([key]):
                return False
            e, unit, _ = (int(x) for x in self.store.get(key).decode().split(":"))
            if e < epoch or (e == epoch and unit >= 0):
                return False
        return True

    def _hold(self, epoch: int, unit: int) -> None:
        """Record (survival mode) the unit this learner trains now (-1: none) and how many it finished."""
        if self.lost_ranks is not None:
            self.store.set(f"holding/{self.group * self.group_size + self.member}",
                           f"{epoch}:{unit}:{self.taken}")

    def _held(self, rank: int, epoch: int) -> tuple[int, int] | None:
        """(unit it held unfinished or -1, units it finished) of `rank` in `epoch`; None if it held none.
        A group's members step together, and its leader claims a unit only once the last is finished
        by all of them: the leader's record speaks for the group (a member's lags by a step when it
        died between finishing a unit and reading the next claim)."""
        leader = rank - rank % self.group_size
        return self._record(leader, epoch) or self._record(rank, epoch)

    def _record(self, rank: int, epoch: int) -> tuple[int, int] | None:
        key = f"holding/{rank}"
        if not self.store.check([key]):
            return None
        e, unit, done = (int(x) for x in self.store.get(key).decode().split(":"))
        return (unit, done) if e == epoch else None

    def _lost_units(self, epoch: int, lost: set[int] | None = None) -> list[int]:
        units = set()
        for rank in sorted(self.lost_ranks() if lost is None else lost):
            held = self._held(rank, epoch)
            if held is not None and held[0] >= 0 and held[0] not in (self._done_units(rank - rank % self.group_size,
                                                                                     epoch) or ()):
                units.add(held[0])  # (one it finished and died before claiming the next is no longer held)
        return sorted(units)

    def lost_shares(self, epoch: int) -> tuple[dict[int, int], int]:
        """For the record of `epoch` (survival mode, once it ended): minibatches each lost learner
        finished in it, and minibatches of the lost learners' unfinished units nobody trained again."""
        if self.lost_ranks is None:
            return {}, 0
        finished = {}
        for rank in sorted(self.lost_ranks()):
            done = self._done_units(rank - rank % self.group_size, epoch)
            held = self._held(rank, epoch)
            if done is not None or held is not None:
                finished[rank] = len(done) if done is not None else held[1]
        return finished, len(self._missing_units(epoch)) * self.group_size

    def schedule_step(self) -> float:
        """The job's progress, in configured global minibatches, at the last claim. In lock step
        every learner takes one minibatch per step, so the clock is the step within the epoch: the
        same on every learner (a learning-rate warmup must not differ between learners whose
        updates are averaged)."""
        if self.lockstep:
            return self._epoch * self.steps_per_epoch + max(self.taken - 1, 0)
        return self._epoch * self.steps_per_epoch + max(self.claimed, 0) / self.learners

    def __iter__(self) -> Iterator[Any]:
        epoch = self._epoch
        while True:
            k = self.claim(epoch)
            if k >= len(self):
                break
            self.claimed, self.taken = k, self.taken + 1
            yield self.order.batch_at(epoch, k)
        self.last_taken = self.taken
        self.last_retrained = self.retrained
        self._epoch, self.claimed, self.taken, self.retrained = epoch + 1, -1, 0, 0

    def state_dict(self) -> dict:
        return {"kind": self.kind, "epoch": self._epoch, "position": 0, "learners": self.learners,
                "group_size": self.group_size,
                "order": self.order.state_dict()["config"] if hasattr(self.order, "state_dict") else {}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind:
            raise ConfigError(f"JobEpochSampler: saved state is for a '{state.get('kind')}' sampler")
        if state.get("learners") != self.learners:
            raise ConfigError(f"JobEpochSampler: saved with {state.get('learners')} learners, now {self.learners}")
        self._epoch, self.claimed, self.taken, self.retrained, self._unit = int(state["epoch"]), -1, 0, 0, None
