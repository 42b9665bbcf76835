"""Epochs that belong to the job, not to each learner (for strategies that are not lock-step).

Every learner holds the same seeded order of the whole corpus's minibatches (a one-rank sampler
at the learner's own minibatch size) and claims the next unclaimed one with the job store's atomic
`add`, so a fast learner trains on more minibatches than a slow one and the epoch ends, for
everyone, when the order is used up. Nothing is negotiated beyond one counter per epoch; the
store is torch.distributed's c10d store (a HashStore for one learner).

The learning-rate clock follows the job: after claiming minibatch k of an epoch, the job has
consumed k + 1 local minibatches, i.e. (k + 1) / n minibatches of the configured global size.
A job epoch resumes from its start (the claims of an interrupted epoch are not recorded).

With `group_size` g > 1 (hierarchical strategies: a node's learners allreduce every step, so they
must step together) a claim takes g consecutive minibatches, one per member: the group's first
learner claims and publishes the claim under a per-group, per-step key, the others read it.
"""
from __future__ import annotations

from typing import Any, Iterator

from asrdist.errors import ConfigError


class JobEpochSampler:
    kind = "job"

    def __init__(self, order: Any, store: Any, learners: int, group_size: int = 1, rank: int = 0):
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
            self._epoch, self.claimed, self.taken = int(epoch), -1, 0

    def claim(self, epoch: int) -> int:
        """The next unclaimed minibatch of `epoch` for this learner (>= len(self) once the epoch
        is used up)."""
        groups = self.learners // self.group_size
        if self.lockstep:  # group g takes units g, g + G, ...: the same count for every group
            units = len(self) // self.group_size
            if self.taken >= units // groups:
                return len(self)
            return (self.taken * groups + self.group) * self.group_size + self.member
        if self.group_size == 1:
            return int(self.store.add(f"epoch/{epoch}/claimed", 1)) - 1
        key = f"epoch/{epoch}/group-{self.group}/step-{self.taken}"
        if self.member == 0:
            self.store.set(key, str(int(self.store.add(f"epoch/{epoch}/claimed", 1)) - 1))
        unit = int(self.store.get(key))
        return unit * self.group_size + self.member if unit < len(self) // self.group_size else len(self)

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
        self._epoch, self.claimed, self.taken = epoch + 1, -1, 0

    def state_dict(self) -> dict:
        return {"kind": self.kind, "epoch": self._epoch, "position": 0, "learners": self.learners,
                "group_size": self.group_size,
                "order": self.order.state_dict()["config"] if hasattr(self.order, "state_dict") else {}}

    def load_state_dict(self, state: dict) -> None:
        if state.get("kind") != self.kind:
            raise ConfigError(f"JobEpochSampler: saved state is for a '{state.get('kind')}' sampler")
        if state.get("learners") != self.learners:
            raise ConfigError(f"JobEpochSampler: saved with {state.get('learners')} learners, now {self.learners}")
        self._epoch, self.claimed, self.taken = int(state["epoch"]), -1, 0
