"""summary.json's schema, `RunSummary`: a real finished run's file and the files earlier versions
wrote load and are written back key for key; keys added since take the defaults readers assumed."""
from __future__ import annotations

import json

import pytest

from asrdist.cli import main
from asrdist.cluster.cpushare import HostCpuUsage
from asrdist.cluster.launcher import HostWire, WireCounters
from asrdist.errors import DataError
from asrdist.run.summary import DedicatedHosts, RunSummary
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.paths import ROOT



def _learner(rank: int, **more) -> dict:
    return {"rank": rank, "steps": 40, "frames": 5000, "train_seconds": 3.5, "bytes_sent": 4000,
            "comm_seconds": 0.4, "wait_seconds": 0.1, **more}


V2026_11_21 = {  # asrdist/train/summary.py at 3131562: the first writer
    "strategy": "sync", "learners": 2, "cores": 4, "threads_per_learner": 2, "model": "dnn", "parameters": 12345,
    "epochs": 2, "steps": 40, "train_frames": 10000, "frames_per_second": 2857.1, "wall_seconds": 9.5,
    "final": {"train_loss": 0.61, "valid_loss": 0.7, "frame_accuracy": 0.8, "per": 0.3},
    "comm": {"bytes_sent": 8000, "comm_seconds": 0.4, "wait_seconds": 0.1,
             "per_learner": [_learner(0, device="cpu"), _learner(1, device="cpu")]},
    "history": [{"epoch": 0, "train_loss": 0.9, "valid_loss": 0.8, "frame_accuracy": 0.7, "per": 0.4},
                {"epoch": 1, "train_loss": 0.61, "valid_loss": 0.7, "frame_accuracy": 0.8, "per": 0.3}],
}

V2026_11_22 = {  # + skipped_nonfinite (5a768b2), starts and wall_seconds_last_start (f8dd32d), lost_learners (66387f8)
    "strategy": "adpsgd", "learners": 3, "lost_learners": [{"rank": 2, "step": 17, "reason": "killed by signal 9",
                                                           "by": "launcher"}],
    "cores": 4, "threads_per_learner": 1, "model": "dnn", "parameters": 12345, "epochs": 2, "steps": 40,
    "train_frames": 10000, "frames_per_second": 2857.1, "skipped_nonfinite": 0, "wall_seconds": 12.0,
    "wall_seconds_last_start": 6.0, "starts": 2, "final": {"train_loss": None, "valid_loss": 0.7, "per": 0.3},
    "comm": {"bytes_sent": 8000, "comm_seconds": 0.4, "wait_seconds": 0.1,
             "per_learner": [_learner(0, device="cpu", loop_seconds=3.6, compute_seconds=2.0, skipped_nonfinite=0,
                                      exchanges=40, answer_seconds=0.0),
                             _learner(1, device="cpu", loop_seconds=3.7, compute_seconds=2.1, skipped_nonfinite=0,
                                      exchanges=40, answer_seconds=0.0)]},
    "history": [{"epoch": 0, "train_loss": None, "wall_seconds": 5.1, "minibatches": 20, "lost_learners": [2],
                 "consensus_distance": 0.02, "valid_loss": 0.8, "per": 0.4, "loss_rose": True}],
}

_WIRE = {"payload_bytes": 9000, "frame_bytes": 9500, "segments": 12,
         "hosts": [{"node": 0, "bytes": 5000, "packets": 6, "payload_bytes": 4600},
                   {"node": 1, "bytes": 4500, "packets": 6, "payload_bytes": 4400}],
         "what": WireCounters.__dataclass_fields__["what"].default}

V2026_11_27 = {  # + nodes and network (c0f3a4c), averaged final (485e594), wire after the learner's keys (fa48d38)
    "strategy": "sync", "learners": 2, "lost_learners": [], "cores": 4, "threads_per_learner": 1, "nodes": 2,
    "network": "emulated-1gbit-0.1ms", "model": "dnn", "parameters": 12345, "epochs": 2, "steps": 40,
    "train_frames": 10000, "frames_per_second": 2857.1, "skipped_nonfinite": 0, "wall_seconds": 12.0,
    "wall_seconds_last_start": 12.0, "starts": 1,
    "final": {"train_loss": 0.6, "valid_loss": 0.69, "cer": 0.2, "wer": 0.5, "averaged_epochs": [0, 1],
              "unaveraged": {"valid_loss": 0.7, "cer": 0.21, "wer": 0.52}},
    "comm": V2026_11_22["comm"], "history": V2026_11_22["history"], "wire": _WIRE,
}

V2026_12_01 = {  # + steal_share (fbea615), dedicated hosts after wire (c7c184f, ede4581)
    **{k: v for k, v in V2026_11_27.items() if k != "wire"}, "steal_share": None, "wire": _WIRE,
    "hosts": [{"node": 0, "cpu_quota": 1.0, "cpu_seconds": 7.5, "throttled_seconds": 0.2, "throttled_periods": 3,
               "periods": 90}],
    "cpus_per_host": 1.0, "straggler_emulation": None,
    "outside_hosts": {"wall_seconds": 10.0, "cpu_seconds": 1.0, "cores": 0.1, "machine_cores": 2, "what": "..."},
}


