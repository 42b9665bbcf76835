"""Config checks that used to be missing, and `--resume` keeping the first start's config.yaml.

Defects: train.log_every=0 divided by zero in the trainer; other train.* ranges, the straggler
settings, data.batch_size vs train.learners and `--strategy single` with several learners were
never checked (or only inside the learners, after the run directory was made); `--resume`
rewrote RUN/config.yaml, losing the record of what produced the first steps.
"""
from __future__ import annotations

import dataclasses
import json
import math
import types
import typing
from pathlib import Path

import pytest
import torch
import yaml

from asrdist.cli import main
from asrdist import config as config_module
from asrdist.config import config_from_tree, load_config
from asrdist.errors import ConfigError
from asrdist.parallel import STRATEGIES, strategy_config_class
from asrdist.run import launch
from tests.corpus_fixture import make_tone_corpus

ROOT = Path(__file__).resolve().parents[1]
RECIPE = str(ROOT / "configs/default.yaml")
TINY = ["data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1", "optim.warmup_steps=0",
        "optim.anneal_after_epoch=null", "train.log_every=5", "train.threads=1"]

# override -> (the key the message names, the allowed range it states)
BAD = {
    "train.log_every=0": ("train.log_every", ">= 1"),
    "train.validate_every_epochs=0": ("train.validate_every_epochs", ">= 1"),
    "train.threads=-1": ("train.threads", ">= 0"),
    "train.timeout_seconds=0": ("train.timeout_seconds", "> 0"),
    "train.timeout_seconds=-5": ("train.timeout_seconds", "> 0"),
    "train.max_steps=-1": ("train.max_steps", ">= 0"),
    "train.checkpoint_every=-1": ("train.checkpoint_every", ">= 0"),
    "train.epochs=0": ("train.epochs", ">= 1"),
    "train.learners=0": ("train.learners", ">= 1"),
    "train.straggler.ranks=[-1]": ("train.straggler.ranks", ">= 0"),
    "train.straggler.slowdown=0.5": ("train.straggler.slowdown", ">= 1"),
    "train.straggler.jitter=-0.1": ("train.straggler.jitter", ">= 0"),
    "data.window_utterances=0": ("data.window_utterances", ">= 1"),
    "eval.bigram_smoothing=-1": ("eval.bigram_smoothing", ">= 0"),
    "eval.beam=-1": ("eval.beam", ">= 0"),
}
# with 2 learners under sync: -> (key, allowed range)
BAD_FOR_TWO = {
    "train.straggler.ranks=[2]": ("train.straggler.ranks", "[0, 1]"),
    "train.straggler.ranks=[0,5]": ("train.straggler.ranks", "[0, 1]"),
    "train.straggler.ranks=[1,1]": ("train.straggler.ranks", "rank 1 given twice"),
    "data.batch_size=255": ("data.batch_size", "multiple of train.learners = 2"),
    "train.group_size=3": ("train.group_size", "does not divide train.learners = 2"),
}


def _assert_names(message: str, key: str, allowed: str) -> None:
    assert "\n" not in message and message.startswith(f"{key}:") and allowed in message, message


@pytest.mark.parametrize("override", sorted(BAD))
def test_out_of_range_values_are_refused_by_the_loader(override):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, [override])
    _assert_names(str(err.value), *BAD[override])


@pytest.mark.parametrize("override", sorted(BAD_FOR_TWO))
def test_values_that_do_not_fit_the_learners_are_refused(override):
    with pytest.raises(ConfigError) as err:
        load_config(RECIPE, ["strategy.name=sync", "train.learners=2", override])
    _assert_names(str(err.value), *BAD_FOR_TWO[override])
    load_config(RECIPE, ["strategy.name=sync", "train.learners=2", "train.straggler.ranks=[1]"])  # in range


def test_single_strategy_means_one_learner():
    with pytest.raises(ConfigError) as err:
        config_from_tree({"train": {"learners": 2}})
    _assert_names(str(err.value), "train.learners", "exactly 1 learner")


