"""`asrdist compare`'s target, repeats and columns (issue 58 items 1, 2, 4) on made-up finished
runs (no training): the default target (the baseline's final error) and --target's forms, runs
of K interleaved rounds with medians and ranges, the error rate's bootstrap interval over
utterances, the recommendation that names a winner only when separated, speed-up over single,
the test split's error and which figures are measured or counted."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

import asrdist.run.launch as launch
from asrdist.cli import main
from asrdist.compare.repeats import recommendation
from asrdist.compare.report import build_summary, format_table
from asrdist.compare.runs import Round, resolve_rounds, train_missing
from asrdist.compare.scores import bootstrap_interval, score_run
from asrdist.compare.target import Target, TargetSpec, parse_target
from asrdist.errors import ConfigError
from tests.support.compare_fixture import CONFIG, TINY, fabricate_runs, make_corpus

SETUP = {"config": str(CONFIG), "learners": 2, "overrides": TINY}


def _set_final(run: Path, per: float, history: tuple[float, ...] | None = None, fps: float | None = None) -> None:
    """A made-up run's final PER (and validations, frames/s), rewritten in its summary.json."""
    s = json.loads((run / "summary.json").read_text())
    s["final"]["per"] = per
    for h, v in zip(s["history"], history or ()):
        h["per"] = v
    if fps is not None:
        s["frames_per_second"] = fps
    (run / "summary.json").write_text(json.dumps(s))


def _no_scores(run, run_dir):
    return "not scored here"


@pytest.fixture
def no_training(monkeypatch):
    monkeypatch.setattr(launch, "train_command", lambda args: pytest.fail(f"trained {args.out} again"))


# -- the target -------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, spec", [
    (None, TargetSpec()), ("baseline", TargetSpec()), ("0.05", TargetSpec("number", 0.05)), (0.3, TargetSpec("number", 0.3)),
    ("best+5%", TargetSpec("best", 0.05)), ("best+12.5%", TargetSpec("best", 0.125)), ("best", TargetSpec("best", 0.0)),
])
def test_target_forms(text, spec):
    assert parse_target(text) == spec


@pytest.mark.parametrize("text", ["-0.1", "best+5", "best-5%", "fast", "inf", "nan"])
def test_a_bad_target_is_one_line_before_anything_is_written(tmp_path, capsys, text, no_training):
    with pytest.raises(ConfigError, match="--target: expected an error rate >= 0, 'baseline' or 'best"):
        parse_target(text)
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    with pytest.raises(SystemExit):
        main(["compare", str(CONFIG), "--strategies", "sync", "--out", str(out), "--data", str(corpus),
              "--target", text])
    err = capsys.readouterr().err
    assert "--target: " in err and "'baseline' or 'best+N%'" in err and not out.exists()


def test_the_default_target_lets_every_strategy_that_reaches_the_baseline_get_a_time(tmp_path):
    """Before issue 58 the default was the best final figure + 5%: only the winner had a time."""
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = fabricate_runs(out, corpus, ["single", "sync", "onebit", "adpsgd"])
    _set_final(runs["sync"], 0.17, (0.25, 0.17))  # better than the baseline: reaches it at epoch 2
    _set_final(runs["adpsgd"], 0.12, (0.18, 0.12))  # the best: reaches the baseline at epoch 1
    # single 0.20 (the baseline), onebit 0.22: never
    summary = build_summary(runs, SETUP, scores=_no_scores)
    assert summary["target"]["value"] == 0.20 and summary["target"]["how"].startswith("baseline: single's final PER")
    times = {r["run"]: r["time_to_target_seconds"] for r in summary["runs"]}
    finals = {r["run"]: r["error_rate"] for r in summary["runs"]}
    assert all(isinstance(times[run], float) for run, per in finals.items() if per <= summary["target"]["value"])
    assert times["onebit"] == "never"
    assert times == pytest.approx({"single": 20.0, "sync": 20_000 / 1500, "onebit": "never", "adpsgd": 4.0})
    # the old default would have left single and sync without a time
    best = build_summary(runs, SETUP, target="best+5%", scores=_no_scores)
    assert best["target"]["value"] == pytest.approx(0.126) and best["target"]["how"].startswith("best+5%")
    assert [r["run"] for r in best["runs"] if r["reached_target"]] == ["adpsgd"]
    # without single the baseline is sync's; with neither, best+5%, and the target says so
    no_single = build_summary({k: v for k, v in runs.items() if k != "single"}, SETUP, scores=_no_scores)
    assert no_single["target"]["value"] == 0.17 and "sync's final PER" in no_single["target"]["how"]
    neither = build_summary({k: runs[k] for k in ("onebit", "adpsgd")}, SETUP, scores=_no_scores)
    assert neither["target"]["value"] == pytest.approx(0.126)
    assert neither["target"]["how"].startswith("no baseline (single or sync) has a final figure: best+5%")


