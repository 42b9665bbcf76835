"""Dedicated CPU shares for emulated hosts: a cgroup per host with a CPU quota (DESIGN.md §5.8).

An emulated host (a network namespace of `netem.EmulatedNetwork`, or one of several hosts on
loopback) computes at a declared speed only when its neighbours cannot lend it their idle time, and
a slow host's idle time goes to no one: `HostCpuShares([0.22] * 8)` makes eight cgroups of the
`cpu` controller, each capped at 0.22 of a core (`cpu.cfs_quota_us / cpu.cfs_period_us` on cgroup
v1, `cpu.max` on v2). Every learner started through `asrdist.cluster.in_host` with
`learner_env(i)` (or a process started with `preexec(i)`) joins host i's group before it imports
anything, and every process and thread it starts stays there (a device's host CPU drives its
communication threads too); the launcher's agents and the job's store stay outside. The groups
are created under this process' own cgroup, named like the namespaces
(`asrdist-<creator pid>-<hex>-n<i>`), and removed on close, on a signal, at exit, and by
`asrdist.cluster.reaper` when the creator dies by SIGKILL; `cleanup_stale()` removes those of dead
creators. `usage(i)` is the group's own counters: the CPU its tasks used and the time the quota
held them back.
"""
from __future__ import annotations

import atexit
import functools
import os
import re
import secrets
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Callable, Sequence

from asrdist.cluster import in_host, reaper
from asrdist.cluster.netem import die_with_parent
from asrdist.errors import ConfigError, TrainingError
from asrdist.utils import environ

PREFIX = "asrdist"
PERIOD_US = 100_000
"""The quota's period: 100 ms (the kernel's default); a quota of 0.22 cores is 22 ms of it."""
MIN_QUOTA_CORES = 0.01
"""The kernel refuses a quota under 1 ms a period."""
LAUNCHER_MARGIN_CORES = 0.3
"""What the default quota leaves outside the hosts: the launcher and its output pumps, torchrun's
agents, host 0's serving the job's store (every learner's claims), and the kernel's network work
charged to no host. Measured as `outside_hosts` on the idle machine (2026-12-03, docs/seeds.md):
0.08-0.25 cores with 8 hosts, 0.24-0.30 with 16; 0.1 until the agents left the hosts' quotas."""
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]+)-n\d+$")


@dataclass(frozen=True)
class Layout:
    """Where this machine's cpu controller is: `version` 1 (cpu and cpuacct hierarchies, maybe the
    same) or 2 (one unified hierarchy); the directories new groups are made in."""
    version: int
    cpu_parent: Path
    acct_parent: Path


@dataclass(frozen=True)
class HostCpuUsage:
    """One host's CPU over its group's life, from the group's own counters."""
    node: int
    cpu_quota: float
    """Cores the host may use (quota / period)."""
    cpu_seconds: float
    """CPU time its tasks used, all threads."""
    throttled_seconds: float
    """Time the quota held its tasks back (summed over periods in which they were throttled)."""
    throttled_periods: int
    periods: int

    def as_dict(self) -> dict:
        return asdict(self)


def _own_cgroup(controller: str) -> str:
    """This process' cgroup path in `controller`'s hierarchy ('' for cgroup v2's line)."""
    for line in Path("/proc/self/cgroup").read_text().splitlines():
        _, controllers, path = line.split(":", 2)
        if controller in controllers.split(","):
            return path
    raise KeyError(controller)


