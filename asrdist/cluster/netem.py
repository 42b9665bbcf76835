"""An emulated cluster network on one machine: Linux network namespaces, veth links, a bridge, tc.

`EmulatedNetwork(n)` builds n "hosts", each a network namespace with one NIC (`eth0`) linked to a
switch namespace, every link rate-capped (`tbf`) and delayed (`netem`) in both directions; nothing
is changed in the root namespace, everything is removed on exit, exceptions and signals, and
`cleanup_stale()` removes dead creators' leftovers. The topology and why:
docs/clusters.md#how-the-emulated-network-is-built-clusternetempy."""
from __future__ import annotations

import atexit
import ctypes
import functools
import ipaddress
import json
import os
import re
import secrets
import shutil
import signal
import subprocess
import warnings
from typing import Any, Callable, Mapping, Sequence

from asrdist.cluster import reaper
from asrdist.errors import ConfigError, Stopped, TrainingError

PREFIX = "asrdist"
NODE_INTERFACE = "eth0"
DEFAULT_SUBNET = "10.213.0.0/24"
_NAME_RE = re.compile(rf"^{PREFIX}-(\d+)-([0-9a-f]+)-(sw|n\d+|probe)$")
_RATE_RE = re.compile(r"^(\d+(?:\.\d+)?)(bit|kbit|mbit|gbit|tbit)$")
_DELAY_RE = re.compile(r"^(\d+(?:\.\d+)?)(us|ms|s)$")
_RATE_UNITS = {"bit": 1, "kbit": 10**3, "mbit": 10**6, "gbit": 10**9, "tbit": 10**12}
_DELAY_UNITS = {"us": 1e-3, "ms": 1.0, "s": 1e3}
_CMD_TIMEOUT_S = 30.0


def parse_rate(rate: str) -> int:
    """'1gbit' -> 1_000_000_000 bits/s (tc's decimal units)."""
    m = _RATE_RE.match(rate.strip().lower())
    if not m or float(m.group(1)) <= 0:
        raise ConfigError(f"network rate '{rate}': expected a positive rate like 1gbit, 10gbit, 100mbit")
    return int(float(m.group(1)) * _RATE_UNITS[m.group(2)])


def parse_delay(delay: str) -> float:
    """'0.1ms' -> 0.1 (milliseconds)."""
    m = _DELAY_RE.match(delay.strip().lower())
    if not m:
        raise ConfigError(f"network delay '{delay}': expected a delay like 0.1ms, 100us, 0ms")
    return float(m.group(1)) * _DELAY_UNITS[m.group(2)]


def _run(argv: Sequence[str], check: bool = True) -> subprocess.CompletedProcess:
    try:
        done = subprocess.run(list(argv), capture_output=True, text=True, timeout=_CMD_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise TrainingError(f"netem: `{' '.join(argv)}` failed: {e}") from e
    if check and done.returncode != 0:
        err = done.stderr.strip().splitlines()
        reason = err[-1] if err else f"exit code {done.returncode}"
        raise TrainingError(f"netem: `{' '.join(argv)}` failed: {reason}")
    return done


def die_with_parent() -> None:
    """preexec_fn: the child gets SIGKILL when the launching process dies, even by SIGKILL."""
    libc = ctypes.CDLL(None, use_errno=True)
    libc.prctl(1, signal.SIGKILL)  # PR_SET_PDEATHSIG


def list_namespaces() -> list[str]:
    """Names of this module's namespaces (any creator)."""
    done = _run(["ip", "netns", "list"], check=False)
    names = [line.split()[0] for line in done.stdout.splitlines() if line.strip()]
    return [n for n in names if _NAME_RE.match(n)]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _ip(argv: list[str]) -> str:
    return _run(argv, check=False).stdout


def _delete_namespace(ns: str) -> None:
    reaper.remove_namespace(ns, _ip)
    reaper.release("ns", ns)


def cleanup_stale() -> list[str]:
    """Remove namespaces (and their processes) left by creators that are no longer alive."""
    removed = []
    for ns in list_namespaces():
        pid = int(_NAME_RE.match(ns).group(1))
        if pid != os.getpid() and not _pid_alive(pid):
            reaper.remove_namespace(ns, _ip)
            removed.append(ns)
    return removed


@functools.lru_cache(maxsize=1)
def _probe() -> tuple[bool, str, bool]:
    """(usable, reason if not, netem qdisc available) — tried once in a throwaway namespace."""
    if os.geteuid() != 0:
        return False, f"emulated network needs root (running as uid {os.geteuid()})", False
    for tool in ("ip", "tc"):
        if shutil.which(tool) is None:
            return False, f"emulated network needs iproute2: `{tool}` not found", False
    ns = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}-probe"
    try:
        _run(["ip", "netns", "add", ns])
        try:
            _run(["ip", "-n", ns, "link", "add", "pa", "type", "veth", "peer", "name", "pb"])
            _run(["ip", "-n", ns, "link", "add", "br0", "type", "bridge"])
            _run(["tc", "-n", ns, "qdisc", "add", "dev", "pa", "root", "handle", "1:",
                  "tbf", "rate", "1gbit", "burst", "128kb", "latency", "50ms"])
            netem = _run(["tc", "-n", ns, "qdisc", "add", "dev", "pa", "parent", "1:1",
                          "netem", "delay", "0.1ms"], check=False).returncode == 0
        finally:
            reaper.remove_namespace(ns, _ip)
    except Stopped:
        raise
    except TrainingError as e:
        return False, f"cannot build an emulated network: {e}", False
    return True, "", netem


