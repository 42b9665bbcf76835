"""`asrdist bench seeds`: each claim's rule judges its runs (and can fail), the rule is on record
before the runs start, and the JSON keeps the contract (claims.<id>: rule, measured, passed, runs,
conditions; every run with predicted and simulator_error)."""
from __future__ import annotations

import argparse
import dataclasses
import json
from pathlib import Path

import pytest

from asrdist.bench import seed_claims, seed_predict, seeds
from asrdist.bench.seed_claims import CLAIMS, Setup
from asrdist.compare.runs import resolve_all
from asrdist.errors import ConfigError
from tests.support.compare_fixture import TINY, make_corpus

SETUP = Setup(learners=8, cpus_per_host=0.2, network="1gbit", epochs=4, batch_size=256, seeds=(0, 1))


def fake_run(errors: list[float], seconds_per_epoch: float = 10.0, fps: float = 1000.0, **extra) -> dict:
    return {"validations": [{"epoch": i, "epoch_progress": float(i + 1), "wall_seconds": seconds_per_epoch * (i + 1),
                             "error": e, "consensus_distance": 0.01} for i, e in enumerate(errors)],
            "frames_per_second": fps, "network": "1gbit",
            "per_learner": [{"rank": r, "comm_seconds": 1.0, "exchanges": 10, "compute_seconds": 1.0, "steps": 10}
                            for r in range(8)], **extra}


def test_s7_passes_only_when_every_adpsgd_ratio_is_within_0_6_of_syncs():
    curve = [0.5, 0.3, 0.2, 0.15]
    runs = {name: fake_run(curve) for name in ("sync", "adpsgd", "adpsgd_random")}
    runs["sync_slow"] = fake_run(curve, seconds_per_epoch=30.0)  # 3x: the straggler holds everyone back
    for name in ("adpsgd_slow_active", "adpsgd_slow_passive", "adpsgd_random_slow"):
        runs[name] = fake_run(curve, seconds_per_epoch=12.0)
    measured, passed, reason = CLAIMS["S7"].judge(runs, SETUP)
    assert passed is True and measured["ratio_with_over_without"]["sync"] == pytest.approx(3.0)
    runs["adpsgd_slow_passive"] = fake_run(curve, seconds_per_epoch=25.0)
    measured, passed, reason = CLAIMS["S7"].judge(runs, SETUP)
    assert passed is False and "adpsgd_fixed_passive" in reason
    runs["adpsgd_slow_passive"] = fake_run([0.5, 0.4, 0.35, 0.3])  # never reaches the others' best...
    measured, passed, _ = CLAIMS["S7"].judge(runs, SETUP)
    assert measured["target_error"] == 0.3  # ...so the shared target is its best: every run reaches it


def test_s1_judges_the_mean_over_seeds_and_reports_each():
    runs = {"sync_seed0": fake_run([0.2, 0.10]), "onebit_seed0": fake_run([0.2, 0.102]),
            "sync_seed1": fake_run([0.2, 0.10]), "onebit_seed1": fake_run([0.2, 0.103])}
    measured, passed, _ = CLAIMS["S1"].judge(runs, SETUP)
    assert passed is True and measured["mean_relative"] == pytest.approx(0.025)
    runs["onebit_seed1"] = fake_run([0.2, 0.13])
    measured, passed, reason = CLAIMS["S1"].judge(runs, SETUP)
    assert passed is False and measured["per_seed"][1]["relative"] == pytest.approx(0.3) and "+" in reason


def test_s3_needs_onebits_speedup_to_grow_with_the_minibatch_and_beat_syncs():
    runs = {"single_small": fake_run([0.1], fps=100), "single_large": fake_run([0.1], fps=120),
            "sync_small": fake_run([0.1], fps=200), "sync_large": fake_run([0.1], fps=400),
            "onebit_small": fake_run([0.1], fps=300), "onebit_large": fake_run([0.1], fps=600)}
    measured, passed, _ = CLAIMS["S3"].judge(runs, SETUP)
    assert passed is True and measured["frames_per_second_speedup"]["onebit_large"] == pytest.approx(5.0)
    runs["onebit_large"] = fake_run([0.1], fps=300)
    assert CLAIMS["S3"].judge(runs, SETUP)[1] is False


