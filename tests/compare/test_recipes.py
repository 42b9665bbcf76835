"""Per-strategy recipes of `asrdist compare` (configs/recipes/): each strategy's optimizer section
replaces the compared recipe's whole, its strategy keys are set, the user's overrides still win,
and a bad recipe file is a one-line error naming it."""
from __future__ import annotations


import pytest

from asrdist.compare.recipes import not_applied, recipe_overrides, recipes_for
from asrdist.compare.report import note_lines
from asrdist.compare.runs import resolve_all
from asrdist.errors import ConfigError
from tests.support.compare_fixture import CONFIG, TINY, make_corpus
from tests.support.paths import CONFIGS

STRATEGIES = ["single", "sync", "onebit", "averaging", "adpsgd"]


@pytest.fixture
def corpus(tmp_path):
    return make_corpus(tmp_path / "corpus")


def test_each_strategy_gets_its_papers_optimizer(corpus):
    configs = resolve_all(CONFIG, STRATEGIES, 4, corpus, TINY, recipes=recipes_for(STRATEGIES, same_recipe=False))
    default = configs["sync"].optim  # no recipe file: the compared recipe's (Nesterov SGD)
    assert (default.name, default.momentum, default.nesterov) == ("sgd", 0.9, True)
    assert configs["single"].optim == default
    onebit = configs["onebit"].optim  # Kaldi's optimizer: without momentum, Seide's 1-bit SGD as written
    assert onebit.natural_gradient and onebit.max_change and onebit.momentum == 0.0 and not onebit.nesterov
    assert onebit == configs["adpsgd"].optim
    averaging = configs["averaging"]  # Kaldi: NG-SGD, no momentum, max-change, geometric decay
    assert averaging.optim.natural_gradient and averaging.optim.max_change and averaging.optim.momentum == 0.0
    assert (averaging.optim.decay, averaging.optim.final_lr) == ("geometric", 0.04)
    assert averaging.optim.anneal_after_epoch is None  # the default recipe's annealing does not leak in
    assert (averaging.strategy.average_every, averaging.strategy.scale_lr) == (10000, False)
    adpsgd = configs["adpsgd"].optim  # Kaldi's optimizer for averaged models (docs/training.md)
    assert adpsgd.natural_gradient and adpsgd.max_change and adpsgd.momentum == 0.0
    assert adpsgd.anneal_after_epoch is None and configs["adpsgd"].strategy.pattern == "fixed"
    nodes = recipes_for(["hierarchical", "hybrid"], same_recipe=False)  # ADPSGD between node leaders
    assert nodes["hierarchical"] == nodes["hybrid"] == recipe_overrides("adpsgd")
    # the model and data stay the compared recipe's
    assert len({(c.model.hidden_dim, c.data.batch_size, c.train.epochs) for c in configs.values()}) == 1


def test_same_recipe_and_user_overrides(corpus):
    same = resolve_all(CONFIG, STRATEGIES, 4, corpus, TINY, recipes=recipes_for(STRATEGIES, same_recipe=True))
    assert len({repr(c.optim) for c in same.values()}) == 1
    own = resolve_all(CONFIG, ["averaging"], 4, corpus, [*TINY, "optim.max_change=true", "optim.lr=2.0"],
                      recipes=recipes_for(["averaging"], same_recipe=False))
    assert own["averaging"].optim.natural_gradient  # the recipe's...
    assert own["averaging"].optim.max_change and own["averaging"].optim.lr == 2.0  # ...then the user's


@pytest.mark.parametrize("text, message", [
    ("model:\n  name: dnn\n", "unknown recipe section 'model'"),
    ("optim:\n  learning_rate: 0.1\n", "optim.learning_rate: unknown key"),
    ("optim: [1\n", "not YAML"),
])
def test_a_bad_recipe_file_is_one_line_naming_it(tmp_path, text, message):
    (tmp_path / "sync.yaml").write_text(text)
    with pytest.raises(ConfigError, match=message) as info:
        recipe_overrides("sync", tmp_path)
    assert str(tmp_path / "sync.yaml") in str(info.value) and "\n" not in str(info.value)
    assert recipe_overrides("single", tmp_path) == []  # no file: the compared recipe


