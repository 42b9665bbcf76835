"""`asrdist bench compare`: the table (and JSON) from finished runs, its argument checks, and
`--train` over finished runs (its training is `asrdist compare`'s, trained in tests/compare/test_compare.py)."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from asrdist.cli import main



def _fake_run(run_dir: Path, strategy: str, bytes_sent: int) -> Path:
    run_dir.mkdir(parents=True)
    summary = {"strategy": strategy, "learners": 2, "final": {"per": 0.25, "frame_accuracy": 0.75},
               "frames_per_second": 1000.0, "wall_seconds": 3.0,
               "comm": {"bytes_sent": bytes_sent, "comm_seconds": 0.5, "wait_seconds": 0.25}}
    (run_dir / "summary.json").write_text(json.dumps(summary))
    return run_dir


def test_table_and_json_from_finished_runs(tmp_path, capsys):
    runs = [_fake_run(tmp_path / "a", "sync", 2_000_000), _fake_run(tmp_path / "b", "onebit", 100_000)]
    out = tmp_path / "compare.json"
    assert main(["bench", "compare", *map(str, runs), "--json", str(out)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "strategy", "learners"]
    assert [line.split()[:2] for line in table[2:]] == [["a", "sync"], ["b", "onebit"]]
    result = json.loads(out.read_text())
    assert [r["strategy"] for r in result["runs"]] == ["sync", "onebit"]
    assert [r["MB sent"] for r in result["runs"]] == [2.0, 0.1] and result["runs"][1]["path"] == str(runs[1])
    assert "trained" not in result and "machine" in result
    assert main(["bench", "compare", str(runs[0])]) == 0  # --json is optional for compare only


@pytest.mark.parametrize("argv, message", [
    ([], "give run directories, or --train"),
    (["RUN", "--learners", "2"], "--learners: only with --train"),
    (["RUN", "optim.lr=0.1"], "optim.lr=0.1: only with --train"),
    (["RUN", "--same-recipe"], "--same-recipe: only with --train"),
    (["--train", "configs/default.yaml", "--strategies", ","], "names no strategy"),
    (["MISSING"], "MISSING/summary.json: missing"),
])
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    assert main(["bench", "compare", *argv]) != 0
    assert message in capsys.readouterr().err


def test_other_benchmarks_still_require_json():
    with pytest.raises(SystemExit):
        main(["bench", "data"])


def test_train_reuses_finished_runs_of_the_same_recipe(tmp_path, capsys, monkeypatch):
    """`--train` is `asrdist compare`'s training (asrdist/compare/runs.py, trained end to end in
    tests/compare/test_compare.py): finished runs of the same recipe are read, not trained again."""
    import asrdist.run.launch as launch
    from tests.support.compare_fixture import CONFIG, TINY, fabricate_runs, make_corpus

    corpus, out, first = make_corpus(tmp_path / "corpus"), tmp_path / "compare", tmp_path / "first.json"
    fabricate_runs(out, corpus, ["sync", "onebit"])
    monkeypatch.setattr(launch, "train_command", lambda args: pytest.fail(f"trained {args.out} again"))
    assert main(["bench", "compare", "--train", str(CONFIG), "--learners", "2", "--strategies", "sync,onebit",
                 "--out", str(out), "--data", str(corpus), "--json", str(first), *TINY]) == 0
    table = capsys.readouterr().out.splitlines()[-4:]
    assert table[0].split()[:3] == ["run", "strategy", "learners"]
    assert [line.split()[:3] for line in table[2:]] == [["sync", "sync", "2"], ["onebit", "onebit", "2"]]
    result = json.loads(first.read_text())
    assert result["trained"] == {"config": str(CONFIG), "learners": 2, "out": str(out), "overrides": TINY}
    assert [r["MB sent"] for r in result["runs"]] == [40.0, 2.0]
