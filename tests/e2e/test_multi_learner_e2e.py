"""Multi-learner training end to end: `asrdist train --learners 2`, 1-bit SGD against sync on the
tone corpus. A killed learner is tests/run/test_fault_matrix.py's (every strategy); the cluster recipe
(two torchrun "nodes") is tested by the SLURM line of docs/clusters.md (tests/run/test_prepare_cli.py) and by
`asrdist train --nodes` (tests/parallel/test_hierarchical.py)."""
from __future__ import annotations

import json
import os
from datetime import timedelta
from pathlib import Path

import pytest
import torch

from asrdist.cli import main
from asrdist.config import load_config
from asrdist.run.launch import prepare_run_dir
from tests.support.corpus_fixture import make_tone_corpus
from tests.support.dist_utils import run_distributed
from tests.support.paths import ROOT

pytestmark = pytest.mark.slow

FAST = ["train.threads=1", "data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.log_every=5",
        "train.timeout_seconds=60"]
# Convergence: plain SGD (no momentum) at a rate where sync converges smoothly; 3 epochs (seed 0, 2026-12-02):
# sync 0.901 frame accuracy (> 0.85), onebit 1.0% from it (<= 3%), valid loss 0.98 x sync's (<= 1.15);
# without error feedback 2.16 x onebit's valid loss (>= 1.3) and 4.4 x its train loss (>= 2). (2 epochs
# left 1.11 and 2.16 against 1.15 and 2: too close.)
CONVERGE = ["train.threads=1", "data.batch_size=128", "model.hidden_dim=64", "model.hidden_layers=2",
            "optim.lr=0.1", "optim.momentum=0", "optim.nesterov=false", "optim.warmup_steps=0",
            "optim.anneal_after_epoch=null", "train.epochs=3", "train.learners=2", "train.log_every=5"]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus")
    assert main(["features", str(path)]) == 0
    return path


def _prepared_run(corpus: Path, run_dir: Path, overrides: list[str]) -> Path:
    cfg = load_config(ROOT / "configs/default.yaml", [f"data.corpus={corpus}", *overrides])
    prepare_run_dir(cfg, run_dir, progress=False)
    return run_dir


# ------------------------------------------------------------------------ (a) the CLI itself

def test_train_two_onebit_learners_through_the_cli(corpus, tmp_path, capsys):
    run = tmp_path / "run"
    assert main(["train", str(ROOT / "configs/default.yaml"), *FAST, "--data", str(corpus), "--learners", "2",
                 "--strategy", "onebit", "--epochs", "1", "--out", str(run), "--no-progress"]) == 0
    summary = json.loads((run / "summary.json").read_text())
    assert summary["learners"] == 2 and summary["strategy"] == "onebit"
    per_learner = summary["comm"]["per_learner"]
    assert [p["rank"] for p in per_learner] == [0, 1]
    for p in per_learner:
        assert p["bytes_sent"] > 0 and p["comm_seconds"] > 0 and p["exchanges"] == summary["steps"] > 0
        assert p["frames"] == summary["train_frames"] // 2
        # the share of the machine's CPU its host took while the learner trained (Linux: /proc/stat)
        assert 0.0 <= p["steal_share"] <= 1.0 if Path("/proc/stat").exists() else p["steal_share"] is None
    assert summary["steal_share"] == max((p["steal_share"] for p in per_learner if p["steal_share"] is not None),
                                         default=None)
    assert summary["comm"]["bytes_sent"] == sum(p["bytes_sent"] for p in per_learner)
    # the side-by-side table of `asrdist bench compare` reads the same summary
    capsys.readouterr()
    assert main(["bench", "compare", str(run)]) == 0
    table = capsys.readouterr().out.splitlines()
    assert table[0].split()[:3] == ["run", "strategy", "learners"] and table[2].split()[:3] == ["run", "onebit", "2"]


# ------------------------------------------------------------------- (b) 1-bit SGD converges

def _learner(rank: int, world_size: int, run_dir: str):
    """One learner of a prepared run, through the same run_learner as `asrdist train`."""
    import yaml

    from asrdist.cluster.process_group import JobEnv
    from asrdist.config import config_from_tree
    from asrdist.parallel.base import LearnerContext
    from asrdist.run.learner import run_learner

    cfg = config_from_tree(yaml.safe_load((Path(run_dir) / "config.yaml").read_text()))
    ctx = LearnerContext(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size,
                         timeout=timedelta(seconds=60), seed=cfg.seed)
    env = JobEnv(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size)
    summary = run_learner(cfg, Path(run_dir), env, ctx, progress=False)
    return summary and {"final": summary.final.to_json(), "history": [r.to_json() for r in summary.history]}


