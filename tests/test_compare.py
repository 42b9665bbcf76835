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
from tests.compare_fixture import CONFIG, FIGURES, TINY, fabricate_runs, make_corpus

SETUP = {"config": str(CONFIG), "learners": 2, "overrides": TINY}


def _compare(out: Path, corpus: Path, strategies: str, *extra: str) -> int:
    return main(["compare", str(CONFIG), "--strategies", strategies, "--learners", "2", "--out", str(out),
                 "--data", str(corpus), *TINY, *extra])


@pytest.fixture
def no_training(monkeypatch):
    def refuse(args):
        raise AssertionError(f"trained {args.out} again")
    monkeypatch.setattr(launch, "train_command", refuse)


@pytest.fixture
def fake_simulator(monkeypatch):
    """Records the calls; predicts 1000 frames/s per learner."""
    import asrdist.sim

    calls = []

    def predict(cfg, learners, seconds_per_frame, *, nodes=1, network="loopback", network_cost=0.0):
        calls.append((cfg.strategy_name, cfg.train.learners, learners, seconds_per_frame, nodes, network,
                      network_cost))
        return 1000.0 * learners
    monkeypatch.setattr(asrdist.sim, "predict_frames_per_second", predict)
    return calls


STEP_COST = {1: 1e-3, 2: 2.5e-3}
"""The made-up machine: seconds per frame of a learner's step among L learners (`stepcost`)."""
NETWORK_COST = 2e-10


@pytest.fixture(autouse=True)
def fake_machine(monkeypatch):
    """The made-up runs have no corpus to time steps on: `stepcost` answers from STEP_COST, and
    records what each call asked for ((learners, threads) pairs)."""
    from asrdist.compare import stepcost

    asked = []

    def step(requests):
        asked.append(sorted((learners, threads) for _, learners, threads in requests.values()))
        return {key: STEP_COST[learners] for key, (_, learners, _) in requests.items()}
    monkeypatch.setattr(stepcost, "step_seconds_per_frame", step)
    monkeypatch.setattr(stepcost, "network_seconds_per_byte", lambda values: NETWORK_COST)
    return asked