def test_every_claim_plans_dedicated_runs_with_distinct_names():
    for claim in CLAIMS.values():
        names = [r.name for r in claim.plan(SETUP)]
        assert names and len(names) == len(set(names)), claim.id
    hier = CLAIMS["S10"].plan(SETUP)
    assert {(r.nodes, r.learners) for r in hier} == {(4, 8), (2, 8)}
    assert all(r.cpus_per_host == pytest.approx(0.4) for r in hier if r.nodes == 4)  # 2 learners x 0.2


def test_s5_averages_within_an_epoch_with_kaldis_optimizer_and_differs_only_in_ngsgd(tmp_path):
    """Both arms train averaging's recipe, averaging every 10 minibatches; only NG-SGD differs."""
    corpus = make_corpus(tmp_path / "corpus")
    arms = {}
    for spec in CLAIMS["S5"].plan(SETUP):
        overrides = seed_predict.run_overrides(spec, SETUP, _args(tmp_path))
        arms[spec.name] = resolve_all(seeds.DEFAULT_CONFIG, ["averaging"], spec.learners, corpus,
                                      [*overrides, *TINY])["averaging"]
    ng, plain = arms["averaging_ngsgd"], arms["averaging_sgd"]
    assert ng.optim.natural_gradient and not plain.optim.natural_gradient
    assert ng.optim.max_change and plain.optim.max_change and ng.optim.momentum == plain.optim.momentum == 0.0
    assert ng.optim.decay == "geometric"  # Kaldi's optimizer, not the default recipe's Nesterov SGD
    assert ng.strategy.average_every == 10 * SETUP.batch_size // SETUP.learners == plain.strategy.average_every
    assert ng.strategy.average_every < 3584  # an epoch of the 160-utterance corpus is 3,584 frames a learner
    assert repr(dataclasses.replace(ng.optim, natural_gradient=False)) == repr(plain.optim)


def _args(tmp_path: Path, **kw) -> argparse.Namespace:
    corpus = tmp_path / "corpus"
    (corpus / "train").mkdir(parents=True, exist_ok=True)
    base = dict(claims="S7,S4", learners=8, cpus_per_host=0.2, network="1gbit", config=seeds.DEFAULT_CONFIG,
                data=corpus, utterances=160, epochs=4, batch_size=256, seeds=2, deadline=60.0, keep=None,
                overrides=[], json=tmp_path / "seeds.json")
    return argparse.Namespace(**{**base, **kw})


def test_the_rule_is_on_record_before_the_runs_start_and_the_json_keeps_its_contract(tmp_path, monkeypatch):
    monkeypatch.setattr(seeds.netem, "available", lambda: (True, ""))
    monkeypatch.setattr(seeds.cpushare, "available", lambda: (True, ""))
    args = _args(tmp_path)
    seen, planned = [], []

    def plan_run(spec, setup, corpus, a, cache):
        planned.append(spec.name)
        return {"validate_every": 3, "predicted": {"frames_per_second": 900.0, "training_seconds_per_epoch": 9.0,
                                                   "time_to_target_seconds": None}}

    def train_run(spec, setup, corpus, run_dir, a, plan):
        on_record = json.loads(args.json.read_text())["claims"]["S7"]
        assert on_record["status"] == "running" and on_record["rule"] == CLAIMS["S7"].rule
        assert planned[-1] == spec.name and plan["validate_every"] == 3  # predicted before it trains
        seen.append(spec.name)
        slow = "slow" in spec.name
        return fake_run([0.5, 0.3, 0.2], seconds_per_epoch=(30.0 if spec.name == "sync_slow" else 12.0) if slow else 10.0,
                        predicted=dict(plan["predicted"]), simulator_error=-0.1)

    monkeypatch.setattr(seeds.seed_predict, "plan_run", plan_run)
    monkeypatch.setattr(seeds, "train_run", train_run)
    result = seeds.run(args)
    assert seen == [r.name for r in CLAIMS["S7"].plan(seeds.Setup(8, 0.2, "1gbit", 4, 256, (0, 1)))]
    saved = json.loads(args.json.read_text())
    s7 = saved["claims"]["S7"]
    assert {"rule", "measured", "passed", "runs", "conditions"} <= set(s7) and s7["passed"] is True
    assert s7["conditions"]["cpus_per_host"] == 0.2
    assert all("predicted" in r and "simulator_error" in r for r in s7["runs"].values())
    # the target (0.2) at the third validation, 3 epochs in: predicted 9 s an epoch x 3 against 30 s measured
    assert s7["runs"]["sync"]["predicted"]["time_to_target_seconds"] == pytest.approx(27.0)
    assert s7["runs"]["sync"]["simulator_error_time_to_target"] == pytest.approx(-0.1)
    assert saved["claims"]["S4"]["passed"] is None and "not reproduced" in saved["claims"]["S4"]["status"]
    assert "S7" in seeds.format_result(result)


