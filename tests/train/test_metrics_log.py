"""MetricsLog's TensorBoard writer shuts down promptly even after a lost wake-up; a logging
window's `train` record counts the job's frames through the job store."""
from __future__ import annotations

import threading
from pathlib import Path
from types import SimpleNamespace

import torch.distributed as dist

from asrdist.train import metrics as metrics_module
from asrdist.train.metrics import FRAMES_KEY, MetricsLog, TrainWindow, read_metrics


def test_closing_after_a_lost_wake_up_waits_one_flush_period_not_two_minutes(tmp_path: Path):
    """A stop signal is raised in the main thread wherever it is; raised inside the writer queue's
    notify, after a waiter's lock is released but before it leaves the waiters list, it leaves a
    stale waiter there, and the next notify (the writer's shutdown request) wakes nobody: a
    stopped run then took 2 minutes to exit (seen under load, py-spy). The stale waiter is planted
    here as the race leaves it: the writer must still shut down at its next timed wake-up
    (TENSORBOARD_FLUSH_SECONDS), far inside the generous limit below, not after TensorBoard's
    default 120 s."""
    log = MetricsLog(tmp_path)
    log.log("train", 1, loss=1.0)
    queue = log._tb.file_writer.event_writer._async_writer._byte_queue
    stale = threading.Lock()
    stale.acquire()  # a waiter lock its thread already re-acquired
    with queue.mutex:
        queue.not_empty._waiters.appendleft(stale)
    closed = threading.Event()
    closer = threading.Thread(target=lambda: (log.close(), closed.set()), daemon=True)
    closer.start()
    assert closed.wait(timeout=60), "MetricsLog.close waited for TensorBoard's two-minute flush"
    assert [r["loss"] for r in read_metrics(tmp_path)] == [1.0]


def test_a_windows_job_rate_counts_every_learners_frames_through_the_store(tmp_path: Path, monkeypatch):
    clock = SimpleNamespace(now=0.0)
    monkeypatch.setattr(metrics_module, "time", SimpleNamespace(perf_counter=lambda: clock.now,
                                                                monotonic=lambda: clock.now))
    store = dist.HashStore()
    leader, other = TrainWindow(store), TrainWindow(store)
    other.add(1.0, 300)
    clock.now = 1.0
    other.rates()  # the other learner's window ends first: its 300 frames go into the job's counter
    leader.add(0.5, 100)
    leader.add(1.5, 100)
    clock.now = 2.0
    log = MetricsLog(tmp_path, enabled=True)
    job_fps = leader.log(log, step=4, epoch=0, lr=0.1)
    log.close()
    record = read_metrics(tmp_path)[0]
    assert job_fps == record["frames_per_second"] == 250.0  # (300 + 200) frames over the leader's 2 s
    assert record["learner_frames_per_second"] == 100.0 and record["loss"] == 1.0 and record["lr"] == 0.1
    assert store.add(FRAMES_KEY, 0) == 500 and leader.losses == [] and leader.frames == 0
    assert TrainWindow(None).rates() == (0.0, 0.0)  # one learner, no store: its own rate is the job's


def test_a_learner_taking_over_from_a_lost_rank_0_records_the_epochs_it_left_unrecorded(tmp_path, capsys):
    """Rank 0 lost while validating epoch 2 (after the epoch's end, before its record): the first
    survivor records epoch 2 from its own history when it takes over, once, and says so."""
    from asrdist.train.trainer import Trainer

    rank0 = MetricsLog(tmp_path)
    rank0.log("epoch", 10, epoch=1, train_loss=2.0, valid_loss=1.9)
    rank0.close()
    survivor = SimpleNamespace(run_dir=tmp_path, ctx=SimpleNamespace(job_rank=1),
                               state=SimpleNamespace(step=30, history=[{"epoch": 1, "train_loss": 2.0},
                                                                       {"epoch": 2, "train_loss": 1.5}]),
                               metrics=MetricsLog(tmp_path, resume_step=float("inf")))
    Trainer._record_epochs_the_lost_leader_did_not(survivor)
    Trainer._record_epochs_the_lost_leader_did_not(survivor)  # nothing twice
    survivor.metrics.close()
    epochs = [r for r in read_metrics(tmp_path) if r["kind"] == "epoch"]
    assert [(r["epoch"], r["train_loss"]) for r in epochs] == [(1, 2.0), (2, 1.5)]
    assert epochs[0]["valid_loss"] == 1.9 and "valid_loss" not in epochs[1]
    assert "epoch 2: recorded by rank 1, without validation" in capsys.readouterr().err