def test_report_from_finished_runs(tmp_path, no_training, fake_simulator, fake_machine, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync", "onebit"])
    assert _compare(out, corpus, "single,sync,onebit") == 0
    printed = capsys.readouterr().out
    assert "not trained again" in printed and f"report: {out / 'report.html'}" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["strategies"] == ["single", "sync", "onebit"] and summary["learners"] == 2
    assert summary["metric"] == "per" and summary["network"] == "loopback" and summary["cores"] == 2
    assert summary["behind_sync"] == []  # onebit's 0.22 is 5% above sync's 0.21: within the 10%
    single, sync, onebit = summary["runs"]
    assert (single["learners"], sync["learners"]) == (1, 2)  # single is the one-learner baseline
    # the simulator gets each run's own config and learners, and the lone learner's time per frame
    # of training steps (data pipeline included: 1 / its frames/s), not its compute alone; a run of
    # 2 learners that time scaled by what their steps cost per frame here (2.5x), as if a learner
    # had both cores (it has 1 thread of 2), and gloo's CPU per byte
    spf = 1 / FIGURES["single"][1]
    assert [c[:3] for c in fake_simulator] == [("single", 1, 1), ("sync", 2, 2), ("onebit", 2, 2)]
    ratio = STEP_COST[2] / STEP_COST[1]
    assert [c[3] for c in fake_simulator] == pytest.approx([spf, spf * ratio / 2, spf * ratio / 2])
    assert all(c[4:] == (1, "loopback", NETWORK_COST) for c in fake_simulator)
    assert summary["one_learner_step_seconds_per_frame"] == pytest.approx(spf)
    assert summary["one_learner_compute_seconds_per_frame"] == pytest.approx(FIGURES["single"][3])
    assert summary["machine"] == {"step_seconds_per_frame": {"1x2": STEP_COST[1], "2x1": STEP_COST[2]},
                                  "network_cpu_seconds_per_byte": NETWORK_COST}
    assert [r["step_cost_ratio"] for r in summary["runs"]] == pytest.approx([1.0, ratio, ratio])
    assert fake_machine == [[(1, 2), (2, 1)]]  # once per learners x threads
    assert sync["predicted_frames_per_second"] == 2000.0 and sync["prediction_error"] == pytest.approx(2000 / 1500 - 1)
    assert onebit["mb_sent"] == 2.0 and sync["comm_seconds"] == 0.5 and sync["wait_seconds"] == 0.25
    assert [p["per"] for p in sync["curve"]] == list(FIGURES["sync"][0])
    assert [p["epoch"] for p in sync["curve"]] == [1, 2] and sync["curve"][1]["seconds"] > sync["curve"][0]["seconds"]
    # time to target: within 5% of the best final PER (single's 0.20), the job's wall seconds to the
    # first validation at or below it (the fixture's epoch e at (e + 1) x frames / fps / 2)
    assert summary["target"]["value"] == pytest.approx(0.21) and "single" in summary["target"]["how"]
    assert single["time_to_target_seconds"] == pytest.approx(20.0) and single["reached_target"] is True
    assert sync["time_to_target_seconds"] == pytest.approx(20_000 / 1500)
    assert onebit["time_to_target_seconds"] == "never" and onebit["reached_target"] is False
    assert summary["recommendation"].startswith("Recommendation: sync reached PER <= 0.2100 first on this machine, "
                                                "in 13.3 s; then single 20.0 s (1.50x); never: onebit (")
    assert "2 learner(s) x 1 thread(s) sharing 2 CPU core(s)" in summary["recommendation"]
    assert printed.index(summary["recommendation"]) < printed.index("s to target")  # it leads
    table = summary["table"]
    assert table["columns"][:4] == ["strategy", "learners", "s to target", "PER"] and len(table["rows"]) == 3
    assert table["rows"][2][:4] == ["onebit", 2, "never", FIGURES["onebit"][0][-1]]
    # each strategy with its own recipe: onebit's is CNTK's AdaGrad (configs/recipes/onebit.yaml)
    assert 'optim.name="adagrad"' in summary["recipes"]["onebit"] and summary["recipes"]["sync"] == []
    assert summary["same_recipe"] is False

    page = (out / "report.html").read_text()
    assert "<title>asrdist compare: single, sync, onebit</title>" in page
    assert ("fed the one-learner run's (single) 1000.0 us per frame of training step (its own row is that figure "
            "again), the learners' steps timed here at 2.5 x "
            "its cost per frame and gloo's 0.20 ns of CPU per byte.") in html.unescape(page)
    assert "1 learner(s) x 2 thread(s), 2 learner(s) x 1 thread(s) sharing 2 CPU core(s)" in page
    assert "their own optimizer recipes (configs/recipes/) for onebit" in page
    assert re.search(r"<td>onebit</td><td>2</td><td>never</td><td>0\.2200</td>", page)
    assert page.index('<p id="recommendation">') < page.index("<table")  # the page leads with it
    pngs = re.findall(r'src="data:image/png;base64,([A-Za-z0-9+/=]+)"', page)
    assert len(pngs) == 2 and all(base64.b64decode(p).startswith(b"\x89PNG\r\n\x1a\n") for p in pngs)
    assert not re.search(r"(src|href)=\"(?!data:)", page)  # self-contained: nothing fetched


@pytest.mark.parametrize("target, first, never", [("0.35", "onebit", []), ("0.2", "single", ["sync", "onebit"])])
def test_target_flag_sets_the_target(tmp_path, no_training, fake_simulator, capsys, target, first, never):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync", "onebit"])
    assert _compare(out, corpus, "single,sync,onebit", "--target", target) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["target"] == {"metric": "per", "value": float(target), "how": "given (--target)"}
    assert summary["recommendation"].startswith(f"Recommendation: {first} reached PER <= {float(target):.4f} first")
    assert [r["run"] for r in summary["runs"] if r["reached_target"] is False] == never
    if target == "0.35":  # every run there at its first validation: epoch 1 at frames / fps / 2
        assert [r["time_to_target_seconds"] for r in summary["runs"]] == pytest.approx(
            [10_000 / FIGURES[n][1] for n in ("single", "sync", "onebit")])


def test_no_run_reaching_the_target_is_said(tmp_path, no_training, fake_simulator, capsys):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["sync", "onebit"])
    assert _compare(out, corpus, "sync,onebit", "--target", "0.1") == 0
    printed = capsys.readouterr().out
    assert "No recommendation: no run reached PER <= 0.1000" in printed
    assert "never" in printed and (out / "report.html").is_file()


