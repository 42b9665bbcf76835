"""One epoch numbering, from 1, everywhere a run says an epoch (docs/training.md#the-run-directory):
the progress line, the log line, metrics.jsonl's records, the epoch history summary.json takes;
and a run directory written when the records counted from 0 reads renumbered (metrics.jsonl,
summary.json, a checkpoint's history), its metrics.jsonl rewritten so on --resume."""
from __future__ import annotations

import json
from pathlib import Path

from asrdist.parallel.base import Strategy
from asrdist.run.summary import RunSummary
from asrdist.train.metrics import MetricsLog, epoch_line, numbered_from_one, read_metrics
from asrdist.train.progress import EpochProgress
from tests.support.engine_fixture import ListOrder, linear_trainer


def test_a_run_numbers_its_epochs_from_1_in_every_record(tmp_path: Path):
    tr = linear_trainer(tmp_path, Strategy(), ListOrder(3), validate=lambda m: {"valid_loss": 1.0}, epochs=2,
                        log_every=1)
    tr.fit()
    raw = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [r["epoch"] for r in raw if r["kind"] == "epoch"] == [1, 2]
    assert sorted({r["epoch"] for r in raw if r["kind"] == "train"}) == [1, 2]
    assert [h["epoch"] for h in tr.state.history] == [1, 2]
    assert epoch_line(tr.state.history[0]).startswith("[asrdist] epoch=1, ")
    assert read_metrics(tmp_path) == raw  # a new run's records read as written
    assert EpochProgress(0, 2, 3, enabled=False).label == "epoch 1/2"  # the first epoch's progress line


def test_an_older_run_directory_reads_renumbered(tmp_path: Path):
    old = [{"kind": "train", "step": 1, "seconds": 0.5, "epoch": 0, "loss": 2.0},
           {"kind": "epoch", "step": 3, "seconds": 1.0, "epoch": 0, "train_loss": 2.0},
           {"kind": "epoch", "step": 6, "seconds": 2.0, "epoch": 1, "train_loss": 1.5}]
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in old))
    assert [(r["kind"], r["epoch"]) for r in read_metrics(tmp_path)] == [("train", 1), ("epoch", 1), ("epoch", 2)]
    assert numbered_from_one([{"epoch": 1}, {"kind": "run"}]) == [{"epoch": 1}, {"kind": "run"}]
    # --resume of such a run: the records kept are rewritten numbered from 1, before new ones follow
    log = MetricsLog(tmp_path, resume_step=3)
    log.log("epoch", 6, epoch=2, train_loss=1.4)
    log.close()
    lines = [json.loads(line) for line in (tmp_path / "metrics.jsonl").read_text().splitlines()]
    assert [(r["kind"], r["epoch"], r["step"]) for r in lines] == [("train", 1, 1), ("epoch", 1, 3), ("epoch", 2, 6)]
    # summary.json of such a run: written back as it was, its epochs numbered from 1 for readers
    summary = {"strategy": "single", "learners": 1, "frames_per_second": 1.0, "wall_seconds": 1.0,
               "final": {"train_loss": 1.5, "valid_loss": 1.0}, "history": [{"epoch": 0}, {"epoch": 1}],
               "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0}}
    read = RunSummary.from_json(summary)
    assert read.epoch_numbers() == [1, 2] and read.to_json()["history"] == summary["history"]
    assert RunSummary.from_json({**summary, "history": [{"epoch": 1}, {"epoch": 2}]}).epoch_numbers() == [1, 2]


def test_a_checkpoint_from_before_resumes_with_its_history_renumbered(tmp_path: Path):
    tr = linear_trainer(tmp_path, Strategy(), ListOrder(3), epochs=2)
    tr.fit()
    state = tr.snapshot()
    state["loop"]["history"] = [{**h, "epoch": h["epoch"] - 1} for h in state["loop"]["history"]]  # as written then
    again = linear_trainer(tmp_path / "again", Strategy(), ListOrder(3), epochs=2)
    assert [h["epoch"] for h in again.restore_snapshot(state).history] == [1, 2]
    assert [h["epoch"] for h in again.restore_snapshot(tr.snapshot()).history] == [1, 2]
