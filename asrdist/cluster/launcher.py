"""The one launch path of learners: torch's own elastic launcher, `torch.distributed.run`, under
asrdist's supervisor (`asrdist.cluster.supervisor`), the emulated network an option of it.

`launch_learners(module, args, n, report_dir, ...)` runs torchrun's own main for n learners, one
agent per host with `nodes=A` (on an `EmulatedNetwork` or loopback); `run_learners` runs a learner
function `module.name(env, args) -> dict` in n learners and returns their results by rank. A job
that survives lost learners (`survive_lost`) runs without torch's agent: the launcher hosts the
store and the supervisor watches each learner (`Survival`). How and why:
docs/process-groups.md#one-launch-path."""
from __future__ import annotations

import contextlib
import json
import os
import secrets
import socket
import subprocess
import sys
import tempfile
from dataclasses import asdict, dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch.distributed as dist

from asrdist.cluster import netem
from asrdist.cluster.cpushare import HostCpuPlan, HostCpuShares, HostCpuUsage
from asrdist.cluster.netem import COUNTER_NAMES, die_with_parent, parse_delay, parse_rate, payload_on_wire
from asrdist.cluster.process_group import (CPU_QUOTA_ENV, NETWORK_ENV, QUOTA_SLOWDOWN_ENV, STORE_PREFIX,
                                           THREADS_ENV, JobEnv)
from asrdist.cluster.supervisor import SHUTDOWN_GRACE_S, JobTimedOut, Survival, run_agents
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel.base import DEFAULT_TIMEOUT_SECONDS
from asrdist.utils.environ import child_environment

AGENT = (sys.executable, "-m", "asrdist.cluster.agent")
"""An agent's command: torch.distributed.run's own main, without the interpreter's teardown after
it (`asrdist.cluster.agent`)."""
LEARNER_MODULE = "asrdist.cluster.netem_launch"
"""The learner side of `run_learners`: runs one learner function under torch.distributed.run."""
# Rendezvous ports (in a fresh namespace, and on loopback): below Linux's ephemeral range
# (32768-60999), where gloo's own sockets and every connection's local port land.
_NAMESPACE_PORT_RANGE = (20000, 29999)


def launch_learners(module: str, args: list[str], learners: int, report_dir: Path,
                    timeout: float | None = None, nodes: int = 1, network: str = "1gbit",
                    max_restarts: int = 0, survive_lost: bool = False, delay: str = "0.1ms",
                    cpu: HostCpuPlan | None = None) -> JobCounters:
    """Run `python -m module *args` as `learners` learners, on this machine (nodes 1) or on `nodes`
    hosts joined by `network` links (a rate, with `delay`, emulated; or 'loopback'); when a learner
    fails, torch's launcher restarts them all up to `max_restarts` times (the module resumes:
    TORCHELASTIC_RESTART_COUNT); raise TrainingError on failure, JobTimedOut past `timeout`.
    `survive_lost` (nodes 1): the job goes on without failed learners and fails only when none
    finishes. `cpu`: each host in a cgroup of its own with `cpu.quotas[i]` cores (`cpushare`).
    Returns what the hosts counted (`JobCounters`), for the caller to record."""
    check_layout(learners, nodes, network)
    per_host = learners // nodes
    if cpu is not None:
        threads = [max(1, round(q / per_host)) for q in cpu.quotas]
    else:  # every learner, of every emulated node, shares this machine's cores
        threads = [max(1, len(os.sched_getaffinity(0)) // learners)] * nodes
    env = child_environment(TORCH_ELASTIC_SHUTDOWN_TIMEOUT=str(SHUTDOWN_GRACE_S),
                            **{NETWORK_ENV: network if nodes > 1 else "loopback"})
    if nodes == 1 or network == "loopback":
        env.setdefault("GLOO_SOCKET_IFNAME", "lo")  # every learner is on this machine

    def host_env(node: int) -> dict:
        extra = {"OMP_NUM_THREADS": str(threads[node]), THREADS_ENV: str(threads[node])}
        if cpu is not None:
            extra.update({CPU_QUOTA_ENV: repr(cpu.quotas[node]), QUOTA_SLOWDOWN_ENV: repr(cpu.slowed[node])})
        return dict(env, **extra)

    wire = None
    with contextlib.ExitStack() as stack:
        shares = stack.enter_context(HostCpuShares(cpu.quotas)) if cpu is not None else None
        records = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="asrdist-exits-")))
        exits = [records / f"agent-{node}.json" for node in range(nodes)]

        # on dedicated hosts only the learners join a host's cgroup (`asrdist.cluster.in_host`): each
        # host's agent, and host 0's with the job's store, runs outside the quotas
        target = ["asrdist.cluster.in_host", module] if shares is not None else [module]

        def agent_env(node: int) -> dict:
            return dict(host_env(node), **(shares.learner_env(node) if shares is not None else {}))

        if survive_lost and nodes == 1:  # learners started here, the store in this process
            _launch_survivable(module, args, learners, report_dir, timeout, host_env(0),
                               shares.preexec(0) if shares is not None else die_with_parent)
        elif nodes == 1:
            cmd = [*AGENT, "--exits", str(exits[0]), "--standalone", "--nnodes", "1", "--nproc-per-node",
                   str(learners), *_agent_options(max_restarts), "-m", *target, *args]
            run_agents([lambda: _popen(cmd, agent_env(0))], report_dir, timeout, exits=exits)
        else:
            def agent_cmd(node: int, master_addr: str, port: int) -> list[str]:
                return [*AGENT, "--exits", str(exits[node]), "--nnodes", str(nodes), "--nproc-per-node",
                        str(per_host),
                        "--node-rank", str(node), "--rdzv-backend", "static", "--master-addr", master_addr,
                        "--master-port", str(port), *_agent_options(max_restarts), "-m", *target, *args]

            if network == "loopback":
                port = _free_loopback_port()
                run_agents([lambda k=k: _popen(agent_cmd(k, "127.0.0.1", port), agent_env(k))
                            for k in range(nodes)], report_dir, timeout, exits=exits)
            else:
                net = stack.enter_context(netem.EmulatedNetwork(nodes, rate=network, delay=delay))
                port = _namespace_port()

                def agent(node: int) -> Callable[[], subprocess.Popen]:
                    cmd = agent_cmd(node, net.node_address(0), port)
                    node_env = dict(agent_env(node), GLOO_SOCKET_IFNAME=net.interface)
                    return lambda: net.popen(node, cmd, env=node_env, preexec=die_with_parent, stdout=None,
                                             stderr=subprocess.PIPE, text=True, bufsize=1)

                run_agents([agent(k) for k in range(nodes)], report_dir, timeout, exits=exits)
                wire = WireCounters.of(net)
        usage = [shares.usage(i) for i in range(nodes)] if shares is not None else []
        outside = shares.outside() if shares is not None else {}
    return JobCounters(wire, usage, outside)