@functools.lru_cache(maxsize=1)
def probe() -> tuple[Layout | None, str]:
    """(layout, '') where this process can make cgroups with a CPU quota; (None, reason) otherwise."""
    if os.geteuid() != 0:
        return None, f"dedicated CPU shares need root (running as uid {os.geteuid()})"
    mounts: dict[str, Path] = {}
    try:
        for line in Path("/proc/self/mounts").read_text().splitlines():
            _, where, fstype, options, *_ = line.split()
            if fstype == "cgroup":
                for controller in ("cpu", "cpuacct"):
                    if controller in options.split(","):
                        mounts.setdefault(controller, Path(where))
            elif fstype == "cgroup2":
                mounts.setdefault("unified", Path(where))
        if "cpu" in mounts and "cpuacct" in mounts:
            cpu = mounts["cpu"] / _own_cgroup("cpu").lstrip("/")
            acct = mounts["cpuacct"] / _own_cgroup("cpuacct").lstrip("/")
            layout = Layout(1, cpu, acct)
        elif "unified" in mounts:
            parent = mounts["unified"] / _own_cgroup("").lstrip("/")
            if "cpu" not in (parent / "cgroup.subtree_control").read_text().split():
                return None, (f"dedicated CPU shares: cgroup v2 at {parent} does not give its children the "
                              f"cpu controller (cgroup.subtree_control)")
            layout = Layout(2, parent, parent)
        else:
            return None, "dedicated CPU shares: no cgroup cpu controller is mounted (/proc/self/mounts)"
    except (OSError, KeyError, ValueError) as e:
        return None, f"dedicated CPU shares: cannot read this machine's cgroups: {e}"
    trial = layout.cpu_parent / f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-n0"
    try:
        trial.mkdir()
        _set_quota(layout, trial, 0.5)
    except OSError as e:
        return None, f"dedicated CPU shares: cannot make a cgroup with a CPU quota in {layout.cpu_parent}: {e}"
    finally:
        reaper.remove_cgroup(trial)
    return layout, ""


def available() -> tuple[bool, str]:
    layout, reason = probe()
    return layout is not None, reason


def default_cpus_per_host(hosts: int) -> float:
    """This machine's cores shared out evenly among `hosts`, less the launcher's margin."""
    cores = len(os.sched_getaffinity(0))
    return max(MIN_QUOTA_CORES, round((cores - LAUNCHER_MARGIN_CORES) / hosts, 4))


def check_quotas(quotas: Sequence[float]) -> None:
    cores = len(os.sched_getaffinity(0))
    for q in quotas:
        if not MIN_QUOTA_CORES <= q <= cores:
            raise ConfigError(f"--cpus-per-host: {q:g} cores per host; expected {MIN_QUOTA_CORES} to "
                              f"this machine's {cores} cores")


def _set_quota(layout: Layout, group: Path, cores: float) -> None:
    quota = max(1000, int(round(cores * PERIOD_US)))
    if layout.version == 1:
        (group / "cpu.cfs_period_us").write_text(str(PERIOD_US))
        (group / "cpu.cfs_quota_us").write_text(str(quota))
    else:
        (group / "cpu.max").write_text(f"{quota} {PERIOD_US}")


def _read_stat(path: Path) -> dict[str, int]:
    return {k: int(v) for k, v in (line.split() for line in path.read_text().splitlines() if line.strip())}


