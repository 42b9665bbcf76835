"""Contention seen: the CPU a run's learners received against their entitlement, from /proc
counters (here a fake /proc tree's), and a run given half its CPU flagged (issue 58, item 3)."""
from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from asrdist.run.summary import RunSummary
from asrdist.utils.contention import CONTENDED_SHARE, job_share, read_cpu, received, shared_cores


def _proc(root: Path, threads: dict[str, tuple[float, float]] | None, stat_seconds: float = 0.0) -> Path:
    """A fake /proc holding process 42: each thread's schedstat (CPU s, run-queue wait s), its stat."""
    base = root / "42"
    (base / "task").mkdir(parents=True, exist_ok=True)
    for tid, (cpu, wait) in (threads or {}).items():
        (base / "task" / tid).mkdir(exist_ok=True)
        (base / "task" / tid / "schedstat").write_text(f"{int(cpu * 1e9)} {int(wait * 1e9)} 7\n")
    ticks = int(stat_seconds * os.sysconf("SC_CLK_TCK"))
    (base / "stat").write_text(f"42 (python (x)) R 1 42 42 0 -1 0 0 0 0 0 {ticks} 0 0 0 20 0 3 0\n")
    return root


def _learner(tmp_path: Path, before: dict, after: dict, name: str = "p"):
    """(CPU s, wait s) of a learner whose threads read `before`, then `after`."""
    first = read_cpu(42, _proc(tmp_path / f"{name}0", before))
    return received(first, read_cpu(42, _proc(tmp_path / f"{name}1", after)))


def test_a_run_given_half_its_cpu_is_flagged(tmp_path):
    """One learner of two threads on 2 cores for 10 s: ready to run 20 s of CPU, given 10."""
    cpu, wait = _learner(tmp_path, {"42": (1.0, 0.5), "43": (0.0, 0.0)}, {"42": (6.0, 5.5), "43": (5.0, 5.0)})
    assert (cpu, wait) == pytest.approx((10.0, 10.0))
    share = job_share([(cpu, wait, 10.0)], shared_cores(1, cores=2))
    assert share.share == pytest.approx(0.5) and share.contended is True
    summary = RunSummary.from_json({
        "strategy": "single", "learners": 1, "frames_per_second": 100.0, "wall_seconds": 10.0, "final": {},
        "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0, "per_learner": [
            {"rank": 0, "cpu_seconds": cpu, "cpu_wait_seconds": wait, "cpu_wall_seconds": 10.0}]},
        "load": {"start": 3.2, "end": 3.9, "cores": 2}})
    summary.set_cpu_share(shared_cores(1, cores=2))
    written = json.loads(json.dumps(summary.to_json()))
    assert written["contended"] is True and written["cpu_share"] == pytest.approx(0.5)
    assert written["load"] == {"start": 3.2, "end": 3.9, "cores": 2}
    assert written["cpu_received"]["entitled_seconds"] == pytest.approx(20.0)
    assert RunSummary.from_json(written).contended is True


def test_a_quiet_run_and_learners_crowding_their_own_cores_are_not_flagged(tmp_path):
    # alone: its second thread busy part of the time, hardly ever waiting for a core
    cpu, wait = _learner(tmp_path, {"42": (0.0, 0.0)}, {"42": (9.5, 0.2), "43": (6.0, 0.3)})
    assert job_share([(cpu, wait, 10.0)], shared_cores(1, cores=2)).share == pytest.approx(15.5 / 16.0)
    # 4 learners on 2 cores wait for each other's cores: each is entitled to half a core
    four = job_share([(5.0, 5.0, 10.0)] * 4, shared_cores(4, cores=2))
    assert four.share == pytest.approx(1.0) and four.contended is False
    # a learner blocked on its peers wants no more than it got
    assert job_share([(3.0, 0.1, 10.0), (9.8, 0.1, 10.0)], [1.0, 1.0]).contended is False
    # on dedicated hosts, entitled to its host's quota: 0.25 cores for 10 s, given 2.4 s
    assert job_share([(2.4, 7.0, 10.0)], [0.25]).share == pytest.approx(0.96)


def test_threads_that_come_and_go_and_a_kernel_without_schedstat(tmp_path):
    # a thread started meanwhile counts from zero; one that ended is not in the second reading
    cpu, wait = _learner(tmp_path, {"42": (1.0, 0.0), "44": (2.0, 1.0)}, {"42": (3.0, 1.0), "45": (1.0, 0.5)})
    assert (cpu, wait) == pytest.approx((3.0, 1.5))
    # without schedstat: the process' stat, no wait, so a core at most is what it wanted
    cpu, wait = received(read_cpu(42, _proc(tmp_path / "s0", None, 1.0)),
                         read_cpu(42, _proc(tmp_path / "s1", None, 4.0)))
    assert (cpu, wait) == (pytest.approx(3.0), None)
    assert job_share([(cpu, wait, 10.0)], [2.0]).share == pytest.approx(0.3)
    assert read_cpu(42, tmp_path / "nothing") is None and received(None, None) == (None, None)
    assert job_share([(None, None, 10.0)], [2.0]) is None
    assert CONTENDED_SHARE == 0.8


def test_this_process_reads_its_own_counters():
    before = read_cpu()
    sum(i * i for i in range(200_000))
    cpu, wait = received(before, read_cpu())
    assert cpu > 0 and (wait is None or wait >= 0)


def test_on_dedicated_hosts_each_learner_is_entitled_to_its_hosts_quota():
    from asrdist.run.launch import quota_cores

    assert quota_cores((0.5, 0.25), 4) == [0.25, 0.25, 0.125, 0.125]  # a straggler's host: half the quota
    assert quota_cores((1.9,), 1) == [1.9]