def test_check_field_is_the_one_range_check():
    check_field = config_module.check_field
    assert check_field("a.b", 3, at_least=1) == 3
    assert check_field("a.b", 2, float, above=0) == 2
    assert check_field("a.b", True, bool) is True
    for value, kind, bounds, expected in [
        (0, int, {"at_least": 1}, "a.b: expected an integer >= 1, got 0"),
        (True, int, {"at_least": 0}, "a.b: expected an integer >= 0, got True"),
        ("5", int, {}, "a.b: expected an integer, got '5'"),
        (1.5, int, {}, "a.b: expected an integer, got 1.5"),
        (math.inf, float, {"above": 0}, "a.b: expected a number > 0, got inf"),
        (math.nan, float, {}, "a.b: expected a number, got nan"),
        (1, bool, {}, "a.b: expected true/false, got 1"),
        (2.0, float, {"at_least": 0, "at_most": 1}, "a.b: expected a number >= 0 and <= 1, got 2.0"),
    ]:
        with pytest.raises(ConfigError) as err:
            check_field("a.b", value, kind, **bounds)
        assert str(err.value) == expected


# ------------------------------------------------------------------ through `asrdist train`

@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus", utterances_per_speaker=6)
    assert main(["features", str(path)]) == 0
    return path


@pytest.mark.slow
@pytest.mark.parametrize("argv,key", [
    (["train.log_every=0"], "train.log_every"),
    (["data.batch_size=100", "--learners", "3", "--strategy", "sync"], "data.batch_size"),
    (["train.straggler.ranks=[4]", "--learners", "2", "--strategy", "sync"], "train.straggler.ranks"),
    (["--learners", "2", "--strategy", "single"], "train.learners"),
])
def test_train_on_a_real_corpus_refuses_without_a_run_directory(corpus, tmp_path, capsys, argv, key):
    out = tmp_path / "run"
    assert main(["train", RECIPE, *TINY, *argv, "--data", str(corpus), "--epochs", "1", "--out", str(out),
                 "--no-progress"]) != 0
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith(f"asrdist: error: {key}:"), err
    assert not out.exists()


def _resume(run: Path, *argv: str) -> int:
    return main(["train", RECIPE, "--resume", str(run), *argv, "--no-progress"])


def _snapshot(run: Path) -> dict[str, tuple[int, int]]:
    return {str(p.relative_to(run)): (p.stat().st_mtime_ns, p.stat().st_size) for p in run.rglob("*")}


@pytest.mark.slow
def test_resume_keeps_config_yaml_and_records_the_resumed_config(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", RECIPE, *TINY, "train.checkpoint_every=3", "train.max_steps=4", "--data", str(corpus),
                 "--epochs", "1", "--out", str(run), "--no-progress"]) == 0
    original = (run / "config.yaml").read_bytes()

    assert _resume(run, "--epochs", "2", "train.max_steps=0") == 0
    assert (run / "config.yaml").read_bytes() == original
    assert yaml.safe_load(original)["train"]["epochs"] == 1
    resumed = yaml.safe_load((run / "config-resume-1.yaml").read_text())
    assert resumed["train"]["epochs"] == 2 and resumed["train"]["max_steps"] == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["epochs"] == 2  # the learner ran with the resumed config
    assert torch.load(run / "model.pt", weights_only=False)["config"]["train"]["epochs"] == 2
    assert launch.run_config_path(run) == run / "config-resume-1.yaml"  # what learners read next

    # a resume that fails (unknown key, bad value) writes nothing at all
    before = _snapshot(run)
    assert _resume(run, "train.bogus=1") != 0
    assert _resume(run, "train.log_every=0") != 0
    assert capsys.readouterr().err.count("asrdist: error:") == 2
    assert _snapshot(run) == before


def test_run_config_path_picks_the_latest_resume(tmp_path):
    for name in ("config.yaml", "config-resume-1.yaml", "config-resume-2.yaml", "config-resume-10.yaml",
                 "config-resume-x.yaml"):
        (tmp_path / name).write_text("{}\n")
    assert launch.run_config_path(tmp_path) == tmp_path / "config-resume-10.yaml"