def available() -> tuple[bool, str]:
    """(True, '') if root, iproute2 and tc can build namespaces with shaped veth links here."""
    ok, reason, _ = _probe()
    return ok, reason


def netem_supported() -> bool:
    """Whether the kernel has the netem qdisc (delay emulation); rate caps need only tbf."""
    return _probe()[2]


def network_label(network: str, delay: str = "0.1ms") -> str:
    """What a benchmark records as `network`: 'loopback', 'emulated-1gbit-0.1ms', or
    'emulated-1gbit-nodelay' when the kernel cannot add delay (no netem)."""
    if network == "loopback":
        return "loopback"
    parse_rate(network)
    return _label(network, delay, parse_delay(delay) > 0, netem_supported())


def _label(rate: str, delay: str, want_delay: bool, delay_applied: bool) -> str:
    if not want_delay:
        return f"emulated-{rate}"
    return f"emulated-{rate}-{delay}" if delay_applied else f"emulated-{rate}-nodelay"


def resolve_network(requested: str, delay: str = "0.1ms") -> tuple[str, str]:
    """(network to use, label to record): 'loopback' with a warning when emulation is unavailable."""
    if requested == "loopback":
        return "loopback", "loopback"
    parse_rate(requested)
    ok, reason = available()
    if not ok:
        warnings.warn(f"network '{requested}': {reason}; falling back to loopback", RuntimeWarning,
                      stacklevel=2)
        return "loopback", "loopback"
    return requested, network_label(requested, delay)


TCP_FRAME_HEADER_BYTES = 14 + 20 + 20
"""Ethernet (14, no FCS: veth counts frames without it) + IPv4 (20) + TCP (20) bytes of every
segment a veth counter sees; TCP timestamps add 12 more (`tcp_header_bytes`)."""
COUNTER_NAMES = ("tx_bytes", "tx_packets", "rx_bytes", "rx_packets")


def interface_counters(interface: str = NODE_INTERFACE) -> dict[str, int]:
    """The kernel's byte and packet counters of `interface` in the calling process' own network
    namespace (inside a learner on an emulated host: its NIC, the host end of its veth link)."""
    base = f"/sys/class/net/{interface}/statistics"
    try:
        return {name: int(open(f"{base}/{name}").read()) for name in COUNTER_NAMES}
    except (OSError, ValueError) as e:
        raise TrainingError(f"netem: cannot read the counters of interface {interface}: {e}") from e


def tcp_header_bytes() -> int:
    """Bytes of headers per TCP segment on an emulated link, in the calling namespace: Ethernet +
    IPv4 + TCP, with the 12 bytes of the timestamp option when the namespace has it on (Linux's
    default). Pure ACKs are segments too: the estimate removes them whole."""
    try:
        timestamps = open("/proc/sys/net/ipv4/tcp_timestamps").read().strip() != "0"
    except OSError:
        timestamps = True
    return TCP_FRAME_HEADER_BYTES + (12 if timestamps else 0)


def payload_on_wire(before: Mapping[str, int], after: Mapping[str, int], direction: str = "tx",
                    header_bytes: int | None = None) -> dict[str, int]:
    """What an interface carried between two `interface_counters` readings: the frames' bytes,
    their count, and the payload estimated as bytes - segments x `tcp_header_bytes()` (every frame
    on an emulated link is a TCP/IPv4 segment of the learners' connections; with segmentation
    offload one counted frame is a super-segment with one header, which the estimate matches)."""
    header = tcp_header_bytes() if header_bytes is None else header_bytes
    frames = after[f"{direction}_bytes"] - before[f"{direction}_bytes"]
    packets = after[f"{direction}_packets"] - before[f"{direction}_packets"]
    return {"bytes": frames, "packets": packets, "payload_bytes": max(0, frames - packets * header)}


