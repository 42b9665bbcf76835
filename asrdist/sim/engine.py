"""The discrete-event simulation of one strategy on one cluster (SimPy processes, one per learner,
or per node where a node moves in lock step). Learners that move alike are simulated once
(`asrdist.sim.alike`).

What a step costs, per strategy (the traffic always comes from the strategy module's own
`*_traffic` function, i.e. the layout and byte accounting of the real run):
- compute: a fixed cost per minibatch, then local minibatch x seconds per frame (x a straggler's
  slowdown or a random jitter, the excess slept); the last `backward_share` of it is backward.
  CPU learners (`Cluster.shared_cores`) run their CPU work (compute, 1-bit coding, averaging
  arithmetic, and `network_cost` per byte moved) on their threads' cores, shared as the
  scheduler shares them (`SharedCores`): more learners than cores slow each other down, and one
  learner's work overlaps another's sleep or communication. Fewer threads cost
  `Cluster.cpu_slowdown`. The first lock-step collective that needs every learner's whole compute
  of a step (sync's last bucket, onebit's exchange, an average, a node's last bucket) also waits
  `lockstep_wait` for the learner the scheduler's time slices left last, and each sequential
  message of a lock-step collective takes at least `collective_step_seconds` (its receiver must be
  woken and get a core; overlapping the bytes on the wire) and `collective_step_cpu` beyond the
  bytes' CPU.
- sync: each bucket's collectives start when backward has produced its gradients (`overlap`),
  one after another on the learner's communication stream, and every collective waits for all
  members of its group (lock step): the slowest learner sets the pace; then the mean's
  arithmetic (`mean_cost`).
- onebit: quantize, owner reduce and dequantize cost `quantize_cost` (`dequantize_cost`) per
  value and pass; the chunked pipeline leaves max(cpu, wire) + min(cpu, wire) / chunks; double
  buffering moves the exchange of step t behind the compute of step t + 1.
- averaging: the flat allreduce every `steps_between_averages` minibatches (a period of more than
  MAX_AVERAGING_STEPS / 2 simulated shortened, its cost in proportion: `averaging_period`).
- adpsgd: learners claim minibatches from one job-wide pool (`own_steps`: each its own steps),
  each claim `claim_seconds` on the job's store;
  an active learner exchanges with its partner (`topology.partner`) after each step: two
  messages at once, one each way (the passive replies as soon as it is asked; a link keeps
  `Link.duplex` of its rate each way meanwhile); a passive answers one partner at a time (a
  SimPy resource: contention), without stopping its compute; an
  exchange across nodes shares both nodes' cards with the exchanges in flight on them (their
  learners share them: its rate is divided by the flows on the busier card); a passive that
  trains gets its answer going `answer_delay` late (an exchange's work beyond the wire), and each
  side spends `exchange_cpu` beyond its bytes' CPU; delay-by-one overlaps the exchange with the
  next step.
- hierarchical / hybrid: the node is the unit: node allreduce, the leaders' exchange, and the
  leader's broadcast to its node; hybrid's synchronous phase is `sync` over all learners.
The cost of a collective and the shared CPU cores: `asrdist.sim.resources`.
"""
from __future__ import annotations

import math
import random
from dataclasses import dataclass, field
from typing import Any

import simpy

from asrdist.errors import ConfigError
from asrdist.parallel import averaging, hierarchical, onebit, sync, topology
from asrdist.parallel.adpsgd import exchange_traffic
from asrdist.parallel.averaging import steps_between_averages
from asrdist.parallel.comm import Transfer
from asrdist.sim.alike import alike_learners, stand_ins
from asrdist.sim.cluster import Cluster, parameter_count
from asrdist.sim.resources import Meet, SharedCores, latency_steps, transfer_seconds
from asrdist.utils.throughput import job_frames_per_second

STRATEGY_NAMES = ("sync", "onebit", "averaging", "adpsgd", "hierarchical", "hybrid")
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
    """hybrid: simulate its synchronous phase (else the ADPSGD phase)."""
    state_copies: int = 0
    """averaging: parameter-sized optimizer tensors per parameter that an average carries besides
    the parameters (`strategy.average_momentum` with SGD momentum: 1; CNTK AdaGrad: 1 more)."""
    seed: int = 0

    def __post_init__(self):
        if self.strategy not in STRATEGY_NAMES + ("single",):
            raise ConfigError(f"simulate: unknown strategy {self.strategy!r} (known: {', '.join(STRATEGY_NAMES)})")
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