@dataclass(frozen=True)
class HostWire:
    """What one emulated host's NIC sent over the whole job (`netem.payload_on_wire` of its veth)."""

    node: int
    bytes: int
    packets: int
    payload_bytes: int


@dataclass(frozen=True)
class WireCounters:
    """What the emulated hosts' NICs carried over the whole job (`asrdist train --nodes`), beside
    the strategy's counted `comm.bytes_sent`: every host's eth0 was created with the job, so its
    counters are the job's traffic (rendezvous, start-up broadcast, validation and the final
    gathering included: more than the training exchanges; after a resume, the last start's only)."""

    payload_bytes: int
    frame_bytes: int
    segments: int
    hosts: list[HostWire]
    what: str = ("bytes the emulated hosts' NICs sent over the whole job (veth tx counters); payload = "
                 "frames less one Ethernet + IPv4 + TCP header per segment")

    @classmethod
    def of(cls, net: netem.EmulatedNetwork) -> "WireCounters":
        zero = dict.fromkeys(COUNTER_NAMES, 0)
        hosts = [HostWire(i, **payload_on_wire(zero, net.link_counters(i))) for i in range(net.num_nodes)]
        return cls(sum(h.payload_bytes for h in hosts), sum(h.bytes for h in hosts), sum(h.packets for h in hosts),
                   hosts)

    def to_json(self) -> dict:
        return asdict(self)

    @classmethod
    def from_json(cls, data: dict) -> "WireCounters":
        return cls(**{**data, "hosts": [HostWire(**h) for h in data["hosts"]]})


@dataclass(frozen=True)
class JobCounters:
    """What a job's hosts counted, for `asrdist train` to record in summary.json."""

    wire: WireCounters | None
    """On an emulated network; None elsewhere."""
    hosts: list[HostCpuUsage]
    """Each dedicated host's CPU counters (`cpu` given); [] otherwise."""
    outside_hosts: dict
    """The machine's CPU outside the dedicated hosts (`HostCpuShares.outside`); {} without them."""


def _agent_options(max_restarts: int) -> list[str]:
    return ["--max-restarts", str(max_restarts), "--monitor-interval", "0.5"]


