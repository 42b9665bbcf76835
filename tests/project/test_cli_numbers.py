"""Numeric command-line options: every one is range-checked when parsed (asrdist.checks.cli_number /
cli_list), so a zero, negative, non-finite or malformed value is argparse's usage error naming the
option, before any work starts, instead of a traceback minutes later."""
from __future__ import annotations

import argparse
import math

import pytest

from asrdist.checks import cli_list, cli_number
from asrdist.cli import build_parser, main


def _numeric_actions(parser: argparse.ArgumentParser, path: str):
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield from _numeric_actions(sub, f"{path} {name}")
        else:
            yield path, action


def test_no_command_takes_an_unchecked_number():
    unchecked = [f"{path} {'/'.join(a.option_strings) or a.dest}"
                 for path, a in _numeric_actions(build_parser(), "asrdist")
                 if a.type in (int, float) and a.choices is None]
    assert unchecked == [], f"use asrdist.checks.cli_number for: {unchecked}"


def test_cli_number_parses_within_bounds_and_refuses_the_rest():
    positive = cli_number(int, at_least=1)
    assert positive("3") == 3 and positive("1_000") == 1000
    for bad in ("0", "-2", "x", "1.5", ""):
        with pytest.raises(argparse.ArgumentTypeError, match=r"expected an integer >= 1, got"):
            positive(bad)
    rate = cli_number(float, above=0, at_most=1)
    assert rate("1e-3") == 1e-3 and rate("1") == 1.0
    for bad in ("0", "1.5", "nan", "inf", "-inf", "1e400"):
        with pytest.raises(argparse.ArgumentTypeError, match=r"expected a number > 0 and <= 1"):
            rate(bad)
    anything = cli_number(float)
    assert anything("-40") == -40.0
    with pytest.raises(argparse.ArgumentTypeError):
        anything("nan")
    assert not math.isnan(cli_number(float, at_least=0)("0"))
    with pytest.raises(TypeError, match="unknown bounds"):  # a misspelt bound fails where it is written
        cli_number(int, atleast=1)


def test_cli_list_parses_every_item_and_refuses_the_empty_list_unless_allowed():
    widths = cli_list(int, at_least=1)
    assert widths("1024, 2048,") == [1024, 2048]
    for bad in ("", ",", "a,b", "4,0", "4,x"):
        with pytest.raises(argparse.ArgumentTypeError, match="comma-separated list of integers >= 1"):
            widths(bad)
    assert cli_list(int, empty=True, at_least=1)("") == []


@pytest.mark.parametrize("argv, option, expected", [
    (["bench", "trainer", "--rounds", "0"], "--rounds", "an integer >= 1"),
    (["bench", "trainer", "--threads", "-1"], "--threads", "an integer >= 0"),
    (["bench", "ngsgd", "--blocks", "0"], "--blocks", "an integer >= 1"),
    (["bench", "ngsgd", "--widths", "a,b"], "--widths", "a comma-separated list of integers >= 1"),
    (["bench", "ngsgd", "--learners", "0"], "--learners", "an integer >= 2"),
    (["bench", "straggler", "--slowdown", "nan"], "--slowdown", "a number >= 1 and <= 1000"),
    (["bench", "scaling", "--learners", ""], "--learners", "a comma-separated list of integers >= 1"),
    (["bench", "comm", "--timeout", "-5"], "--timeout", "a number > 0"),
    (["bench", "compare", "--learners", "0"], "--learners", "an integer >= 1"),
    (["features", "data", "--num-mel-bins", "200"], "--num-mel-bins", "an integer >= 10 and <= 128"),
    (["corpus", "synth", "out", "--utterances", "0"], "--utterances", "an integer >= 3"),
    (["train", "recipe.yaml", "--epochs", "0"], "--epochs", "an integer >= 1"),
    (["eval", "run", "--data", "d", "--adapt-rounds", "-1"], "--adapt-rounds", "an integer >= 0"),
    (["eval", "run", "--data", "d", "--adapt-word-balance", "inf"], "--adapt-word-balance",
     "a number >= 0 and <= 100"),
    (["eval", "run", "--data", "d", "--min-duration", "0"], "--min-duration", "an integer >= 1 and <= 100"),
    (["eval", "run", "--data", "d", "--acoustic-scale", "0"], "--acoustic-scale", "a number > 0 and <= 100"),
    (["decode", "run", "a.wav", "--prior-scale", "-1"], "--prior-scale", "a number >= 0 and <= 10"),
    (["decode", "run", "a.wav", "--adapt-word-balance", "-1"], "--adapt-word-balance", "a number >= 0 and <= 100"),
    (["compare", "recipe.yaml", "--out", "o", "--learners", "-3"], "--learners", "an integer >= 1"),
    (["demo", "--epochs", "zero"], "--epochs", "an integer >= 1"),
])
def test_a_bad_number_is_a_usage_error_naming_the_option(argv, option, expected, capsys, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # nothing may be written, wherever it would go
    with pytest.raises(SystemExit) as exit_info:
        main(argv + ["--json", str(tmp_path / "out.json")] if argv[0] == "bench" else argv)
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert f"argument {option}: expected {expected}, got" in err
    assert "Traceback" not in err and list(tmp_path.iterdir()) == []
    assert len(err.splitlines()) == 1 and err.startswith("asrdist: error: ")  # one line, as every asrdist error


@pytest.mark.parametrize("argv, line", [
    ([], "asrdist: error: the following arguments are required: COMMAND (see asrdist --help)"),
    (["corpus", "synth"], "asrdist: error: corpus synth: the following arguments are required: out "
                          "(see asrdist corpus synth --help)"),
    (["train", "recipe.yaml", "--bogus"], "asrdist: error: train: unrecognized arguments: --bogus "
                                          "(see asrdist train --help)"),
])
def test_a_usage_error_is_one_line_naming_the_command(argv, line, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2 and capsys.readouterr().err.splitlines() == [line]


def test_bench_ngsgd_refuses_a_global_batch_smaller_than_its_learners_before_timing(capsys, tmp_path):
    out = tmp_path / "ngsgd.json"
    rc = main(["bench", "ngsgd", "--learners", "8", "--global-batch", "4", "--json", str(out)])
    assert rc != 0 and not out.exists()
    err = capsys.readouterr().err.strip().splitlines()
    assert err == ["asrdist: error: bench ngsgd: --global-batch (4) must give each of the 8 learners at least "
                   "one sample"]


def test_bench_straggler_refuses_a_straggler_outside_the_job(capsys, tmp_path):
    rc = main(["bench", "straggler", "--learners", "2", "--straggler-rank", "2", "--json", str(tmp_path / "s.json")])
    assert rc != 0
    assert capsys.readouterr().err.strip() == ("asrdist: error: bench straggler: --straggler-rank must be below "
                                               "--learners (2), got 2")