def test_unknown_claims_and_too_few_learners_are_refused_in_one_line(tmp_path, monkeypatch):
    monkeypatch.setattr(seeds.netem, "available", lambda: (True, ""))
    monkeypatch.setattr(seeds.cpushare, "available", lambda: (True, ""))
    with pytest.raises(ConfigError, match="unknown claim S12"):
        seeds.run(_args(tmp_path, claims="S1,S12"))
    with pytest.raises(ConfigError, match="S10 needs --learners >= 8"):
        seeds.run(_args(tmp_path, claims="S10", learners=4))
    assert not (tmp_path / "seeds.json").exists()


def test_the_shared_target_is_the_worst_best_error():
    assert seed_claims.shared_target([fake_run([0.3, 0.2]), fake_run([0.4, 0.25])]) == 0.25
    assert seed_claims.time_to(fake_run([0.3, 0.2]), 0.25) == 20.0
    assert seed_claims.time_to(fake_run([0.3, 0.2]), None) is None


def test_time_to_target_is_the_training_time_where_a_run_recorded_it():
    run = fake_run([0.3, 0.2])
    run["validations"][1]["seconds"] = 17.5  # 20 s of wall, 2.5 of them validating
    assert seed_claims.time_to(run, 0.25) == 17.5


def test_k_gives_at_least_ten_validations_and_as_few_more_as_it_can():
    assert seed_predict.validate_every(40, 4) == 19  # 4 x (1 + 39 // 19) = 12; at k = 20, 4 x 2 = 8
    assert seed_predict.validate_every(5, 2) == 1  # 2 x (1 + 4) = 10
    assert seed_predict.validate_every(1, 2) == 1  # no k gives ten: every minibatch
    for steps, epochs in ((7, 3), (100, 6), (33, 2)):
        k = seed_predict.validate_every(steps, epochs)
        assert epochs * (1 + (steps - 1) // k) >= 10 > epochs * (1 + (steps - 1) // (k + 1))


def test_the_predicted_time_to_target_and_its_error_for_every_layout():
    runs = {"sync_4x2": fake_run([0.4, 0.2], predicted={"training_seconds_per_epoch": 12.0}),
            "hybrid_4x2": fake_run([0.2, 0.1], predicted={"training_seconds_per_epoch": 8.0}),
            "sync": fake_run([0.2], predicted=None)}
    times = seed_predict.claim_times({"4x2": {"time_to_target_seconds": {"sync": 20.0, "hybrid": 10.0}},
                                      "time_to_target_seconds": {"sync": 10.0}})
    assert times == {"sync": 10.0, "sync_4x2": 20.0, "hybrid_4x2": 10.0}
    seed_predict.fill_time_to_target(runs, times)
    assert runs["sync_4x2"]["predicted"]["time_to_target_seconds"] == 24.0  # 2 epochs x 12 s
    assert runs["sync_4x2"]["simulator_error_time_to_target"] == pytest.approx(0.2)
    assert runs["hybrid_4x2"]["simulator_error_time_to_target"] == pytest.approx(-0.2)
    assert "simulator_error_time_to_target" not in runs["sync"]  # no prediction: nothing to fill


def test_a_run_records_its_validations_and_its_simulator_error(tmp_path, monkeypatch):
    def run_train(argv, run_dir, deadline, bench):
        assert "train.validate_every=4" in argv and "train.epochs=4" in argv
        run_dir.mkdir(parents=True)
        point = {"epoch": 0, "step": 4, "epoch_progress": 0.5, "wall_seconds": 6.0, "validation_seconds": 1.0,
                 "valid_loss": 1.0, "per": 0.4}
        summary = {"strategy": "sync", "learners": 8, "final": {"valid_loss": 1.0}, "frames_per_second": 1.0,
                   "wall_seconds": 20.0, "validations": [point, {**point, "epoch_progress": 1.0, "step": 8,
                                                                 "wall_seconds": 12.0, "validation_seconds": 2.0,
                                                                 "per": 0.3}],
                   "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0,
                            "per_learner": [{"rank": r, "frames": 1000, "train_seconds": 10.0, "loop_seconds": 10.0,
                                             "cpu_seconds": 2.0 + r, "cpu_wall_seconds": 11.0}
                                            for r in range(8)]}}
        (run_dir / "summary.json").write_text(json.dumps(summary))
        return 20.0

    monkeypatch.setattr(seeds, "run_train", run_train)
    spec = CLAIMS["S7"].plan(SETUP)[0]
    plan = {"validate_every": 4, "predicted": {"frames_per_second": 880.0}}
    run = seeds.train_run(spec, SETUP, tmp_path / "corpus", tmp_path / "run", _args(tmp_path), plan)
    assert [v["seconds"] for v in run["validations"]] == [5.0, 10.0]  # wall less validating
    assert [v["epoch_progress"] for v in run["validations"]] == [0.5, 1.0] and run["final_error"] == 0.3
    assert run["frames_per_second"] == pytest.approx(800.0)  # 8 x 1000 frames over 10 s
    assert run["simulator_error"] == pytest.approx(0.1) and run["predicted"] is plan["predicted"]
    # each learner's CPU while it trained: what its host's quota really gave its loop
    assert [(p["cpu_seconds"], p["cpu_wall_seconds"]) for p in run["per_learner"]] == [(2.0 + r, 11.0) for r in range(8)]


