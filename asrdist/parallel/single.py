"""`single`: one learner, no communication (the `Strategy` base's own behaviour)."""
from __future__ import annotations

from asrdist.parallel.base import Strategy
from asrdist.parallel.descriptor import LockStep, StrategyDescriptor

SINGLE = StrategyDescriptor(Strategy, LockStep, lambda config, job: LockStep())