def run_learners(fn_module: str, fn_name: str, world_size: int, nodes: int | None = None,
                 network: str = "loopback", args: dict[str, Any] | None = None,
                 timeout: float = DEFAULT_TIMEOUT_SECONDS, delay: str = "0.1ms",
                 cpus_per_host: float | None = None) -> list[dict[str, Any]]:
    """Run learner function `fn_module.fn_name(env, args)` in `world_size` learners through
    `launch_learners`; their results (JSON-able dicts) by rank.

    nodes: hosts, `world_size / nodes` learners each (default one per learner); network:
    'loopback' (every host on this machine's loopback) or a link rate such as '1gbit' (an
    EmulatedNetwork with `delay` per link; needs root, see netem.available()). One host is this
    machine: no network at all. A learner's `env.network` is the label ('loopback' or
    'emulated-RATE-DELAY'), `env.timeout_s` the job's `timeout`. Raises one TrainingError line
    naming the learner whose failure came first, or the unfinished ranks of a job that outlived
    `timeout`. `cpus_per_host`: each host in a cgroup of its own with that many cores; each
    result then carries its host's CPU counters as `host_cpu`."""
    nodes = check_layout(world_size, nodes, network)
    cpu = None if cpus_per_host is None else HostCpuPlan.make(cpus_per_host, nodes, world_size)
    if nodes == 1:
        network = "loopback"
    if network != "loopback":
        parse_delay(delay)  # bad input is refused before the probe builds a namespace
        ok, reason = netem.available()
        if not ok:
            raise ConfigError(f"network '{network}': {reason} (use network 'loopback')")
    label = "loopback" if network == "loopback" else netem.network_label(network, delay)
    with tempfile.TemporaryDirectory(prefix="asrdist-learners-") as tmp:
        out = Path(tmp)
        cli = ["--function", f"{fn_module}:{fn_name}", "--args", json.dumps(args or {}), "--result-dir", tmp,
               "--label", label, "--timeout", repr(float(timeout))]
        try:
            counters = launch_learners(LEARNER_MODULE, cli, world_size, out, timeout, nodes, network, delay=delay,
                                       cpu=cpu)
        except JobTimedOut:
            unfinished = [str(r) for r in range(world_size) if not (out / f"result{r}.json").is_file()]
            raise JobTimedOut(f"learners did not finish within {timeout:g} s (network {label}; unfinished ranks: "
                              f"{', '.join(unfinished) or 'none'}); every learner was stopped") from None
        results = []
        for rank in range(world_size):
            path = out / f"result{rank}.json"
            if not path.is_file():
                raise TrainingError(f"learner rank {rank} exited without writing its result")
            results.append(json.loads(path.read_text()))
            if counters.hosts:
                results[-1]["host_cpu"] = counters.hosts[rank // (world_size // nodes)].as_dict()
    return results


def check_layout(world_size: int, nodes: int | None, network: str) -> int:
    """`nodes` (None: one per learner) once `world_size` learners split evenly into them and
    `network` is 'loopback' or a rate."""
    if world_size < 1:
        raise ConfigError(f"learners: world_size must be >= 1, got {world_size}")
    if network != "loopback":
        parse_rate(network)
    nodes = world_size if nodes is None else nodes
    if not 1 <= nodes <= world_size or world_size % nodes:
        raise ConfigError(f"learners: {world_size} learners cannot be split evenly into {nodes} nodes")
    return nodes


def _launch_survivable(module: str, args: list[str], learners: int, report_dir: Path, timeout: float | None,
                       env: dict, preexec: Callable[[], None]) -> None:
    """One process per learner, the job's store hosted here (see the module docstring)."""

    store = dist.TCPStore("127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=60))
    env = dict(env, TORCHELASTIC_USE_AGENT_STORE="True", TORCHELASTIC_MAX_RESTARTS="0")
    cmd = [sys.executable, "-m", module, *args]

    def learner(rank: int) -> Callable[[], subprocess.Popen]:
        job = JobEnv(rank, learners, rank, learners, survive_lost=True, master_addr="127.0.0.1", master_port=store.port)
        return lambda: _popen(cmd, dict(env, ROLE_RANK=str(rank), **job.as_environ()), preexec)

    run_agents([learner(r) for r in range(learners)], report_dir, timeout,
               survival=Survival(dist.PrefixStore(STORE_PREFIX, store), Path(report_dir)))


def _popen(cmd: list[str], env: dict, preexec: Callable[[], None] = die_with_parent) -> subprocess.Popen:
    return subprocess.Popen(cmd, env=env, stdout=None, stderr=subprocess.PIPE, text=True, bufsize=1,
                            start_new_session=True, preexec_fn=preexec)


def _free_loopback_port() -> int:
    """A port free on 127.0.0.1 now, from below the ephemeral range: once the check's socket
    closes, no connection's local port can take it before rank 0's agent binds it (an OS-assigned
    port could be; CI once failed with EADDRINUSE that way)."""
    for _ in range(100):
        port = _namespace_port()
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    low, high = _NAMESPACE_PORT_RANGE
    raise TrainingError(f"learners: no free port on 127.0.0.1 in {low}-{high} after 100 tries")


def _namespace_port() -> int:
    # SystemRandom: never consume (or depend on) the caller's seeded global random stream
    low, high = _NAMESPACE_PORT_RANGE
    return secrets.SystemRandom().randint(low, high)
