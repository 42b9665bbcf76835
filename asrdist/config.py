"""Typed run configuration: YAML recipe -> dataclasses, strict about unknown keys.

A recipe has sections `data`, `model`, `optim`, `train`, `strategy`, `eval` and a top-level `seed`.
`section.key=value` overrides are applied on top (values parsed as YAML scalars). The strategy
section's keys depend on `strategy.name`: each strategy module defines its own config dataclass.
"""
from __future__ import annotations

import dataclasses
import types
import typing
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from asrdist.errors import ConfigError
from asrdist.models.registry import ModelConfig
from asrdist.optim.build import OptimConfig


@dataclass
class DataConfig:
    corpus: str = "demo/corpus"
    """Corpus directory as built by `asrdist corpus ...` (train/, valid/, test/ inside)."""
    num_mel_bins: int = 40
    """Filterbank size used when the corpus has no features yet."""
    cmvn: str = "global"
    """global | speaker | none."""
    targets: str = "monophone"
    """Frame models: monophone | tied. CTC models: phones | chars."""
    tied_states: int = 200
    """Number of tied context-dependent classes when targets = tied."""
    batch_size: int = 256
    """Global minibatch: frames (DNN), chunks (LSTM) or max frames per batch (CTC); split evenly across learners."""
    window_utterances: int = 64
    """Frame randomization window, in utterances."""

    def __post_init__(self):
        if self.cmvn not in ("global", "speaker", "none"):
            raise ConfigError(f"data.cmvn: '{self.cmvn}' is not one of global, speaker, none")
        if self.targets not in ("monophone", "tied", "phones", "chars"):
            raise ConfigError(f"data.targets: '{self.targets}' is not one of monophone, tied, phones, chars")
        if self.batch_size < 1:
            raise ConfigError("data.batch_size: must be >= 1")


@dataclass
class StragglerConfig:
    ranks: list[int] = field(default_factory=list)
    """Learners made slow."""
    slowdown: float = 1.0
    """Each slow learner sleeps (slowdown - 1) x its own compute time after every step."""
    jitter: float = 0.0
    """Random mode: every learner sleeps uniform(0, jitter) x its compute time."""


@dataclass
class TrainConfig:
    epochs: int = 4
    learners: int = 1
    """Local learner processes (torch.distributed.run --nproc-per-node)."""
    max_steps: int = 0
    """Stop after this many steps in total (0 = no limit)."""
    log_every: int = 20
    checkpoint_every: int = 0
    """Atomic checkpoint every K steps (0 = only at epoch end)."""
    validate_every_epochs: int = 1
    timeout_seconds: float = 180.0
    """Timeout of every collective and of the whole launch's rendezvous."""
    threads: int = 0
    """Torch threads per learner (0 = cores / local learners)."""
    emulate_compute_ms: float = 0.0
    """Replace forward/backward by a sleep and synthetic gradients (scaling benchmarks)."""
    straggler: StragglerConfig = field(default_factory=StragglerConfig)
    group_size: int = 0
    """Learners per group (a "node" for hierarchical strategies); 0 = torchrun's LOCAL_WORLD_SIZE."""

    def __post_init__(self):
        if self.epochs < 1:
            raise ConfigError("train.epochs: must be >= 1")
        if self.learners < 1:
            raise ConfigError("train.learners: must be >= 1")


@dataclass
class EvalConfig:
    min_duration: int = 3
    """Minimum phone duration in frames for Viterbi decoding."""
    acoustic_scale: float = 1.0
    prior_scale: float = 1.0
    bigram_smoothing: float = 1.0
    beam: int = 8
    """CTC beam width (0 = greedy only)."""


