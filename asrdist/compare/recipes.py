"""Per-strategy recipes of `asrdist compare`: each strategy trains with its own papers' optimizer
settings on the compared recipe's model and data (configs/recipes/<strategy>.yaml), unless
`--same-recipe`. A recipe file's `optim` section replaces the compared recipe's whole `optim`
section (a key it leaves out takes its default, so nothing of another optimizer leaks in); its
`strategy` keys are set on the strategy. A strategy without a file (single, sync, ...) keeps
the compared recipe. The recipes become `section.key=value` overrides placed before the user's,
so the user's overrides still apply to every run.

A recipe file's `models` lists the model kinds (`model.name`) it was chosen and measured on; for a
compared recipe of another model (AN4's character CTC model, a user's LSTM) the strategy keeps the
compared recipe's optimizer, and `not_applied` says why: an optimizer chosen for one model can
be far off for another (on AN4's CTC model, adpsgd with the DNN's recipe ended at CER 0.36 against
0.075 with the character recipe's; docs/measurements.md#per-strategy-recipes).

A compared recipe may carry its own variant for a strategy beside it: for `configs/an4_chars.yaml`
and onebit, `configs/an4_chars_onebit.yaml`. Where one exists, that strategy takes the variant's
`optim` section and `strategy` keys (its other sections are left out: the comparison keeps the
compared recipe's model and data) instead of configs/recipes/<strategy>.yaml, which was chosen on
another model."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from asrdist.config import load_config
from asrdist.errors import ConfigError
from asrdist.optim.build import OptimConfig

RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipes"
_SECTIONS = ("models", "optim", "strategy")


def recipe_overrides(strategy: str, recipes_dir: Path = RECIPES_DIR, model: str | None = None) -> list[str]:
    """`strategy`'s recipe as overrides ([] without a recipe file, or when `model` is given and is
    not one of the models the recipe lists)."""
    tree, path = _recipe(strategy, recipes_dir), recipes_dir / f"{strategy}.yaml"
    return [] if tree is None or _excluding(tree, path, model) else _overrides(tree, path)


def _recipe(strategy: str, recipes_dir: Path) -> dict | None:
    path = recipes_dir / f"{strategy}.yaml"
    if not path.is_file():
        return None
    tree = _read(path)
    unknown = sorted(map(str, set(tree) - set(_SECTIONS))) if isinstance(tree, dict) else ["(not a mapping)"]
    if unknown:
        raise ConfigError(f"{path}: unknown recipe section '{unknown[0]}' (a recipe holds {', '.join(_SECTIONS)})")
    return tree


def _excluding(tree: dict, path: Path, model: str | None) -> list[str] | None:
    """The model kinds the recipe lists when `model` is not one of them (None: it applies; no
    `models` key, or no `model` given, applies to every model)."""
    models = tree.get("models")
    if models is None:
        return None
    if not isinstance(models, list) or not models or not all(isinstance(m, str) for m in models):
        raise ConfigError(f"{path}: models: a list of model names (model.name), got {models!r}")
    return None if model is None or model in models else models


def variant_path(config: Path, strategy: str) -> Path:
    """Where the compared recipe `config` keeps its own variant for `strategy`."""
    return config.with_name(f"{config.stem}_{strategy}{config.suffix}")


def variant_overrides(config: Path, strategy: str) -> list[str] | None:
    """The `optim` section and `strategy` keys (but its name) of `config`'s own variant for
    `strategy` as overrides; None when there is no such file."""
    path = variant_path(config, strategy)
    if not path.is_file():
        return None
    tree = _read(path)
    if not isinstance(tree, dict):
        raise ConfigError(f"{path}: a recipe is a mapping of sections")
    strategy_keys = dict(tree.get("strategy") or {})
    named = strategy_keys.pop("name", strategy)
    if named != strategy:
        raise ConfigError(f"{path}: strategy.name is {named!r}, but the file name says {strategy!r}")
    return _overrides({"optim": tree.get("optim") or {}, "strategy": strategy_keys}, path)


def _read(path: Path):
    try:
        return yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({' '.join(str(exc).split())})") from None


def _overrides(tree: dict, path: Path) -> list[str]:
    optim = tree.get("optim") or {}
    fields = {f.name: f for f in dataclasses.fields(OptimConfig)}
    bad = sorted(set(optim) - set(fields))
    if bad:
        raise ConfigError(f"{path}: optim.{bad[0]}: unknown key")
    out = []
    if optim:
        for name, f in fields.items():
            value = optim[name] if name in optim else (
                f.default if f.default is not dataclasses.MISSING else f.default_factory())
            out.append(f"optim.{name}={json.dumps(value)}")  # JSON is YAML: null, true, 0.1, "sgd"
    out += [f"strategy.{k}={json.dumps(v)}" for k, v in (tree.get("strategy") or {}).items()]
    return out


def compared_model(config: Path | None, overrides: list[str] = ()) -> str | None:
    """The compared recipe's model kind (`model.name`, the user's `model.*` overrides applied)."""
    if config is None:
        return None
    return load_config(config, [o for o in overrides if o.startswith("model.")]).model.name


def recipes_for(strategies: list[str], same_recipe: bool, config: Path | None = None,
                overrides: list[str] = ()) -> dict[str, list[str]]:
    """strategy -> the overrides of its recipe ([] for every strategy with `same_recipe`): the
    compared recipe `config`'s own variant for it where there is one, else configs/recipes/'s
    where it lists the compared model (`overrides`: the user's, for `model.name`)."""
    if same_recipe:
        return {name: [] for name in strategies}
    model = compared_model(config, overrides)
    out = {}
    for name in strategies:
        own = variant_overrides(Path(config), name) if config is not None else None
        out[name] = own if own is not None else recipe_overrides(name, model=model)
    return out


def not_applied(strategies: list[str], same_recipe: bool, config: Path | None,
                overrides: list[str] = ()) -> dict[str, str]:
    """strategy -> why its recipe file (configs/recipes/) is not used for the compared model: one
    line each, for the command's output and the report."""
    model = None if same_recipe else compared_model(config, overrides)
    if model is None:
        return {}
    out = {}
    for name in strategies:
        tree = _recipe(name, RECIPES_DIR)
        if tree is None or variant_path(Path(config), name).is_file():
            continue
        models = _excluding(tree, RECIPES_DIR / f"{name}.yaml", model)
        if models:
            out[name] = (f"configs/recipes/{name}.yaml was chosen on model {', '.join(models)}, not {model}: "
                         f"{name} trains with the compared recipe's optimizer")
    return out
