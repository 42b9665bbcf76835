"""What the simulator is told about a cluster: devices, links, models and the presets of the
source documents. Every preset number names its source, or says that it is an assumption.

Compute: a frame of an acoustic model costs about 6 x parameters floating-point operations
(forward 2 per weight, backward 4); a device preset is a sustained rate in FLOP/s, so its
seconds per frame follow from the model's parameter count (from the model registry).
"""
from __future__ import annotations

import math
from dataclasses import dataclass, field

from asrdist.errors import ConfigError


@dataclass(frozen=True)
class Link:
    """One kind of connection: bytes per second one learner (or node, between nodes) can push,
    and the latency of one message."""

    bandwidth: float
    latency: float
    source: str = "assumption"
    duplex: float = 1.0
    """The share of `bandwidth` each direction keeps while a pairwise exchange sends a message
    each way at once: 1 on a full-duplex link (the presets); measured on an emulated one."""

    def __post_init__(self):
        if not self.bandwidth > 0 or self.latency < 0 or not 0 < self.duplex <= 1:
            raise ConfigError(f"link: need bandwidth > 0, latency >= 0 and 0 < duplex <= 1, got {self.bandwidth}, "
                              f"{self.latency}, {self.duplex}")


@dataclass(frozen=True)
class Device:
    """A learner's compute: sustained FLOP/s on the model's matrix products."""

    flops: float
    source: str = "assumption"


LINKS: dict[str, Link] = {
    # Inside a node.
    "pcie": Link(6e9, 10e-6, "assumption: PCIe 3.0 x16 (15.75 GB/s nominal) through host memory, as "
                             "CNTK's MPI exchange of 2014 staged it: about 6 GB/s, 10 us"),
    "nvlink": Link(50e9, 5e-6, "assumption: NVLink 2.0 between V100s (IBM AC922: 3 x 25 GB/s per direction "
                               "per GPU pair); 50 GB/s effective, 5 us"),
    # Between nodes (a node's network card, shared by its learners).
    "infiniband": Link(12.5e9, 3e-6, "assumption: EDR InfiniBand, 100 Gbit/s per node, 3 us"),
    "100gbit": Link(10e9, 20e-6, "100 Gbit/s Ethernet (IBM Interspeech 2019 abstract); assumption: 80% of it "
                                 "(10 GB/s) and 20 us per message"),
    "1gbit": Link(1e9 / 8, 0.1e-3, "asrdist's emulated network (DESIGN.md 5.8: tc, 1 Gbit/s, 0.1 ms)"),
    "10gbit": Link(10e9 / 8, 0.1e-3, "tc-shaped 10 Gbit/s, 0.1 ms (as 1gbit)"),
    "loopback": Link(2e9, 50e-6, "assumption: gloo over loopback on a 2-core VM, 2 GB/s, 50 us "
                                 "(`asrdist bench simulator` measures it)"),
}

GPU_SHARE = 0.4911
"""Every GPU's sustained share of its fp32 peak, as `simulate --validate` fits it on all the papers
(the IBM blog's one-V100 week; `validate.fit`)."""

DEVICES: dict[str, Device] = {
    "k20x": Device(GPU_SHARE * 3.95e12, "NVIDIA K20X: 3.95 TFLOP/s fp32 peak (datasheet); assumption: the V100's "
                                        "sustained share of peak"),
    "p100": Device(GPU_SHARE * 10.6e12, "NVIDIA P100 SXM2: 10.6 TFLOP/s fp32 peak (datasheet); assumption: the "
                                        "V100's sustained share of peak"),
    "v100": Device(GPU_SHARE * 15.7e12, "NVIDIA V100 SXM2: 15.7 TFLOP/s fp32 peak (datasheet); sustained share "
                                        "fitted on IBM's blog (about 1 week on 1 V100): `asrdist simulate "
                                        "--validate`"),
}

MODELS: dict[str, dict] = {
    # model config for asrdist.models.registry, input features per frame, output classes
    "swbd": {"model": {"name": "swbd"}, "feature_dim": 39, "num_classes": 9304,
             "source": "Seide 2014: 46M-parameter Switchboard DNN, 429 inputs (11 x 39), 7 x 2048 sigmoid, "
                       "9304 tied states (asrdist's registry 'swbd')"},
    "ibm-lstm": {"model": {"name": "blstm", "hidden_layers": 6, "hidden_dim": 512, "chunk": 21},
                 "feature_dim": 260, "num_classes": 32000,
                 "source": "IBM SWB2000 LSTM: 32,000 classes (IBM blog 2019), 21-frame chunks (DESIGN.md 5); "
                           "assumption: 6 bidirectional layers of 512 cells per direction, 260 inputs"},
}


def model_shapes(model: dict, feature_dim: int, num_classes: int) -> list[tuple[int, ...]]:
    """Parameter shapes of a registry model, built on the meta device (no memory)."""
    # torch and the models only here: `asrdist simulate --help` reads this module's tables (start-up time)
    import torch

    from asrdist.models.registry import ModelConfig, build_model  # (same reason)

    cfg = model if isinstance(model, ModelConfig) else ModelConfig(**model)
    with torch.device("meta"):
        built = build_model(cfg, feature_dim, num_classes)
    return [tuple(p.shape) for p in built.parameters() if p.requires_grad]