def test_s6_finds_each_strategys_largest_batch_on_the_sqrt2_grid():
    grid = seed_claims.batch_grid(SETUP)
    assert grid == [256, 360, 512, 728, 1024, 1448, 2048]  # x sqrt(2) each, a multiple of 8 learners
    plan = CLAIMS["S6"].plan(SETUP)
    assert len(plan) == 2 * len(grid) and all("optim.lr_scaling=sqrt" in r.overrides for r in plan)
    # sync reaches the target (its own error at 256, +3%) up to 512; adpsgd up to 1448 (> 2 x 512)
    runs = {f"sync_b{b}": fake_run([0.3, 0.2 if b <= 512 else 0.25]) for b in grid}
    runs.update({f"adpsgd_b{b}": fake_run([0.3, 0.205 if b <= 1448 else 0.3]) for b in grid})
    measured, passed, reason = CLAIMS["S6"].judge(runs, SETUP)
    assert measured["target_error"] == pytest.approx(0.206) and measured["largest_batch"] == {"sync": 512,
                                                                                              "adpsgd": 1448}
    assert passed is True and measured["ratio"] == pytest.approx(1448 / 512)
    runs.update({f"adpsgd_b{b}": fake_run([0.3, 0.3]) for b in grid if b > 728})  # now only up to 728 < 1024
    measured, passed, reason = CLAIMS["S6"].judge(runs, SETUP)
    assert passed is False and "under 2 x sync's 512" in reason
    runs.update({f"sync_b{b}": fake_run([0.3, 0.2]) for b in grid})  # sync reaches it everywhere: no limit found
    assert CLAIMS["S6"].judge(runs, SETUP)[1] is None


