"""Dedicated emulated hosts: a cgroup CPU quota per host (`asrdist.cluster.cpushare`), its plan
for stragglers, the learners inside it, and nothing left behind however the launcher ends."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from asrdist.cluster import cpushare, netem
from asrdist.cluster.cpushare import HostCpuPlan, HostCpuShares
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.process_group import CPU_QUOTA_ENV, QUOTA_SLOWDOWN_ENV, JobEnv
from asrdist.errors import ConfigError
from asrdist.run.train_cli import cpus_per_host_arg
from tests.support.paths import DEFAULT_RECIPE

HANG_S = 120  # only catches hangs
MODULE = "test_cpushare"  # learners import this file's functions through PYTHONPATH


@pytest.fixture
def cgroups_available():
    ok, why = cpushare.available()
    if not ok:
        pytest.skip(f"dedicated CPU shares unavailable: {why}")


@pytest.fixture
def workers_import_tests(monkeypatch):
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


# ------------------------------------------------------------------ the plan (no cgroups needed)
def test_a_stragglers_host_gets_the_share_divided_by_its_slowdown():
    plan = HostCpuPlan.make(0.3, nodes=4, learners=4, straggler_ranks=[2], slowdown=3.0)
    assert plan.quotas == pytest.approx((0.3, 0.3, 0.1, 0.3))
    assert plan.slowed == (1.0, 1.0, 3.0, 1.0) and plan.sleep_ranks == ()
    assert plan.straggler_emulation() == "cpu-quota"


def test_a_straggler_sharing_its_host_keeps_the_sleep_stand_in():
    plan = HostCpuPlan.make(0.8, nodes=2, learners=4, straggler_ranks=[1], slowdown=2.0)
    assert plan.quotas == (0.8, 0.8) and plan.slowed == (1.0, 1.0) and plan.sleep_ranks == (1,)
    assert plan.straggler_emulation() == "sleep (stand-in)"
    whole = HostCpuPlan.make(0.8, nodes=2, learners=4, straggler_ranks=[2, 3], slowdown=2.0)
    assert whole.quotas == (0.8, 0.4) and whole.straggler_emulation() == "cpu-quota"
    assert HostCpuPlan.make(0.5, 2, 2).straggler_emulation() is None


def test_quotas_outside_what_the_kernel_and_machine_take_are_refused():
    with pytest.raises(ConfigError, match="--cpus-per-host"):
        HostCpuPlan.make(0.001, 2, 2)
    with pytest.raises(ConfigError, match="--cpus-per-host"):
        HostCpuPlan.make(len(os.sched_getaffinity(0)) + 1.0, 2, 2)
    assert cpus_per_host_arg("shared") == "shared" and cpus_per_host_arg("0.25") == 0.25
    with pytest.raises(Exception, match="0"):
        cpus_per_host_arg("0")


def test_the_default_share_leaves_the_launchers_margin():
    cores = len(os.sched_getaffinity(0))
    assert cpushare.default_cpus_per_host(8) * 8 == pytest.approx(cores - cpushare.LAUNCHER_MARGIN_CORES, abs=1e-3)


def test_the_learner_reads_its_hosts_quota_from_the_launcher():
    env = {"RANK": "1", "WORLD_SIZE": "2", CPU_QUOTA_ENV: "0.1", QUOTA_SLOWDOWN_ENV: "3.0"}
    spec = JobEnv.from_environ(env)
    assert spec.cpu_quota == 0.1 and spec.quota_slowdown == 3.0
    plain = JobEnv.from_environ({"RANK": "0", "WORLD_SIZE": "2"})
    assert plain.cpu_quota == 0.0 and plain.quota_slowdown == 1.0


# ------------------------------------------------------------------------- real cgroups (root)
def _own_cgroup_of(pid: int) -> str:
    for line in Path(f"/proc/{pid}/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if "cpu" in controllers.split(",") or controllers == "":
            return path
    raise AssertionError(f"pid {pid}: no cpu cgroup")


@pytest.mark.slow
@pytest.mark.usefixtures("cgroups_available")
def test_a_process_of_a_dedicated_host_is_in_its_cgroup_with_the_declared_quota():
    with HostCpuShares([0.25, 0.5]) as shares:
        procs = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"],
                                  preexec_fn=shares.preexec(i)) for i in range(2)]
        try:
            for i, (proc, quota) in enumerate(zip(procs, (0.25, 0.5))):
                group = shares.group(i)
                assert _own_cgroup_of(proc.pid).rstrip("/").endswith(group.name)
                if shares.layout.version == 1:
                    declared = int((group / "cpu.cfs_quota_us").read_text()) / int((group / "cpu.cfs_period_us").read_text())
                else:
                    q, period = (group / "cpu.max").read_text().split()
                    declared = int(q) / int(period)
                assert declared == pytest.approx(quota)
                assert str(proc.pid) in (group / "cgroup.procs").read_text().split()
        finally:
            for proc in procs:
                proc.kill()
                proc.wait()
        groups = [shares.group(i) for i in range(2)]
    assert not any(g.exists() for g in groups)
    assert shares.usage(1).cpu_quota == 0.5  # the last counters outlive the groups


def spin(spec: JobEnv, args: dict) -> dict:
    """Learner function: busy for `seconds` of wall time; which cgroup it ran in, the CPU it got."""
    path = _own_cgroup_of(os.getpid())
    t0, c0 = time.monotonic(), time.process_time()
    while time.monotonic() - t0 < args["seconds"]:
        pass
    return {"rank": spec.rank, "cgroup": path, "cpu_fraction": (time.process_time() - c0) / (time.monotonic() - t0),
            "cpu_quota": spec.cpu_quota, "threads": spec.num_threads, "agent_cgroup": _own_cgroup_of(os.getppid())}


@pytest.mark.slow
@pytest.mark.usefixtures("cgroups_available", "emulated_network_available")
def test_learners_on_emulated_hosts_compute_within_their_hosts_quota(workers_import_tests):
    results = run_learners(MODULE, "spin", 2, 2, "1gbit", {"seconds": 1.5}, HANG_S, cpus_per_host=0.2)
    groups = {r["cgroup"] for r in results}
    assert len(groups) == 2 and all(Path(g).name.startswith(f"{cpushare.PREFIX}-{os.getpid()}-") for g in groups)
    # the learners' agents (torchrun's, the job's store in host 0's) run outside every host's quota
    assert all(Path(r["agent_cgroup"]).name not in {Path(g).name for g in groups} for r in results), results
    for r in results:
        # a busy loop can use no more than its host's quota, whether the other core is idle or not
        assert r["cpu_fraction"] <= 0.2 * 1.15, r
        assert r["cpu_quota"] == 0.2 and r["threads"] == 1
        assert r["host_cpu"]["cpu_quota"] == 0.2 and r["host_cpu"]["throttled_seconds"] > 0
        assert r["host_cpu"]["cpu_seconds"] > 0
    assert not [g for g in cpushare.list_groups() if f"-{os.getpid()}-" in g]


_KILLED = """
import json, sys, time
from asrdist.cluster.cpushare import HostCpuShares
from asrdist.cluster.netem import EmulatedNetwork
shares = HostCpuShares([0.2]).open()
net = EmulatedNetwork(1).open()
child = net.popen(0, [sys.executable, "-c", "import time; time.sleep(600)"], preexec=shares.preexec(0))
print(json.dumps({"namespaces": net.namespaces(), "group": str(shares.group(0)), "child": child.pid}), flush=True)
time.sleep(600)
"""


def _gone(predicate, what: str) -> None:
    deadline = time.monotonic() + HANG_S
    while not predicate():
        assert time.monotonic() < deadline, f"{what} still there after {HANG_S} s"
        time.sleep(0.05)


@pytest.mark.slow
@pytest.mark.usefixtures("cgroups_available", "emulated_network_available")
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGTERM])
def test_a_killed_launcher_leaves_no_cgroup_and_no_namespace(sig):
    proc = subprocess.Popen([sys.executable, "-c", _KILLED], stdout=subprocess.PIPE, text=True,
                            stdin=subprocess.DEVNULL)
    try:
        line = proc.stdout.readline()
        assert line, "the launcher ended before its line"
        info = json.loads(line)
        assert Path(info["group"]).is_dir() and str(info["child"]) in Path(info["group"], "cgroup.procs").read_text()
        proc.send_signal(sig)
        proc.wait(timeout=HANG_S)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()

    def listed() -> set[str]:
        return set(netem.list_namespaces())
    _gone(lambda: not Path(info["group"]).exists(), f"cgroup {info['group']}")
    _gone(lambda: not set(info["namespaces"]) & listed(), "namespaces")
    _gone(lambda: not Path(f"/proc/{info['child']}").exists(), f"learner {info['child']}")
    assert not [g for g in cpushare.list_groups() if f"-{proc.pid}-" in g]


@pytest.mark.slow
@pytest.mark.usefixtures("cgroups_available")
def test_cleanup_stale_removes_only_groups_of_dead_creators():
    layout, _ = cpushare.probe()
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = layout.cpu_parent / f"{cpushare.PREFIX}-{dead.pid}-abcdef-n0"
    stale.mkdir()
    try:
        with HostCpuShares([0.3]) as shares:  # opening removes the dead creator's group
            assert not stale.exists() and shares.group(0).is_dir()
    finally:
        if stale.exists():
            stale.rmdir()


def test_a_straggler_slowed_by_its_quota_sleeps_no_stand_in():
    from asrdist.config import RunConfig
    from asrdist.run.worker import slowed_by_quota

    cfg = RunConfig()
    cfg.train.straggler.ranks, cfg.train.straggler.slowdown = [1], 3.0
    slowed_by_quota(cfg, JobEnv(rank=0, world_size=2, local_rank=0, local_world_size=1))
    assert cfg.train.straggler.slowdown == 3.0  # a host at full speed: the config as it is
    slowed_by_quota(cfg, JobEnv(rank=1, world_size=2, local_rank=0, local_world_size=1, quota_slowdown=3.0))
    assert cfg.train.straggler.slowdown == 1.0 and cfg.train.straggler.ranks == [1]


def test_compare_refuses_a_share_it_cannot_give_before_it_writes_anything(tmp_path, monkeypatch):
    from asrdist.compare.runs import Hosts, resolve_all  # here: the other tests need no compare

    monkeypatch.setattr(netem, "available", lambda: (True, ""))
    monkeypatch.setattr(cpushare, "available", lambda: (True, ""))
    recipe = DEFAULT_RECIPE
    with pytest.raises(ConfigError, match=r"single: --cpus-per-host: 9 cores per host"):
        resolve_all(recipe, ["single", "sync"], 2, tmp_path / "corpus", [], Hosts(2, "1gbit", 9.0))
    assert not list(tmp_path.iterdir())


def test_a_learner_that_cannot_join_its_hosts_cgroup_says_so_in_one_line(tmp_path):
    env = dict(os.environ, ASRDIST_HOST_CGROUPS=str(tmp_path / "gone" / "cgroup.procs"))
    proc = subprocess.run([sys.executable, "-m", "asrdist.cluster.in_host", "asrdist.cli", "--help"], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_S)
    assert proc.returncode == 1 and proc.stdout == ""
    assert proc.stderr.startswith("asrdist: error: learner ") and "cannot join its host's cgroup" in proc.stderr
    assert len(proc.stderr.strip().splitlines()) == 1


def test_a_learner_in_its_host_runs_its_module_as_python_m_does(tmp_path):
    procs = tmp_path / "cgroup.procs"  # a plain file stands in for the cgroup's: the pid is written to it
    procs.write_text("")
    (tmp_path / "echo_args.py").write_text("import sys\nprint(__name__, sys.argv[1:])\n")
    env = dict(os.environ, ASRDIST_HOST_CGROUPS=str(procs), PYTHONPATH=str(tmp_path))
    proc = subprocess.run([sys.executable, "-m", "asrdist.cluster.in_host", "echo_args", "--x", "1"], env=env,
                          capture_output=True, text=True, stdin=subprocess.DEVNULL, timeout=HANG_S)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "__main__ ['--x', '1']"
    assert procs.read_text().strip().isdigit()