class _Learner:
    """Counters of one simulated learner."""

    __slots__ = ("rank", "steps", "frames", "bytes", "comm", "wait", "compute", "done_at")

    def __init__(self, rank: int):
        self.rank, self.steps, self.frames, self.bytes = rank, 0, 0, 0
        self.comm = self.wait = self.compute = self.done_at = 0.0


def simulated_steps(spec: SimSpec) -> int:
    """Minibatches per learner simulated: `steps`, or two of averaging's whole periods
    (`averaging_period`)."""
    if spec.strategy != "averaging" or spec.own_steps or spec.cluster.learners < 2:
        return spec.steps
    return max(spec.steps, 2 * averaging_period(spec)[0])


def averaging_period(spec: SimSpec) -> tuple[int, float]:
    """(minibatches simulated between two averages, the share of an average's cost each one
    carries). A period longer than MAX_AVERAGING_STEPS / 2 minibatches is simulated shortened to
    that, its average costed (time, bytes and arithmetic) in proportion, so that communication per
    minibatch stays what the real period gives; only the spread of the learners' compute over a
    period (jitter) is that of the shorter one. With `own_steps` (a run of exactly `steps`
    minibatches, as `bench scaling` times) the period is the real one."""
    every = steps_between_averages(spec.strategy_config, spec.local_batch)
    if spec.own_steps:  # a run of exactly `steps` minibatches: its averages fall where they fall
        return every, 1.0
    simulated = min(every, MAX_AVERAGING_STEPS // 2)
    return simulated, simulated / every


def simulate(spec: SimSpec) -> SimResult:
    """Run the simulation of `spec` and summarize it."""
    return _Simulation(spec).run()


class _Simulation:
    def __init__(self, spec: SimSpec):
        self.spec, self.cluster = spec, spec.cluster
        self.env = simpy.Environment()
        self.meet = Meet(self.env)
        self.n = spec.cluster.learners
        self.learners = {r: _Learner(r) for r in alike_learners(spec) or range(self.n)}  # rank -> simulated
        nodes = len({r // spec.cluster.per_node for r in self.learners})  # members simulated per group:
        self.group_sizes = {"world": len(self.learners), "node": len(self.learners) // nodes, "rail": nodes}
        self.rng = random.Random(spec.seed)
        self.steps = spec.steps
        self.pool = spec.steps * self.n  # job-wide minibatches (asynchronous strategies)
        self.average: list[Transfer] = []  # averaging's allreduce (none for a lone learner)
        self.dry_at: float | None = None  # when the last minibatch of the pool was claimed
        c = spec.cluster
        if c.shared_cores:
            self.cores = [SharedCores(self.env, c.shared_cores) for _ in range(1 if c.one_machine else c.nodes)]

    # -- pieces -------------------------------------------------------------------------
    def draw_compute(self, rank: int) -> tuple[float, float]:
        """One minibatch of learner `rank`: (seconds of work on its device or CPU cores, seconds
        of waiting: the fixed cost per minibatch and a straggler's extra sleep)."""
        s = self.spec
        work = s.local_batch * s.seconds_per_frame * self.cluster.cpu_slowdown()
        factor = s.slowdown.get(rank, 1.0) * (1.0 + (self.rng.uniform(0.0, s.jitter) if s.jitter else 0.0))
        return work, work * (factor - 1.0) + s.step_overhead

    def compute(self, me: _Learner, work: float, sleep: float):
        t0 = self.env.now
        yield self.env.timeout(sleep)
        yield from self.cpu(me, work)
        me.compute += self.env.now - t0

    def cpu(self, me: _Learner, seconds: float):
        """`seconds` of work; CPU learners share their machine's cores with every other learner's
        work in progress (`SharedCores`), so more learners than cores slow each other down, and
        work overlaps other learners' waiting."""
        if not self.cluster.shared_cores:
            yield self.env.timeout(seconds)
            return
        cores = self.cores[0 if self.cluster.one_machine else me.rank // self.cluster.per_node]
        yield cores.run(seconds, self.cluster.threads())

    def group_key(self, t: Transfer, rank: int) -> Any:
        per_node = self.cluster.per_node
        return {"world": "world", "node": ("node", rank // per_node), "rail": ("rail", rank % per_node)}[t.group]

    def collective(self, me: _Learner, t: Transfer, step: int, index: int, stalled: bool = True,
                   share: float = 1.0, after_whole_step: bool = False):
        """A lock-step collective: wait for the group, then its time (x `share`: `averaging_period`);
        `after_whole_step`: the first that needs every member's whole compute of the step (sync's
        last bucket), which also waits `lockstep_wait` on shared cores."""
        t0 = self.env.now
        s = self.spec
        duration = transfer_seconds(t, self.cluster)
        messages = latency_steps(t) if self.cluster.shared_cores else 0
        # its messages' wake-ups overlap its bytes on the wire (the kernel takes them in while the
        # receiver sleeps): a collective takes at least its messages' least time
        duration = max(duration, messages * s.collective_step_seconds)
        if after_whole_step and self.cluster.shared_cores:
            duration += s.lockstep_wait
        duration *= share
        meet = self.meet.join((self.group_key(t, me.rank), step, index), self.group_sizes[t.group], duration)
        # the CPU of the bytes it sends and (about as many) receives, and of each message's wake-ups
        cpu = (s.network_cost * 2 * t.bytes_sent + messages * s.collective_step_cpu) * share
        if cpu:
            meet = self.env.all_of([meet, self.env.process(self.cpu(me, cpu))])
        yield meet
        me.bytes += t.bytes_sent * share
        me.comm += self.env.now - t0
        if stalled:
            me.wait += self.env.now - t0

    # -- lock-step strategies -----------------------------------------------------------
    def lockstep_learner(self, me: _Learner, buckets: list[list[Transfer]], overlap: bool):
        s = self.spec
        total = sum(b[0].values for b in buckets) or 1
        for step in range(self.steps):
            work, sleep = self.draw_compute(me.rank)
            t0 = self.env.now
            stream = yield from self._compute_launching(me, work, sleep, buckets, step, overlap, total)
            me.compute += self.env.now - t0
            t0 = self.env.now
            if stream is not None:
                yield stream
            if buckets and s.mean_cost:
                yield from self.cpu(me, s.mean_cost * s.values)
            me.wait += self.env.now - t0
            yield from self._after_step(me, step)
            me.steps += 1
            me.frames += s.local_batch
        me.done_at = self.env.now

    def _compute_launching(self, me: _Learner, work: float, sleep: float, buckets: list[list[Transfer]], step: int,
                           overlap: bool, total: int):
        """A lock-step learner's compute (after its `sleep`): forward, then backward bucket by
        bucket, each bucket's collectives launched once the backward work that produced it is done
        (`overlap`; else all of them after backward), one bucket after another on the learner's
        stream. On shared cores backward takes longer than its work, and the buckets wait for it.
        Returns the stream's last process (None without buckets)."""
        s = self.spec
        yield self.env.timeout(sleep)
        backward = work * s.backward_share
        yield from self.cpu(me, work - backward)
        stream, index = None, 0
        pieces = [b[0].values / total for b in buckets] if overlap else [1.0] + [0.0] * (len(buckets) - 1)
        for i, (bucket, piece) in enumerate(zip(buckets, pieces)):
            if piece > 0:
                yield from self.cpu(me, backward * piece)
            stream = self.env.process(self._bucket_collectives(me, bucket, step, index, stream, i == len(buckets) - 1))
            index += len(bucket)
        if not buckets:
            yield from self.cpu(me, backward)
        return stream

    def _bucket_collectives(self, me: _Learner, bucket: list[Transfer], step: int, index: int, previous,
                            last: bool):
        """One bucket's collectives on the stream; the `last` bucket is the one that waits for every
        learner's whole backward, so it pays the wait for the last learner (`lockstep_wait`)."""
        if previous is not None:  # the stream issues the buckets in order
            yield previous
        for i, t in enumerate(bucket):
            yield from self.collective(me, t, step, index + i, stalled=False,
                                       after_whole_step=last and i == 0)

    def _bucket_stream(self, me, buckets, step, overlap, backward_start, backward, total):
        done = 0
        index = 0
        for b, bucket in enumerate(buckets):
            done += bucket[0].values
            ready = backward_start + backward * (done / total if overlap else 1.0)
            if ready > self.env.now:
                yield self.env.timeout(ready - self.env.now)
            for i, t in enumerate(bucket):  # the last bucket waits for every member's whole backward
                yield from self.collective(me, t, step, index, stalled=False,
                                           after_whole_step=b == len(buckets) - 1 and i == 0)
                index += 1

    def _after_step(self, me: _Learner, step: int):
        s = self.spec
        if self.average and (step + 1) % self.average_every == 0:
            for i, t in enumerate(self.average):
                yield from self.collective(me, t, step, 1000 + i, share=self.average_share,
                                           after_whole_step=i == 0)
            t0 = self.env.now
            yield from self.cpu(me, s.copy_cost * s.averaged_values * self.average_share)
            me.comm += self.env.now - t0
            me.wait += self.env.now - t0

    def onebit_learner(self, me: _Learner, transfers: list[Transfer], double_buffering: bool, chunks: int):
        s = self.spec
        inside = [t for t in transfers if t.group == "node"]
        across = [t for t in transfers if t.group != "node"]
        share = self.cluster.per_node if inside else 1
        values = s.values / share  # what this learner quantizes across nodes
        n_across = across[0].size if across else 1
        decode = s.quantize_cost if s.dequantize_cost is None else s.dequantize_cost
        quantize = s.quantize_cost * values
        reduce = (decode + s.quantize_cost / n_across) * values
        dequantize = decode * values
        pending = None
        for step in range(s.steps):
            yield from self.compute(me, *self.draw_compute(me.rank))
            t0 = self.env.now
            if inside:
                yield from self.collective(me, inside[0], step, 0, after_whole_step=True)
            if not double_buffering:
                yield from self._onebit_wire(me, across, step, quantize + reduce + dequantize, chunks, True,
                                             not inside)
            else:
                yield from self.cpu(me, quantize)
                if pending is not None:
                    t1 = self.env.now
                    yield pending
                    me.wait += self.env.now - t1
                yield from self.cpu(me, dequantize)
                pending = self.env.process(self._onebit_wire(me, across, step, reduce, chunks, False, not inside))
            if inside:
                yield from self.collective(me, inside[1], step, 10_000)
            me.comm += self.env.now - t0 if double_buffering else 0.0
            if double_buffering:
                me.wait += quantize + dequantize
            me.steps += 1
            me.frames += s.local_batch
        if pending is not None:
            yield pending
        me.done_at = self.env.now

    def _onebit_wire(self, me, across, step, cpu, chunks, stalled, after_whole_step):
        """The exchange's collectives and its `cpu` of coding, pipelined over `chunks`: a chunk is
        coded while the next crosses the wire. On a dedicated device only the coding the wire does
        not hide takes time; CPU learners code on cores they share (`SharedCores`), so all of it
        runs there, as the chunks arrive (all but the last chunk's during the wire), taking its
        share of the cores from every learner's work. `after_whole_step`: the step's first lock-step
        collective."""
        on_cores = self.cluster.shared_cores and cpu > 0
        overlapped = self.env.process(self.cpu(me, cpu * (1.0 - 1.0 / chunks))) if on_cores else None
        t0 = self.env.now
        for i, t in enumerate(across):
            yield from self.collective(me, t, step, 1 + i, stalled=stalled,
                                       after_whole_step=after_whole_step and i == 0)
        wire = self.env.now - t0
        t1 = self.env.now
        if overlapped is not None:
            yield overlapped
            yield from self.cpu(me, cpu / chunks)
        else:
            yield from self.cpu(me, max(cpu - wire, 0.0) + min(cpu, wire) / chunks)
        me.comm += self.env.now - t1
        if stalled:
            me.wait += self.env.now - t1

    # -- asynchronous strategies --------------------------------------------------------
    def claim(self) -> bool:
        if self.pool <= 0:
            return False
        self.pool -= 1
        if self.pool == 0:
            self.dry_at = self.env.now
        return True

    def adpsgd_unit(self, members: list[_Learner], leader_rank: int, unit: int, units: int, node_traffic,
                    broadcast: Transfer | None, overlap: bool):
        """One ADPSGD participant: a learner, or (hierarchical) a node moving in lock step."""
        s, cfg = self.spec, self.spec.strategy_config
        active = units > 1 and topology.is_active(unit, units)
        pending = None
        rnd = 0
        total = sum(b[0].values for b in node_traffic) or 1
        step = 0
        while True:
            if not (step < self.steps if self.spec.own_steps else all(self.claim() for _ in range(self.unit_size))):
                break
            if s.claim_seconds:  # the claim's round trips to the job's store
                yield self.env.timeout(s.claim_seconds)
            drawn = [self.draw_compute(m.rank) for m in members]
            computes = [self.env.process(self.compute(m, *d)) for m, d in zip(members, drawn)]
            if node_traffic:
                streams = [self.env.process(self._bucket_stream(m, node_traffic, step, overlap,
                                                                self.env.now + sum(d) * (1 - s.backward_share),
                                                                sum(d) * s.backward_share, total))
                           for m, d in zip(members, drawn)]
                yield self.env.all_of(computes)
                t0 = self.env.now
                yield self.env.all_of(streams)
                for m in members:
                    m.wait += self.env.now - t0
            else:
                yield self.env.all_of(computes)
            if active:
                partner = topology.partner(unit, units, rnd, cfg.pattern, cfg.seed)
                rnd += 1
                leader = self.learners[leader_rank]
                if cfg.delay_by_one:
                    if pending is not None:
                        t0 = self.env.now
                        yield pending
                        for m in members:
                            m.wait += self.env.now - t0
                    pending = self.env.process(self._exchange(leader, partner, False, members))
                else:
                    yield from self._exchange(leader, partner, True, members)
            if broadcast is not None:
                t0 = self.env.now
                duration = transfer_seconds(broadcast, self.cluster)
                yield self.env.timeout(duration)
                for m in members:
                    m.comm += duration
                    m.wait += duration
                self.learners[leader_rank].bytes += broadcast.bytes_sent
            for m in members:
                m.steps += 1
                m.frames += s.local_batch
            step += 1
        if pending is not None:
            yield pending
        for m in members:
            m.done_at = self.env.now

    def _exchange(self, leader: _Learner, partner_unit: int, stalled: bool, members: list[_Learner]):
        s = self.spec
        partner_rank = partner_unit * self.unit_size
        passive = self.learners[partner_rank]
        t0 = self.env.now
        yield from self.cpu(leader, s.copy_cost * s.values / 2)  # x_pre into the message
        turn = self.answerers[partner_unit].request()
        yield turn
        if s.answer_delay:  # the passive's answering thread gets going while its trainer computes
            yield self.env.timeout(s.answer_delay)
        ex, ans = self.exchange["exchange"], self.exchange["answer"]
        nodes = sorted({partner_rank // self.cluster.per_node, leader.rank // self.cluster.per_node})
        crosses = len(nodes) == 2
        # the passive replies as soon as it is asked: one message each way, at once
        duration = transfer_seconds(ex, self.cluster, crosses, max(ex.bytes_sent, ans.bytes_sent))
        # an exchange across nodes shares both nodes' cards with the other exchanges in flight on
        # them (the learners of a node share its card): its rate is the card's rate over the flows
        # on the busier card when it starts. (Holding a card exclusively instead made exchanges
        # queue in a convoy around a fixed ring, one after the other however many nodes.)
        if crosses:
            for node in nodes:
                self.flows[node] += 1
            duration *= max(self.flows[node] for node in nodes)
        work = [self.env.timeout(duration), self.env.process(self.cpu(passive, s.copy_cost * s.values / 2))]
        if s.network_cost or s.exchange_cpu:  # each side sends one message and receives the other
            moved = s.network_cost * (ex.bytes_sent + ans.bytes_sent) + s.exchange_cpu
            work += [self.env.process(self.cpu(leader, moved)), self.env.process(self.cpu(passive, moved))]
        yield self.env.all_of(work)
        passive.comm += duration  # its answer in flight (its compute goes on meanwhile: no wait)
        if crosses:
            for node in nodes:
                self.flows[node] -= 1
        # both move halfway: the active before it goes on, the passive before it answers again
        self.env.process(self._passive_average(passive, partner_unit, turn))
        yield from self.cpu(leader, s.copy_cost * s.values * 1.5)
        leader.bytes += ex.bytes_sent
        passive.bytes += ans.bytes_sent
        for m in members:
            m.comm += self.env.now - t0
            if stalled:
                m.wait += self.env.now - t0

    def _passive_average(self, passive: _Learner, unit: int, turn):
        yield from self.cpu(passive, self.spec.copy_cost * self.spec.values * 1.5)
        self.answerers[unit].release(turn)

    # -- running ------------------------------------------------------------------------
    def run(self) -> SimResult:
        s, c, env = self.spec, self.cluster, self.env
        cfg = s.strategy_config
        name = s.strategy
        if name == "hybrid" and s.synchronous:
            name = "sync_everyone"
        if name == "single" or (self.n == 1 and name != "onebit"):  # a lone onebit still codes its gradient
            for me in self.learners.values():
                env.process(self.lockstep_learner(me, [], False))
        elif name in ("sync", "sync_everyone", "averaging"):
            if name == "averaging":
                buckets = []
                self.average = averaging.average_traffic(s.averaged_values, self.n, cfg)
                self.average_every, self.average_share = averaging_period(s)
                self.steps = simulated_steps(s)
                overlap = False
            else:
                sync_cfg = cfg if name == "sync" else sync.SyncConfig(overlap=False)
                buckets = sync.exchange_traffic(s.shapes, self.n, c.per_node, sync_cfg)
                overlap = sync_cfg.overlap
            for me in self.learners.values():
                env.process(self.lockstep_learner(me, buckets, overlap))
        elif name == "onebit":
            for me in self.learners.values():
                transfers = onebit.exchange_traffic(s.shapes, self.n, c.per_node, me.rank, cfg)
                env.process(self.onebit_learner(me, transfers, cfg.double_buffering, onebit.PIPELINE_CHUNKS))
        else:  # adpsgd, hierarchical, hybrid's asynchronous phase
            per_unit = 1 if name == "adpsgd" else c.per_node
            self.unit_size = per_unit
            units = self.n // per_unit
            self.answerers = [simpy.Resource(env, capacity=1) for _ in range(units)]
            self.flows = [0] * c.nodes  # exchanges in flight on each node's card
            self.exchange = exchange_traffic(s.values)
            node_traffic, broadcast = [], None
            if per_unit > 1:
                inner = sync.SyncConfig(overlap=name == "hierarchical")
                node_traffic = sync.exchange_traffic(s.shapes, per_unit, per_unit, inner, group="node")
                broadcast = next(t for t in hierarchical.step_traffic(s.shapes, self.n, per_unit, 0)
                                 if t.kind == "broadcast")
            for u in range(units):
                members = [self.learners[r] for r in range(u * per_unit, (u + 1) * per_unit) if r in self.learners]
                env.process(self.adpsgd_unit(members, u * per_unit, u, units, node_traffic, broadcast,
                                             name == "hierarchical"))
        env.run()
        return self._summary()

    def _summary(self) -> SimResult:
        ls = [self.learners[r] for r in stand_ins(self.spec)]
        # the one throughput (asrdist.utils.throughput): the job's frames over its longest learner's
        # time, the end of a pool included; a window's pace before the pool ran dry and its tail
        # are kept apart so that an epoch of other length is extrapolated from them (`epoch_seconds`)
        frames = sum(l.frames for l in ls)
        end = max(l.done_at for l in ls)
        busy = self.dry_at if self.dry_at is not None else end
        return SimResult(
            frames_per_second=job_frames_per_second([l.frames for l in ls], [l.done_at for l in ls]),
            pace_seconds_per_frame=busy / frames if frames else 0.0,
            tail_seconds=max(0.0, end - busy),
            seconds_per_step=sum(l.done_at / max(l.steps, 1) for l in ls) / len(ls),
            comm_share=sum(min(l.comm / max(l.done_at, 1e-12), 1.0) for l in ls) / len(ls),
            wait_share=sum(min(l.wait / max(l.done_at, 1e-12), 1.0) for l in ls) / len(ls),
            bytes_per_step=[l.bytes / max(l.steps, 1) for l in ls],
            bytes_sent=[int(round(l.bytes)) for l in ls],
            steps=[l.steps for l in ls],
            compute_seconds_per_step=sum(l.compute / max(l.steps, 1) for l in ls) / len(ls),
        )
