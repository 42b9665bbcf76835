"""`asrdist compare`: the report and summary.json from finished runs (made up in the real format,
no training), the simulator's prediction beside the measured frames/s, what is trained or resumed,
one-line errors with nothing written. A small real comparison runs end to end in test_demo.py."""
from __future__ import annotations

import base64
import html
import json
import re
import sys
from pathlib import Path

import pytest

import asrdist.run.launch as launch
from asrdist.cli import build_parser, main
from asrdist.compare.report import build_summary
from asrdist.compare.runs import resolve_all, train_missing
from asrdist.sim.calibration import Microbenchmarks
from tests.support.compare_fixture import CONFIG, FIGURES, TINY, fabricate_runs, make_corpus

SETUP = {"config": str(CONFIG), "learners": 2, "overrides": TINY}


def _compare(out: Path, corpus: Path, strategies: str, *extra: str) -> int:
    return main(["compare", str(CONFIG), "--strategies", strategies, "--learners", "2", "--out", str(out),
                 "--data", str(corpus), *TINY, *extra])


@pytest.fixture
def no_training(monkeypatch):
    def refuse(args):
        raise AssertionError(f"trained {args.out} again")
    monkeypatch.setattr(launch, "train_command", refuse)


MICRO = Microbenchmarks(2, {"1x2": 1e-3, "2x1": 2.5e-3}, {"1x2": 0.05, "2x1": 0.05}, 20_000.0, 2e-9, 1e-9,
                        0.5e-9, 1e-9, "loopback", 1e9, 0.8, 2e-10, 50e-6)
"""The made-up machine: a learner's step costs 1 ms a frame alone on both cores, 2.5 ms among 2 on one."""


@pytest.fixture(autouse=True)
def fake_calibration(monkeypatch):
    """The made-up runs have no corpus to time a learner on: every calibration is MICRO. Records
    what each asked for: (strategy, learners, nodes, network, when)."""
    from asrdist.calibrate import microbench

    asked = []

    def calibrate_run(name, cfg, nodes, network, when):
        asked.append((name, cfg.train.learners, nodes, network, when))
        return microbench.RunCalibration(MICRO, {"feature_dim": 40, "num_classes": 9, "link": {}, "parameters": 1,
                                                 "corun": {"slowdown": 1.0}}, when, "2026-11-28T10:00:00+00:00",
                                         json.loads(json.dumps(cfg.to_dict())))
    monkeypatch.setattr(microbench, "calibrate_run", calibrate_run)
    return asked


def _predicted(run: Path, calibration=None) -> float:
    """The simulator's frames/s of a made-up run from MICRO, computed apart from the report."""
    from asrdist.calibrate import microbench
    from asrdist.compare.runs import run_config

    cfg = run_config(run)
    calibration = calibration or microbench.RunCalibration(MICRO, {"feature_dim": 40, "num_classes": 9}, "", "", {})
    return microbench.predict(calibration, cfg, cfg.strategy_name, 1, "loopback")[0].frames_per_second


