"""`asrdist demo` end to end on the tone corpus with a tiny DNN: the one-learner baseline and its
PER table, then the comparison (`asrdist compare`, really trained: single and 2-learner onebit),
its report and summary.json; `bench compare` reads the same runs; a second demo trains nothing."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import yaml

import asrdist.run.launch as launch
from asrdist.cli import main
from tests.support.paths import ROOT



def _workdir(tone_corpus: Path, tmp_path: Path) -> tuple[Path, Path]:
    """A demo work directory whose corpora are copies of the tone corpus (no synthesis), and a tiny recipe."""
    work = tmp_path / "demo"
    for name in ("corpus", "flite"):
        shutil.copytree(tone_corpus, work / name)
        (work / name / "summary.json").write_text("{}\n")  # what tells the demo a corpus is built
    tree = yaml.safe_load((ROOT / "configs" / "default.yaml").read_text())
    tree["model"].update(hidden_dim=32, hidden_layers=1)
    tree["data"]["batch_size"] = 128
    config = tmp_path / "tiny.yaml"
    config.write_text(yaml.safe_dump(tree))
    return work, config


@pytest.mark.slow
def test_demo_baseline_then_comparison_then_nothing_trained_again(tone_corpus, tmp_path, capsys, monkeypatch):
    work, config = _workdir(tone_corpus, tmp_path)
    argv = ["demo", "--workdir", str(work), "--config", str(config), "--epochs", "2", "--learners", "2",
            "--strategies", "onebit", "--repeats", "1"]
    assert main(argv) == 0
    printed = capsys.readouterr().out
    out = work / "compare"
    baseline = json.loads((work / "demo.json").read_text())
    assert baseline["run"] == str(out / "single") and len(baseline["rows"]) == 2
    assert all(0 < r["frame_accuracy"] <= 1 and r["per"] < r["prior_only_per"] for r in baseline["rows"])
    assert printed.index("prior-only PER") < printed.index("[compare] onebit: training")  # baseline first
    assert f"report: {(out / 'report.html').resolve()}" in printed

    summary = json.loads((out / "summary.json").read_text())
    single, onebit = summary["runs"]
    for r in summary["runs"]:
        assert 0 < r["frame_accuracy"] <= 1 and r["frames_per_second"] > 0 and r["compute_seconds_per_frame"] > 0
        assert [p["epoch"] for p in r["curve"]] == [1, 2] and 0 < r["curve"][0]["seconds"] < r["curve"][1]["seconds"]
        assert "hidden_dim: 32" in (Path(r["path"]) / "config.yaml").read_text()
    assert (single["learners"], single["mb_sent"]) == (1, 0)
    assert (onebit["learners"], onebit["threads_per_learner"]) == (2, 1) and onebit["mb_sent"] > 0
    # the simulator calibrated on microbenchmarks of one learner of each run's own recipe and corpus,
    # timed just before the run trained (single's by the demo's baseline, which the comparison reuses)
    calibration = summary["calibration"]
    assert {c["when"] for c in calibration.values()} == {"before it trained"}
    assert set(calibration["single"]["microbenchmarks"]["step_seconds_per_frame"]) == {"1x2"}
    micro = calibration["onebit"]["microbenchmarks"]
    assert set(micro["step_seconds_per_frame"]) == {"2x1"} and micro["link_bytes_per_second"] > 0
    assert micro["link_cpu_seconds_per_byte"] > 0 and micro["onebit_exchange_seconds_per_value"] > 0
    assert all(r["prediction"] == "simulated" and r["predicted_frames_per_second"] > 0 for r in summary["runs"])
    assert "<table id=\"summary\">" in (out / "report.html").read_text()
    # time to accuracy, end to end: every validation carries the job's wall seconds (summary.json's
    # history, metrics.jsonl) and the consensus model's loss and PER; the report leads with the
    # time each run took to the target
    for r in summary["runs"]:
        history = json.loads((Path(r["path"]) / "summary.json").read_text())["history"]
        walls = [h["wall_seconds"] for h in history]
        assert len(walls) == 2 and 0 < walls[0] < walls[1] and [p["wall_seconds"] for p in r["curve"]] == walls
        assert all(h["valid_loss"] > 0 and h["per"] is not None for h in history)
        assert r["points"][:2] == [[w, h["per"]] for w, h in zip(walls, history)]
        assert r["points"][-1][1] == r["error_rate"] and r["points"][-1][0] >= walls[-1]
    # (default: the baseline's final PER, single's: every run that does as well gets a time)
    assert summary["target"]["value"] == single["error_rate"] and single["reached_target"] is True
    assert all(r["reached_target"] for r in summary["runs"] if r["error_rate"] <= single["error_rate"])
    assert all(r["time_to_target_seconds"] == "never" or r["time_to_target_seconds"] > 0 for r in summary["runs"])
    assert summary["recommendation"].startswith("Recommendation: ") and summary["recommendation"] in printed
    assert printed.index(summary["recommendation"]) < printed.index("s to target")
    # each trained its own recipe: single the demo's (Nesterov SGD), onebit Kaldi's optimizer
    # (configs/recipes/onebit.yaml; docs/measurements.md)
    optim = {name: yaml.safe_load((out / name / "config.yaml").read_text())["optim"] for name in ("single", "onebit")}
    baseline = optim["single"]
    assert (baseline["name"], baseline["momentum"], baseline["natural_gradient"]) == ("sgd", 0.9, False)
    assert (optim["onebit"]["momentum"], optim["onebit"]["natural_gradient"], optim["onebit"]["decay"]) == (
        0.0, True, "geometric")

    assert main(["bench", "compare", str(out / "single"), str(out / "onebit")]) == 0
    table = capsys.readouterr().out.splitlines()[-2:]
    assert [line.split()[:3] for line in table] == [["single", "single", "1"], ["onebit", "onebit", "2"]]

    first_page = (out / "report.html").read_text()
    monkeypatch.setattr(launch, "train_command", lambda args: pytest.fail(f"trained {args.out} again"))
    assert main(argv) == 0
    assert "not trained again" in capsys.readouterr().out
    again = json.loads((out / "summary.json").read_text())
    assert [r["frames_per_second"] for r in again["runs"]] == [r["frames_per_second"] for r in summary["runs"]]
    assert again["calibration"] == calibration  # timed once: the rebuilt report predicts the same
    assert (out / "report.html").read_text().split("<figure>")[0] == first_page.split("<figure>")[0]
