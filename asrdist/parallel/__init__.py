"""Data-parallel strategies. Each lives in its own module; `build_strategy` picks by name."""
from __future__ import annotations

import importlib
from typing import Any

from asrdist.errors import ConfigError
from asrdist.parallel.base import CommCounters, LearnerContext, Strategy

# name -> (module, strategy class, config dataclass or None)
STRATEGIES: dict[str, tuple[str, str, str | None]] = {
    "single": ("asrdist.parallel.base", "Strategy", None),
    "sync": ("asrdist.parallel.sync", "SyncStrategy", "SyncConfig"),
    "onebit": ("asrdist.parallel.onebit", "OneBitStrategy", "OneBitConfig"),
    "averaging": ("asrdist.parallel.averaging", "AveragingStrategy", "AveragingConfig"),
    "adpsgd": ("asrdist.parallel.adpsgd", "AdpsgdStrategy", "AdpsgdConfig"),
    "hierarchical": ("asrdist.parallel.hierarchical", "HierarchicalStrategy", "HierarchicalConfig"),
    "hybrid": ("asrdist.parallel.hierarchical", "HybridStrategy", "HybridConfig"),
}


def strategy_config_class(name: str) -> type | None:
    if name not in STRATEGIES:
        raise ConfigError(f"strategy.name: unknown strategy '{name}' (known: {', '.join(STRATEGIES)})")
    module, _, cfg = STRATEGIES[name]
    return getattr(importlib.import_module(module), cfg) if cfg else None


def build_strategy(name: str, config: Any = None) -> Strategy:
    module, cls, _ = STRATEGIES[name]
    return getattr(importlib.import_module(module), cls)(config)


__all__ = ["CommCounters", "LearnerContext", "Strategy", "build_strategy", "strategy_config_class"]
