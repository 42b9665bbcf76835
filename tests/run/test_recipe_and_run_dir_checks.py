"""Recipes of the wrong shape and run directories that cannot take a run: one line each, before
anything is written (found by a bad-input sweep of `asrdist train`)."""
from __future__ import annotations

import pytest

from asrdist.cli import main
from asrdist.config import read_config_tree
from asrdist.errors import ConfigError


@pytest.mark.parametrize("text, message", [
    ("data: 5\n", "data: expected a section"),
    ("data:\n  - corpus: x\n", "data: expected a section"),
    ("strategy: [sync]\n", "strategy: expected a section"),
    ("1: a\nfoo: b\n", ":1: key 1 is not a name"),
    ("optim:\n  lr: 0.1\n  momentum: 0.9\noptim:\n  lr: 0.2\n", ":4: key 'optim' given twice"),
    ("optim:\n  lr: 0.1\n  lr: 0.2\n", ":3: key 'lr' given twice"),
])
def test_a_recipe_of_the_wrong_shape_is_one_line(tmp_path, text, message):
    path = tmp_path / "recipe.yaml"
    path.write_text(text)
    with pytest.raises(ConfigError, match=message):
        read_config_tree(path)


def test_recipes_read_exponents_as_numbers_and_a_strategy_name_as_its_section(tmp_path):
    path = tmp_path / "recipe.yaml"
    path.write_text("strategy: sync\noptim:\n  lr: 1e-3\n  weight_decay: 5E-5\ndata:\n  corpus: 1e5\n")
    tree = read_config_tree(path)
    assert tree["optim"] == {"lr": 0.001, "weight_decay": 5e-5} and tree["strategy"] == {"name": "sync"}
    (tmp_path / "binary.yaml").write_bytes(b"\xff\xfeabc")
    with pytest.raises(ConfigError, match="not a UTF-8 text file"):
        read_config_tree(tmp_path / "binary.yaml")
    with pytest.raises(ConfigError, match="is a directory"):
        read_config_tree(tmp_path)


def test_train_refuses_run_directories_that_would_overwrite_or_land_in_the_corpus(tone_corpus, tmp_path, capsys):
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "config.yaml").write_text("my own notes\n")
    afile = tmp_path / "afile"
    afile.write_text("keep\n")
    cases = [(mine, "already used"), (tone_corpus / "train" / "run", "inside the corpus"),
             (afile, "is an existing file"), (afile / "sub", f"{afile} is a file")]
    for out, message in cases:
        code = main(["train", "configs/default.yaml", "--data", str(tone_corpus), "--out", str(out), "--no-progress"])
        err = capsys.readouterr().err
        assert code != 0 and message in err and "Traceback" not in err, err
    assert (mine / "config.yaml").read_text() == "my own notes\n" and afile.read_text() == "keep\n"
    assert not (tone_corpus / "train" / "run").exists()