def test_same_recipe_trains_every_strategy_on_the_given_optimizer(tmp_path, no_training, fake_simulator, capsys):
    corpus = make_corpus(tmp_path / "corpus")
    own, same = tmp_path / "own", tmp_path / "same"
    fabricate_runs(own, corpus, ["sync", "onebit"])
    # runs made with their own recipes are not the runs --same-recipe asks for: refused, nothing trained
    assert _compare(own, corpus, "sync,onebit", "--same-recipe") == 2
    assert ("own/onebit: trained with another config (optim.adagrad_skip_unseen: True there, False asked)"
            in capsys.readouterr().err)
    fabricate_runs(same, corpus, ["sync", "onebit"], same_recipe=True)
    assert _compare(same, corpus, "sync,onebit", "--same-recipe") == 0
    summary = json.loads((same / "summary.json").read_text())
    assert summary["same_recipe"] is True and summary["recipes"] == {"sync": [], "onebit": []}
    assert "every strategy on the same recipe (--same-recipe)" in (same / "report.html").read_text()


def test_a_rebuilt_report_reuses_the_machine_figures_and_a_failed_measurement_is_said(
        tmp_path, no_training, fake_simulator, fake_machine, monkeypatch):
    from asrdist.compare import stepcost
    from asrdist.errors import DataError

    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync"])
    assert _compare(out, corpus, "single,sync") == 0
    first = json.loads((out / "summary.json").read_text())

    def unmeasurable(*args):
        raise DataError("no corpus here")
    monkeypatch.setattr(stepcost, "step_seconds_per_frame", unmeasurable)
    monkeypatch.setattr(stepcost, "network_seconds_per_byte", unmeasurable)
    assert _compare(out, corpus, "single,sync") == 0  # the earlier figures: nothing measured again
    again = json.loads((out / "summary.json").read_text())
    assert again["machine"] == first["machine"] and again["runs"] == first["runs"]
    assert fake_simulator[2:] == fake_simulator[:2]

    # nothing known, nothing measurable: the lone learner's time as it is, and the page says why
    (out / "summary.json").unlink()
    fake_simulator.clear()
    assert _compare(out, corpus, "single,sync") == 0
    single, sync = json.loads((out / "summary.json").read_text())["runs"]
    assert sync["prediction"] == "simulated (step cost not measured: no corpus here)"
    assert sync["step_cost_ratio"] is None and single["prediction"] == "simulated"
    page = html.unescape((out / "report.html").read_text())
    assert "sync: simulated frames/s: simulated (step cost not measured: no corpus here)" in page
    assert "single: simulated frames/s" not in page
    spf = 1 / FIGURES["single"][1]
    assert [c[3] for c in fake_simulator] == pytest.approx([spf, spf])
    assert [c[6] for c in fake_simulator] == [0.0, 0.0]


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
    assert run["predicted_frames_per_second"] is None and "add single to --strategies" in run["prediction"]


def test_the_real_simulator_predicts_each_run(tmp_path, no_training):
    pytest.importorskip("asrdist.sim")
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = build_summary(fabricate_runs(out, corpus, ["single", "sync", "adpsgd"]), SETUP)["runs"]
    for r in runs:
        assert r["prediction"] == "simulated" and r["predicted_frames_per_second"] > 0, r
    # one learner computing 1 ms per frame and nothing to exchange: about 1000 frames/s
    assert runs[0]["predicted_frames_per_second"] == pytest.approx(1000.0, rel=0.2)


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


def test_a_run_that_fails_in_training_is_a_row_of_the_report_and_an_error(tmp_path, monkeypatch, capsys,
                                                                          fake_simulator):
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


def test_a_stopped_run_stops_the_comparison(tmp_path, monkeypatch, capsys, fake_simulator):
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
    (run / "summary.json").write_text(json.dumps({**summary, "nodes": nodes, "network": network}))


def test_runs_on_emulated_hosts_are_simulated_as_such_and_other_hosts_refused(tmp_path, no_training,
                                                                              fake_simulator, capsys, monkeypatch):
    import asrdist.cluster.netem

    monkeypatch.setattr(asrdist.cluster.netem, "available", lambda: (True, ""))  # nothing is trained here
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = fabricate_runs(out, corpus, ["single", "sync"])
    _on_hosts(runs["sync"], 2, "1gbit")  # as `asrdist train --nodes 2 --network 1gbit` records it
    assert _compare(out, corpus, "single,sync", "--nodes", "2", "--network", "1gbit") == 0
    summary = json.loads((out / "summary.json").read_text())
    assert (summary["nodes"], summary["network"]) == (2, "1gbit")
    assert [c[4:6] for c in fake_simulator] == [(1, "loopback"), (2, "1gbit")]  # single alone, sync on the hosts
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
