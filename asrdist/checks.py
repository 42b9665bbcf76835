"""The one check of a typed config field, for every section's dataclass (run, model, optimizer,
strategy): the value's kind and its allowed range, or a one-line ConfigError naming the key."""
from __future__ import annotations

import math
from typing import Any

from asrdist.errors import ConfigError

_KIND_NAMES = {int: "an integer", float: "a number", bool: "true/false"}


def check_field(key: str, value: Any, kind: type = int, *, at_least: float | None = None,
                above: float | None = None, at_most: float | None = None, below: float | None = None) -> Any:
    """`value` is a `kind` (a bool is never a number; an int is a float; numbers are finite) within
    the bounds, or a one-line ConfigError naming `key` and the allowed range."""
    bounds = [f"{op} {b:g}" for op, b in ((">=", at_least), (">", above), ("<=", at_most), ("<", below))
              if b is not None]
    expected = " ".join([_KIND_NAMES[kind], " and ".join(bounds)]).strip()
    if kind is bool:
        ok = isinstance(value, bool)
    elif isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        ok = False
    else:
        ok = (math.isfinite(value)
              and (at_least is None or value >= at_least) and (above is None or value > above)
              and (at_most is None or value <= at_most) and (below is None or value < below))
    if not ok:
        raise ConfigError(f"{key}: expected {expected}, got {value!r}")
    return value