class EmulatedNetwork:
    """`num_nodes` namespaces joined by shaped veth links to a bridge in a switch namespace.

    Use as a context manager; `close()` is idempotent and also runs on SIGINT/SIGTERM and atexit.
    """

    def __init__(self, num_nodes: int, rate: str = "1gbit", delay: str = "0.1ms",
                 subnet: str = DEFAULT_SUBNET):
        if num_nodes < 1:
            raise ConfigError(f"emulated network: num_nodes must be >= 1, got {num_nodes}")
        self.num_nodes = num_nodes
        self.rate, self.delay = rate, delay
        self.rate_bps = parse_rate(rate)
        self.delay_ms = parse_delay(delay)
        try:
            net = ipaddress.ip_network(subnet)
        except ValueError as e:
            raise ConfigError(f"emulated network subnet '{subnet}': {e}") from e
        if not net.is_private or net.version != 4:
            raise ConfigError(f"emulated network subnet '{subnet}': must be a private IPv4 subnet")
        if net.num_addresses - 2 < num_nodes:
            raise ConfigError(f"emulated network subnet '{subnet}': too small for {num_nodes} nodes")
        self.subnet = net
        self._addresses = [str(a) for a in list(net.hosts())[:num_nodes]]
        base = f"{PREFIX}-{os.getpid()}-{secrets.token_hex(3)}"
        self.switch_namespace = f"{base}-sw"
        self._namespaces = [f"{base}-n{i}" for i in range(num_nodes)]
        self.delay_applied = False
        self._created: list[str] = []
        self._procs: list[subprocess.Popen] = []
        self._prev_handlers: dict[int, Any] = {}
        self._open = False
        self._closed = False

    # ----------------------------------------------------------------- lifecycle
    def __enter__(self) -> "EmulatedNetwork":
        self.open()
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()

    def open(self) -> "EmulatedNetwork":
        if self._open or self._closed:
            raise TrainingError("emulated network: open() called twice")
        ok, reason = available()
        if not ok:
            raise ConfigError(reason)
        self._open = True
        self._install_cleanup_hooks()
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def _build(self) -> None:
        sw = self.switch_namespace
        self._add_namespace(sw)
        _run(["ip", "-n", sw, "link", "add", "br0", "type", "bridge"])
        _run(["ip", "-n", sw, "link", "set", "br0", "up"])
        want_delay = self.delay_ms > 0
        if want_delay and not netem_supported():
            warnings.warn("emulated network: kernel has no netem qdisc; links are rate-capped "
                          f"but the {self.delay} delay is not applied", RuntimeWarning, stacklevel=4)
        self.delay_applied = want_delay and netem_supported()
        for i, ns in enumerate(self._namespaces):
            self._add_namespace(ns)
            port = f"p{i}"
            # The peer is created directly inside the node namespace: it never exists in the root one.
            _run(["ip", "-n", sw, "link", "add", port, "type", "veth", "peer", "name", NODE_INTERFACE,
                  "netns", ns])
            _run(["ip", "-n", sw, "link", "set", port, "master", "br0"])
            _run(["ip", "-n", sw, "link", "set", port, "up"])
            _run(["ip", "-n", ns, "link", "set", "lo", "up"])
            _run(["ip", "-n", ns, "addr", "add", f"{self._addresses[i]}/{self.subnet.prefixlen}",
                  "dev", NODE_INTERFACE])
            _run(["ip", "-n", ns, "link", "set", NODE_INTERFACE, "up"])
            self._shape(ns, NODE_INTERFACE)
            self._shape(sw, port)

    def _add_namespace(self, ns: str) -> None:
        _run(["ip", "netns", "add", ns])
        self._created.append(ns)
        reaper.watch("ns", ns)  # removed even if this process dies by SIGKILL

    def _shape(self, ns: str, dev: str) -> None:
        # Burst of ~1 ms at line rate (>= 64 KiB): enough for tbf to reach its rate with HZ=250
        # timers, small enough that a long transfer sees the cap.
        burst = max(64 * 1024, self.rate_bps // 8 // 1000)
        _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "root", "handle", "1:", "tbf",
              "rate", f"{self.rate_bps}bit", "burst", str(burst), "latency", "50ms"])
        if self.delay_applied:
            _run(["tc", "-n", ns, "qdisc", "add", "dev", dev, "parent", "1:1", "handle", "10:",
                  "netem", "delay", f"{self.delay_ms}ms", "limit", "100000"])

    def close(self) -> None:
        """Kill processes started here, delete every namespace (their veths and bridge go too)."""
        self._closed = True
        while self._procs:
            stop_process(self._procs.pop())
        # Node namespaces first: their veth ends vanish with them, then the switch with its bridge.
        while self._created:
            _delete_namespace(self._created.pop())
        self._remove_cleanup_hooks()

    # ------------------------------------------------------------ signal handling
    def _install_cleanup_hooks(self) -> None:
        atexit.register(self.close)
        for sig in (signal.SIGINT, signal.SIGTERM):
            try:
                prev = signal.getsignal(sig)
                if prev is signal.SIG_IGN:
                    continue
                signal.signal(sig, self._on_signal)
                self._prev_handlers[sig] = prev
            except ValueError:
                pass  # not the main thread: atexit and the children's death signal still apply

    def _remove_cleanup_hooks(self) -> None:
        atexit.unregister(self.close)
        for sig, prev in list(self._prev_handlers.items()):
            try:
                if signal.getsignal(sig) == self._on_signal:
                    signal.signal(sig, prev)
                    del self._prev_handlers[sig]
            except ValueError:
                pass

    def _on_signal(self, signum: int, frame: Any) -> None:
        prev = self._prev_handlers.get(signum, signal.SIG_DFL)
        self.close()
        if callable(prev):
            prev(signum, frame)  # e.g. default_int_handler raises KeyboardInterrupt
        elif prev == signal.SIG_DFL:
            signal.signal(signum, signal.SIG_DFL)
            os.kill(os.getpid(), signum)

    # ------------------------------------------------------------------- access
    @property
    def label(self) -> str:
        """The `network` value benchmarks record."""
        return _label(self.rate, self.delay, self.delay_ms > 0, self.delay_applied)

    @property
    def interface(self) -> str:
        """The NIC name inside every node namespace (for GLOO_SOCKET_IFNAME)."""
        return NODE_INTERFACE

    def namespaces(self) -> list[str]:
        return [self.switch_namespace, *self._namespaces]

    def namespace(self, i: int) -> str:
        return self._namespaces[self._check_node(i)]

    def node_address(self, i: int) -> str:
        return self._addresses[self._check_node(i)]

    def _check_node(self, i: int) -> int:
        if not 0 <= i < self.num_nodes:
            raise ConfigError(f"emulated network: node {i} out of range 0..{self.num_nodes - 1}")
        if not self._open or self._closed:
            raise TrainingError("emulated network: not open")
        return i

    def popen(self, i: int, argv: Sequence[str], env: Mapping[str, str] | None = None,
              preexec: Callable[[], None] = die_with_parent, **kwargs: Any) -> subprocess.Popen:
        """Start `argv` inside node i's namespace (`ip netns exec`); killed by close(). `preexec`
        runs in the child first (default: it dies with this process; `HostCpuShares.preexec`
        also puts it in its host's cgroup)."""
        proc = subprocess.Popen(["ip", "netns", "exec", self.namespace(i), *argv],
                                env=None if env is None else dict(env), start_new_session=True,
                                preexec_fn=preexec, **kwargs)
        self._procs.append(proc)
        return proc

    def link_counters(self, i: int) -> dict[str, int]:
        """`interface_counters` of node i's NIC, read from outside its namespace."""
        out = _run(["ip", "-s", "-j", "-n", self.namespace(i), "link", "show", "dev", NODE_INTERFACE]).stdout
        stats = json.loads(out)[0]["stats64"]
        return {f"{d}_{k}": int(stats[d][k]) for d in ("tx", "rx") for k in ("bytes", "packets")}

    def qdisc_stats(self, i: int) -> dict[str, dict[str, Any]]:
        """The shaping qdisc of node i's link in each direction: kind, rate (bits/s), bytes sent.

        'uplink' is node -> switch (egress of the node's eth0), 'downlink' switch -> node."""
        stats = {}
        for direction, ns, dev in (("uplink", self.namespace(i), NODE_INTERFACE),
                                   ("downlink", self.switch_namespace, f"p{i}")):
            out = _run(["tc", "-s", "-j", "-n", ns, "qdisc", "show", "dev", dev]).stdout
            root = next(q for q in json.loads(out) if q.get("root"))
            stats[direction] = {"kind": root["kind"], "rate_bps": int(root["options"]["rate"]) * 8,
                                "bytes": int(root["bytes"]), "packets": int(root["packets"])}
        return stats


def stop_process(proc: subprocess.Popen, grace_s: float = 2.0) -> None:
    """SIGTERM the process group, SIGKILL after `grace_s`."""
    if proc.poll() is not None:
        return
    for sig, wait_s in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 5.0)):
        try:
            os.killpg(proc.pid, sig)
        except ProcessLookupError:
            return
        try:
            proc.wait(timeout=wait_s)
            return
        except subprocess.TimeoutExpired:
            continue