def test_report_from_finished_runs(tmp_path, no_training, fake_calibration, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = fabricate_runs(out, corpus, ["single", "sync", "onebit"])
    busy = json.loads((runs["sync"] / "summary.json").read_text())
    (runs["sync"] / "summary.json").write_text(json.dumps({**busy, "steal_share": 0.3}))  # its host was busy
    assert _compare(out, corpus, "single,sync,onebit") == 0
    printed = capsys.readouterr().out
    assert "not trained again" in printed and f"report: {out / 'report.html'}" in printed
    summary = json.loads((out / "summary.json").read_text())
    # the run whose host took 30% of the CPU is named, after the table and in the report; the others not
    assert [line.split(":")[0] for line in summary["busy_host"]] == ["sync"]
    assert "note: sync: this machine's host took 30% of its CPU time (steal)" in printed
    assert "sync: this machine&#x27;s host took 30% of its CPU time" in (out / "report.html").read_text()
    assert summary["strategies"] == ["single", "sync", "onebit"] and summary["learners"] == 2
    assert summary["metric"] == "per" and summary["network"] == "loopback" and summary["cores"] == 2
    assert summary["behind_sync"] == []  # onebit's 0.22 is 5% above sync's 0.21: within the 10%
    single, sync, onebit = summary["runs"]
    assert (single["learners"], sync["learners"]) == (1, 2)  # single is the one-learner baseline
    # runs trained before, with no calibration saved: each one's learner timed now, after it, and
    # said so; each run predicted from its own calibration alone (not from any run's timing)
    when = "after it trained (none was saved before)"
    assert fake_calibration == [("single", 1, 1, "loopback", when), ("sync", 2, 1, "loopback", when),
                                ("onebit", 2, 1, "loopback", when)]
    assert all((out / "calibration" / f"{n}.json").is_file() for n in ("single", "sync", "onebit"))
    calibration = summary["calibration"]
    assert calibration["sync"]["when"] == when and calibration["sync"]["microbenchmarks"]["cores"] == 2
    # a learner among 2 on 1 thread of 2: its step 2.5 ms a frame, as if it had both cores
    assert calibration["sync"]["inputs"]["seconds_per_frame"] == pytest.approx(2.5e-3 / 2)
    assert calibration["single"]["inputs"]["seconds_per_frame"] == pytest.approx(1e-3)
    assert "microbenchmark" in calibration["onebit"]["inputs"]["sources"]["seconds_per_frame"]
    for record in summary["runs"]:
        assert record["prediction"] == "simulated"
        assert record["predicted_frames_per_second"] == pytest.approx(_predicted(Path(record["path"])))
    assert single["predicted_frames_per_second"] == pytest.approx(20_000 / (20_000 * 1e-3 + 2 * 0.05), rel=0.05)
    assert sync["prediction_error"] == pytest.approx(sync["predicted_frames_per_second"] / 1500 - 1)
    assert onebit["mb_sent"] == 2.0 and sync["comm_seconds"] == 0.5 and sync["wait_seconds"] == 0.25
    assert [p["per"] for p in sync["curve"]] == list(FIGURES["sync"][0])
    assert [p["epoch"] for p in sync["curve"]] == [1, 2] and sync["curve"][1]["seconds"] > sync["curve"][0]["seconds"]
    # time to target: by default the baseline's final PER (single's 0.20), the job's wall seconds to
    # the first validation at or below it (the fixture's epoch e at (e + 1) x frames / fps / 2)
    assert summary["target"]["value"] == pytest.approx(0.20) and summary["target"]["how"].startswith(
        "baseline: single's final PER (0.2000, its final figure)")
    assert single["time_to_target_seconds"] == pytest.approx(20.0) and single["reached_target"] is True
    assert sync["time_to_target_seconds"] == "never" and sync["reached_target"] is False
    assert onebit["time_to_target_seconds"] == "never" and onebit["reached_target"] is False
    # one run each: no interval separates anyone
    assert summary["recommendation"].startswith(
        "Recommendation: not separated (one run each, no interval; --repeats 2 or more gives one): single reached "
        "PER <= 0.2000 first on this machine, in 20.0 s; never: sync, onebit (")
    assert "2 learner(s) x 1 thread(s) sharing 2 CPU core(s)" in summary["recommendation"]
    # the speed-ups over single, the kinds of the figures; no model.pt in the made-up runs: no
    # utterance scores, no test figure, and each run says why
    assert sync["speedup_vs_single"] == {"time_to_target": None, "frames_per_second": 1.5}
    assert single["speedup_vs_single"] == {"time_to_target": 1.0, "frames_per_second": 1.0}
    assert sync["test_error_rate"] is None and sync["interval"]["error_rate_utterances"] is None
    assert sync["repeats"] == 1 and [r["run"] for r in sync["rounds"]] == ["sync"] and sync["rounds"][0]["seed"] == 0
    assert sync["interval"]["frames_per_second"] == [1500.0, 1500.0]
    assert "no model.pt to score" in sync["scores"]
    kinds = dict(zip(summary["table"]["columns"], summary["table"]["kinds"]))
    assert kinds["MB sent"] == "counted" and kinds["frames/s"] == "measured" and kinds["simulated frames/s"] == "simulated"
    assert "counted (the bytes each learner's exchange hands to torch.distributed" in printed
    assert printed.index(summary["recommendation"]) < printed.index("s to target")  # it leads
    table = summary["table"]
    assert table["columns"][:5] == ["strategy", "learners", "s to target", "speed-up to target", "PER"]
    assert len(table["rows"]) == 3
    assert table["rows"][2][:5] == ["onebit", 2, "never", None, FIGURES["onebit"][0][-1]]
    # each strategy with its own recipe where it has one (configs/recipes/): onebit has, sync has none
    assert "optim.natural_gradient=true" in summary["recipes"]["onebit"] and summary["recipes"]["sync"] == []
    assert summary["recipes_not_applied"] == {}  # the DNN: every recipe file lists it
    assert summary["same_recipe"] is False

    page = (out / "report.html").read_text()
    assert "<title>asrdist compare: single, sync, onebit</title>" in page
    assert ("calibrated for each run on microbenchmarks of one learner of its config alone" in html.unescape(page)
            and "(timed after training for onebit, single, sync: no calibration was saved before)" in page)
    assert "1 learner(s) x 2 thread(s), 2 learner(s) x 1 thread(s) sharing 2 CPU core(s)" in page
    assert "their own optimizer recipes (configs/recipes/) for onebit" in page  # single and sync have none
    assert re.search(r"<td>onebit</td><td>2</td><td>never</td><td>-</td><td>0\.2200</td>", page)
    assert "<th>counted</th>" in page and "speed-up frames/s" in page
    assert "sync: error rate over utterances, test split: " in page and "no model.pt to score" in page
    assert page.index('<p id="recommendation">') < page.index("<table")  # the page leads with it
    pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(pngs) == 2 and all(base64.b64decode(p).startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # self-contained: nothing fetched


@pytest.mark.parametrize("target, first, never", [("0.35", "onebit", []), ("0.2", "single", ["sync", "onebit"])])
def test_target_flag_sets_the_target(tmp_path, no_training, capsys, target, first, never):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync", "onebit"])
    assert _compare(out, corpus, "single,sync,onebit", "--target", target) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target"] == {"metric": "per", "value": float(target), "how": f"given (--target {target})"}
    assert summary["recommendation"].startswith(f"Recommendation: not separated (one run each, no interval; "
                                                f"--repeats 2 or more gives one): {first} reached PER <= "
                                                f"{float(target):.4f} first")
    assert [r["run"] for r in summary["runs"] if r["reached_target"] is False] == never
    if target == "0.35":  # every run there at its first validation: epoch 1 at frames / fps / 2
        assert [r["time_to_target_seconds"] for r in summary["runs"]] == pytest.approx(
            [10_000 / FIGURES[n][1] for n in ("single", "sync", "onebit")])


def test_ddp_is_compared_beside_sync(tmp_path, no_training, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["sync", "ddp"])
    assert _compare(out, corpus, "sync,ddp") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategies"] == ["sync", "ddp"] and summary["behind_sync"] == []
    assert [(r["strategy"], r["prediction"]) for r in summary["runs"]] == [("sync", "simulated"),
                                                                          ("ddp", "simulated")]


def test_no_run_reaching_the_target_is_said(tmp_path, no_training, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["sync", "onebit"])
    assert _compare(out, corpus, "sync,onebit", "--target", "0.1") == 0
    printed = capsys.readouterr().out
    assert "No recommendation: no run reached PER <= 0.1000" in printed
    assert "never" in printed and (out / "report.html").is_file()


def test_same_recipe_trains_every_strategy_on_the_given_optimizer(tmp_path, no_training, capsys):
    corpus = make_corpus(tmp_path / "corpus")
    own, same = tmp_path / "own", tmp_path / "same"
    fabricate_runs(own, corpus, ["sync", "adpsgd"])
    # runs made with their own recipes are not the runs --same-recipe asks for: refused, nothing trained
    assert _compare(own, corpus, "sync,adpsgd", "--same-recipe") == 2
    assert "own/adpsgd: trained with another config (optim." in capsys.readouterr().err
    fabricate_runs(same, corpus, ["sync", "onebit"], same_recipe=True)
    assert _compare(same, corpus, "sync,onebit", "--same-recipe") == 0
    summary = json.loads((same / "summary.json").read_text())
    assert summary["same_recipe"] is True and summary["recipes"] == {"sync": [], "onebit": []}
    assert "every strategy on the same recipe (--same-recipe)" in (same / "report.html").read_text()


def test_a_rebuilt_report_reuses_the_calibrations_and_a_failed_measurement_is_said(
        tmp_path, no_training, fake_calibration, monkeypatch):
    from asrdist.calibrate import microbench
    from asrdist.errors import DataError

    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync"])
    assert _compare(out, corpus, "single,sync") == 0
    first = json.loads((out / "summary.json").read_text())

    def unmeasurable(*args):
        raise DataError("no corpus here")
    monkeypatch.setattr(microbench, "calibrate_run", unmeasurable)
    assert _compare(out, corpus, "single,sync") == 0  # the saved calibrations: nothing measured again
    again = json.loads((out / "summary.json").read_text())
    assert again["calibration"] == first["calibration"] and again["runs"] == first["runs"]
    assert len(fake_calibration) == 2

    # a calibration saved for another config is not this run's: measured again (here: it cannot be)
    saved = json.loads((out / "calibration" / "sync.json").read_text())
    saved["config"]["train"]["epochs"] = 99
    (out / "calibration" / "sync.json").write_text(json.dumps(saved))
    (out / "calibration" / "single.json").write_text("{truncated")  # unreadable: measured again too
    assert _compare(out, corpus, "single,sync") == 0
    single, sync = json.loads((out / "summary.json").read_text())["runs"]
    assert sync["prediction"] == "not calibrated: no corpus here" and sync["predicted_frames_per_second"] is None
    assert single["prediction"] == "not calibrated: no corpus here"
    page = html.unescape((out / "report.html").read_text())
    assert "sync: simulated frames/s: not calibrated: no corpus here" in page
    assert "Simulated frames/s: asrdist's simulator" not in page


def test_without_simulator_or_one_learner_run_the_report_says_why(tmp_path, no_training, monkeypatch):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync"])
    build_parser()  # what the command line imports to register `simulate` is loaded before the package goes
    monkeypatch.setitem(sys.modules, "asrdist.sim", None)  # import fails as when it is not installed
    assert _compare(out, corpus, "single,sync") == 0
    runs = json.loads((out / "summary.json").read_text())["runs"]
    assert all(r["predicted_frames_per_second"] is None and r["prediction"].startswith("simulator not available")
               for r in runs)
    assert "simulated frames/s: simulator not available" in (out / "report.html").read_text()
    monkeypatch.delitem(sys.modules, "asrdist.sim")
    (run,) = build_summary({"sync": out / "sync"}, SETUP)["runs"]
    assert run["predicted_frames_per_second"] is None and run["prediction"].startswith("not calibrated")


def test_each_run_is_calibrated_just_before_it_trains(tmp_path, monkeypatch, fake_calibration):
    """A run compare trains is timed (its learner's microbenchmarks) right before its training
    starts, and predicted from that; a finished run keeps the calibration saved before it."""
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    made = fabricate_runs(tmp_path / "made", corpus, ["single", "sync", "onebit"])
    events = []

    def train(args):  # stands in for `asrdist train`: the run ends with its files; notes who was calibrated
        events.append((args.strategy, [c[0] for c in fake_calibration]))
        args.out.mkdir()
        for name in ("config.yaml", "metrics.jsonl", "summary.json"):
            (args.out / name).write_text((made[args.strategy] / name).read_text())
        return 0
    monkeypatch.setattr(launch, "train_command", train)
    assert _compare(out, corpus, "single,sync,onebit") == 0
    # each calibrated after the run before it trained, and before its own training started
    assert events == [("single", ["single"]), ("sync", ["single", "sync"]), ("onebit", ["single", "sync", "onebit"])]
    assert all(c[4] == "before it trained" for c in fake_calibration) and len(fake_calibration) == 3
    summary = json.loads((out / "summary.json").read_text())
    assert {c["when"] for c in summary["calibration"].values()} == {"before it trained"}
    assert "timed after training" not in (out / "report.html").read_text()
    for record in summary["runs"]:
        assert record["predicted_frames_per_second"] == pytest.approx(_predicted(Path(record["path"])))


def test_trains_what_is_missing_and_resumes_what_is_unfinished(tmp_path, monkeypatch):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    made = fabricate_runs(tmp_path / "made", corpus, ["single", "sync", "onebit"])
    fabricate_runs(out, corpus, ["single"])
    unfinished = out / "sync"
    unfinished.mkdir()
    (made["sync"] / "summary.json").rename(tmp_path / "sync-summary.json")
    for name in ("config.yaml", "metrics.jsonl"):
        (unfinished / name).write_text((made["sync"] / name).read_text())
    (unfinished / "checkpoints" / "step-10").mkdir(parents=True)
    (unfinished / "checkpoints" / "latest").write_text("step-10\n")
    trained = []

    def train(args):  # stands in for `asrdist train`: the run ends with its summary
        trained.append((args.strategy, args.learners, args.out, args.resume, args.data, args.overrides))
        args.out.mkdir(exist_ok=True)
        source = tmp_path / "sync-summary.json" if args.strategy == "sync" else made[args.strategy] / "summary.json"
        (args.out / "summary.json").write_text(source.read_text())
        if args.resume is None:
            for name in ("config.yaml", "metrics.jsonl"):
                (args.out / name).write_text((made[args.strategy] / name).read_text())
        return 0
    monkeypatch.setattr(launch, "train_command", train)
    configs = resolve_all(CONFIG, ["single", "sync", "onebit"], 2, corpus, TINY)
    assert train_missing(CONFIG, configs, out, corpus, TINY) == {n: out / n for n in configs}
    assert trained == [("sync", 2, unfinished, unfinished, corpus, TINY),
                       ("onebit", 2, out / "onebit", None, corpus, TINY)]
    assert all((out / n / "summary.json").is_file() for n in configs)


@pytest.mark.parametrize("argv, message", [
    (["--strategies", "sync,nosuch"], "--strategies: unknown strategy 'nosuch' (known: single, sync"),
    (["--strategies", " , "], "--strategies names no strategy"),
    (["--strategies", "sync,sync"], "'sync' given twice"),
    (["optim.nosuch=1"], "optim.nosuch"),
    (["--data", "NOCORPUS"], "NOCORPUS: not a corpus"),
    # what `asrdist train` refuses of one strategy's run is refused before the first one trains
    (["--strategies", "single,adpsgd", "train.max_restarts=1"],
     "adpsgd: train.max_restarts: adpsgd goes on without a lost learner"),
])
def test_bad_input_is_one_line_and_writes_nothing(tmp_path, argv, message, capsys, no_training):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    args = ["compare", str(CONFIG), "--strategies", "sync", "--out", str(out), "--data", str(corpus)]
    assert main(args + argv) != 0
    err = capsys.readouterr().err
    assert err.startswith("asrdist: error: ") and message in err and err.count("\n") == 1, err
    assert not out.exists()


def test_out_must_be_a_directory(tmp_path, capsys, no_training):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    out.write_text("a file")
    assert _compare(out, corpus, "sync") != 0
    assert "is not a directory" in capsys.readouterr().err and out.read_text() == "a file"


def test_a_run_made_with_another_recipe_is_refused_before_training(tmp_path, no_training, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["sync"])
    assert _compare(out, corpus, "onebit,sync", "train.epochs=3") != 0
    assert "cmp/sync: trained with another config (train.epochs: 2 there, 3 asked)" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["sync"]  # no onebit run, no report


def test_a_run_that_fails_in_training_is_a_row_of_the_report_and_an_error(tmp_path, monkeypatch, capsys):
    from asrdist.errors import TrainingError

    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync"])

    def diverge(args):
        raise TrainingError("learner rank 1: loss is nan at step 165 (epoch 0)")
    monkeypatch.setattr(launch, "train_command", diverge)
    assert _compare(out, corpus, "single,onebit,sync") != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "onebit: training failed (onebit: learner rank 1: loss is nan" in err, err
    single, onebit, sync = json.loads((out / "summary.json").read_text())["runs"]
    assert onebit["failed"].startswith("learner rank 1: loss is nan") and onebit["learners"] == 2
    assert onebit["frames_per_second"] is None and sync["failed"] is None and sync["frames_per_second"] == 1500.0
    page = (out / "report.html").read_text()
    assert "<li>onebit: training failed: learner rank 1: loss is nan" in page
    assert "<td>onebit</td><td>2</td><td>-</td>" in page


def test_a_stopped_run_stops_the_comparison(tmp_path, monkeypatch, capsys):
    """Ctrl-C (or a kill) during one strategy's training is the user's wish to stop: compare trains
    no other strategy and writes no report, where a failed training is a row of the report."""
    from asrdist.errors import Stopped

    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single"])
    trained = []

    def stopped(args):
        trained.append(args.strategy)
        raise Stopped("stopped by SIGINT: every learner and launcher was stopped")
    monkeypatch.setattr(launch, "train_command", stopped)
    assert _compare(out, corpus, "single,onebit,sync") != 0
    assert trained == ["onebit"] and "stopped by SIGINT" in capsys.readouterr().err
    assert not (out / "report.html").exists() and not (out / "summary.json").exists()


# -- on emulated hosts ----------------------------------------------------------------------------

def _on_hosts(run: Path, nodes: int, network: str) -> None:
    summary = json.loads((run / "summary.json").read_text())
    wire = {"payload_bytes": 45_000_000, "frame_bytes": 47_000_000, "segments": 1000, "hosts": []}
    (run / "summary.json").write_text(json.dumps({**summary, "nodes": nodes, "network": network, "wire": wire}))


def test_runs_on_emulated_hosts_are_simulated_as_such_and_other_hosts_refused(tmp_path, no_training,
                                                                              fake_calibration, capsys, monkeypatch):
    import asrdist.cluster.netem

    monkeypatch.setattr(asrdist.cluster.netem, "available", lambda: (True, ""))  # nothing is trained here
    from asrdist.calibrate import microbench

    predicted_on, predict = [], microbench.predict

    def spied(calibration, cfg, strategy, nodes, network):
        predicted_on.append((strategy, nodes, network))
        return predict(calibration, cfg, strategy, nodes, network)
    monkeypatch.setattr(microbench, "predict", spied)
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = fabricate_runs(out, corpus, ["single", "sync"])
    _on_hosts(runs["sync"], 2, "1gbit")  # as `asrdist train --nodes 2 --network 1gbit` records it
    assert _compare(out, corpus, "single,sync", "--nodes", "2", "--network", "1gbit") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["nodes"], summary["network"]) == (2, "1gbit")
    # the bytes the hosts' NICs carried, measured, beside the counted ones; none on loopback
    assert [(r["mb_sent"], r["mb_wire"]) for r in summary["runs"]] == [(0.0, None), (40.0, 45.0)]
    assert [c[2:4] for c in fake_calibration] == [(1, "loopback"), (2, "1gbit")]  # single alone, sync on the hosts
    assert [r["prediction"] for r in summary["runs"]] == ["simulated", "simulated"]
    assert predicted_on == [("single", 1, "loopback"), ("sync", 2, "1gbit")]  # and simulated so
    assert "2 learner(s) x 1 thread(s) sharing 2 CPU core(s), as 2 emulated hosts joined by 1gbit links" in \
        (out / "report.html").read_text()
    capsys.readouterr()
    for other in (["--nodes", "2", "--network", "10gbit"], []):
        assert _compare(out, corpus, "single,sync", *other) != 0
        err = capsys.readouterr().err
        assert "cmp/sync: trained on 2 host(s) over 1gbit" in err and err.count("\n") == 1, err
    assert _compare(out, corpus, "sync", "--nodes", "3") != 0
    assert "--nodes: 2 learners cannot be split evenly into 3 emulated hosts" in capsys.readouterr().err


@pytest.mark.slow
@pytest.mark.usefixtures("emulated_network_available")
def test_compare_trains_on_emulated_hosts_and_each_run_says_where(tone_corpus, tmp_path):
    """The real thing, small: single alone, sync on 2 emulated hosts of 1 learner each, on the
    session's tone corpus (features extracted already: no synthesis, no extraction here)."""
    corpus = tone_corpus
    out = tmp_path / "cmp"
    assert _compare(out, corpus, "single,sync", "train.epochs=1", "--nodes", "2", "--network", "1gbit") == 0
    single = json.loads((out / "single" / "summary.json").read_text())
    sync = json.loads((out / "sync" / "summary.json").read_text())
    assert (single["nodes"], single["network"]) == (1, "loopback")
    assert (sync["nodes"], sync["network"], sync["learners"]) == (2, "1gbit", 2)
    summary = json.loads((out / "summary.json").read_text())
    assert summary["network"] == "1gbit" and summary["runs"][1]["prediction"] == "simulated"
