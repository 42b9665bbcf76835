"""A stop signal (`kill`, a closed terminal) that arrives while a library reads a file stays a stop:
the readers that turn a library's many exception types into one DataError naming the file let
asrdist's `Stopped` through (a SIGHUP while kaldiio read an alignment once became "cannot read
alignment (stopped by SIGHUP)" and exit 2, not the shell's 129)."""
from __future__ import annotations

import signal

import kaldiio
import numpy as np
import pytest
import torch

from asrdist.cluster.supervisor import stopped_error
from asrdist.errors import DataError, Stopped
from asrdist.io.kaldi_dir import read_alignments
from asrdist.run.rundir import read_torch_file
from asrdist.train.metrics import MetricsLog


def _stop(*args, **kwargs):
    raise stopped_error(signal.SIGHUP)


@pytest.fixture
def alignment_dir(tmp_path):
    with kaldiio.WriteHelper(f"ark,scp:{tmp_path / 'alignment.ark'},{tmp_path / 'alignment.scp'}") as writer:
        writer("utt1", np.array([1, 2, 3], dtype=np.int32))
    return tmp_path


def test_an_alignment_read_stopped_by_a_signal_is_a_stop_and_a_broken_one_a_data_error(alignment_dir, monkeypatch):
    assert list(read_alignments(alignment_dir)["utt1"]) == [1, 2, 3]
    monkeypatch.setattr(kaldiio, "load_mat", _stop)
    with pytest.raises(Stopped) as stop:
        read_alignments(alignment_dir)
    assert stop.value.exit_code == 128 + signal.SIGHUP
    monkeypatch.setattr(kaldiio, "load_mat", lambda *a: (_ for _ in ()).throw(ValueError("truncated")))
    with pytest.raises(DataError, match="utt1: cannot read alignment"):
        read_alignments(alignment_dir)


def test_a_checkpoint_read_stopped_by_a_signal_is_a_stop(tmp_path, monkeypatch):
    path = tmp_path / "model.pt"
    torch.save({"x": 1}, path)
    monkeypatch.setattr(torch, "load", _stop)
    with pytest.raises(Stopped):
        read_torch_file(path, "model")
    monkeypatch.setattr(torch, "load", lambda *a, **k: (_ for _ in ()).throw(EOFError("Ran out of input")))
    with pytest.raises(DataError, match="not a readable model"):
        read_torch_file(path, "model")


def test_a_stop_while_tensorboard_starts_stops_the_run(tmp_path, monkeypatch):
    import torch.utils.tensorboard as tensorboard

    monkeypatch.setattr(tensorboard, "SummaryWriter", _stop)
    with pytest.raises(Stopped):
        MetricsLog(tmp_path)


def test_a_stop_while_a_comparison_calibrates_a_run_stops_the_comparison(tmp_path, monkeypatch):
    """`compare` carries on without a prediction when a run's calibration fails, but not when the
    user stopped it."""
    from asrdist.calibrate import microbench

    monkeypatch.setattr(microbench, "calibrate_run", _stop)
    with pytest.raises(Stopped):
        microbench.measure_and_save(tmp_path, "sync", None, 1, "loopback", "before it trained")
    monkeypatch.setattr(microbench, "calibrate_run", lambda *a: (_ for _ in ()).throw(DataError("no corpus")))
    assert microbench.measure_and_save(tmp_path, "sync", None, 1, "loopback", "before it trained") == \
        "not calibrated: no corpus"
