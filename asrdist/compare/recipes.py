"""Per-strategy recipes of `asrdist compare`: each strategy trains with its own papers' optimizer
settings on the compared recipe's model and data (configs/recipes/<strategy>.yaml), unless
`--same-recipe`. A recipe file's `optim` section replaces the compared recipe's whole `optim`
section (a key it leaves out takes its default, so nothing of another optimizer leaks in); its
`strategy` keys are set on the strategy. A strategy without a file (single, sync, ...) keeps
the compared recipe. The recipes become `section.key=value` overrides placed before the user's,
so the user's overrides still apply to every run."""
from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import yaml

from asrdist.errors import ConfigError
from asrdist.optim.build import OptimConfig

RECIPES_DIR = Path(__file__).resolve().parents[2] / "configs" / "recipes"
_SECTIONS = ("optim", "strategy")


def recipe_overrides(strategy: str, recipes_dir: Path = RECIPES_DIR) -> list[str]:
    """`strategy`'s recipe as overrides ([] without a recipe file)."""
    path = recipes_dir / f"{strategy}.yaml"
    if not path.is_file():
        return []
    try:
        tree = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
    except yaml.YAMLError as exc:
        raise ConfigError(f"{path}: not YAML ({' '.join(str(exc).split())})") from None
    unknown = sorted(map(str, set(tree) - set(_SECTIONS))) if isinstance(tree, dict) else ["(not a mapping)"]
    if unknown:
        raise ConfigError(f"{path}: unknown recipe section '{unknown[0]}' (a recipe holds {', '.join(_SECTIONS)})")
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


def recipes_for(strategies: list[str], same_recipe: bool) -> dict[str, list[str]]:
    """strategy -> the overrides of its recipe ([] for every strategy with `same_recipe`)."""
    return {name: [] if same_recipe else recipe_overrides(name) for name in strategies}
