"""Emulated cluster network (namespaces, veth, bridge, tc) and the learner launcher."""
from __future__ import annotations

import json
import os
import re
import select
import signal
import socket
import subprocess
import sys
import time
from dataclasses import replace
from pathlib import Path

import pytest

from asrdist.cluster import netem
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.netem import EmulatedNetwork, parse_delay, parse_rate
from asrdist.cluster.process_group import NETWORK_ENV, THREADS_ENV, JobEnv
from asrdist.cluster.supervisor import JobTimedOut
from asrdist.errors import ConfigError, TrainingError

needs_netns = pytest.mark.usefixtures("emulated_network_available")
pytestmark = pytest.mark.filterwarnings("ignore:emulated network. kernel has no netem")
MODULE = "test_netem"  # the workers import this file's learner functions through PYTHONPATH
HANG_S = 120  # generous: these limits only catch hangs, never pace a test


@pytest.fixture
def workers_import_tests(monkeypatch):
    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(filter(None, [here, os.environ.get("PYTHONPATH")])))


def _our_namespaces() -> list[str]:
    return [ns for ns in netem.list_namespaces() if ns.startswith(f"{netem.PREFIX}-{os.getpid()}-")]


def _existing_namespaces() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def _ns_json(ns: str | None, *argv: str) -> list[dict]:
    cmd = argv[0:1] + (("-n", ns) if ns else ()) + ("-j",) + argv[1:]
    return json.loads(subprocess.run(cmd, capture_output=True, text=True, check=True).stdout)


# ---------------------------------------------------------------- learner functions (run in workers)
def _join(spec: JobEnv) -> None:
    from datetime import timedelta

    from asrdist.cluster.process_group import start_learner

    start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")


def learner_allreduce(spec: JobEnv, args: dict) -> dict:
    """Allreduce rank-dependent values; rank 0 also reads its link's qdisc counters around it."""
    import torch
    import torch.distributed as dist

    def uplink() -> dict:
        if spec.network == "loopback":
            return {}
        out = subprocess.run(["tc", "-s", "-j", "qdisc", "show", "dev", os.environ["GLOO_SOCKET_IFNAME"]],
                             capture_output=True, text=True, check=True).stdout
        return next(q for q in json.loads(out) if q.get("root"))

    _join(spec)
    x = torch.arange(args["floats"], dtype=torch.float32) * (spec.rank + 1)
    before = uplink()
    dist.all_reduce(x)
    after = uplink()
    parent = Path(f"/proc/{os.getppid()}/cmdline").read_bytes().split(b"\0")
    return {"rank": spec.rank, "node": spec.node_rank, "local_rank": spec.local_rank,
            "master": spec.master_addr, "threads": torch.get_num_threads(), "sum_head": x[:5].tolist(),
            "checksum": float(x.double().sum()), "qdisc_before": before, "qdisc_after": after,
            "network": spec.network, "timeout_s": spec.timeout_s, "gloo_ifname": os.environ.get("GLOO_SOCKET_IFNAME"),
            "run_id": os.environ.get("TORCHELASTIC_RUN_ID"), "agent": [w.decode() for w in parent if w]}


def learner_fails(spec: JobEnv, args: dict) -> dict:
    if spec.rank == args["bad_rank"]:
        raise ValueError(f"injected failure on rank {spec.rank}")
    _join(spec)  # the others wait here for the dead one
    return {}


def learner_hangs(spec: JobEnv, args: dict) -> dict:
    if spec.rank == args["bad_rank"]:
        time.sleep(3600)
    return {"rank": spec.rank}


# ---------------------------------------------------------------------------------- no root needed
def test_parse_rate_and_delay():
    assert parse_rate("1gbit") == 10**9 and parse_rate("10gbit") == 10**10
    assert parse_rate("2.5mbit") == 2_500_000
    assert parse_delay("0.1ms") == pytest.approx(0.1) and parse_delay("250us") == pytest.approx(0.25)
    for bad in ("1gb", "fast", "0gbit", "-1mbit"):
        with pytest.raises(ConfigError, match="network rate"):
            parse_rate(bad)
    with pytest.raises(ConfigError, match="network delay"):
        parse_delay("1 hour")


