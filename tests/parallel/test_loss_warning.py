"""onebit warns, with advice, when its training loss rises over an epoch; other strategies stay quiet."""
from __future__ import annotations

from asrdist.parallel.onebit import OneBitStrategy
from asrdist.parallel.sync import SyncStrategy
from asrdist.train.metrics import warn_if_loss_rose


def _end_epochs(strategy, losses: list[float]) -> list[dict]:
    history: list[dict] = []
    for epoch, loss in enumerate(losses):
        record = {"epoch": epoch, "train_loss": loss}
        warn_if_loss_rose(record, history, strategy, rank=0)
        history.append(record)
    return history


def test_onebit_warns_once_the_loss_rises(capsys):
    history = _end_epochs(OneBitStrategy(), [0.49, 0.77, 0.86, 0.5])
    assert [r.get("loss_rose", False) for r in history] == [False, True, True, False]
    lines = capsys.readouterr().out.splitlines()
    assert len(lines) == 2
    assert "warning: onebit: train loss rose from 0.4900 to 0.7700 in epoch 1" in lines[0]
    assert "lower optim.lr" in lines[0]


def test_sync_has_no_advice_and_no_warning(capsys):
    history = _end_epochs(SyncStrategy(), [0.4, 0.9])
    assert "loss_rose" not in history[1] and capsys.readouterr().out == ""