class HostCpuShares:
    """One cgroup per host, host i capped at `quotas[i]` cores. A context manager; `close()` is
    idempotent and also runs at exit and on SIGINT/SIGTERM (through the caller's handlers: the
    launcher's supervisor turns them into an exception that unwinds to close())."""

    def __init__(self, quotas: Sequence[float]):
        check_quotas(quotas)
        self.quotas = [float(q) for q in quotas]
        self._groups: list[tuple[Path, Path]] = []
        self._base = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self._final: list[HostCpuUsage] | None = None
        self._machine_start: tuple[float, float] | None = None
        self._machine_final: dict | None = None

    def __enter__(self) -> "HostCpuShares":
        return self.open()

    def __exit__(self, *exc) -> None:
        self.close()

    def open(self) -> "HostCpuShares":
        layout, reason = probe()
        if layout is None:
            raise ConfigError(reason)
        cleanup_stale()
        self.layout = layout
        atexit.register(self.close)
        try:
            for i, q in enumerate(self.quotas):
                cpu = layout.cpu_parent / f"{self._base}-n{i}"
                acct = layout.acct_parent / cpu.name
                for path in dict.fromkeys((cpu, acct)):
                    path.mkdir()
                    reaper.watch("cg", str(path))
                self._groups.append((cpu, acct))
                _set_quota(layout, cpu, q)
            self._machine_start = (machine_busy_seconds(), time.monotonic())
        except OSError as e:
            self.close()
            raise TrainingError(f"dedicated CPU shares: cannot make host {len(self._groups)}'s cgroup: {e}") from e
        return self

    def procs_files(self, node: int) -> list[str]:
        """The `cgroup.procs` files a process writes its pid to, to join host `node`."""
        return [str(p / "cgroup.procs") for p in dict.fromkeys(self._groups[node])]

    def preexec(self, node: int) -> Callable[[], None]:
        """A `preexec_fn`: the child joins host `node`'s group and dies with its parent."""
        files = self.procs_files(node)

        def join_and_die_with_parent() -> None:
            in_host.join(files)
            die_with_parent()
        return join_and_die_with_parent

    def learner_env(self, node: int) -> dict[str, str]:
        """The environment through which `asrdist.cluster.in_host` puts a learner on host `node`
        (the launcher's agents stay outside the hosts). The files are named through this process'
        root (/proc/PID/root): `ip netns exec` mounts a sysfs of the namespace's own in which no
        cgroup hierarchy is mounted."""
        root = f"/proc/{os.getpid()}/root"
        return {environ.HOST_CGROUPS: os.pathsep.join(root + f for f in self.procs_files(node))}

    def group(self, node: int) -> Path:
        """Host `node`'s group in the cpu hierarchy."""
        return self._groups[node][0]

    def usage(self, node: int) -> HostCpuUsage:
        """Host `node`'s counters now (or when the groups were closed)."""
        if self._final is not None:
            return self._final[node]
        cpu, acct = self._groups[node]
        stat = _read_stat(cpu / "cpu.stat")
        if self.layout.version == 1:
            used = int((acct / "cpuacct.usage").read_text()) / 1e9
            throttled = stat.get("throttled_time", 0) / 1e9
        else:
            used, throttled = stat.get("usage_usec", 0) / 1e6, stat.get("throttled_usec", 0) / 1e6
        return HostCpuUsage(node, self.quotas[node], round(used, 3), round(throttled, 3),
                            stat.get("nr_throttled", 0), stat.get("nr_periods", 0))

    def outside(self) -> dict:
        """The machine's CPU outside the hosts since the groups were made: the launcher, the
        kernel's work charged to no host, and anything else running here (another job's load)."""
        if self._machine_final is not None or self._machine_start is None:
            return self._machine_final or {}
        busy0, t0 = self._machine_start
        wall = max(1e-9, time.monotonic() - t0)
        outside = machine_busy_seconds() - busy0 - sum(self.usage(i).cpu_seconds for i in range(len(self._groups)))
        return {"wall_seconds": round(wall, 3), "cpu_seconds": round(outside, 3), "cores": round(outside / wall, 4),
                "machine_cores": len(os.sched_getaffinity(0)),
                "what": "CPU the machine spent outside the hosts' cgroups while they existed (/proc/stat less "
                        "the hosts' own counters): the launcher, kernel work charged to no host, other jobs"}

    def close(self) -> None:
        """Read every group's counters one last time, kill what is left in it, remove it."""
        if self._groups and self._final is None:
            try:
                self._final = [self.usage(i) for i in range(len(self._groups))]
                self._machine_final = self.outside()  # over the counters just read
            except (OSError, ValueError):
                self._final = None
        while self._groups:
            for path in dict.fromkeys(self._groups.pop()):
                if reaper.remove_cgroup(path):
                    reaper.release("cg", str(path))
        atexit.unregister(self.close)