# -- repeats ------------------------------------------------------------------------------------------

def _two_rounds(tmp_path: Path, strategies: list[str]) -> tuple[Path, Path, dict]:
    """Made-up runs of two rounds under OUT (round 2 with seed 1: 0.01 worse at the end, 20% fewer
    frames/s, each validation 25% later)."""
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    first = fabricate_runs(out, corpus, strategies)
    second = fabricate_runs(tmp_path / "made2", corpus, strategies, overrides=TINY + ["seed=1"])
    for name, run in second.items():
        summary = json.loads((run / "summary.json").read_text())
        for h in summary["history"]:
            h["wall_seconds"] *= 1.25
        summary["wall_seconds"] *= 1.25
        (run / "summary.json").write_text(json.dumps(summary))
        _set_final(run, summary["final"]["per"] + 0.01, fps=summary["frames_per_second"] * 0.8)
        run.rename(out / f"{name}-r2")
    return corpus, out, first


def test_rounds_are_interleaved_with_a_seed_each_and_resume_trains_only_what_is_missing(tmp_path, monkeypatch):
    corpus = make_corpus(tmp_path / "corpus")
    configs, rounds = resolve_rounds(CONFIG, ["single", "sync"], 2, corpus, TINY, 3)
    assert list(configs) == ["single", "sync", "single-r2", "sync-r2", "single-r3", "sync-r3"]
    assert [configs[r].seed for r in configs] == [0, 0, 1, 1, 2, 2]
    assert rounds["sync-r3"] == Round("sync", 3, ["seed=2"]) and rounds["sync"] == Round("sync", 1, [])
    out = tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync"])  # round 1 finished (a comparison without repeats)
    stopped = out / "sync-r2"  # round 2's sync stopped half-way: resumed from its checkpoint
    (stopped / "checkpoints" / "step-10").mkdir(parents=True)
    (stopped / "checkpoints" / "latest").write_text("step-10\n")
    # its start wrote its config before the checkpoint
    (stopped / "config.yaml").write_text((out / "sync" / "config.yaml").read_text().replace("seed: 0", "seed: 1"))
    trained, before = [], []

    def train(args):
        trained.append((args.out.name, args.strategy, args.overrides[-1], args.resume))
        args.out.mkdir(exist_ok=True)
        (args.out / "summary.json").write_text("{}")
    monkeypatch.setattr(launch, "train_command", train)
    train_missing(CONFIG, configs, out, corpus, TINY, rounds=rounds, before=before.append)
    assert trained == [("single-r2", "single", "seed=1", None), ("sync-r2", "sync", "seed=1", stopped),
                       ("single-r3", "single", "seed=2", None), ("sync-r3", "sync", "seed=2", None)]
    assert before == []  # a strategy is calibrated before its first round only (finished here)


def test_repeats_give_medians_ranges_and_a_separated_winner(tmp_path, capsys, no_training, monkeypatch):
    corpus, out, _ = _two_rounds(tmp_path, ["single", "sync", "adpsgd"])
    import asrdist.compare.report as report

    monkeypatch.setattr(report, "score_run", lambda out_, run, run_dir: "not scored here")
    assert main(["compare", str(CONFIG), "--strategies", "single,sync,adpsgd", "--learners", "2", "--out", str(out),
                 "--data", str(corpus), "--repeats", "2", "--target", "0.215", *TINY]) == 0
    printed = capsys.readouterr().out
    summary = json.loads((out / "summary.json").read_text())
    assert summary["repeats"] == 2
    single, sync, adpsgd = summary["runs"]
    assert [r["run"] for r in sync["rounds"]] == ["sync", "sync-r2"] and [r["seed"] for r in sync["rounds"]] == [0, 1]
    assert sync["repeats"] == 2 and sync["frames_per_second"] == pytest.approx(1350.0)  # median of 1500, 1200
    assert sync["interval"]["frames_per_second"] == [1200.0, 1500.0]
    assert sync["interval"]["error_rate"] == pytest.approx([0.21, 0.22]) and sync["error_rate"] == pytest.approx(0.215)
    # adpsgd reaches PER 0.215 at its second validation in both rounds: 8 s, then 10 s; sync at 13.3
    # s and 16.7 s; single at 20 s and 25 s
    assert adpsgd["interval"]["time_to_target_seconds"] == pytest.approx([8.0, 10.0])
    assert sync["interval"]["time_to_target_seconds"] == pytest.approx([40 / 3, 50 / 3])
    assert single["time_to_target_seconds"] == pytest.approx(22.5)
    assert summary["recommendation"].startswith("Recommendation: adpsgd reached PER <= 0.2150 first on this machine, "
                                                "in 9.0 s (median), separated from the runner-up (adpsgd [8.0-10.0 s]")
    assert "1,350 [1,200-1,500]" in format_table(summary) and "9.0 [8.0-10.0]" in printed
    assert "Each strategy trained 2 times in interleaved rounds" in printed
    # speed-up over single: its median time and frames/s against single's
    assert adpsgd["speedup_vs_single"] == pytest.approx({"time_to_target": 22.5 / 9, "frames_per_second": 2250 / 900})