def _converge(corpus: Path, run_dir: Path, *strategy: str) -> dict:
    """The run's figures, less the wall times its history records (the machine's, not the model's)."""
    _prepared_run(corpus, run_dir, CONVERGE + list(strategy))
    result = run_distributed(_learner, 2, run_dir, str(run_dir))[0]
    for record in result.get("history", []):
        record.pop("wall_seconds", None)
    return result


def test_onebit_with_error_feedback_matches_sync_and_without_is_worse(corpus, tmp_path):
    """Why frame accuracy and not PER: the validation speaker has 12 utterances (~48 phones), so
    PER moves in steps of 2%, and with the soft posteriors of these short runs the Viterbi decoder
    inserts phones the tone corpus never uses (PER near 1 at 91% frame accuracy). Frame accuracy
    over its 686 frames, and the held-out cross-entropy, are the stable measures here."""
    sync = _converge(corpus, tmp_path / "sync", "strategy.name=sync")
    onebit = _converge(corpus, tmp_path / "onebit", "strategy.name=onebit")
    no_feedback = _converge(corpus, tmp_path / "nofb", "strategy.name=onebit", "strategy.error_feedback=false")
    s, o, n = sync["final"], onebit["final"], no_feedback["final"]
    assert s["frame_accuracy"] > 0.85, s  # sync itself learned (chance is far below)
    assert abs(o["frame_accuracy"] - s["frame_accuracy"]) <= 0.03 * s["frame_accuracy"], (o, s)
    assert o["valid_loss"] <= 1.15 * s["valid_loss"], (o, s)
    # without error feedback: clearly worse on held-out and training objective at the same epochs
    assert n["valid_loss"] >= 1.3 * o["valid_loss"], (n, o)
    assert n["train_loss"] >= 2.0 * o["train_loss"], (n, o)
    # same seed, same strategy: the same numbers and the same model, bit for bit
    again = _converge(corpus, tmp_path / "onebit2", "strategy.name=onebit")
    assert again == onebit
    first = torch.load(tmp_path / "onebit" / "model.pt", weights_only=False)["model"]
    second = torch.load(tmp_path / "onebit2" / "model.pt", weights_only=False)["model"]
    assert all(torch.equal(first[k], second[k]) for k in first)


# ------------------------------------------------------------ the benchmarks' own plumbing

def test_bench_comm_runs_both_strategies_side_by_side(tmp_path):
    out = tmp_path / "comm.json"
    assert main(["bench", "comm", "--json", str(out), "--shapes", "tiny", "--network", "loopback",
                 "--learners", "2", "--repeats", "2"]) == 0
    r = json.loads(out.read_text())
    assert r["network"] == "loopback" and r["learners"] == 2 and r["cores"] == len(os.sched_getaffinity(0))
    assert len(r["sync_seconds"]) == len(r["onebit_seconds"]) == 2
    assert r["onebit_identical_on_all_learners"] and r["sync_mean_correct"]
    # loopback: no NIC of the job's own to read, so no wire figure (tests/cluster/test_wire_bytes.py: emulated hosts)
    assert r["bytes_ratio"] is None and r["wire"] is None and r["counted_matches_wire"] is None
    assert r["bytes_ratio_counted"] == r["onebit_bytes_per_exchange"] / r["sync_bytes_per_exchange"] < 0.1
    assert r["exchange_speedup"] == r["sync_seconds_median"] / r["onebit_seconds_median"] > 0
    assert r["quantize_vs_copy"] > 0 and r["threads_per_learner"] >= 1


def test_bench_scaling_learner_drives_the_trainer_step():
    """One learner in this process (the launcher's multi-learner path is the comm test's)."""
    from asrdist.bench.scaling_worker import scaling_learner
    from asrdist.cluster.process_group import JobEnv

    spec = JobEnv(rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1,
                  master_addr="127.0.0.1", master_port=0, network="loopback", num_threads=1, timeout_s=30)
    args = {"model": {"name": "dnn", "hidden_layers": 1, "hidden_dim": 16}, "feature_dim": 8, "num_classes": 10,
            "optim": {"name": "sgd", "lr": 0.1}, "compute_ms": 5.0, "local_batch": 64, "steps": 3, "warmup": 1,
            "strategy": "onebit"}
    r = scaling_learner(spec, args)
    assert r["frames"] == 3 * 64 and r["steps"] == 3 and r["parameters"] == 16 * 88 + 16 + 10 * 16 + 10
    assert r["frames_per_second"] == r["frames"] / r["seconds"]
    assert r["compute_seconds_per_step"] >= 0.005  # the trainer's emulated compute ran
    assert r["bytes_sent_per_step"] == 0  # one learner sends nothing
