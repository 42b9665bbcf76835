"""What one simulation is told (`SimSpec`) and what it gives (`SimResult`), and the shape of
its strategy's traffic (`sim_shape`: from the strategy's descriptor in `parallel.STRATEGIES`)."""
from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from asrdist.errors import ConfigError
from asrdist.parallel import STRATEGIES
from asrdist.parallel.descriptor import LockStep, Shape, SimJob
from asrdist.sim.cluster import Cluster, parameter_count

MAX_AVERAGING_STEPS = 2000


@dataclass
class SimSpec:
    """Everything one simulation needs."""

    strategy: str
    strategy_config: Any
    shapes: list[tuple[int, ...]]
    cluster: Cluster
    local_batch: int
    """Frames per learner per minibatch."""
    seconds_per_frame: float
    """One learner's compute per frame when it has the whole device (machine) to itself."""
    step_overhead: float = 0.0
    quantize_cost: float = 1e-9
    """Seconds per value and pass of 1-bit quantization (quantize, owner reduce, dequantize)."""
    dequantize_cost: float | None = None
    """Seconds per value of 1-bit dequantization (None: `quantize_cost`); the owner's reduce
    dequantizes the n contributions to its stripe and re-quantizes the stripe."""
    copy_cost: float = 0.0
    """Seconds per value of parameter arithmetic in an average or exchange (host or device)."""
    mean_cost: float = 0.0
    """Seconds per value of the sync gradient mean's arithmetic besides the wire (CPU learners:
    copy into the buckets, divide, copy back; 0 where it is negligible)."""
    network_cost: float = 0.0
    """CPU learners: CPU seconds per byte a learner sends or receives (gloo's and the kernel's
    copies), spent on its machine's cores while the bytes are on the wire (0: devices with their
    own network engines, or negligible)."""
    lockstep_wait: float = 0.0
    """CPU learners (`Cluster.shared_cores`): seconds the first lock-step collective after a step's
    whole compute waits for its last learner beyond what processor sharing gives. `SharedCores`
    lets learners that start a step together finish its compute together; the scheduler's time
    slices stagger them (measured: `asrdist.calibrate.lockstep`)."""
    claim_seconds: float = 0.0
    """Seconds a learner that claims minibatches from a job-wide pool (adpsgd, hierarchical,
    hybrid's asynchronous phase) spends on the job's store per minibatch before its compute: the
    claim and the progress it records (measured on CPU learners: `asrdist.calibrate.lockstep`; 0: not
    modelled)."""
    collective_step_seconds: float = 0.0
    """CPU learners (`Cluster.shared_cores`): the least seconds each sequential message of a
    lock-step collective (`resources.latency_steps`: a ring allreduce's 2(n-1)) takes. With more
    learners than cores the receiver of a message is often not running: it must be woken and get a
    core before the next message can go. The wake-ups overlap the bytes on the wire, so a
    collective takes the longer of the link's time and its messages' (measured among the run's
    learners: `asrdist.calibrate.lockstep`; 0: not modelled)."""
    collective_step_cpu: float = 0.0
    """CPU learners: CPU seconds a learner spends per sequential message of a lock-step collective
    beyond its bytes' (`network_cost`): gloo's and the kernel's wake-ups and bookkeeping (measured
    with `collective_step_seconds`)."""
    answer_delay: float = 0.0
    """Seconds an ADPSGD exchange takes beyond the link's pairwise exchange: its own work (the
    header's turn, the copies and halfway step on buffers the network just wrote) and, its passive
    training while it answers, the answering thread's and gloo's wait for a core, the interpreter
    and the update's lock before the reply goes out (measured on CPU learners:
    `asrdist.calibrate.lockstep`; 0: not modelled)."""
    exchange_cpu: float = 0.0
    """CPU learners: CPU seconds each side of an ADPSGD exchange spends beyond its bytes'
    (`network_cost`) and the halfway step's copies (`copy_cost`): the copies and arithmetic on
    buffers the network just wrote, gloo's and the answering thread's wake-ups (measured among
    training learners: `asrdist.calibrate.lockstep`; 0: not modelled)."""
    backward_share: float = 2 / 3
    slowdown: dict[int, float] = field(default_factory=dict)
    """Straggler ranks and their slowdown (compute x slowdown)."""
    jitter: float = 0.0
    """Every learner's compute x (1 + uniform(0, jitter)) per step."""
    steps: int = 24
    """Minibatches per learner simulated (a job-wide pool of steps x learners for adpsgd)."""
    own_steps: bool = False
    """Each learner trains exactly `steps` minibatches and the job ends with the slowest, as
    `bench scaling`'s learners do. False: asynchronous learners draw minibatches from one job-wide
    pool of steps x learners (the trainer's job epochs), and averaging runs whole periods."""
    synchronous: bool = False
    """A strategy with a synchronous phase (hybrid: `StrategyDescriptor.synchronous_epochs`):
    simulate that phase (else the other)."""
    state_copies: int = 0
    """averaging: parameter-sized optimizer tensors per parameter that an average carries besides
    the parameters (`strategy.average_momentum` with SGD momentum: 1; CNTK AdaGrad: 1 more)."""
    seed: int = 0

    def __post_init__(self):
        if self.strategy not in STRATEGIES:
            raise ConfigError(f"simulate: unknown strategy {self.strategy!r} (known: {', '.join(simulated_names())})")
        if self.local_batch < 1 or not self.seconds_per_frame > 0 or self.steps < 2:
            raise ConfigError("simulate: need a local batch >= 1 frame, seconds per frame > 0 and >= 2 steps")
        if not all(1 <= f < math.inf for f in self.slowdown.values()):
            raise ConfigError(f"simulate: a straggler's slowdown must be finite and >= 1, got {self.slowdown}")

    @property
    def values(self) -> int:
        return parameter_count(self.shapes)

    @property
    def averaged_values(self) -> int:
        """Values one learner contributes to an average: parameters and averaged optimizer state."""
        return self.values * (1 + self.state_copies)