def test_the_recommendation_says_not_separated_when_the_ranges_overlap():
    target = Target("per", 0.2, "given")
    entries = [{"run": "sync", "time_to_target_seconds": 10.0, "repeats": 3, "failed": None,
                "interval": {"time_to_target_seconds": [9.0, 14.0]}},
               {"run": "adpsgd", "time_to_target_seconds": 12.0, "repeats": 3, "failed": None,
                "interval": {"time_to_target_seconds": [11.0, 13.0]}},
               {"run": "onebit", "time_to_target_seconds": "never", "repeats": 3, "failed": None,
                "interval": {"time_to_target_seconds": ["never", "never"]}}]
    line = recommendation(target, entries, "setup")
    assert line.startswith("Recommendation: not separated: sync reached PER <= 0.2000 first by median time, 10.0 s, "
                           "but its runs' times overlap the runner-up's (sync [9.0-14.0 s], adpsgd [11.0-13.0 s]")
    assert "never: onebit" in line
    entries[0]["interval"]["time_to_target_seconds"] = [9.0, 10.5]
    assert recommendation(target, entries, "setup").startswith("Recommendation: sync reached PER <= 0.2000 first")
    # a runner-up that reached it in some rounds only: its fastest round counts
    entries[1]["interval"]["time_to_target_seconds"] = [10.0, "never"]
    assert "not separated" in recommendation(target, entries, "setup")


# -- intervals over utterances, the test split, columns -----------------------------------------------

def test_the_bootstrap_interval_holds_the_error_rate_and_narrows_with_more_utterances():
    refs = [f"a b c d e f g h i j {i}" for i in range(40)]
    hyps = [r if i % 4 else "a b c d e f g h i j" for i, r in enumerate(refs)]  # 10 of 440 tokens deleted
    low, high = bootstrap_interval(refs, hyps)
    assert low < 10 / 440 < high and high - low < 0.05
    wide = bootstrap_interval(refs[:8], hyps[:8])
    assert wide[1] - wide[0] > high - low
    assert bootstrap_interval(refs, refs) == [0.0, 0.0]
    assert bootstrap_interval([""], ["x"]) is None  # no reference to score against


def test_a_runs_utterances_are_scored_once_and_again_for_a_new_model(tmp_path, monkeypatch):
    import asrdist.run.evaluate as evaluate

    corpus = make_corpus(tmp_path / "corpus")
    (corpus / "valid").mkdir()
    (corpus / "test").mkdir()
    run = fabricate_runs(tmp_path / "cmp", corpus, ["sync"])["sync"]
    assert score_run(tmp_path / "cmp", "sync", run) == f"{run}: no model.pt to score"
    (run / "model.pt").write_bytes(b"weights")
    scored = []

    def fake(run_dir, data, progress=True, details=False, eval_overrides=None):
        scored.append(Path(data).name)
        return {"per_utterance": [{"ref": "a b", "hyp": "a", "errors": 1, "ref_length": 2},
                                  {"ref": "c d", "hyp": "c d", "errors": 0, "ref_length": 2}]}
    monkeypatch.setattr(evaluate, "evaluate_run", fake)
    first = score_run(tmp_path / "cmp", "sync", run)
    assert scored == ["valid", "test"] and first["test"]["error_rate"] == 0.25 and first["valid"]["utterances"] == 2
    assert score_run(tmp_path / "cmp", "sync", run) == first and scored == ["valid", "test"]  # kept
    (run / "model.pt").write_bytes(b"other weights")
    score_run(tmp_path / "cmp", "sync", run)
    assert scored == ["valid", "test"] * 2  # a new model is scored again


def test_the_test_error_and_the_utterance_interval_are_columns(tmp_path):
    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = fabricate_runs(out, corpus, ["single", "sync"])
    split = {"error_rate": 0.25, "utterances": 2, "refs": ["a b", "c d"] * 10, "hyps": ["a", "c d"] * 10}
    summary = build_summary(runs, SETUP, scores=lambda run, d: {"valid": split, "test": split if run == "sync" else None})
    single, sync = summary["runs"]
    assert sync["test_error_rate"] == 0.25 and single["test_error_rate"] is None
    low, high = sync["interval"]["error_rate_utterances"]
    assert low < 0.25 < high and sync["interval"]["test_error_rate_utterances"] == [low, high]
    columns = summary["table"]["columns"]
    assert "test PER" in columns and "PER 95% (utterances)" in columns
    row = dict(zip(columns, summary["table"]["rows"][1]))
    assert row["test PER"] == 0.25 and row["PER 95% (utterances)"] == [low, high]
    assert f"{low:.4f}-{high:.4f}" in format_table(summary)
    kinds = dict(zip(columns, summary["table"]["kinds"]))
    assert {kinds[c] for c in ("s to target", "PER", "test PER", "frames/s", "wall s")} == {"measured"}
    assert kinds["MB sent"] == "counted"


