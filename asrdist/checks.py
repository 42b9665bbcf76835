"""The one check of a typed config field, for every section's dataclass (run, model, optimizer,
strategy): the value's kind and its allowed range, or a one-line ConfigError naming the key; and
the same rules as argparse types for the commands' numeric options (`cli_number`, `cli_list`); and
the one check of a device to compute on (`compute_device`, `cli_device`)."""
from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any, Callable

from asrdist.errors import ConfigError

if TYPE_CHECKING:
    import torch

MAX_SLOWDOWN = 1000.0
"""The largest straggler slowdown (and jitter factor) taken: beyond it a step's sleep is no
emulation of a slow learner but a hang, and far beyond it no clock can hold the deadline."""

_KIND_NAMES = {int: "an integer", float: "a number", bool: "true/false"}
_PLURAL_NAMES = {int: "integers", float: "numbers", bool: "true/false values"}


def check_field(key: str, value: Any, kind: type = int, *, at_least: float | None = None,
                above: float | None = None, at_most: float | None = None, below: float | None = None) -> Any:
    """`value` is a `kind` (a bool is never a number; an int is a float; numbers are finite) within
    the bounds, or a one-line ConfigError naming `key` and the allowed range."""
    bounds = dict(at_least=at_least, above=above, at_most=at_most, below=below)
    if not _within(value, kind, bounds):
        raise ConfigError(f"{key}: expected {_expected(kind, bounds)}, got {value!r}")
    return value


def cli_number(kind: type = int, **bounds: float) -> Callable[[str], Any]:
    """An argparse `type=` for a numeric option: its text as a `kind` within `bounds` (check_field's
    keywords and rules), else argparse's usage error naming the option and the allowed range."""
    expected = _expected(kind, bounds)  # here, so that a misspelt bound fails where it is written

    def parse(text: str) -> Any:
        return _parse(text, kind, bounds, expected)

    parse.__name__ = kind.__name__  # argparse names the type in its message for a ValueError
    return parse


def cli_list(kind: type = int, *, empty: bool = False, **bounds: float) -> Callable[[str], list]:
    """An argparse `type=` for a comma-separated list of numbers, each a `kind` within `bounds`
    (empty items skipped); the empty list only with `empty`."""
    expected = _expected(kind, bounds, plural=True)

    def parse(text: str) -> list:
        try:
            values = [_parse(item.strip(), kind, bounds, expected) for item in text.split(",") if item.strip()]
        except argparse.ArgumentTypeError:
            values = None
        if values is None or not (values or empty):
            raise argparse.ArgumentTypeError(f"expected a comma-separated list of {expected}, got {text!r}")
        return values

    parse.__name__ = f"{kind.__name__} list"
    return parse


def _parse(text: str, kind: type, bounds: dict, expected: str) -> Any:
    try:
        value = kind(text)
    except ValueError:
        value = text
    if not _within(value, kind, bounds):
        raise argparse.ArgumentTypeError(f"expected {expected}, got {text!r}")
    return value


def _within(value: Any, kind: type, bounds: dict) -> bool:
    if kind is bool:
        return isinstance(value, bool)
    if isinstance(value, bool) or not isinstance(value, (int, float) if kind is float else kind):
        return False
    at_least, above, at_most, below = (bounds.get(k) for k in ("at_least", "above", "at_most", "below"))
    return (math.isfinite(value)
            and (at_least is None or value >= at_least) and (above is None or value > above)
            and (at_most is None or value <= at_most) and (below is None or value < below))


def _expected(kind: type, bounds: dict, plural: bool = False) -> str:
    ops = {"at_least": ">=", "above": ">", "at_most": "<=", "below": "<"}
    unknown = set(bounds) - set(ops)
    if unknown:
        raise TypeError(f"unknown bounds {sorted(unknown)}")
    limits = [f"{ops[k]} {b:g}" for k, b in bounds.items() if b is not None]
    name = (_PLURAL_NAMES if plural else _KIND_NAMES)[kind]
    return " ".join([name, " and ".join(limits)]).strip()


def compute_device(name: str | torch.device | None = None, option: str = "device") -> torch.device:
    """The device a command computes on: `name` (cpu, cuda, cuda:N) where this torch can use it;
    None: the GPU where this torch sees one, else the CPU. Any other is a one-line ConfigError
    naming `option` (the command-line flag that gave `name`)."""
    import torch  # here: `asrdist --help` imports no torch

    if name is None:
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    why = _device_problem(name)
    if why is not None:
        raise ConfigError(f"{option}: {why}")
    return torch.device(name)


def cli_device(text: str) -> torch.device:
    """An argparse `type=` for a `--device` option: `compute_device`'s device, else argparse's
    usage error naming the option."""
    why = _device_problem(text)
    if why is not None:
        raise argparse.ArgumentTypeError(why)
    return compute_device(text)


def _device_problem(name: str | torch.device) -> str | None:
    """Why this torch cannot compute on `name`, or None when it can."""
    import torch  # here: `asrdist --help` imports no torch

    try:
        device = torch.device(name)
    except (RuntimeError, TypeError):
        device = None
    if device is None or device.type not in ("cpu", "cuda"):
        return f"expected cpu, cuda or cuda:N, got {str(name)!r}"
    if device.type == "cuda":
        if not torch.cuda.is_available():
            return f"{str(name)!r}: this torch ({torch.__version__}) sees no CUDA device"
        count = torch.cuda.device_count()
        if device.index is not None and device.index >= count:
            return f"{str(name)!r}: this machine has {count} CUDA device(s), cuda:0 to cuda:{count - 1}"
    return None