@dataclass
class RunConfig:
    seed: int = 0
    data: DataConfig = field(default_factory=DataConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    train: TrainConfig = field(default_factory=TrainConfig)
    strategy: Any = None
    """The strategy's own config dataclass; its `name` picks the class."""
    strategy_name: str = "single"
    eval: EvalConfig = field(default_factory=EvalConfig)

    def to_dict(self) -> dict:
        d = {"seed": self.seed}
        for name in ("data", "model", "optim", "train"):
            d[name] = dataclasses.asdict(getattr(self, name))
        d["strategy"] = {"name": self.strategy_name,
                         **(dataclasses.asdict(self.strategy) if self.strategy is not None else {})}
        d["eval"] = dataclasses.asdict(self.eval)
        return d


def _coerce(value: Any, tp: Any, where: str) -> Any:
    origin = typing.get_origin(tp)
    if dataclasses.is_dataclass(tp):
        if not isinstance(value, dict):
            raise ConfigError(f"{where}: expected a mapping")
        return from_dict(tp, value, where)
    if origin in (typing.Union, types.UnionType):
        args = [a for a in typing.get_args(tp) if a is not type(None)]
        if value is None:
            return None
        return _coerce(value, args[0], where)
    if origin is list:
        if not isinstance(value, list):
            raise ConfigError(f"{where}: expected a list, got {value!r}")
        (item,) = typing.get_args(tp) or (Any,)
        return [_coerce(v, item, f"{where}[{i}]") for i, v in enumerate(value)]
    if tp is Any:
        return value
    if tp is bool:
        if not isinstance(value, bool):
            raise ConfigError(f"{where}: expected true/false, got {value!r}")
        return value
    if tp is int:
        if isinstance(value, bool) or not isinstance(value, int):
            raise ConfigError(f"{where}: expected an integer, got {value!r}")
        return value
    if tp is float:
        if isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ConfigError(f"{where}: expected a number, got {value!r}")
        return float(value)
    if tp is str:
        if not isinstance(value, (str, int, float)) or isinstance(value, bool):
            raise ConfigError(f"{where}: expected a string, got {value!r}")
        return str(value)
    return value


def from_dict(cls: type, data: dict, where: str) -> Any:
    """Build dataclass `cls` from a mapping; unknown keys and wrong types are ConfigErrors."""
    hints = typing.get_type_hints(cls)
    names = {f.name for f in dataclasses.fields(cls)}
    unknown = sorted(set(data) - names)
    if unknown:
        raise ConfigError(f"{where}.{unknown[0]}: unknown config key (known: {', '.join(sorted(names))})")
    kwargs = {k: _coerce(v, hints[k], f"{where}.{k}") for k, v in data.items()}
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise ConfigError(f"{where}: {exc}") from None


def apply_override(tree: dict, override: str) -> None:
    if "=" not in override:
        raise ConfigError(f"override '{override}': expected section.key=value")
    key, _, raw = override.partition("=")
    parts = key.strip().split(".")
    node = tree
    for p in parts[:-1]:
        node = node.setdefault(p, {})
        if not isinstance(node, dict):
            raise ConfigError(f"override '{override}': '{p}' is not a section")
    value = yaml.safe_load(raw) if raw.strip() else ""
    if isinstance(value, str):
        try:  # YAML 1.1 reads "1e-3" as a string
            value = float(value)
        except ValueError:
            pass
    node[parts[-1]] = value


def read_config_tree(path: str | Path) -> dict:
    """The raw mapping of a YAML recipe; a missing or malformed file is a one-line ConfigError."""
    path = Path(path)
    if not path.is_file():
        raise ConfigError(f"{path}: config file not found")
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: invalid YAML ({str(exc).splitlines()[0]})") from None
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: expected a mapping at the top level")
    return tree


def load_config(path: str | Path | None, overrides: list[str] = ()) -> RunConfig:
    tree = read_config_tree(path) if path is not None else {}
    for o in overrides:
        apply_override(tree, o)
    return config_from_tree(tree)


def config_from_tree(tree: dict) -> RunConfig:
    from asrdist.parallel import strategy_config_class

    known = {"seed", "data", "model", "optim", "train", "strategy", "eval"}
    unknown = sorted(set(tree) - known)
    if unknown:
        raise ConfigError(f"{unknown[0]}: unknown config section (known: {', '.join(sorted(known))})")
    strategy_tree = dict(tree.get("strategy") or {})
    name = str(strategy_tree.pop("name", "single"))
    cls = strategy_config_class(name)
    if cls is None:
        if strategy_tree:
            raise ConfigError(f"strategy.{sorted(strategy_tree)[0]}: unknown config key for strategy '{name}'")
        strategy = None
    else:
        strategy = from_dict(cls, strategy_tree, "strategy")
    sections = {}
    for key, cls_ in (("data", DataConfig), ("model", ModelConfig), ("optim", OptimConfig),
                      ("train", TrainConfig), ("eval", EvalConfig)):
        sections[key] = from_dict(cls_, tree.get(key) or {}, key)
    seed = tree.get("seed", 0)
    if isinstance(seed, bool) or not isinstance(seed, int):
        raise ConfigError(f"seed: expected an integer, got {seed!r}")
    return RunConfig(seed=seed, strategy=strategy, strategy_name=name, **sections)