@pytest.mark.slow
@pytest.mark.timeout(900)  # four trainings one after another on a loaded machine (a hang still ends the test)
def test_compare_with_two_repeats_end_to_end_extends_a_comparison_and_resumes(tone_corpus, tmp_path, capsys,
                                                                                monkeypatch):
    """The real thing, small: single and 2-learner sync for 1 epoch on the tone corpus, first one
    round (a comparison without repeats), then --repeats 2 trains round 2 only, then nothing. The
    simulator's calibration is left out (tests/e2e/test_demo.py times it): the runs are the point."""
    from asrdist.calibrate import microbench

    monkeypatch.setattr(microbench, "measure_and_save", lambda *args: "not calibrated: left out of this test")
    out = tmp_path / "cmp"
    argv = ["compare", str(CONFIG), "--strategies", "single,sync", "--learners", "2", "--out", str(out),
            "--data", str(tone_corpus), *TINY[:-1], "train.epochs=1"]
    assert main(argv) == 0
    assert main([*argv, "--repeats", "2"]) == 0
    printed = capsys.readouterr().out
    assert "single: finished run" in printed and "[compare] single-r2: training" in printed
    summary = json.loads((out / "summary.json").read_text())
    assert summary["repeats"] == 2 and summary["target"]["how"].startswith("baseline: single's final PER")
    for entry in summary["runs"]:
        assert [r["seed"] for r in entry["rounds"]] == [0, 1] and entry["repeats"] == 2
        finals = [json.loads((Path(r["path"]) / "summary.json").read_text())["final"]["per"] for r in entry["rounds"]]
        # the utterances scored again reproduce each run's final figure (the same model, the same split)
        assert [r["error_rate"] for r in entry["rounds"]] == pytest.approx(finals)
        low, high = entry["interval"]["error_rate_utterances"]
        assert low <= entry["error_rate"] <= high and entry["interval"]["error_rate"] == [min(finals), max(finals)]
        assert entry["test_error_rate"] is not None and entry["interval"]["test_error_rate_utterances"]
        assert entry["interval"]["frames_per_second"][0] <= entry["frames_per_second"]
    assert summary["runs"][0]["speedup_vs_single"]["frames_per_second"] == 1.0
    page = (out / "report.html").read_text()
    assert "Each strategy trained 2 times in interleaved rounds" in page and "<th>counted</th>" in page
    scores = {p.name: p.stat().st_mtime_ns for p in (out / "scores").iterdir()}
    assert sorted(scores) == ["single-r2.json", "single.json", "sync-r2.json", "sync.json"]
    monkeypatch.setattr(launch, "train_command", lambda args: pytest.fail(f"trained {args.out} again"))
    assert main([*argv, "--repeats", "2"]) == 0
    assert json.loads((out / "summary.json").read_text())["runs"] == summary["runs"]
    assert {p.name: p.stat().st_mtime_ns for p in (out / "scores").iterdir()} == scores  # scored once


def test_a_run_that_says_it_was_contended_is_flagged_in_its_strategys_row_and_notes(tmp_path):
    """The runs' `contended`, `load` and `cpu_share` (recorded by `asrdist train`, issue 58 item 3)
    are read where a run's record has them: kept per round, flagged in the row and a note."""
    from asrdist.compare.report import note_lines, row_cells
    import asrdist.compare.report as report

    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    runs = fabricate_runs(out, corpus, ["single", "sync"])
    original = report.run_record

    def with_contention(run_dir):
        record = original(run_dir)
        busy = Path(run_dir).name == "single"
        return {**record, "contended": busy, "load": 3.5 if busy else 1.0, "cpu_share": 0.45 if busy else 0.97}
    try:
        report.run_record = with_contention
        summary = build_summary(runs, SETUP, scores=_no_scores)
    finally:
        report.run_record = original
    single, sync = summary["runs"]
    assert (single["contended"], single["cpu_share"], single["load"]) == (True, 0.45, 3.5)
    assert single["rounds"][0]["contended"] is True and sync["contended"] is False
    assert row_cells(single)[0] == "single (contended)" and row_cells(sync)[0] == "sync"
    assert [line.split(":")[0] for line in note_lines(summary) if "contended" in line] == ["single"]