def test_a_recipes_own_variant_for_a_strategy_replaces_the_papers_recipe(corpus, tmp_path):
    compared = tmp_path / "mine.yaml"
    compared.write_text(CONFIG.read_text())
    (tmp_path / "mine_onebit.yaml").write_text(
        "model:\n  hidden_dim: 7\n"  # left out: the comparison keeps the compared recipe's model
        "optim:\n  name: adagrad\n  lr: 10.0\n  adagrad_skip_unseen: true\n"
        "strategy:\n  name: onebit\n  double_buffering: true\n")
    recipes = recipes_for(["sync", "onebit", "averaging"], same_recipe=False, config=compared)
    assert recipes["averaging"] == recipe_overrides("averaging")  # no variant: configs/recipes/
    configs = resolve_all(compared, ["sync", "onebit", "averaging"], 2, corpus, TINY, recipes=recipes)
    onebit = configs["onebit"]
    assert (onebit.optim.name, onebit.optim.lr, onebit.optim.momentum) == ("adagrad", 10.0, 0.0)
    assert onebit.strategy.double_buffering
    assert onebit.model == configs["sync"].model
    assert recipes_for(["onebit"], same_recipe=True, config=compared) == {"onebit": []}


def test_a_variant_naming_another_strategy_is_one_line(tmp_path):
    compared = tmp_path / "mine.yaml"
    compared.write_text(CONFIG.read_text())
    (tmp_path / "mine_onebit.yaml").write_text("strategy:\n  name: sync\n")
    with pytest.raises(ConfigError, match="strategy.name is 'sync', but the file name says 'onebit'") as info:
        recipes_for(["onebit"], same_recipe=False, config=compared)
    assert "mine_onebit.yaml" in str(info.value) and "\n" not in str(info.value)


def test_the_an4_character_recipe_compares_onebit_with_its_own_variant():
    an4 = CONFIGS / "an4_chars.yaml"
    overrides = recipes_for(["onebit", "sync"], same_recipe=False, config=an4)
    assert "optim.lr=10.0" in overrides["onebit"] and "optim.name=\"adagrad\"" in overrides["onebit"]
    assert overrides["sync"] == []


def test_recipes_chosen_on_the_dnn_leave_other_models_their_own_optimizer(corpus):
    """configs/recipes/ lists the models each recipe was measured on: AN4's CTC model keeps the
    character recipe's optimizer for adpsgd and the others, and the report says why."""
    an4 = CONFIGS / "an4_chars.yaml"
    names = ["sync", "averaging", "adpsgd", "hierarchical", "hybrid", "onebit"]
    recipes = recipes_for(names, same_recipe=False, config=an4)
    assert all(recipes[n] == [] for n in ("adpsgd", "hierarchical", "hybrid"))
    assert "optim.lr=10.0" in recipes["onebit"]  # its own variants beside the recipe still win
    assert "strategy.average_every=5000" in recipes["averaging"] and "optim.lr=0.35" in recipes["averaging"]
    why = not_applied(names, same_recipe=False, config=an4)
    assert set(why) == {"adpsgd", "hierarchical", "hybrid"}
    assert why["adpsgd"] == ("configs/recipes/adpsgd.yaml was chosen on model dnn, not ctc: adpsgd trains with "
                             "the compared recipe's optimizer")
    assert not_applied(names, same_recipe=True, config=an4) == {}
    assert note_lines({"runs": [], "recipes_not_applied": why})[-3:] == list(why.values())  # after the table
    # the DNN gets them, and a user's model.name override decides as the recipe's own would
    assert recipes_for(["adpsgd"], same_recipe=False, config=CONFIG)["adpsgd"] == recipe_overrides("adpsgd")
    assert not_applied(["adpsgd"], same_recipe=False, config=CONFIG) == {}
    assert recipes_for(["adpsgd"], same_recipe=False, config=CONFIG, overrides=["model.name=lstm"])["adpsgd"] == []
    configs = resolve_all(an4, ["adpsgd"], 2, corpus, TINY, recipes=recipes)
    assert (configs["adpsgd"].optim.momentum, configs["adpsgd"].optim.natural_gradient) == (0.9, False)


def test_a_recipes_models_must_be_a_list_of_names(tmp_path):
    (tmp_path / "adpsgd.yaml").write_text("models: dnn\noptim:\n  lr: 0.4\n")
    with pytest.raises(ConfigError, match="models: a list of model names") as info:
        recipe_overrides("adpsgd", tmp_path, model="dnn")
    assert str(tmp_path / "adpsgd.yaml") in str(info.value) and "\n" not in str(info.value)
    with pytest.raises(ConfigError, match="models: a list of model names"):
        recipe_overrides("adpsgd", tmp_path)  # read at all, it is checked
    (tmp_path / "adpsgd.yaml").write_text("optim:\n  lr: 0.4\n")  # no models: every model
    assert "optim.lr=0.4" in recipe_overrides("adpsgd", tmp_path, model="ctc")
