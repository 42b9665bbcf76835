"""The discrete-event simulation of one strategy on one cluster (SimPy processes, one per learner,
or per node where a node moves in lock step). Learners that move alike are simulated once
(`asrdist.sim.alike`). The process follows the shape the strategy's descriptor declares
(`asrdist.parallel.descriptor`: lock-step, pipelined, pairwise), its traffic the strategy module's
own byte accounting; compute runs on shared CPU cores or a device. The cost of a collective and the
shared CPU cores: `asrdist.sim.resources`. What a step costs, per shape:
docs/simulator.md#how-a-step-is-simulated-simenginepy."""
from __future__ import annotations

import random
from typing import Any

import simpy

from asrdist.parallel import topology
from asrdist.parallel.comm import Transfer
from asrdist.parallel.descriptor import LockStep, Pairwise, Pipelined
from asrdist.sim.alike import alike_learners, stand_ins
from asrdist.sim.resources import Meet, SharedCores, latency_steps, transfer_seconds
from asrdist.sim.spec import SimResult, SimSpec, averaging_period, sim_shape, simulated_steps
from asrdist.utils.throughput import job_frames_per_second


class _Learner:
    """Counters of one simulated learner."""

    __slots__ = ("rank", "steps", "frames", "bytes", "comm", "wait", "compute", "done_at")

    def __init__(self, rank: int):
        self.rank, self.steps, self.frames, self.bytes = rank, 0, 0, 0
        self.comm = self.wait = self.compute = self.done_at = 0.0

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
        self.host_factor = self._host_factors() if spec.cluster.cpu_hosts else {}
        self.steps = spec.steps
        self.pool = spec.steps * self.n  # job-wide minibatches (asynchronous strategies)
        self.average: list[Transfer] = []  # averaging's allreduce (none for a lone learner)
        self.dry_at: float | None = None  # when the last minibatch of the pool was claimed
        c = spec.cluster
        if c.shared_cores:
            self.cores = [SharedCores(self.env, c.shared_cores) for _ in range(1 if c.one_machine else c.nodes)]
        # dedicated CPU hosts: each host's quota (its learners' shares), shared by all the CPU work in
        # progress on it (its learners' steps, a passive's answering thread, their messages' CPU), as
        # the kernel shares a cgroup's quota among its threads
        self.quota = [SharedCores(self.env, c.per_node) for _ in range(c.nodes)] if c.cpu_hosts else None

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
        yield from self.cpu(me, work, compute=True)
        me.compute += self.env.now - t0

    def _host_factors(self) -> dict[int, float]:
        """rank -> slowdown of its dedicated host's quota, as `cpushare.HostCpuPlan` sets it: a
        host whose learners are all stragglers gets `slowdown` times less quota; a straggler
        beside learners at full speed is slowed by the sleep stand-in, its host's quota is whole."""
        per, factors = self.cluster.per_node, {}
        for node in range(self.cluster.nodes):
            ranks = range(node * per, (node + 1) * per)
            slowed = {self.spec.slowdown.get(r, 1.0) for r in ranks}
            if len(slowed) == 1 and (factor := slowed.pop()) > 1.0:
                factors.update((r, factor) for r in ranks)
        return factors

    def host_slowdown(self, rank: int) -> float:
        """How much longer learner `rank`'s CPU work other than its compute takes: a straggler's
        host on dedicated CPU hosts (its quota is `slowdown` times smaller for all its work), else 1."""
        return self.host_factor.get(rank, 1.0)

    def cpu(self, me: _Learner, seconds: float, compute: bool = False):
        """`seconds` of work; CPU learners share their machine's cores with every other learner's
        work in progress (`SharedCores`), so more learners than cores slow each other down, and
        work overlaps other learners' waiting. `compute`: the step's own work (a straggler's
        slowdown is already in it: `draw_compute`)."""
        if not self.cluster.shared_cores:
            seconds = seconds if compute else seconds * self.host_slowdown(me.rank)
            if self.quota is None:
                yield self.env.timeout(seconds)
            else:
                yield self.quota[me.rank // self.cluster.per_node].run(seconds, 1)
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
        # the CPU of the bytes it sends and (about as many) receives, and of each message's wake-ups
        cpu = (s.network_cost * 2 * t.bytes_sent + messages * s.collective_step_cpu) * share
        meet = self.meet.join((self.group_key(t, me.rank), step, index), self.group_sizes[t.group], duration)
        if cpu and self.cluster.serial_message_cpu:  # after the wire, on the host's quota; the next
            # collective waits for the group's slowest
            yield meet
            meet = self.env.process(self.cpu(me, cpu))
        elif cpu:
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
        yield from self.cpu(me, work - backward, compute=True)
        stream, index = None, 0
        pieces = [b[0].values / total for b in buckets] if overlap else [1.0] + [0.0] * (len(buckets) - 1)
        for i, (bucket, piece) in enumerate(zip(buckets, pieces)):
            if piece > 0:
                yield from self.cpu(me, backward * piece, compute=True)
            stream = self.env.process(self._bucket_collectives(me, bucket, step, index, stream, i == len(buckets) - 1))
            index += len(bucket)
        if not buckets:
            yield from self.cpu(me, backward, compute=True)
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

    def pipelined_learner(self, me: _Learner, transfers: list[Transfer], double_buffering: bool, chunks: int):
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
                yield from self._pipelined_wire(me, across, step, quantize + reduce + dequantize, chunks, True,
                                             not inside)
            else:
                yield from self.cpu(me, quantize)
                if pending is not None:
                    t1 = self.env.now
                    yield pending
                    me.wait += self.env.now - t1
                yield from self.cpu(me, dequantize)
                pending = self.env.process(self._pipelined_wire(me, across, step, reduce, chunks, False, not inside))
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

    def _pipelined_wire(self, me, across, step, cpu, chunks, stalled, after_whole_step):
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

    def pairwise_unit(self, members: list[_Learner], leader_rank: int, unit: int, units: int):
        """One participant of a pairwise strategy: a learner, or a node moving in lock step."""
        s, shape = self.spec, self.pairwise
        node_traffic, broadcast, overlap = shape.node_buckets, shape.broadcast, shape.overlap
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
                partner = topology.partner(unit, units, rnd, shape.pattern, shape.seed)
                rnd += 1
                leader = self.learners[leader_rank]
                if shape.delay_by_one:
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
        ex, ans = self.pairwise.exchange, self.pairwise.answer
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
        # each side sends one message and receives the other; on CPU hosts beside the wire, on each
        # side's quota (one message each way, which the kernel takes in while the receiver waits)
        moved = s.network_cost * (ex.bytes_sent + ans.bytes_sent) + s.exchange_cpu
        work = [self.env.timeout(duration), self.env.process(self.cpu(passive, s.copy_cost * s.values / 2))]
        if moved:
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
        shape = sim_shape(self.spec)
        if isinstance(shape, LockStep):
            if shape.average:
                self.average = shape.average
                self.average_every, self.average_share = averaging_period(self.spec)
                self.steps = simulated_steps(self.spec)
            for me in self.learners.values():
                self.env.process(self.lockstep_learner(me, shape.buckets, shape.overlap))
        elif isinstance(shape, Pipelined):
            for me in self.learners.values():
                self.env.process(self.pipelined_learner(me, shape.transfers(me.rank), shape.double_buffering,
                                                        shape.chunks))
        else:
            self.start_pairwise(shape)
        self.env.run()
        return self._summary()

    def start_pairwise(self, shape: Pairwise) -> None:
        """One process per participant: a learner, or a node of `shape.unit` learners."""
        self.pairwise, self.unit_size = shape, shape.unit
        units = self.n // shape.unit
        self.answerers = [simpy.Resource(self.env, capacity=1) for _ in range(units)]
        self.flows = [0] * self.cluster.nodes  # exchanges in flight on each node's card
        for u in range(units):
            members = [self.learners[r] for r in range(u * shape.unit, (u + 1) * shape.unit) if r in self.learners]
            self.env.process(self.pairwise_unit(members, u * shape.unit, u, units))

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
