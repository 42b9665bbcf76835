"""How a recipe, its `section.key=value` overrides and `asrdist train`'s flags combine: an override
that is not YAML, a flag and an override of the same key, `--strategy` naming the recipe's
settings it drops, an empty section filled by an override."""
from __future__ import annotations


import pytest

from asrdist.config import load_config
from asrdist.errors import ConfigError
from tests.support.paths import ROOT

RECIPE = str(ROOT / "configs/default.yaml")


def test_switching_strategy_names_the_recipe_strategy_settings_it_drops(tmp_path, capsys):
    """--strategy X on a recipe written for strategy Y trains X from its defaults: the settings of Y
    it leaves out are named, so `pattern: random` is not thought to reach hierarchical."""
    import argparse

    from asrdist.run.launch import resolve_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("strategy:\n  name: adpsgd\n  pattern: random\n  delay_by_one: true\n")
    args = argparse.Namespace(config=str(recipe), overrides=[], data=None, epochs=None, learners=None, resume=None,
                              strategy="hierarchical")
    cfg = resolve_config(args)
    assert cfg.strategy_name == "hierarchical" and cfg.strategy.pattern == "fixed"
    assert ("--strategy hierarchical: the recipe's settings of strategy adpsgd (delay_by_one, pattern) are not used"
            in capsys.readouterr().err)
    args.strategy = "adpsgd"  # the recipe's own: kept, nothing to say
    assert resolve_config(args).strategy.pattern == "random" and capsys.readouterr().err == ""
    # a setting given again on the command line is used, and not named as left out
    args.strategy, args.overrides = "hierarchical", ["strategy.pattern=random"]
    assert resolve_config(args).strategy.pattern == "random"
    assert "adpsgd (delay_by_one) are not used" in capsys.readouterr().err


@pytest.mark.parametrize("flag, value, override", [("learners", 3, "train.learners=5"), ("epochs", 2, "train.epochs=2"),
                                                   ("data", "corpus", "data.corpus=other")])
def test_a_flag_and_an_override_of_the_same_key_are_refused(tmp_path, flag, value, override):
    import argparse

    from asrdist.run.launch import resolve_config

    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("strategy:\n  name: sync\n")
    args = argparse.Namespace(config=str(recipe), overrides=[override], data=None, epochs=None, learners=None,
                              resume=None, strategy=None)
    setattr(args, flag, value)
    key = override.split("=")[0]
    with pytest.raises(ConfigError, match=f"^{key}: given twice, as --{flag} {value} and as {override}; keep one$"):
        resolve_config(args)


@pytest.mark.parametrize("value", ["[1", "{", "*x", "@", "`", "'", "%x", "!!binary x", "!!python/name:os.system"])
def test_an_override_that_is_not_yaml_is_one_line(value):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, [f"optim.lr={value}"])
    message = str(err.value)
    assert "\n" not in message and message.startswith(f"override 'optim.lr={value}': the value is not YAML ("), message


def test_an_empty_section_takes_overrides(tmp_path):
    """`data:` with nothing under it is YAML's null: an override of one of its keys fills it."""
    recipe = tmp_path / "r.yaml"
    recipe.write_text("data:\nmodel:\n  hidden_dim: 16\n")
    cfg = load_config(recipe, ["data.corpus=/some/corpus"])
    assert cfg.data.corpus == "/some/corpus" and cfg.model.hidden_dim == 16