def test_bad_layouts_and_subnets():
    with pytest.raises(ConfigError, match="split evenly"):
        run_learners(MODULE, "learner_hangs", 3, 2, "loopback", {}, 5)
    with pytest.raises(ConfigError, match="network rate"):
        run_learners(MODULE, "learner_hangs", 2, 2, "1gigabit", {}, 5)
    with pytest.raises(ConfigError, match="private"):
        EmulatedNetwork(2, subnet="8.8.8.0/24")
    with pytest.raises(ConfigError, match="too small"):
        EmulatedNetwork(3, subnet="10.213.0.0/30")


def test_the_allreduce_timing_refuses_bad_input_in_one_line_before_any_learner(capsys):
    from asrdist.cluster.netem_launch import main

    for argv, what in [(["--learners", "3", "--nodes", "2", "--network", "loopback"], "cannot be split evenly"),
                       (["--learners", "2", "--network", "fast"], "network rate 'fast'"),
                       (["--learners", "2", "--network", "1gbit", "--delay", "1 hour"], "network delay '1 hour'")]:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert err.startswith("asrdist: error: ") and what in err and err.count("\n") == 1, err


def test_one_environment_type_from_the_launcher_to_the_learner():
    """What torchrun sets is what `JobEnv.from_environ` reads, and what asrdist's own launchers
    write (`as_environ`) reads back as the same learner."""
    environ = {"RANK": "3", "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "2", "GROUP_RANK": "1",
               "MASTER_ADDR": "10.0.0.1", "MASTER_PORT": "29500"}
    env = JobEnv.from_environ(environ)
    assert (env.rank, env.world_size, env.local_rank, env.local_world_size) == (3, 4, 1, 2)
    assert (env.node_rank, env.num_nodes, env.master_addr, env.master_port) == (1, 2, "10.0.0.1", 29500)
    assert env.network is None and env.num_threads >= 1
    assert env.restart == 0 and not env.survive_lost
    for written in (env, JobEnv(2, 6, 0, 3, restart=2, survive_lost=True, master_addr="127.0.0.1", master_port=1234,
                                network="loopback", num_threads=3)):
        back = JobEnv.from_environ({**written.as_environ(), NETWORK_ENV: str(written.network),
                                    THREADS_ENV: str(written.num_threads)})
        assert replace(back, network=written.network) == written
    assert JobEnv(5, 8, 1, 2).node_rank == 2 and JobEnv(5, 8, 1, 2).num_nodes == 4  # torchrun's layout
    for missing in ("RANK", "WORLD_SIZE"):
        with pytest.raises(ConfigError, match=f"'{missing}' not set"):
            JobEnv.from_environ({k: v for k, v in environ.items() if k != missing})


def test_resolve_network_falls_back_to_loopback(monkeypatch):
    assert netem.resolve_network("loopback") == ("loopback", "loopback")
    monkeypatch.setattr(netem, "available", lambda: (False, "needs root (running as uid 1000)"))
    with pytest.warns(RuntimeWarning, match="needs root.*falling back to loopback"):
        assert netem.resolve_network("1gbit") == ("loopback", "loopback")
    with pytest.raises(ConfigError, match="network rate"):
        netem.resolve_network("fast")


@needs_netns
@pytest.mark.slow
def test_resolve_network_labels_the_emulation():
    network, label = netem.resolve_network("10gbit", "0.1ms")
    assert network == "10gbit"
    assert label == ("emulated-10gbit-0.1ms" if netem.netem_supported() else "emulated-10gbit-nodelay")


