"""Every recipe shipped under configs/ loads: a typo in a key or a value out of range fails here
rather than in a user's first `asrdist train`."""
from __future__ import annotations


import pytest

from asrdist.compare.recipes import RECIPES_DIR, recipe_overrides
from asrdist.config import load_config
from tests.support.paths import ROOT

RECIPES = sorted((ROOT / "configs").glob("*.yaml"))
STRATEGY_RECIPES = sorted(RECIPES_DIR.glob("*.yaml"))


def test_the_shipped_recipes_are_found():
    assert {"default.yaml", "an4_chars.yaml", "an4_chars_onebit.yaml", "an4_chars_averaging.yaml"} <= {
        p.name for p in RECIPES}
    assert STRATEGY_RECIPES


@pytest.mark.parametrize("path", RECIPES, ids=lambda p: p.name)
def test_a_shipped_recipe_loads(path):
    cfg = load_config(path)
    assert cfg.train.epochs >= 1


@pytest.mark.parametrize("path", STRATEGY_RECIPES, ids=lambda p: p.name)
def test_a_strategy_recipe_applies_to_the_default_recipe(path):
    overrides = recipe_overrides(path.stem)
    assert overrides
    cfg = load_config(ROOT / "configs" / "default.yaml", [*overrides, f"strategy.name={path.stem}"])
    assert cfg.strategy_name == path.stem


def test_the_an4_onebit_recipe_is_the_character_recipe_but_for_its_optimizer_and_strategy():
    chars, onebit = load_config(ROOT / "configs/an4_chars.yaml"), load_config(ROOT / "configs/an4_chars_onebit.yaml")
    assert (chars.data, chars.model, chars.eval) == (onebit.data, onebit.model, onebit.eval)
    assert (chars.train.epochs, chars.optim.warmup_steps, chars.optim.anneal_after_epoch, chars.optim.anneal_factor) \
        == (onebit.train.epochs, onebit.optim.warmup_steps, onebit.optim.anneal_after_epoch, onebit.optim.anneal_factor)
    assert (onebit.strategy_name, onebit.optim.name, onebit.optim.momentum) == ("onebit", "adagrad", 0.0)


def test_the_an4_averaging_recipe_is_the_character_recipe_but_for_its_strategy():
    chars = load_config(ROOT / "configs/an4_chars.yaml")
    averaging = load_config(ROOT / "configs/an4_chars_averaging.yaml")
    assert (chars.data, chars.model, chars.optim, chars.eval, chars.train.epochs) == (
        averaging.data, averaging.model, averaging.optim, averaging.eval, averaging.train.epochs)
    assert (averaging.strategy_name, averaging.strategy.average_every, averaging.train.learners) == ("averaging", 5000, 4)