def test_s11_needs_the_hierarchical_allreduce_13x_the_flat_rings_frames_per_second():
    plan = CLAIMS["S11"].plan(SETUP)
    assert {(r.learners, r.nodes) for r in plan} == {(8, 2)}
    assert all(r.cpus_per_host == pytest.approx(0.8) for r in plan)
    assert {o for r in plan for o in r.overrides if "hierarchical" in o} == {"strategy.hierarchical=true",
                                                                              "strategy.hierarchical=false"}
    runs = {"sync_hierarchical": fake_run([0.3, 0.2], fps=1400.0), "sync_flat": fake_run([0.3, 0.2], fps=1000.0)}
    measured, passed, _ = CLAIMS["S11"].judge(runs, SETUP)
    assert passed is True and measured["frames_per_second_ratio"] == pytest.approx(1.4)
    runs["sync_hierarchical"]["frames_per_second"] = 1200.0
    measured, passed, reason = CLAIMS["S11"].judge(runs, SETUP)
    assert passed is False and "1.20x" in reason


def test_stored_runs_are_predicted_again_from_their_own_microbenchmarks(tmp_path, capsys):
    """`python -m asrdist.bench.seed_predict JSON`: today's simulator on a measured claim's stored
    microbenchmarks (S7 of 2026-12-03: its 7 runs), beside the prediction made before each ran."""
    result = json.loads((Path(__file__).parents[2] / "docs/measured/seeds_S7_2026-12-03.json").read_text())
    (tmp_path / "corpus" / "train").mkdir(parents=True)  # the runs' resolved configs name a corpus
    result.update(corpus=str(tmp_path / "corpus"), config=str(Path(__file__).parents[2] / "configs/default.yaml"))
    for run in result["claims"]["S7"]["runs"].values():
        run["predicted"].update(feature_dim=40, num_classes=40)  # the espeak corpus' 40 mel bins and phones
    rows = seed_predict.repredict(result)
    assert [r["run"] for r in rows] == list(result["claims"]["S7"]["runs"])
    by = {r["run"]: r for r in rows}
    assert by["sync"]["stored"] == pytest.approx(1663.87, rel=1e-4) and by["sync"]["measured"] == pytest.approx(1394.3,
                                                                                                               rel=1e-4)
    assert all(r["now"] > 0 for r in rows)
    # a 3x slower host holds up sync's every allreduce, and adpsgd far less
    assert by["sync_slow"]["now"] < 0.7 * by["sync"]["now"] and by["adpsgd_slow_active"]["now"] > 0.8 * by["adpsgd"]["now"]
    path = tmp_path / "s7.json"
    path.write_text(json.dumps(result))
    assert seed_predict.main([str(path)]) == 0
    out = capsys.readouterr().out
    assert "sync_slow" in out and "runs within +-20%" in out
    assert seed_predict.main([]) == 2
    capsys.readouterr()
    for bad in (tmp_path / "missing.json", tmp_path / "corpus"):  # no file; not JSON (a directory)
        assert seed_predict.main([str(bad)]) == 2
        err = capsys.readouterr().err.strip().splitlines()
        assert len(err) == 1 and err[0].startswith(f"asrdist: error: seed_predict {bad}:")
    (tmp_path / "other.json").write_text('{"setup": {}}')
    assert seed_predict.main([str(tmp_path / "other.json")]) == 2


def test_a_stored_claim_on_a_fresh_machine_builds_its_built_in_corpus_again(tmp_path, monkeypatch, capsys):
    """The JSON names the cached built-in corpus it trained on; where that is gone (a fresh
    machine), `seed_predict` builds it again; any other missing corpus is one line and exit 2."""
    result = json.loads((Path(__file__).parents[2] / "docs/measured/seeds_S5_2026-12-04.json").read_text())
    result.update(corpus=str(tmp_path / "cache" / "corpus-espeak-160-seed0"),
                  config=str(Path(__file__).parents[2] / "configs/default.yaml"))
    built = []

    def cached(utterances):
        built.append(utterances)
        return make_corpus(tmp_path / "rebuilt")
    monkeypatch.setattr(seed_predict, "cached_corpus", cached)
    rows = seed_predict.repredict(result)
    assert built == [160] and [r["run"] for r in rows] == ["averaging_ngsgd", "averaging_sgd"]
    assert all(r["now"] > 0 for r in rows)
    result["corpus"] = str(tmp_path / "mine")  # not the built-in one: nothing to build
    path = tmp_path / "s5.json"
    path.write_text(json.dumps(result))
    assert seed_predict.main([str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "not a corpus" in err[0] and err[0].startswith(f"asrdist: error: seed_predict {path}:")
