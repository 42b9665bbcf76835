"""`asrdist prepare` and the SLURM script of docs/clusters.md: its torchrun line, as written there, started
twice on this machine as node 0 and node 1 (c10d rendezvous on 127.0.0.1), trains a prepared run."""
from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import pytest

from asrdist.cli import main
from asrdist.errors import ConfigError
from asrdist.run.worker import check_start
from tests.support.paths import ROOT

TINY = ["train.threads=1", "data.batch_size=128", "model.hidden_dim=32", "model.hidden_layers=1",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.timeout_seconds=60", "train.max_steps=6"]


def docs_torchrun_argv(env: dict[str, str]) -> list[str]:
    """The torchrun command of the SLURM script in docs/clusters.md, its $VARIABLES from `env`."""
    block = re.search(r"```bash\n(#!/bin/bash\n#SBATCH.*?)```", (ROOT / "docs" / "clusters.md").read_text(), re.S)
    assert block, "docs/clusters.md: no SLURM script"
    script = block.group(1).replace("\\\n", " ")
    line = next(line for line in script.splitlines() if line.startswith("srun torchrun"))
    line = re.sub(r"\$\{?(\w+)\}?", lambda m: env[m.group(1)], line)
    argv = shlex.split(line)
    assert argv[:2] == ["srun", "torchrun"]
    return argv[1:]


def test_prepare_refuses_a_used_run_dir_and_bad_config(tone_corpus, tmp_path, capsys):
    run = tmp_path / "run"
    args = ["prepare", str(ROOT / "configs/default.yaml"), "--out", str(run), "--data", str(tone_corpus), *TINY]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert "asrdist.run.worker" in out and json.loads(out[:out.index("}") + 1])["run_dir"] == str(run.resolve())
    assert {"config.yaml", "targets.pt", "env.json", "state.json"} <= {p.name for p in run.iterdir()}
    assert json.loads((run / "state.json").read_text())["state"] == "prepared"
    # preparing it again, or starting it as a new run: one line saying how it starts (here with
    # --resume, which trains a run without a checkpoint from the start, or under torchrun)
    not_started = f"{run}: prepared by `asrdist prepare` and not started yet; start it on this machine with " \
                  f"`asrdist train --resume {run}`, or under torchrun"
    for again in (args, ["train", str(ROOT / "configs/default.yaml"), "--out", str(run)]):
        assert main(again) != 0
        err = capsys.readouterr().err.splitlines()
        assert len(err) == 1 and not_started in err[0] and f"asrdist.run.worker {run}" in err[0], err
    assert {p.name for p in run.iterdir()} == {"config.yaml", "targets.pt", "env.json", "state.json"}  # nothing written
    assert main(args[:2] + ["--data", str(tone_corpus), "--out", str(tmp_path / "other"), "optim.nope=1"]) != 0
    assert "optim.nope" in capsys.readouterr().err and not (tmp_path / "other").exists()


def _worker(run: Path, world_size: int) -> subprocess.CompletedProcess:
    """One learner of a torchrun job of `world_size`, as torchrun's environment describes it."""
    env = dict(os.environ, RANK="0", WORLD_SIZE=str(world_size), LOCAL_RANK="0", LOCAL_WORLD_SIZE=str(world_size),
               OMP_NUM_THREADS="1")
    return subprocess.run([sys.executable, "-m", "asrdist.run.worker", str(run), "--no-progress"], env=env,
                          capture_output=True, text=True, timeout=120)


@pytest.mark.slow  # one learner process each time; test_worker_start_check_* is the same check in-process
def test_the_worker_refuses_another_world_size_and_a_run_that_already_trained(tone_corpus, tmp_path, capsys):
    """Before joining any job: torchrun must start the prepared number of learners, and a run with
    results or checkpoints is continued with --resume, not trained again over them (a requeued
    cluster job without --resume lost its progress)."""
    run = tmp_path / "run"
    assert main(["prepare", str(ROOT / "configs/default.yaml"), "--out", str(run), "--data", str(tone_corpus),
                 "--learners", "2", "--strategy", "sync", *TINY]) == 0
    capsys.readouterr()
    done = _worker(run, 3)
    assert done.returncode == 1 and "prepared for 2 learner(s), torchrun started 3" in done.stderr, done.stderr
    (run / "summary.json").write_text("{}")
    done = _worker(run, 2)
    assert done.returncode == 1, done.stderr
    assert "finished training (summary.json); continue it with `--resume`" in done.stderr, done.stderr
    assert not (run / "checkpoints").exists() and (run / "summary.json").read_text() == "{}"


@pytest.mark.slow
def test_readme_slurm_torchrun_line_on_two_nodes(tone_corpus, tmp_path):
    from torch.distributed import TCPStore

    run = tmp_path / "run"
    assert main(["prepare", str(ROOT / "configs/default.yaml"), "--out", str(run), "--data", str(tone_corpus),
                 "--learners", "2", "--strategy", "sync", *TINY]) == 0
    # The rendezvous store lives here, on a port the kernel picks and this process holds, and
    # both agents join it as clients: as on a cluster where HEAD_NODE hosts it, but no port is freed.
    store = TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=150))
    env = {"SLURM_NNODES": "2", "NPROC_PER_NODE": "1", "SLURM_JOB_ID": "test", "HEAD_NODE": "127.0.0.1",
           "PORT": str(store.port), "RUN_DIR": str(run)}
    argv = docs_torchrun_argv(env)
    at = argv.index("-m")
    argv = [sys.executable, "-m", "torch.distributed.run", *argv[1:at], "--rdzv-conf", "is_host=0", *argv[at:]]
    agents = [subprocess.Popen(argv, env=dict(os.environ, OMP_NUM_THREADS="1"), stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    logs = []
    try:
        logs = [agent.communicate(timeout=240)[0] for agent in agents]
    finally:
        for agent in agents:
            if agent.poll() is None:
                agent.kill()
                agent.wait()
    assert [a.returncode for a in agents] == [0, 0], "\n".join(log[-2000:] for log in logs)
    summary = json.loads((run / "summary.json").read_text())
    assert summary["learners"] == 2 and summary["strategy"] == "sync" and summary["steps"] == 6
    assert (run / "model.pt").is_file() and all(p["bytes_sent"] > 0 for p in summary["comm"]["per_learner"])


def test_a_start_under_an_outside_torchrun_is_recorded_as_asrdist_train_records_it(tmp_path):
    # a resume through torchrun kept the failed start's reports and was not counted in `starts`
    from asrdist.cluster.process_group import JobEnv
    from asrdist.config import config_from_tree
    from asrdist.run import worker
    from asrdist.run.rundir import resume_configs

    cfg = config_from_tree({})
    for rank in (0, 1):
        (tmp_path / f"failed-rank-{rank}.txt").write_text("learner rank 1: killed\n")
    def learner(rank: int, network: str | None = None) -> JobEnv:
        return JobEnv(rank=rank, world_size=2, local_rank=rank, local_world_size=2, network=network)

    # asrdist's own launcher (it gives its learners their network): it keeps the records itself
    worker._record_start(tmp_path, cfg, learner(0, "loopback"), resumed=True)
    assert (tmp_path / "failed-rank-0.txt").exists() and resume_configs(tmp_path) == {}
    worker._record_start(tmp_path, cfg, learner(1), resumed=True)  # each learner clears its own report
    assert not (tmp_path / "failed-rank-1.txt").exists() and resume_configs(tmp_path) == {}
    worker._record_start(tmp_path, cfg, learner(0), resumed=True)  # rank 0 records the resume
    assert not (tmp_path / "failed-rank-0.txt").exists()
    assert list(resume_configs(tmp_path)) == [1]
    assert (tmp_path / "config-resume-1.yaml").read_text().startswith(
        "# asrdist train --resume: (asrdist.run.worker under torchrun)")
    worker._record_start(tmp_path, cfg, learner(0), resumed=False)  # a first start records nothing
    assert list(resume_configs(tmp_path)) == [1]


def test_worker_start_check_refuses_another_world_size_and_a_run_that_already_trained(tmp_path):
    """The check the worker makes before joining any job (its process: the test above, slow)."""
    run = tmp_path / "run"
    run.mkdir()
    with pytest.raises(ConfigError, match=r"prepared for 2 learner\(s\), torchrun started 3; start nodes x "
                                          r"--nproc-per-node = 2 learners, or prepare the run again with --learners 3"):
        check_start(run, 2, 3, resume=False)
    check_start(run, 2, 2, resume=False)  # a fresh run of the right size starts
    (run / "summary.json").write_text("{}")
    with pytest.raises(ConfigError, match=r"finished training \(summary.json\); continue it with `--resume`"):
        check_start(run, 2, 2, resume=False)
    check_start(run, 2, 2, resume=True)  # --resume continues it
    with pytest.raises(ConfigError, match="torchrun started 1"):
        check_start(run, 2, 1, resume=True)  # the size is checked on a resume too
