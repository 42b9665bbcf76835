"""`asrdist simulate` refuses bad input in one line naming the option, simulates learners that move
alike once (with the same figures as learner by learner), and refuses up front what would take
minutes."""
from __future__ import annotations

import json

import pytest

from asrdist.cli import main
from asrdist.sim import alike
from asrdist.sim.cluster import LINKS, Cluster
from asrdist.sim.engine import simulate
from asrdist.sim.spec import SimSpec
from asrdist.sim.scenario import strategy_config

SHAPES = [(512, 440), (512,), (512, 512), (512,), (40, 512), (40,)]


@pytest.mark.parametrize("option, value", [
    ("--seconds-per-frame", "0"), ("--seconds-per-frame", "nan"), ("--seconds-per-frame", "inf"),
    ("--global-batch", "0"), ("--global-batch", "-8"), ("--global-batch", "1.5"),
    ("--quantize-ns", "-1"), ("--quantize-ns", "nan"),
    ("--frames-per-epoch", "0"), ("--frames-per-epoch", "inf"),
    ("--epochs", "0"), ("--epochs", "two"),
    ("--jitter", "-0.1"), ("--jitter", "nan"),
])
def test_a_bad_number_is_argparse_usage_error_naming_the_option(option, value, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["simulate", f"{option}={value}"])
    assert exit.value.code == 2
    assert f"argument {option}: expected" in capsys.readouterr().err


@pytest.mark.parametrize("args, message", [
    (["--cluster", "0x8"], "--cluster: expected NODESxPER_NODE"),
    (["--cluster", "2x-1"], "--cluster: expected NODESxPER_NODE"),
    (["--cluster", "nanx2"], "--cluster: expected NODESxPER_NODE"),
    (["--cluster", "2x2x2"], "--cluster: expected NODESxPER_NODE"),
    (["--cluster", "100000x8"], "--cluster: at most 65536 learners"),
    (["--cluster", "1x1"], "--cluster: ranking the strategies needs at least 2 learners"),
    (["--validate", "--cluster", "2x2"], "--validate: runs the source papers' own cases, which --cluster cannot "
                                         "change; leave it out, or drop --validate"),
    (["--validate", "--strategy", "sync", "--set", "overlap=true"],
     "--validate: runs the source papers' own cases, which --strategy and --set cannot change; leave them out"),
    (["--straggler", "3"], "--straggler: expected RANK:SLOWDOWN"),
    (["--straggler", "8:2"], "--straggler: expected RANK:SLOWDOWN with 0 <= RANK < 8"),
    (["--straggler=-1:2"], "--straggler: expected RANK:SLOWDOWN"),
    (["--straggler", "3:0.5"], "--straggler: expected RANK:SLOWDOWN"),
    (["--straggler", "3:nan"], "--straggler: expected RANK:SLOWDOWN"),
    (["--straggler", "3:inf"], "--straggler: expected RANK:SLOWDOWN"),
    (["--straggler", "3:1e308"], "--straggler: expected RANK:SLOWDOWN with 0 <= RANK < 8 and 1 <= SLOWDOWN <= 1000"),
    (["--set", "pattern=random"], "--set needs --strategy"),
    (["--strategy", "sync", "--set", "overlap"], "--set: expected KEY=VALUE"),
    (["--strategy", "sync", "--set", "foo=1"], "--set: sync has no setting 'foo'"),
    (["--strategy", "adpsgd", "--set", "pattern=zig"], "--set: strategy.pattern"),
    (["--strategy", "sync", "--set", "bucket_cap_mb=nan"], "--set: strategy.bucket_cap_mb"),
    (["--strategy", "single"], "--strategy: unknown strategy 'single'"),
    (["--inside", "0gbit"], "--inside: expected pcie, nvlink"),
    (["--network", "nan"], "--network: expected pcie, nvlink"),
    (["--network=-5gbit"], "--network: expected"),
    (["--network", "0.1bit"], "--network: expected"),
    (["--frames-per-epoch", "1000"], "--global-batch: a minibatch of 2048 frames is more than --frames-per-epoch"),
    (["--cluster", "1x1024", "--strategy", "sync", "--global-batch", "2047"],
     "--global-batch: 2047 frames do not split evenly over 1024 learners; use a multiple of 1024, e.g. 1024 or 2048"),
])
def test_bad_input_is_one_line_naming_the_option(args, message, tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["simulate", *args, "--json", str(out)]) == 2
    err = capsys.readouterr().err
    assert err.startswith(f"asrdist: error: {message}") and err.count("\n") == 1, err
    assert not out.exists()


def _spec(strategy: str, cluster: Cluster, **kw) -> SimSpec:
    settings = {"sync_epochs": 1} if strategy == "hybrid" else None
    return SimSpec(strategy, strategy_config(strategy, settings), SHAPES, cluster, 256, 2e-5, steps=6, **kw)


@pytest.mark.parametrize("strategy, changes", [
    ("sync", {}), ("sync", {"slowdown": {5: 2.0}}), ("averaging", {"slowdown": {0: 1.5, 6: 3.0}}),
    ("hybrid", {"synchronous": True, "slowdown": {7: 2.0}}), ("hierarchical", {"slowdown": {5: 2.0}}),
    ("hybrid", {}),
])
def test_learners_that_move_alike_are_simulated_once_with_the_same_figures(strategy, changes, monkeypatch):
    """The same spec simulated with one learner standing for each kind, and learner by learner."""
    cluster = Cluster(3, 4, LINKS["nvlink"], LINKS["1gbit"])
    spec = _spec(strategy, cluster, **changes)
    assert len(alike.alike_learners(spec)) < cluster.learners
    once = simulate(spec)
    monkeypatch.setattr(alike, "_kinds", lambda spec: None)
    assert alike.simulated_learners(spec) == cluster.learners
    assert simulate(spec) == once