def machine_busy_seconds() -> float:
    """CPU seconds this machine has spent busy since boot, all cores (/proc/stat: all but idle and
    iowait; guest time is already in user)."""
    fields = [int(x) for x in Path("/proc/stat").read_text().split("\n", 1)[0].split()[1:9]]
    return (sum(fields) - fields[3] - fields[4]) / os.sysconf("SC_CLK_TCK")


def cleanup_stale() -> list[str]:
    """Remove host groups left by creators that are no longer alive."""
    layout, _ = probe()
    removed = []
    if layout is None:
        return removed
    for parent in dict.fromkeys((layout.cpu_parent, layout.acct_parent)):
        for path in parent.glob(f"{PREFIX}-*"):
            m = _NAME_RE.match(path.name)
            if m and int(m.group(1)) != os.getpid() and not Path(f"/proc/{m.group(1)}").exists():
                if reaper.remove_cgroup(path):
                    removed.append(str(path))
    return removed


def list_groups() -> list[str]:
    """This module's groups (any creator), for tests and leftover checks."""
    layout, _ = probe()
    if layout is None:
        return []
    return sorted(str(p) for parent in dict.fromkeys((layout.cpu_parent, layout.acct_parent))
                  for p in parent.glob(f"{PREFIX}-*") if _NAME_RE.match(p.name))


@dataclass(frozen=True)
class HostCpuPlan:
    """The CPU each host of a job gets: `cpus_per_host` cores, a straggler's host `slowdown` times
    fewer when every learner on it is a straggler (`slowed[i]`: the slowdown its quota applies,
    1.0 for a host at full speed). `sleep_ranks`: stragglers that share a host with learners at
    full speed: they keep the sleep stand-in (the quota cannot slow one learner of a host)."""
    cpus_per_host: float
    quotas: tuple[float, ...]
    slowed: tuple[float, ...]
    sleep_ranks: tuple[int, ...] = ()

    @classmethod
    def make(cls, cpus_per_host: float, nodes: int, learners: int, straggler_ranks: Sequence[int] = (),
             slowdown: float = 1.0) -> "HostCpuPlan":
        per_host = learners // nodes
        quotas, slowed, sleep = [], [], []
        for node in range(nodes):
            ranks = set(range(node * per_host, (node + 1) * per_host))
            stragglers = ranks & set(straggler_ranks)
            by_quota = slowdown > 1 and stragglers == ranks
            quotas.append(cpus_per_host / slowdown if by_quota else cpus_per_host)
            slowed.append(slowdown if by_quota else 1.0)
            if slowdown > 1 and stragglers and not by_quota:
                sleep.extend(sorted(stragglers))
        plan = cls(cpus_per_host, tuple(quotas), tuple(slowed), tuple(sleep))
        check_quotas(plan.quotas)
        return plan

    def straggler_emulation(self) -> str | None:
        """How this plan slows its stragglers: 'cpu-quota', 'sleep (stand-in)', both, or None."""
        ways = (["cpu-quota"] if any(s > 1 for s in self.slowed) else []) + (
            ["sleep (stand-in)"] if self.sleep_ranks else [])
        return " + ".join(ways) or None


def resolve_cpus_per_host(value: float | str | None, nodes: int, network: str) -> float | None:
    """`--cpus-per-host` as given ('shared', a number, or None) -> the cores of each host's quota,
    or None for no quota: 'shared'; None on one host or loopback hosts; None on emulated hosts is
    `default_cpus_per_host`. Refused in one line where cgroups cannot be written."""
    if value == "shared" or (value is None and (nodes == 1 or network == "loopback")):
        return None
    cpus = default_cpus_per_host(nodes) if value is None else float(value)
    ok, reason = available()
    if not ok:
        raise ConfigError(f"--cpus-per-host {cpus:g}: {reason} (or --cpus-per-host shared)")
    return cpus