@dataclass
class SimResult:
    frames_per_second: float
    """The job's frames per second over the simulated window, as asrdist measures a run
    (`asrdist.utils.throughput.job_frames_per_second`): all learners' frames over the longest
    learner's time, the tail of a pool (`tail_seconds`) included."""
    seconds_per_step: float
    """Mean over learners of wall seconds per own minibatch."""
    comm_share: float
    """Mean share of a learner's time with its communication in flight."""
    wait_share: float
    """Mean share of a learner's time blocked on communication (not hidden behind compute)."""
    bytes_per_step: list[float]
    """Per learner: bytes sent per own minibatch."""
    bytes_sent: list[int]
    steps: list[int]
    compute_seconds_per_step: float
    pace_seconds_per_frame: float = 0.0
    """The job's seconds per frame while its learners are all busy: until the pool ran dry
    (learners that claim minibatches from a pool), else the whole window. An epoch of F frames
    takes F x this + `tail_seconds` (for the simulated window itself: 1 / `frames_per_second`)."""
    tail_seconds: float = 0.0
    """Learners that claim minibatches from a pool (adpsgd, hierarchical): from the moment the
    pool ran dry to the last learner's end (a straggler's last minibatch, exchanges in flight).
    An epoch pays it once, beyond its frames at `pace_seconds_per_frame`."""

def sim_shape(spec: SimSpec) -> Shape:
    """The traffic of `spec`'s strategy as its descriptor declares it (`parallel.descriptor`)."""
    job = SimJob(spec.shapes, spec.cluster.learners, spec.cluster.per_node, spec.local_batch, spec.averaged_values,
                 spec.synchronous)
    return STRATEGIES[spec.strategy].sim_shape(spec.strategy_config, job)


def simulated_names() -> list[str]:
    """The strategies a user may name to simulate (`single` is the speed-up's base, not a choice)."""
    return [name for name in STRATEGIES if name != "single"]


def simulated_steps(spec: SimSpec) -> int:
    """Minibatches per learner simulated: `steps`, or two whole periods of a periodic average
    (averaging: `averaging_period`)."""
    shape = sim_shape(spec)
    if not isinstance(shape, LockStep) or not shape.average or spec.own_steps:
        return spec.steps
    return max(spec.steps, 2 * averaging_period(spec)[0])


def averaging_period(spec: SimSpec) -> tuple[int, float]:
    """(minibatches simulated between two averages, the share of an average's cost each one
    carries). A period longer than MAX_AVERAGING_STEPS / 2 minibatches is simulated shortened to
    that, its average costed (time, bytes and arithmetic) in proportion, so that communication per
    minibatch stays what the real period gives; only the spread of the learners' compute over a
    period (jitter) is that of the shorter one. With `own_steps` (a run of exactly `steps`
    minibatches, as `bench scaling` times) the period is the real one."""
    every = sim_shape(spec).average_every
    if spec.own_steps:  # a run of exactly `steps` minibatches: its averages fall where they fall
        return every, 1.0
    simulated = min(every, MAX_AVERAGING_STEPS // 2)
    return simulated, simulated / every