def parameter_count(shapes) -> int:
    """Values in tensors of these shapes (a model's parameters from `model_shapes`)."""
    return sum(math.prod(s) for s in shapes)


def seconds_per_frame(device: Device, parameters: int) -> float:
    """Compute time of one frame (forward + backward, about 6 FLOP per parameter)."""
    return 6.0 * parameters / device.flops


@dataclass
class Cluster:
    """nodes x per_node learners; `inside` joins the learners of a node, `between` the nodes."""

    nodes: int = 1
    per_node: int = 1
    inside: Link = field(default_factory=lambda: LINKS["loopback"])
    between: Link = field(default_factory=lambda: LINKS["loopback"])
    shared_cores: int = 0
    """CPU learners: the cores one node's learners share (threads per learner = max(1, cores //
    learners)); their CPU work queues for these cores. 0 = every learner has its own device."""
    one_machine: bool = False
    """The nodes are emulated on one machine: all learners share `shared_cores`."""
    thread_speedup: float = 0.0
    """CPU learners: how much faster one learner's CPU work runs on all `shared_cores` threads
    than on one (measured; memory-bound work gains little). 0 = linear in threads."""
    cpu_hosts: bool = False
    """Every learner computes on a CPU quota of its host (`asrdist.sim.dedicated`; with
    `shared_cores` 0): a straggler's host is slowed in all of its CPU work, and on hosts of one
    learner the CPU a message costs does not overlap its wire time (`serial_message_cpu`)."""

    @property
    def serial_message_cpu(self) -> bool:
        """A host of one learner under a quota neither computes nor moves its bytes while it is
        throttled: a collective, whose ring steps each need every member, lasts its wire time plus
        its slowest member's CPU for it. Learners sharing a host's quota lend each other the share
        they leave waiting on the wire, so there (and on devices with network engines) CPU and wire
        overlap, as they do for an ADPSGD exchange on any CPU host (one message each way, which the
        kernel takes in while the receiver waits for its quota)."""
        return self.cpu_hosts and self.per_node == 1

    def __post_init__(self):
        if self.cpu_hosts and self.shared_cores:
            raise ConfigError("cluster: learners on CPU hosts of their own share no cores (shared_cores 0)")
        if self.nodes < 1 or self.per_node < 1:
            raise ConfigError(f"cluster: need nodes >= 1 and learners per node >= 1, got {self.nodes} x {self.per_node}")
        if self.thread_speedup < 0:
            raise ConfigError(f"cluster: thread_speedup must be >= 0, got {self.thread_speedup}")

    @property
    def learners(self) -> int:
        return self.nodes * self.per_node

    def threads(self) -> int:
        """Threads (cores held) per CPU learner: max(1, cores // learners sharing them)."""
        sharing = self.learners if self.one_machine else self.per_node
        return max(1, self.shared_cores // sharing)

    def cpu_slowdown(self) -> float:
        """How much longer a learner's CPU work takes on its `threads()` threads than a lone
        learner's on all cores, before any queueing for cores (the engine queues)."""
        if not self.shared_cores:
            return 1.0

        def speedup(t: int) -> float:  # interpolated between 1 thread and all cores
            full = self.thread_speedup or float(self.shared_cores)
            return 1.0 + (full - 1.0) * (t - 1) / max(self.shared_cores - 1, 1)

        return speedup(self.shared_cores) / speedup(min(self.threads(), self.shared_cores))


MAX_LEARNERS = 65536
"""The largest cluster `asrdist simulate` takes (its summary lists every learner)."""
MAX_LEARNER_STEPS = 4096 * 24
"""Minibatches simulated learner by learner (alike learners once) in one strategy: 4096 learners
of 24 steps, about 10 s of adpsgd (512x8) and 40 s of hybrid (2048x8) on a 2-core VM
(`scenario.check_size`)."""
MAX_ONEBIT_SPAN = 128
"""Learners per node of a hierarchical onebit exchange: every learner's column shards grow with
them (on a 2-core VM 64x64 takes 19 s, 16x256 38 s, 4x1024 3 minutes; nodes and flat learners
are cheap: 512x8 11 s, 1x4096 9 s)."""


def parse_cluster(text: str) -> tuple[int, int]:
    """'8x4' -> (8 nodes, 4 learners per node); '16' -> (1, 16)."""
    try:
        parts = [int(p) for p in text.lower().split("x")]
    except ValueError:
        parts = []
    if len(parts) == 1:
        parts = [1, parts[0]]
    if len(parts) != 2 or min(parts) < 1:
        raise ConfigError(f"--cluster: expected NODESxPER_NODE like 8x4 (or a learner count), got {text!r}")
    if parts[0] * parts[1] > MAX_LEARNERS:
        raise ConfigError(f"--cluster: at most {MAX_LEARNERS} learners, got {text!r}")
    return parts[0], parts[1]


def link_named(name: str) -> Link:
    if name in LINKS:
        return LINKS[name]
    from asrdist.cluster.netem import parse_rate  # as torch above: `simulate --help` stays light

    return Link(parse_rate(name) / 8, 0.1e-3, f"tc-shaped {name}, 0.1 ms")
