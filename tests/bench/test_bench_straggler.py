"""`asrdist bench straggler` (issue 34 item 3): time to target from real runs' validations."""
from __future__ import annotations

import json

import pytest

from asrdist.bench.straggler import _shared_target, copes_check, regime, time_to_target
from asrdist.cli import main
from tests.support.corpus_fixture import make_tone_corpus

POINTS = [{"wall_seconds": 10.0, "valid_loss": 2.0}, {"wall_seconds": 20.0, "valid_loss": 1.5},
          {"wall_seconds": 30.0, "valid_loss": 1.6}, {"wall_seconds": 40.0, "valid_loss": 1.2}]


def test_time_to_target_is_the_first_validation_at_or_below_it():
    assert time_to_target(POINTS, 1.5) == 20.0
    assert time_to_target(POINTS, 1.3) == 40.0
    assert time_to_target(POINTS, 1.0) is None


def test_the_shared_target_is_the_best_loss_every_run_reached():
    other = [{"wall_seconds": 5.0, "valid_loss": 1.8}, {"wall_seconds": 9.0, "valid_loss": 1.4}]
    assert _shared_target([{"validations": POINTS}, {"validations": other}]) == 1.4
    assert all(time_to_target(p, 1.4) is not None for p in (POINTS, other))


def test_the_adpsgd_check_can_fail():
    assert copes_check(3.0, 1.5, 3.0)["passed"] is True
    assert copes_check(3.0, 2.0, 3.0)["passed"] is False  # 2.0 > 0.6 x 3.0
    assert copes_check(None, 1.5, 3.0)["passed"] is None
    # beside the ratio: what the straggler cost each in time, and adpsgd's share of sync's loss
    barely = copes_check(1.25, 1.05, 3.0)  # sync barely slowed: the ratio check fails...
    assert barely["passed"] is False and barely["extra_time"] == pytest.approx({"sync": 0.25, "adpsgd": 0.05})
    assert barely["adpsgd_extra_vs_sync"] == pytest.approx(0.2)  # ...though adpsgd lost a fifth of sync's time
    assert copes_check(1.0, 1.2, 3.0)["adpsgd_extra_vs_sync"] is None  # sync lost nothing: no share


def test_the_regime_says_how_far_a_straggler_can_slow_sync():
    def sync_run(compute, loop):
        return {"per_learner": [{"compute_seconds": compute, "loop_seconds": loop}] * 2}
    comm_bound = regime(sync_run(25.0, 100.0), learners=2, slowdown=3.0)
    assert comm_bound["sync_compute_share"] == 0.25 and comm_bound["sync_ratio_bound"] == 1.5
    assert comm_bound["adpsgd_ratio_from_throughput"] == 1.5  # 2 / (1 + 1/3)
    assert comm_bound["passes_if_time_follows_throughput"] is False  # 1.5 > 0.6 x 1.5
    compute_bound = regime(sync_run(90.0, 100.0), learners=2, slowdown=3.0)
    assert compute_bound["sync_ratio_bound"] == 2.8 and compute_bound["passes_if_time_follows_throughput"] is True


@pytest.mark.parametrize("argv, message", [
    (["--data", "/nonexistent-corpus"], "bench straggler --data /nonexistent-corpus: not a corpus directory"),
    (["--network", "fast"], "network rate 'fast'"),
    (["--learners", "2", "--straggler-rank", "2"], "--straggler-rank must be below --learners (2), got 2"),
    (["--config", "/nonexistent.yaml"], "bench straggler --config /nonexistent.yaml: no such recipe"),
])
def test_bad_input_is_one_line_and_writes_nothing(argv, message, tmp_path, capsys):
    out = tmp_path / "s.json"
    assert main(["bench", "straggler", "--json", str(out), *argv]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("asrdist: error: ") and message in err and "\n" not in err, err
    assert not out.exists()


@pytest.mark.slow
@pytest.mark.timeout(900)  # six training jobs, one after another (a hang still ends the test)
def test_bench_straggler_trains_and_writes_its_keys(tmp_path):
    corpus = make_tone_corpus(tmp_path / "corpus", utterances_per_speaker=8, speakers=4)  # small: six jobs
    # --jobs 1: extracted in this process, the same features without a pool of spawned workers to start
    assert main(["features", str(corpus), "--jobs", "1"]) == 0
    out = tmp_path / "straggler.json"
    assert main(["bench", "straggler", "--json", str(out), "--network", "loopback", "--data", str(corpus),
                 "--epochs", "2", "--keep", str(tmp_path / "runs"), "model.hidden_dim=64", "model.hidden_layers=2",
                 "data.batch_size=126", "optim.warmup_steps=0"]) == 0
    result = json.loads(out.read_text())
    for key in ("sync_time_to_target_ratio", "adpsgd_time_to_target_ratio", "delay_by_one_time_to_target_ratio"):
        assert result[key] > 0, key
    assert result["exchange_vs_compute"] > 0
    assert result["adpsgd_copes_with_straggler"]["passed"] in (True, False)
    assert 0 < result["regime"]["sync_compute_share"] < 1 and result["regime"]["passes_if_time_follows_throughput"] in (True, False)
    runs = result["runs"]
    assert set(runs) == {"sync", "sync_straggler", "adpsgd", "adpsgd_straggler", "adpsgd_plain", "adpsgd_delay_by_one"}
    # every run trained for real: two validations each, and the straggler's steps took longer
    assert all(len(r["validations"]) == 2 for r in runs.values())
    slow = {p["rank"]: p for p in runs["sync_straggler"]["per_learner"]}
    assert slow[1]["compute_seconds"] > 0 and runs["sync_straggler"]["extra"][0] == "train.straggler.ranks=[1]"
    assert (tmp_path / "runs" / "adpsgd_delay_by_one" / "summary.json").is_file()
