"""Data-parallel strategies. Each lives in its own module and declares one `StrategyDescriptor`;
`STRATEGIES` is the one registry: name -> descriptor, each module imported when first asked for."""
from __future__ import annotations

import importlib
from collections.abc import Iterator, Mapping
from typing import Any

from asrdist.errors import ConfigError
from asrdist.parallel.base import CommCounters, LearnerContext, Strategy
from asrdist.parallel.descriptor import StrategyDescriptor


class _Registry(Mapping[str, StrategyDescriptor]):
    """name -> descriptor, from "module:ATTRIBUTE" (imported when first asked for)."""

    def __init__(self, where: dict[str, str]):
        self._where = where

    def __getitem__(self, name: str) -> StrategyDescriptor:
        if name not in self._where:
            raise ConfigError(f"strategy.name: unknown strategy '{name}' (known: {', '.join(self._where)})")
        module, attribute = self._where[name].split(":")
        return getattr(importlib.import_module(module), attribute)

    def __iter__(self) -> Iterator[str]:
        return iter(self._where)

    def __len__(self) -> int:
        return len(self._where)

    def __contains__(self, name: object) -> bool:
        return name in self._where


STRATEGIES: Mapping[str, StrategyDescriptor] = _Registry({
    "single": "asrdist.parallel.single:SINGLE",
    "sync": "asrdist.parallel.sync:SYNC",
    "ddp": "asrdist.parallel.ddp:DDP",
    "onebit": "asrdist.parallel.onebit:ONEBIT",
    "averaging": "asrdist.parallel.averaging:AVERAGING",
    "adpsgd": "asrdist.parallel.adpsgd:ADPSGD",
    "hierarchical": "asrdist.parallel.hierarchical:HIERARCHICAL",
    "hybrid": "asrdist.parallel.hierarchical:HYBRID",
})


def strategy_config_class(name: str) -> type | None:
    return STRATEGIES[name].config_class


def build_strategy(name: str, config: Any = None) -> Strategy:
    return STRATEGIES[name].strategy_class(config)


__all__ = ["STRATEGIES", "CommCounters", "LearnerContext", "Strategy", "StrategyDescriptor", "build_strategy",
           "strategy_config_class"]
