"""Issue 59 item 5: when the survivors of a job that went on without lost learners (hierarchical, adpsgd,
averaging) stop on a non-finite loss, the error line says the model diverged (epoch, step, which
learners), not that an earlier lost learner hung; the last checkpoint is kept and `--resume` advised.
Quick: the supervisor's outcome and the run directory's advice; slow: a real hierarchical job that
loses a node, then its survivors' loss is made NaN (tests/support/hook_site)."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time

import pytest

from asrdist.bench.faults import learner_pids
from asrdist.cluster.supervisor import Survival
from asrdist.errors import TrainingError
from asrdist.run import rundir
from asrdist.train import checkpoint as ckpt, state as run_state
from tests.support.paths import ROOT

NAN = "loss is nan at step 812 (epoch 2); lower optim.lr or check the data (or train.nonfinite=skip)"


def test_the_survivors_divergence_is_named_not_the_earlier_hang(tmp_path):
    survival = Survival(store=None, report_dir=tmp_path)
    survival.lost = {2: "hung: no answer within 4 s; stopped by the launcher", 3: "its node lost rank 2", 0: NAN,
                     1: NAN}
    with pytest.raises(TrainingError) as told:
        survival.outcome([1, 1, -9, 1])
    line = str(told.value)
    assert line.startswith("the survivors' model diverged at step 812 (epoch 2): learners 0, 1 stopped on a "
                           "non-finite value (rank 0: loss is nan)"), line
    assert "lost before it: rank 2 (hung: no answer within 4 s; stopped by the launcher), rank 3" in line
    assert line.endswith("no learner finished") and "\n" not in line


def test_a_node_mate_stopped_by_the_divergence_is_listed_with_it(tmp_path):
    survival = Survival(store=None, report_dir=tmp_path)
    survival.lost = {3: "killed by signal 9", 0: NAN, 1: "its node lost rank 0"}
    with pytest.raises(TrainingError, match=r"diverged at step 812 \(epoch 2\): learner 0 stopped .*, with it "
                                            r"rank 1 \(its node lost rank 0\); lost before it: rank 3"):
        survival.outcome([1, 1, 1, -9])


def test_the_learner_whose_own_loss_went_non_finite_is_quoted_before_those_it_reached(tmp_path):
    """A node mate's gradient gets the NaN through the node's exchange and may stop first; the line
    quotes the learner whose loss was NaN, where the divergence began."""
    survival = Survival(store=None, report_dir=tmp_path)
    survival.lost = {3: "killed by signal 9",
                     0: "non-finite gradient at step 50 (epoch 2) (loss 0.0299947); lower optim.lr", 1: NAN}
    with pytest.raises(TrainingError, match=r"diverged at step 812 \(epoch 2\): learners 0, 1 stopped on a "
                                            r"non-finite value \(rank 1: loss is nan\); lost before it: rank 3"):
        survival.outcome([1, 1, 1, -9])


def test_without_a_divergence_the_first_loss_is_named(tmp_path):
    survival = Survival(store=None, report_dir=tmp_path)
    survival.lost = {2: "killed by signal 9", 0: "its connection closed"}
    with pytest.raises(TrainingError, match=r"^learner rank 2: killed by signal 9; no learner finished$"):
        survival.outcome([1, 1, -9])


def test_a_divergence_keeps_the_checkpoint_from_before_the_start_and_advises_resuming_it(tmp_path):
    run = tmp_path / "run"
    ckpt.save_learner(run, "epoch-0002", 0, {"rank": 0})
    ckpt.publish(run, "epoch-0002", 1)
    with pytest.raises(TrainingError) as told, rundir.undone_on_failure(run):
        run_state.write_state(run, "started", learners=1)
        raise TrainingError(f"the survivors' model diverged at step 900 (epoch 2): learner 0 ...; {NAN}")
    line = str(told.value)
    assert f"({run} keeps checkpoint epoch-0002, from before this start: continue it with `asrdist train " \
           f"--resume {run}` with a lower optim.lr" in line, line
    assert (run / "checkpoints" / "epoch-0002" / "rank-0.pt").is_file()


@pytest.mark.slow
def test_a_hierarchical_job_whose_survivors_diverge_says_so(tone_corpus, tmp_path):
    """4 learners in nodes of 2; once the first checkpoint is published rank 3 is killed (node 1
    goes), then the survivors' loss turns NaN: the one line names the divergence and the checkpoint."""
    run_dir, flag = tmp_path / "run", tmp_path / "nan-now"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT / "tests" / "support" / "hook_site"), str(ROOT)]),
           "ASRDIST_TEST_NAN_FILE": str(flag), "ASRDIST_TEST_NAN_RANKS": "0,1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "asrdist.cli", "train", "configs/default.yaml", "model.hidden_dim=32",
         "model.hidden_layers=2", "data.batch_size=128", "train.log_every=1", "optim.warmup_steps=0",
         "optim.anneal_after_epoch=null", "optim.lr=0.05", "train.timeout_seconds=4", "train.group_size=2",
         "--data", str(tone_corpus), "--learners", "4", "--strategy", "hierarchical", "--epochs", "200",
         "--out", str(run_dir), "--no-progress"],
        cwd=ROOT, env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    try:
        end = time.monotonic() + 300  # only to catch a hang
        latest = run_dir / "checkpoints" / "latest"
        while not latest.is_file() or len(learner_pids(run_dir)) < 4:
            assert proc.poll() is None and time.monotonic() < end, proc.stderr.read() if proc.poll() else "no start"
            time.sleep(0.1)  # polling an outside process, not synchronisation
        os.kill(learner_pids(run_dir)[3], signal.SIGKILL)
        said = []
        for line in proc.stderr:  # the launcher says when the job goes on without node 1
            said.append(line)
            if line.startswith("[asrdist] learner rank ") and "the job goes on with 2 learners" in line:
                break
        flag.touch()
        err = "".join(said) + proc.stderr.read()
        proc.wait(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
    errors = [line for line in err.splitlines() if line.startswith("asrdist: error: ")]
    assert proc.returncode != 0 and len(errors) == 1, err
    line = errors[0]
    assert line.startswith("asrdist: error: the survivors' model diverged at step "), line
    # both survivors' loss turns NaN once the flag is there, but each looks for it on its own: the
    # one that sees it a step later fails in the collective its node-mate left, and is named as such
    assert re.search(r"learners (?:0, 1|1, 0) stopped on a non-finite value \(rank [01]: loss is nan"
                     r"|learner ([01]) stopped on a non-finite value \(rank \1: loss is nan[^)]*\), with it rank [01] \(",
                     line), line
    assert "lost before it: rank 3 (killed by signal 9)" in line or "lost before it: rank 2" in line, line
    kept = (run_dir / "checkpoints" / "latest").read_text().strip()
    assert f"keeps checkpoint {kept}" in line and f"asrdist train --resume {run_dir}" in line, line
    assert json.loads((run_dir / "state.json").read_text())["state"] == "failed"
    assert not (run_dir / "model.pt").exists()
