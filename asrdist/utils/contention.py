"""Contention seen, not inferred: the CPU a run's learners received against their share of it.

1. Each learner reads its own threads' counters when its training starts and when it ends
   (`read_cpu`: /proc/self/task/*/schedstat, each thread's CPU time and its time ready to run but
   waiting for a core; /proc/self/stat's user + system time, children's included, where the
   kernel keeps no schedstat), and the load average.
2. Between the readings (`received`): the CPU it received, and the CPU it wanted (received plus
   its threads' run-queue wait).
3. Its entitlement (`job_share`): its cores (this machine's cores / the learners on them, or its
   emulated host's quota / that host's learners) x its wall seconds, but no more than it wanted
   (a learner blocked on a peer, or one that cannot keep its threads busy, is not short of CPU);
   without its wait (no schedstat), a core at most.
4. The job's share: all learners' received CPU / all learners' entitlement. Under CONTENDED_SHARE
   the run is `contended`: another job took cores it would have had (docs/comparing.md).
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

PROC = Path("/proc")
CONTENDED_SHARE = 0.8
"""A run whose learners received less than this share of their entitlement is flagged."""


@dataclass(frozen=True)
class CpuReading:
    """One process' CPU counters at one moment: per thread (thread id -> (CPU s, run-queue wait s))
    from schedstat, or, where there is none, the process' CPU seconds alone (`total`)."""
    threads: dict[str, tuple[float, float]] | None
    total: float


def _schedstat(task: Path) -> tuple[float, float] | None:
    try:
        cpu_ns, wait_ns, *_ = (task / "schedstat").read_text().split()
        return int(cpu_ns) / 1e9, int(wait_ns) / 1e9
    except (OSError, ValueError):
        return None  # a thread that ended between the listing and the read, or no schedstat


def _stat_seconds(stat: Path) -> float | None:
    """utime + stime + cutime + cstime of a /proc/PID/stat (after the command's closing ')')."""
    try:
        fields = stat.read_text().rsplit(")", 1)[1].split()
        return sum(int(v) for v in fields[11:15]) / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError):
        return None


def read_cpu(pid: str | int = "self", proc: Path = PROC) -> CpuReading | None:
    """Process `pid`'s counters now (`proc`: where /proc is; a test's fake tree); None where
    neither schedstat nor stat can be read (not Linux)."""
    base = Path(proc) / str(pid)
    threads = {}
    try:
        tasks = sorted((base / "task").iterdir())
    except OSError:
        tasks = []
    for task in tasks:
        figures = _schedstat(task)
        if figures is not None:
            threads[task.name] = figures
    total = _stat_seconds(base / "stat")
    if not threads:
        return None if total is None else CpuReading(None, total)
    return CpuReading(threads, sum(cpu for cpu, _ in threads.values()) if total is None else total)


def received(before: CpuReading | None, after: CpuReading | None) -> tuple[float | None, float | None]:
    """(CPU seconds received, seconds its threads waited for a core) between two readings of one
    process; the wait is None without schedstat, both None without readings. A thread that
    started between them counts from zero; one that ended is left out of the schedstat sums."""
    if before is None or after is None:
        return None, None
    if before.threads is None or after.threads is None:
        return max(0.0, after.total - before.total), None
    cpu = wait = 0.0
    for tid, (c, w) in after.threads.items():
        c0, w0 = before.threads.get(tid, (0.0, 0.0))
        cpu, wait = cpu + max(0.0, c - c0), wait + max(0.0, w - w0)
    return cpu, wait


def load_average() -> float | None:
    """This machine's 1-minute load average (None where there is none)."""
    try:
        return round(os.getloadavg()[0], 2)
    except OSError:
        return None


def machine_cores() -> int:
    """The cores this process may run on."""
    return len(os.sched_getaffinity(0))


@dataclass(frozen=True)
class CpuShare:
    """A job's CPU against its entitlement (the module docstring's steps 3 and 4)."""
    received_seconds: float
    wanted_seconds: float | None
    entitled_seconds: float
    cores_per_learner: list[float]

    @property
    def share(self) -> float | None:
        return self.received_seconds / self.entitled_seconds if self.entitled_seconds > 0 else None

    @property
    def contended(self) -> bool | None:
        share = self.share
        return None if share is None else share < CONTENDED_SHARE

    def as_dict(self) -> dict:
        return {"received_seconds": round(self.received_seconds, 3),
                "wanted_seconds": None if self.wanted_seconds is None else round(self.wanted_seconds, 3),
                "entitled_seconds": round(self.entitled_seconds, 3),
                "cores_per_learner": sorted(set(round(c, 4) for c in self.cores_per_learner)),
                "contended_below": CONTENDED_SHARE}


def job_share(learners: list[tuple[float | None, float | None, float | None]],
              cores_per_learner: list[float]) -> CpuShare | None:
    """The share of `learners`, each (CPU s received, run-queue wait s or None, wall s) with its
    entitled cores; None where a learner has no reading."""
    if not learners or any(cpu is None or wall is None for cpu, _, wall in learners):
        return None
    got = sum(cpu for cpu, _, _ in learners)
    entitled, wanted = 0.0, 0.0
    for (cpu, wait, wall), cores in zip(learners, cores_per_learner):
        # without its wait, what a learner wanted is unknown: a core at most (what one thread wants)
        entitled += min(1.0, cores) * wall if wait is None else min(cores * wall, cpu + wait)
        wanted += cpu + (wait or 0.0)
    known = all(wait is not None for _, wait, _ in learners)
    return CpuShare(got, wanted if known else None, entitled, list(cores_per_learner))


def shared_cores(learners: int, cores: int | None = None) -> list[float]:
    """Each learner's entitled cores when `learners` share this machine's `cores` alike."""
    cores = machine_cores() if cores is None else cores
    return [cores / learners] * learners