@pytest.mark.slow
@pytest.mark.parametrize("nodes", [1, None])
def test_loopback_learners_are_started_by_torch_distributed_run(workers_import_tests, nodes):
    """run_learners is launch_learners underneath: every learner is a child of a
    torch.distributed.run agent (one for the machine, or one per host: `nodes` None is one host per
    learner, here on loopback) and reads torchrun's environment, laid out as torchrun lays hosts."""
    res = run_learners(MODULE, "learner_allreduce", 2, nodes, "loopback", {"floats": 1000}, 60)
    expected = [3.0 * i for i in range(5)]
    assert [r["rank"] for r in res] == [0, 1]
    assert all(r["sum_head"] == expected and r["master"] == res[0]["master"] for r in res)
    assert all(r["threads"] == max(1, len(os.sched_getaffinity(0)) // 2) for r in res)
    assert all(r["network"] == "loopback" and r["timeout_s"] == 60 and r["gloo_ifname"] == "lo" for r in res)
    for r in res:
        assert r["run_id"], r  # set by torch's elastic agent, by nothing else
        agent = r["agent"]
        assert agent[1:3] == ["-m", "asrdist.cluster.agent"], agent  # torch.distributed.run.main
        assert agent[agent.index("-m", 3) + 1] == "asrdist.cluster.netem_launch", agent
    if nodes == 1:
        assert [(r["node"], r["local_rank"]) for r in res] == [(0, 0), (0, 1)]
        assert "--standalone" in res[0]["agent"]
    else:
        assert [(r["node"], r["local_rank"]) for r in res] == [(0, 0), (1, 0)]
        assert res[0]["master"] == "127.0.0.1"  # host 0's agent, on this machine's loopback
        assert [r["agent"][r["agent"].index("--node-rank") + 1] for r in res] == ["0", "1"]


@pytest.mark.slow
def test_a_learner_functions_error_is_one_line_naming_its_rank(workers_import_tests):
    with pytest.raises(TrainingError) as err:
        run_learners(MODULE, "learner_fails", 2, 1, "loopback", {"bad_rank": 1}, HANG_S)
    assert str(err.value) == "learner rank 1: ValueError: injected failure on rank 1"
    assert not isinstance(err.value, JobTimedOut)


@pytest.mark.slow
def test_hanging_learner_is_killed_and_named(workers_import_tests):
    t0 = time.monotonic()
    with pytest.raises(JobTimedOut, match=r"^learners did not finish within 6 s \(network loopback") as err:
        run_learners(MODULE, "learner_hangs", 2, None, "loopback", {"bad_rank": 1}, 6)
    # rank 0 normally finished; on a loaded machine it may still be starting, so both are named
    assert re.search(r"unfinished ranks: (0, )?1\)", str(err.value)), err.value
    assert time.monotonic() - t0 < HANG_S  # only guards against waiting for the 1 h sleep


# ----------------------------------------------- the same bookkeeping in-process, `ip` and `tc` recorded
class _FakeIp:
    """Stands in for netem's `_run`: records every `ip` / `tc` command and keeps the set of
    namespaces the commands would leave, so the bookkeeping is checked without root or namespaces
    (the tests marked slow below build the real thing)."""

    def __init__(self, existing=()):
        self.commands: list[list[str]] = []
        self.namespaces: set[str] = set(existing)

    def __call__(self, argv, check=True):
        argv = list(argv)
        self.commands.append(argv)
        out = ""
        if argv[:3] == ["ip", "netns", "add"]:
            assert argv[3] not in self.namespaces, argv
            self.namespaces.add(argv[3])
        elif argv[:3] == ["ip", "netns", "delete"]:
            self.namespaces.discard(argv[3])
        elif argv[:3] == ["ip", "netns", "list"]:
            out = "".join(f"{ns} (id: {i})\n" for i, ns in enumerate(sorted(self.namespaces)))
        return subprocess.CompletedProcess(argv, 0, out, "")

    def outside_namespaces(self) -> list[list[str]]:
        """Commands that would change the root namespace: every other one names its namespace."""
        own = ("add", "delete", "list", "pids")
        return [c for c in self.commands if not (c[:2] == ["ip", "netns"] and c[2] in own) and "-n" not in c]


@pytest.fixture
def fake_ip(monkeypatch):
    fake = _FakeIp()
    monkeypatch.setattr(netem, "_run", fake)
    monkeypatch.setattr(netem, "available", lambda: (True, ""))
    monkeypatch.setattr(netem, "netem_supported", lambda: True)
    return fake


def test_network_commands_stay_in_its_own_namespaces_and_all_are_deleted(fake_ip):
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    with EmulatedNetwork(2, rate="1gbit", delay="0.1ms") as net:
        names = net.namespaces()
        assert len(set(names)) == 3 and set(names) == fake_ip.namespaces
        assert all(n.startswith(f"{netem.PREFIX}-{os.getpid()}-") for n in names)
        assert net.node_address(0) != net.node_address(1) and net.delay_applied
    assert not fake_ip.namespaces and not fake_ip.outside_namespaces()
    shaped = [c for c in fake_ip.commands if c[0] == "tc" and "tbf" in c]
    # both directions of both links: the node's eth0 and the switch's port
    assert sorted((c[2], c[c.index("dev") + 1]) for c in shaped) == sorted(
        [(names[1], "eth0"), (names[2], "eth0"), (names[0], "p0"), (names[0], "p1")])
    assert all(c[c.index("rate") + 1] == f"{10**9}bit" for c in shaped)
    assert sum("netem" in c for c in fake_ip.commands) == 4
    deletes = [c[3] for c in fake_ip.commands if c[:3] == ["ip", "netns", "delete"]]
    assert deletes[-1] == names[0]  # the switch last: the nodes' veth ends go with the nodes
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


def test_network_is_deleted_when_the_body_or_the_build_raises(fake_ip, monkeypatch):
    with pytest.raises(RuntimeError, match="body failed"):
        with EmulatedNetwork(2):
            assert len(fake_ip.namespaces) == 3
            raise RuntimeError("body failed")
    assert not fake_ip.namespaces
    record = fake_ip.__call__

    def fail_on_the_second_link(argv, check=True):
        if argv[:2] == ["tc", "-n"] and argv[2].endswith("-n1"):
            raise TrainingError("netem: `tc` failed: injected")
        return record(argv, check)

    monkeypatch.setattr(netem, "_run", fail_on_the_second_link)
    with pytest.raises(TrainingError, match="injected"):
        EmulatedNetwork(2).open()
    assert not fake_ip.namespaces


def test_cleanup_stale_removes_only_namespaces_of_dead_creators(monkeypatch):
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    stale = f"{netem.PREFIX}-{dead.pid}-abcdef-n0"
    mine = f"{netem.PREFIX}-{os.getpid()}-abcdef-sw"
    alive = f"{netem.PREFIX}-{os.getppid()}-abcdef-n1"
    fake = _FakeIp([stale, mine, alive, "someone-elses"])
    monkeypatch.setattr(netem, "_run", fake)
    assert netem.cleanup_stale() == [stale]
    assert fake.namespaces == {mine, alive, "someone-elses"}


def test_resolve_network_labels_the_emulation_by_what_the_kernel_applies(monkeypatch):
    monkeypatch.setattr(netem, "available", lambda: (True, ""))
    for supported, label in [(True, "emulated-10gbit-0.1ms"), (False, "emulated-10gbit-nodelay")]:
        monkeypatch.setattr(netem, "netem_supported", lambda supported=supported: supported)
        assert netem.resolve_network("10gbit", "0.1ms") == ("10gbit", label)
    assert netem.resolve_network("10gbit", "0ms") == ("10gbit", "emulated-10gbit")


# ------------------------------------------------------------------------------------ needs root
@needs_netns
@pytest.mark.slow
def test_network_built_and_fully_removed():
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    root_links = {link["ifname"] for link in _ns_json(None, "ip", "link", "show")}
    with EmulatedNetwork(2, rate="1gbit", delay="0.1ms") as net:
        names = net.namespaces()
        assert len(set(names)) == 3 and set(names) <= _existing_namespaces()
        assert all(str(os.getpid()) in n for n in names)
        ports = {link["ifname"]: link for link in _ns_json(net.switch_namespace, "ip", "link", "show")}
        assert ports["p0"]["master"] == "br0" and ports["p1"]["master"] == "br0"
        for i in range(2):
            links = {link["ifname"]: link for link in _ns_json(net.namespace(i), "ip", "addr", "show")}
            assert set(links) == {"lo", "eth0"}
            assert "UP" in links["lo"]["flags"] and "UP" in links["eth0"]["flags"]
            addrs = [a["local"] for a in links["eth0"]["addr_info"] if a["family"] == "inet"]
            assert addrs == [net.node_address(i)]
            stats = net.qdisc_stats(i)
            assert stats["uplink"]["kind"] == stats["downlink"]["kind"] == "tbf"
            assert stats["uplink"]["rate_bps"] == stats["downlink"]["rate_bps"] == 10**9
        assert net.node_address(0) != net.node_address(1)
        # the root namespace is untouched
        assert {link["ifname"] for link in _ns_json(None, "ip", "link", "show")} == root_links
    assert not set(names) & _existing_namespaces()
    assert {link["ifname"] for link in _ns_json(None, "ip", "link", "show")} == root_links
    assert (signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)) == handlers


@needs_netns
@pytest.mark.slow
def test_network_removed_when_body_raises():
    with pytest.raises(RuntimeError, match="body failed"):
        with EmulatedNetwork(2) as net:
            names = net.namespaces()
            sleeper = net.popen(0, [sys.executable, "-c", "import time; time.sleep(600)"])
            raise RuntimeError("body failed")
    assert sleeper.poll() is not None
    assert not set(names) & _existing_namespaces()


_SERVER = """
import socket, sys
s = socket.socket(); s.bind((sys.argv[1], int(sys.argv[2]))); s.listen(); print("ready", flush=True)
c, _ = s.accept(); c.sendall(c.recv(100)[::-1]); c.close()
"""
_CLIENT = """
import socket, sys
results = {}
for host, port in zip(sys.argv[1::2], sys.argv[2::2]):
    try:
        with socket.create_connection((host, int(port)), timeout=2) as s:
            s.sendall(b"hello"); results[host] = s.recv(100).decode()
    except OSError as e:
        results[host] = type(e).__name__
print(__import__("json").dumps(results))
"""


@needs_netns
@pytest.mark.slow
def test_nodes_reach_each_other_but_not_the_host():
    host_addrs = [a["local"] for link in _ns_json(None, "ip", "addr", "show")
                  for a in link.get("addr_info", []) if a["family"] == "inet"]
    host_listener = socket.socket()
    host_listener.bind(("0.0.0.0", 0))
    host_listener.listen()
    host_port = host_listener.getsockname()[1]
    try:
        # sanity: the host listener is reachable from the host itself
        socket.create_connection(("127.0.0.1", host_port), timeout=2).close()
        with EmulatedNetwork(2) as net:
            server = net.popen(1, [sys.executable, "-c", _SERVER, net.node_address(1), "23456"],
                               stdout=subprocess.PIPE, text=True)
            assert _first_line(server).strip() == "ready"
            targets = [net.node_address(1), "23456"]
            for addr in host_addrs:
                targets += [addr, str(host_port)]
            client = net.popen(0, [sys.executable, "-c", _CLIENT, *targets], stdout=subprocess.PIPE,
                               text=True)
            out, _ = client.communicate(timeout=HANG_S)
            results = json.loads(out)
            peer = net.node_address(1)
    finally:
        host_listener.close()
    assert results.pop(peer) == "olleh"
    # 127.0.0.1 is the namespace's own loopback (nobody listens); other host addresses are unroutable
    assert set(results) == set(host_addrs) and "127.0.0.1" in results
    for addr, outcome in results.items():
        assert outcome == ("ConnectionRefusedError" if addr.startswith("127.") else "OSError"), results


@needs_netns
@pytest.mark.slow
def test_gloo_allreduce_across_two_emulated_nodes_passes_the_shaped_links(workers_import_tests):
    floats = 2_000_000  # 8 MB
    res = run_learners(MODULE, "learner_allreduce", 2, 2, "1gbit", {"floats": floats}, 90)
    assert [(r["rank"], r["node"], r["local_rank"]) for r in res] == [(0, 0, 0), (1, 1, 0)]
    assert res[0]["master"].startswith("10.213.0.")
    expected_sum = 3.0 * floats * (floats - 1) / 2
    assert all(r["sum_head"] == [3.0 * i for i in range(5)] for r in res)
    assert all(r["checksum"] == pytest.approx(expected_sum, rel=1e-9) for r in res)
    before, after = res[0]["qdisc_before"], res[0]["qdisc_after"]
    assert after["kind"] == "tbf" and after["options"]["rate"] * 8 == 10**9
    # Any allreduce of S bytes over 2 learners makes each send at least S/2 through its link.
    assert after["bytes"] - before["bytes"] >= floats * 4 // 2
    assert not _our_namespaces()


@needs_netns
@pytest.mark.slow
def test_learners_grouped_into_nodes(workers_import_tests):
    res = run_learners(MODULE, "learner_allreduce", 4, 2, "10gbit", {"floats": 100}, 90)
    layout = [(r["rank"], r["node"], r["local_rank"]) for r in res]
    assert layout == [(0, 0, 0), (1, 0, 1), (2, 1, 0), (3, 1, 1)]
    assert all(r["sum_head"] == [10.0 * i for i in range(5)] for r in res)
    assert not _our_namespaces()


@needs_netns
@pytest.mark.slow
def test_torchrun_two_nodes_on_the_emulated_network(tmp_path, workers_import_tests):
    """The cluster recipe itself: one torchrun per emulated host, static rendezvous on node 0."""
    with EmulatedNetwork(2, rate="1gbit") as net:
        env = dict(os.environ, GLOO_SOCKET_IFNAME=net.interface, OMP_NUM_THREADS="1")
        agents = [net.popen(node, [sys.executable, "-m", "torch.distributed.run", "--nnodes", "2",
                                   "--nproc-per-node", "1", "--node-rank", str(node),
                                   "--master-addr", net.node_address(0), "--master-port", "29500",
                                   "-m", "asrdist.cluster.netem_launch",
                                   "--function", f"{MODULE}:learner_allreduce",
                                   "--args", json.dumps({"floats": 1000}), "--result-dir", str(tmp_path),
                                   "--label", net.label, "--timeout", "60"],
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                  for node in range(2)]
        logs = [agent.communicate(timeout=120)[0] for agent in agents]
        assert [a.returncode for a in agents] == [0, 0], logs[0][-2000:] + logs[1][-2000:]
        master = net.node_address(0)
    res = [json.loads((tmp_path / f"result{r}.json").read_text()) for r in range(2)]
    assert [(r["rank"], r["node"], r["master"]) for r in res] == [(0, 0, master), (1, 1, master)]
    assert all(r["sum_head"] == [3.0 * i for i in range(5)] for r in res)
    assert res[0]["qdisc_after"]["bytes"] > res[0]["qdisc_before"]["bytes"]


@needs_netns
@pytest.mark.slow
def test_failing_learner_is_named_and_everything_removed(workers_import_tests):
    with pytest.raises(TrainingError, match=r"^learner rank 1: ValueError: injected failure on rank 1$"):
        run_learners(MODULE, "learner_fails", 2, 2, "1gbit", {"bad_rank": 1}, 60)
    assert not _our_namespaces()


# SIGINT as at an interactive prompt: a test runner started in the background (`make test &`,
# nohup, many CI shells) passes SIGINT on *ignored*, and EmulatedNetwork rightly leaves an ignored
# signal ignored, so without this line the child would sleep through the test's SIGINT.
_SIGNALLED = """
import json, signal, sys, time
signal.signal(signal.SIGINT, signal.default_int_handler)
from asrdist.cluster.netem import EmulatedNetwork
net = EmulatedNetwork(1).open()
child = net.popen(0, [sys.executable, "-c", "import time; time.sleep(600)"])
print(json.dumps({"namespaces": net.namespaces(), "child": child.pid}), flush=True)
time.sleep(600)
"""


def _first_line(proc: subprocess.Popen, timeout_s: float = HANG_S) -> str:
    """The first line `proc` prints (the sign that it is ready), or a failure naming why not."""
    ready, _, _ = select.select([proc.stdout], [], [], timeout_s)
    assert ready, f"no line from the child within {timeout_s} s"
    line = proc.stdout.readline()
    assert line, f"the child ended without its line: {proc.communicate(timeout=timeout_s)[1]}"
    return line


def _stop_and_clean(proc: subprocess.Popen) -> None:
    """After a failure: kill the child and remove what a killed creator leaves behind."""
    if proc.poll() is None:
        proc.kill()
        proc.wait(timeout=HANG_S)
        netem.cleanup_stale()


@needs_netns
@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_signal_removes_everything(sig):
    proc = subprocess.Popen([sys.executable, "-c", _SIGNALLED], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        info = json.loads(_first_line(proc))
        assert set(info["namespaces"]) <= _existing_namespaces()
        proc.send_signal(sig)
        _, err = proc.communicate(timeout=HANG_S)
    finally:
        _stop_and_clean(proc)
    code = proc.returncode
    assert code != 0
    if sig == signal.SIGTERM:
        assert code == -signal.SIGTERM
    else:
        assert "KeyboardInterrupt" in err
    assert not set(info["namespaces"]) & _existing_namespaces()
    assert not _pid_alive(info["child"])


@needs_netns
@pytest.mark.slow
def test_cleanup_stale_removes_only_dead_creators():
    dead = subprocess.Popen(["true"])
    dead.wait()
    stale = f"{netem.PREFIX}-{dead.pid}-abcdef-n0"
    subprocess.run(["ip", "netns", "add", stale], check=True)
    try:
        with EmulatedNetwork(1) as net:
            removed = netem.cleanup_stale()
            assert stale in removed
            assert set(net.namespaces()) <= _existing_namespaces()
            assert not set(net.namespaces()) & set(removed)
    finally:
        subprocess.run(["ip", "netns", "delete", stale], capture_output=True)
    assert stale not in _existing_namespaces()


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True