def test_jitter_and_asynchronous_learners_are_simulated_one_by_one():
    cluster = Cluster(2, 4, LINKS["nvlink"], LINKS["1gbit"])
    assert alike.simulated_learners(_spec("sync", cluster, jitter=0.1)) == 8
    assert alike.simulated_learners(_spec("adpsgd", cluster)) == 8
    assert alike.simulated_learners(_spec("onebit", cluster)) == 8
    assert alike.simulated_learners(_spec("sync", cluster)) == 1
    assert alike.simulated_learners(_spec("hierarchical", cluster)) == 2 * 2  # per node: its leader, the rest


def test_a_large_cluster_runs_when_its_learners_move_alike_and_is_refused_up_front_otherwise(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--cluster", "2048x8", "--strategy", "sync", "--straggler", "9:2",
                 "--json", str(out)]) == 0
    prediction = json.loads(out.read_text())["prediction"]
    assert prediction["learners"] == 16384 and prediction["frames_per_second"] > 0
    capsys.readouterr()
    for cluster, args, message in [
            ("2048x8", ["--strategy", "adpsgd"], "adpsgd would simulate 16384 learners one by one"),
            ("2048x8", ["--strategy", "sync", "--jitter", "0.1"], "sync would simulate 16384 learners"),
            ("4096x8", ["--strategy", "hierarchical"], "hierarchical would simulate 8192 learners")]:
        assert main(["simulate", "--cluster", cluster, *args]) == 2
        err = capsys.readouterr().err
        assert err.startswith(f"asrdist: error: --cluster {cluster}: {message}") and err.count("\n") == 1, err
    assert main(["simulate", "--cluster", "4x256", "--strategy", "onebit"]) == 2
    assert "onebit would span 256 learners per node in one exchange; the limit is 128" in capsys.readouterr().err


def test_the_advisor_ranks_what_it_can_simulate_and_names_the_rest(tmp_path, monkeypatch, capsys):
    from asrdist.sim import scenario

    monkeypatch.setattr(scenario, "MAX_LEARNER_STEPS", 4 * 24)  # 8 learners one by one are too many
    out = tmp_path / "advice.json"
    assert main(["simulate", "--cluster", "2x4", "--json", str(out)]) == 0
    advice = json.loads(out.read_text())
    left_out = advice["not_simulated"]
    assert {"onebit", "adpsgd_fixed", "adpsgd_random", "adpsgd_delay_by_one"} <= set(left_out)
    assert all(" would simulate " in why and " learners one by one" in why for why in left_out.values())
    ranked = [p["name"] for p in advice["ranking"]]
    assert "sync" in ranked and not set(ranked) & set(left_out)
    assert advice["why"].endswith(f"not simulated at this size: {', '.join(left_out)}")
    assert "not simulated at this size" in capsys.readouterr().out
    monkeypatch.setattr(scenario, "MAX_LEARNER_STEPS", 0)  # nothing left: one line
    assert main(["simulate", "--cluster", "2x4"]) == 2
    assert capsys.readouterr().err.startswith("asrdist: error: --cluster 2x4: ")


def test_the_speedup_is_over_a_healthy_learner_whichever_rank_straggles(tmp_path):
    speedups = []
    for straggler in ("0:3", "1:3"):
        out = tmp_path / f"{straggler[0]}.json"
        assert main(["simulate", "--cluster", "1x4", "--strategy", "sync", "--straggler", straggler,
                     "--json", str(out)]) == 0
        speedups.append(json.loads(out.read_text())["prediction"]["speedup"])
    assert speedups[0] == pytest.approx(speedups[1], rel=1e-9) and speedups[0] < 4 / 3 * 1.01


def test_the_advisor_table_keeps_its_columns_apart_for_extreme_clusters():
    from asrdist.sim.cli import table
    from types import SimpleNamespace

    row = SimpleNamespace(name="onebit_double_buffering", frames_per_second=0.3, speedup=1.5e-9,
                          epoch_seconds=3600 * 4.83e8, comm_share=1.0, wait_share=0.96, bytes_per_step=2.7e8)
    normal = SimpleNamespace(name="sync", frames_per_second=34076.2, speedup=4.757, epoch_seconds=3600 * 0.9071,
                             comm_share=0.64, wait_share=0.41, bytes_per_step=3.159e8)
    header, extreme, usual = table([row, normal]).splitlines()
    assert extreme.split() == ["onebit_double_buffering", "0.3", "1.5e-09", "4.83e+08", "100", "96", "270.0"]
    assert usual.split() == ["sync", "34,076", "4.76", "0.907", "64", "41", "315.9"]
    assert len(header) == len(usual) == len(extreme)


def test_a_json_output_that_cannot_be_written_is_refused_before_simulating(tmp_path, capsys):
    assert main(["simulate", "--cluster", "2x2", "--strategy", "sync", "--json", str(tmp_path)]) == 2
    captured = capsys.readouterr()
    assert captured.out == "" and captured.err == f"asrdist: error: {tmp_path}: output file is an existing directory; give a file name\n"