@pytest.mark.slow
def test_resume_without_a_checkpoint_trains_from_the_start(corpus, tmp_path, capsys):
    """A run with no checkpoint (prepared and never started, or killed before its first): --resume
    trains it from the start and says so (issue 37: it used to point at torchrun, or in a circle)."""
    run = tmp_path / "run"
    cfg = load_config(RECIPE, [f"data.corpus={corpus}", *TINY])
    launch.prepare_run_dir(cfg, run, progress=False)
    (run / "launcher.log").write_text("a start that stopped before its first checkpoint\n")
    assert _resume(run, "--epochs", "1") == 0
    err = capsys.readouterr().err
    assert f"{run}: no checkpoint to resume from (prepared" in err and "training from the start" in err, err
    assert "asrdist: error" not in err and (run / "summary.json").is_file()
    assert json.loads((run / "state.json").read_text())["state"] == "finished"


# ------------------------------------------------------------------ every numeric field of every section

def _numeric_fields(cls, prefix: str):
    """(key, is_list) of every int/float field of a config dataclass, nested sections included."""
    hints = typing.get_type_hints(cls)
    for f in dataclasses.fields(cls):
        tp = hints[f.name]
        if typing.get_origin(tp) in (typing.Union, types.UnionType):
            tp = next(a for a in typing.get_args(tp) if a is not type(None))
        if dataclasses.is_dataclass(tp):
            yield from _numeric_fields(tp, f"{prefix}{f.name}.")
        elif tp in (int, float):
            yield f"{prefix}{f.name}", False
        elif typing.get_origin(tp) is list and typing.get_args(tp)[0] in (int, float):
            yield f"{prefix}{f.name}", True


def _every_numeric_field() -> list[tuple[str, bool, list[str]]]:
    fields = [(key, is_list, []) for section, cls in config_module.config_sections().items()
              for key, is_list in _numeric_fields(cls, f"{section}.")]
    for name in STRATEGIES:
        cls = strategy_config_class(name)
        if cls is not None:
            fields += [(key, is_list, [f"strategy.name={name}", "train.learners=2"])
                       for key, is_list in _numeric_fields(cls, "strategy.")]
    return fields


NUMERIC_FIELDS = _every_numeric_field()


def test_the_walk_finds_every_section_and_strategy():
    keys = {key for key, _, _ in NUMERIC_FIELDS}
    assert {"optim.lr", "model.dropout", "train.straggler.slowdown", "data.batch_size", "eval.beam",
            "strategy.bucket_cap_mb", "strategy.exclude_threshold", "strategy.sync_epochs"} <= keys
    assert len(NUMERIC_FIELDS) >= 50


@pytest.mark.parametrize("key,is_list,context", NUMERIC_FIELDS, ids=[f"{k}({c[0][14:] if c else ''})" for k, _, c in NUMERIC_FIELDS])
def test_every_numeric_field_has_a_checked_range(key, is_list, context):
    """Issue 12 item 1: far out of range, not finite, or not a number: one line naming the key."""
    for bad in ("-1000000000", ".nan", ".inf", "-.inf", "abc"):
        override = f"{key}=[{bad}]" if is_list else f"{key}={bad}"
        with pytest.raises(ConfigError) as err:
            load_config(RECIPE, [*context, override])
        message = str(err.value)
        assert "\n" not in message and message.startswith(key), (override, message)


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


def test_a_job_too_large_for_this_machine_is_refused_and_oversubscribed_threads_noted(monkeypatch, capsys):
    from asrdist.config import load_config
    from asrdist.errors import ConfigError
    from asrdist.run import launch

    cfg = load_config(str(ROOT / "configs/default.yaml"))
    monkeypatch.setattr(launch, "_available_memory", lambda: 24 * 2 ** 30)
    monkeypatch.setattr(launch.os, "cpu_count", lambda: 2)
    cfg.train.learners, cfg.train.threads = 300, 1
    with pytest.raises(ConfigError, match=r"train.learners: 300 learners need about \d+\.\d GiB here .* 24.0 GiB"):
        launch.check_this_machine(cfg)
    cfg.train.learners = 4
    launch.check_this_machine(cfg)
    assert "train.threads=1 x 4 learner(s) = 4 threads on 2 core(s): oversubscribed" in capsys.readouterr().err
    cfg.train.learners, cfg.train.threads = 2, 0
    launch.check_this_machine(cfg)
    assert capsys.readouterr().err == ""


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