@pytest.mark.parametrize("written", [V2026_11_21, V2026_11_22, V2026_11_27, V2026_12_01],
                         ids=["2026-11-21", "2026-11-22", "2026-11-27", "2026-12-01"])
def test_a_summary_of_every_earlier_version_loads_and_is_written_back_key_for_key(written, tmp_path):
    (tmp_path / "summary.json").write_text(json.dumps(written))
    summary = RunSummary.read(tmp_path)
    assert json.dumps(summary.to_json()) == json.dumps(written)  # keys, values and their order
    assert summary.comm.per_learner[1].rank == 1 and summary.history[0].epoch == 0
    assert summary.final.valid_loss in (0.7, 0.69)


def test_keys_added_since_take_the_defaults_readers_assumed():
    old = RunSummary.from_json(V2026_11_21)
    assert (old.nodes, old.network, old.starts, old.lost_learners, old.steal_share) == (1, "loopback", 1, [], None)
    assert old.skipped_nonfinite == 0 and old.wire is None and old.dedicated is None
    assert old.stepping_seconds() == [3.5, 3.5]  # train_seconds where there was no loop_seconds
    assert old.history[0].wall_seconds is None and old.final.error_rate(("per", "wer")) == ("per", 0.3)
    new = RunSummary.from_json(V2026_12_01)
    assert new.dedicated.hosts[0].cpu_quota == 1.0 and new.dedicated.straggler_emulation is None
    assert new.wire.hosts[1] == HostWire(1, 4500, 6, 4400)
    assert new.final.unaveraged.cer == 0.21 and new.final.floats() == {"train_loss": 0.6, "valid_loss": 0.69,
                                                                        "cer": 0.2, "wer": 0.5}
    assert new.history[0].extra == {"minibatches": 20, "lost_learners": [2], "loss_rose": True}


def test_what_the_launcher_counted_is_recorded_after_the_learners_keys_as_it_was():
    """`asrdist train --nodes` records the hosts' counters (`run_workers`) where the launcher
    rewrote the file before: wire, then the dedicated hosts, after what the learner wrote."""
    learner_wrote = {k: v for k, v in V2026_12_01.items() if k not in ("wire", *DedicatedHosts.KEYS)}
    summary = RunSummary.from_json(learner_wrote)
    summary.wire = WireCounters.from_json(_WIRE)
    summary.dedicated = DedicatedHosts([HostCpuUsage(**V2026_12_01["hosts"][0])], 1.0, None,
                                       V2026_12_01["outside_hosts"])
    assert json.dumps(summary.to_json()) == json.dumps(V2026_12_01)


def test_a_file_that_is_not_a_summary_is_one_line(tmp_path):
    with pytest.raises(DataError, match="missing; is .* a finished asrdist run"):
        RunSummary.read(tmp_path)
    (tmp_path / "summary.json").write_text("{")
    with pytest.raises(DataError, match="not JSON"):
        RunSummary.read(tmp_path)
    (tmp_path / "summary.json").write_text(json.dumps({**V2026_11_21, "comm": {"bytes_sent": 1, "comm_seconds": 0}}))
    with pytest.raises(DataError, match=r"not an asrdist summary \(no 'comm.wait_seconds'\)"):
        RunSummary.read(tmp_path)


@pytest.mark.slow  # end to end: two learners through `asrdist train`
def test_a_real_finished_run_is_read_and_written_back_key_for_key(tmp_path):
    corpus = make_tone_corpus(tmp_path / "corpus")
    assert main(["features", str(corpus)]) == 0
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/default.yaml"), "--data", str(corpus), "--learners", "2", "--strategy",
                 "sync", "--epochs", "1", "--out", str(run), "--no-progress", "model.hidden_dim=16",
                 "model.hidden_layers=1", "data.batch_size=64"]) == 0
    text = (run / "summary.json").read_text()
    summary = RunSummary.read(run)
    assert json.dumps(summary.to_json()) == json.dumps(json.loads(text))
    assert list(json.loads(text)) == [  # what the learner wrote before RunSummary, in its order
        "strategy", "learners", "lost_learners", "cores", "threads_per_learner", "nodes", "network", "model",
        "parameters", "epochs", "steps", "train_frames", "frames_per_second", "skipped_nonfinite", "wall_seconds",
        "wall_seconds_last_start", "steal_share", "starts", "final", "comm", "history", "load", "cpu_share",
        "contended", "cpu_received"]
    assert summary.load["cores"] and summary.cpu_share > 0 and summary.contended in (True, False)
    assert all(p.cpu_seconds > 0 and p.cpu_wall_seconds > 0 for p in summary.comm.per_learner)
    assert [p.rank for p in summary.comm.per_learner] == [0, 1] and summary.nodes == 1
    assert summary.history[0].valid_loss is not None and summary.final.valid_loss is not None
