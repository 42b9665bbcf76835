"""Every config value is range-checked by the loader (`load_config`), in one line naming the key
and the range it allows: each section's numeric fields (found by walking the config dataclasses,
every strategy's included), values that must fit the number of learners, `check_field` itself,
and a job too large for this machine."""
from __future__ import annotations

import dataclasses
import math
import types
import typing

import pytest

from asrdist import config as config_module
from asrdist.config import config_from_tree, load_config
from asrdist.errors import ConfigError
from asrdist.parallel import STRATEGIES, strategy_config_class
from tests.support.paths import ROOT

RECIPE = str(ROOT / "configs/default.yaml")

# override -> (the key the message names, the allowed range it states)
BAD = {
    "train.log_every=0": ("train.log_every", ">= 1"),
    "train.validate_every_epochs=0": ("train.validate_every_epochs", ">= 1"),
    "train.validate_every=-1": ("train.validate_every", ">= 0"),
    "train.threads=-1": ("train.threads", ">= 0"),
    "train.timeout_seconds=0": ("train.timeout_seconds", "> 0"),
    "train.timeout_seconds=-5": ("train.timeout_seconds", "> 0"),
    "train.max_steps=-1": ("train.max_steps", ">= 0"),
    "train.checkpoint_every=-1": ("train.checkpoint_every", ">= 0"),
    "train.epochs=0": ("train.epochs", ">= 1"),
    "train.average_last=0": ("train.average_last", ">= 1"),
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
    """Far out of range, not finite, or not a number: one line naming the key."""
    for bad in ("-1000000000", ".nan", ".inf", "-.inf", "abc"):
        override = f"{key}=[{bad}]" if is_list else f"{key}={bad}"
        with pytest.raises(ConfigError) as err:
            load_config(RECIPE, [*context, override])
        message = str(err.value)
        assert "\n" not in message and message.startswith(key), (override, message)


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

