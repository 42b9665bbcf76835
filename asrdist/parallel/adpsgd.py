"""`adpsgd`: asynchronous decentralized parallel SGD (Lian et al. 2018, Alg. 1; IBM ICASSP 2019,
Interspeech 2019, ICASSP 2020), DESIGN.md §5.5. Every learner's step k, as the paper writes it:
1. compute g(x̂_k), the gradient of the model as it is before this step's averaging;
2. average: an *active* (even ring position) exchanges with one *passive* (`asrdist.parallel.topology`),
   which answers from a communication thread while it computes; each side adds (x_other − x)/2
   under its parameter lock (the sum of all parameters is preserved, no update is lost);
3. step: x_{k+1} = W_k x_k − η g(x̂_k), the optimizer's step with g on the averaged model.
`delay_by_one`: x_{k+1} = W_k x_k − η g(x_{k−1}) on every learner (an active's exchange of x_k
overlaps g(x_k)). "η g" is the optimizer's step (momentum, AdaGrad: local state, never averaged).
Partners: `fixed` or `random` per round from (seed, round). `finalize` leaves the average of all.
Details: docs/strategies.md#adpsgd-asynchronous-decentralized-sgd-paralleladpsgdpy;
lost learners: docs/reliability.md#how-survivors-agree-parallelmembershippy."""
from __future__ import annotations

import threading
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Callable, Iterator

import torch
import torch.distributed as dist

from asrdist.checks import check_field
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import comm, topology
from asrdist.parallel.base import CommCounters, LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.descriptor import Pairwise, SimJob, StrategyDescriptor, Survival
from asrdist.parallel.consensus import average_into, consensus_distance
from asrdist.parallel.groups import exchange_group
from asrdist.parallel.membership import POLL_S as STORE_POLL_S
from asrdist.parallel.membership import Membership, NodeMembership, Watchdog

_HEADER, _PAYLOAD, _REPLY = 1, 2, 3  # message tags
_EXCHANGE, _GOODBYE = 1, 2  # header kinds
_PASSIVE_WAIT = timedelta(days=1)  # a passive may hear nothing for a whole validation


@dataclass
class AdpsgdConfig:
    pattern: str = "fixed"
    """fixed: each active alternates between its ring neighbours; random: partners from a
    permutation every learner draws from `seed` and the round (IBM ICASSP 2020)."""
    delay_by_one: bool = False
    """x_{k+1} = W_k x_k − η g(x_{k−1}) on every learner: an active's exchange of x_k overlaps the
    computation of g(x_k), which every learner applies one step later (module docstring)."""
    seed: int = 0
    """Seed of the random pattern's permutations (the same on every learner)."""

    def __post_init__(self):
        if self.pattern not in topology.PATTERNS:
            raise ConfigError(f"strategy.pattern: expected one of {', '.join(topology.PATTERNS)}, got {self.pattern!r}")
        check_field("strategy.delay_by_one", self.delay_by_one, bool)
        check_field("strategy.seed", self.seed, at_least=0)


def exchange_traffic(numel: int, element_size: int = 4) -> dict[str, comm.Transfer]:
    """One pairwise exchange of `numel` parameters as each side sends it: the active's header
    (two int64) and parameters, the passive's reply. The strategy counts exactly these."""
    return {"exchange": comm.Transfer("exchange", "pair", 2, 2 * 8 + numel * element_size, numel),
            "answer": comm.Transfer("answer", "pair", 2, numel * element_size, numel)}


def flat_parameters(model: torch.nn.Module) -> torch.Tensor:
    """Move every parameter into one flat float32 buffer and make the parameters views of it, so
    an exchange reads and writes the whole model in one tensor operation."""
    params = list(model.parameters())
    if any(p.dtype != torch.float32 for p in params):
        raise ConfigError("adpsgd: every parameter must be float32")
    flat = comm.flatten([p.data for p in params])
    for p, view in zip(params, comm.flat_views(flat, [p.shape for p in params])):
        p.data = view
    return flat


class HeldGradient:
    """delay-by-one's gradient: each step applies the previous step's gradient and keeps its own (a
    copy: sync's gradients are views of its buckets, which the next backward refills)."""

    def __init__(self):
        self._held: list[torch.Tensor | None] | None = None

    def swap(self, params: list[torch.Tensor]) -> bool:
        """Hold g(x_k) and make p.grad g(x_{k−1}); False at the first step (nothing held yet, p.grad None)."""
        held, self._held = self._held, [None if p.grad is None else p.grad.detach().clone() for p in params]
        for p, g in zip(params, held or [None] * len(params)):
            p.grad = g
        return held is not None


class AdpsgdStrategy(Strategy):
    name = "adpsgd"
    config_class = AdpsgdConfig
    lockstep = False
    survival = Survival.LEARNERS

    def __init__(self, config: AdpsgdConfig | None = None, *, counters: CommCounters | None = None,
                 exchange_group=None, membership: Membership | NodeMembership | None = None):
        """Nested in another strategy (hierarchical's node leaders): `exchange_group` is the group
        exchanges travel on, which the outer strategy built on every rank; `membership` says who is
        lost as the outer strategy sees it (None: fail fast). A nested adpsgd builds neither."""
        super().__init__(config, counters=counters)
        self.nested = exchange_group is not None
        self._lock = threading.Lock()
        self._paused = False
        self._round = 0
        self._flat: torch.Tensor | None = None
        self._group = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._landing: torch.Tensor | None = None
        """delay-by-one: the finished exchange's half-step, added when the update takes it (W_k x_k)."""
        self._delay = False
        """delay-by-one in a distributed job (set at setup): every learner steps with `_held`."""
        self._held = HeldGradient()
        """delay-by-one: g(x_{k−1}), the gradient of the previous step, applied at this one."""
        self._answerer: threading.Thread | None = None
        self._answer_error: BaseException | None = None
        self._said_goodbye = False
        self._goodbyes: set[int] = set()
        self._buffers: tuple[torch.Tensor, torch.Tensor] | None = None
        """An active's x_pre and its partner's reply (reused by every exchange)."""
        self._deferred: torch.Tensor | None = None
        """A passive's half of exchanges that completed while paused, added when the pause ends."""
        self._heard = threading.Condition()
        self.membership = membership  # made at setup when the job survives losses, unless nested
        self._watchdog: Watchdog | None = None
        self._exchange_group = exchange_group
        self._exchanges: list[tuple[float, int, int]] = []
        """(wall time it started, this active's ring position, the passive's) of every exchange."""

    # -- set-up ----------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        if ctx.distributed:
            if not dist.is_initialized():
                raise TrainingError(f"adpsgd: rank {ctx.rank} of {ctx.world_size} has no process group")
            comm.broadcast_module(model, self.counters, src=0, group=ctx.group, timeout=ctx.timeout)
        self._flat = flat_parameters(model)
        if not ctx.distributed:
            return
        self._delay = self.config.delay_by_one
        self._group = self._exchange_group or exchange_group(
            None if ctx.group is None else dist.get_process_group_ranks(ctx.group), ctx.timeout)
        self.active = topology.is_active(ctx.rank, ctx.world_size)
        if self.membership is None and not self.nested:
            self.start_membership(ctx)
        if self.membership is not None:
            self._watchdog = Watchdog(self.membership, ctx.timeout, name="adpsgd-watchdog")
        if self.active and self.config.delay_by_one:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="adpsgd-exchange")
        if not self.active:
            self._answerer = threading.Thread(target=self._answer_loop, name="adpsgd-answer", daemon=True)
            self._answerer.start()

    @property
    def flat(self) -> torch.Tensor | None:
        """Every parameter in one flat buffer (the parameters are views of it; made at setup)."""
        return self._flat

    @property
    def parameter_lock(self) -> threading.Lock:
        """Held while anything writes the parameters (an update, an exchange landing): hold it to
        read them while the answering thread runs."""
        return self._lock

    # -- the trainer's hooks ---------------------------------------------------------------
    def after_backward(self) -> None:
        """Plain ADPSGD's averaging, between the gradient of x̂_k (just computed) and the step:
        an active exchanges now, on the training thread (the paper's order, W_k x_k − η g(x̂_k))."""
        if not self._delay:
            self._exchange_now(stalled=True)

    def apply_update(self, step_fn: Callable[[], None]) -> None:
        if not self._delay:  # x_{k+1} = W_k x_k − η g(x̂_k): the averaged model takes the step
            with self._lock:
                step_fn()
            return
        self._wait_pending()  # an active's W_k x_k: the exchange of x_k, which ran while g(x_k) was computed
        if self._held.swap(parameters_with_grad(self.model)):  # no g(x_{-1}) at the first step: x_1 = W_0 x_0
            with self._lock:
                step_fn()  # x_{k+1} = W_k x_k − η g(x_{k−1}); a passive's W_k: the answers landed so far

    def after_step(self) -> None:
        self._raise_answer_error()
        if self._delay:  # the exchange of x_{k+1} overlaps the computation of g(x_{k+1})
            self._exchange_now(stalled=False)

    def _exchange_now(self, stalled: bool) -> None:
        """An active's exchange with this round's partner: now (`stalled`) or on its thread."""
        if not self.ctx.distributed or not self.active:
            return
        partner = self._partner()
        self._round += 1
        if partner is None:  # every passive is lost: train alone
            return
        if stalled:
            self._exchange(partner, self._snapshot(), stalled=True)
            return
        self._wait_pending()
        self._pending = self._executor.submit(self._exchange, partner, self._snapshot(), False)

    @contextmanager
    def paused(self) -> Iterator[None]:
        self._wait_pending()
        with self._lock:
            self._paused = True
        try:
            yield
        finally:
            with self._lock:
                self._paused = False
                if self._deferred is not None:
                    self._flat.add_(self._deferred)
                    self._deferred = None

    def epoch_end_metrics(self) -> dict:
        distance = self.among_survivors(lambda group, members: consensus_distance(
            self.model, world_size=len(members), group=group, timeout=self.ctx.timeout))
        return {"consensus_distance": distance}

    def consensus_scope(self) -> tuple[object, int]:
        return self.ctx.group, self.ctx.world_size  # this strategy's group (hierarchical: the leaders')

    def close(self, error: BaseException | None = None) -> None:
        if error is not None:  # stop at once: the passive thread is a daemon, pending work is dropped
            if self._executor is not None:
                self._executor.shutdown(wait=False, cancel_futures=True)
            return
        try:
            self._wait_pending()
            self._say_goodbye()
        except BaseException as exc:  # close must not raise: finalize reports it
            self._answer_error = self._answer_error or exc

    def finalize(self) -> None:
        if not self.ctx.distributed:
            return
        self.end_exchanges()

        def average(group, members):  # every live active has finished its last exchange
            self.await_goodbyes(members)
            with torch.no_grad():
                average_into(self.model, self.counters, group=group, timeout=self.ctx.timeout)
        self.among_survivors(average)

    def end_exchanges(self) -> None:
        """The first half of `finalize`: finish the last exchange, say goodbye to every live passive."""
        self._wait_pending()
        self._say_goodbye()

    def await_goodbyes(self, members: list[int]) -> None:
        """The second half, once every survivor finished its first: a passive waits for the goodbye
        of every active among the agreed survivors `members` (ranks of this strategy's group)."""
        if self._answerer is not None:
            live_actives = set(topology.active_ranks(self.ctx.world_size)) & set(members)
            with self._heard:
                heard = self._heard.wait_for(lambda: live_actives <= self._goodbyes or self._answer_error is not None,
                                             self.ctx.timeout.total_seconds())
            self._raise_answer_error()
            if not heard:
                raise TrainingError(f"rank {self.ctx.rank}: adpsgd: not every active learner said goodbye "
                                    f"within {self.ctx.timeout.total_seconds():g} s")
            if self.membership is None or not self.membership.lost_ranks():
                self._answerer.join(self.ctx.timeout.total_seconds())
            # else the thread may still wait for a lost active's goodbye: a daemon, it is left behind
        if self._executor is not None:
            self._executor.shutdown(wait=True)

    def gossip(self) -> dict | None:
        if not self.ctx.distributed:
            return None
        return {"learners": self.ctx.world_size, "pattern": self.config.pattern, "seed": self.config.seed,
                "exchanges": list(self._exchanges)}

    def state_dict(self) -> dict:
        return {**super().state_dict(), "round": self._round}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._round = int(state.get("round", 0))

    # -- lost learners -----------------------------------------------------------------------
    def _partner(self) -> int | None:
        """This round's passive, or the next live passive on the ring when it is lost (None: all are)."""
        n = self.ctx.world_size
        scheduled = topology.partner(self.ctx.rank, n, self._round, self.config.pattern, self.config.seed)
        if self.membership is None or not self.membership.is_lost(scheduled):
            return scheduled
        passives = topology.passive_ranks(n)
        at = passives.index(scheduled)
        return next((p for p in passives[at + 1:] + passives[:at] if not self.membership.is_lost(p)), None)

    def _lose(self, rank: int, exc: BaseException, what: str) -> None:
        """A failed exchange with `rank`: mark it lost, or fail when this strategy does not survive losses."""
        if self.membership is None:
            raise TrainingError(f"rank {self.ctx.rank}: {what} failed: {comm.transport_error(exc)}") from exc
        self.membership.report(rank, "died: its connection closed during an exchange")

    def _wait(self, work, peer: int) -> None:
        """Wait for a point-to-point operation with `peer`: with gloo's timeout when a failure ends
        the job, under the watchdog's deadline when the job goes on without a lost learner."""
        if self._watchdog is None:
            work.wait(self.ctx.timeout)
            return
        with self._watchdog.watching(peer):
            work.wait(_PASSIVE_WAIT)

    def _receive_header(self, header: torch.Tensor) -> int:
        """The next exchange's header, from whichever active asks first; returns its group rank. A
        passive may hear nothing for a whole validation of its actives: it waits up to a day."""
        work = dist.irecv(header, group=self._group, tag=_HEADER)
        work.wait(_PASSIVE_WAIT)
        return work._source_rank()  # as torch.distributed.recv finds the sender

    # -- the exchange ------------------------------------------------------------------------
    def _snapshot(self) -> torch.Tensor:
        """An active's x_pre, in the buffer its exchanges reuse (the previous exchange is over)."""
        if self._buffers is None:
            self._buffers = (self._staging(), self._staging())
        with self._lock:
            return self._buffers[0].copy_(self._flat.detach())

    def _exchange(self, partner: int, mine_pre: torch.Tensor, stalled: bool) -> None:
        """Active side: send x_pre while the partner's x_pre comes back, move halfway towards it."""
        t0, started = time.perf_counter(), time.time()
        what = f"adpsgd exchange with rank {partner} (timeout {self.ctx.timeout.total_seconds():g} s)"
        header = torch.tensor([_EXCHANGE, self._round], dtype=torch.int64)
        theirs = self._buffers[1]
        try:
            sends = [dist.isend(header, group=self._group, group_dst=partner, tag=_HEADER),
                     dist.isend(mine_pre, group=self._group, group_dst=partner, tag=_PAYLOAD)]
            self._wait(dist.irecv(theirs, group=self._group, group_src=partner, tag=_REPLY), partner)
            for work in sends:  # done: the partner answered
                self._wait(work, partner)
        except RuntimeError as exc:
            self._buffers = None  # the failed exchange may still hold them
            self._lose(partner, exc, what)
            return
        delta = theirs.sub_(mine_pre).mul_(0.5).to(self._flat.device)
        if self._executor is not None:  # delay-by-one: lands at the update, never during g(x_k)
            self._landing = delta
        else:
            with self._lock:
                self._flat.add_(delta)
        dt = time.perf_counter() - t0
        self._exchanges.append((started, self.ctx.rank, partner))
        self.counters.add(bytes_sent=exchange_traffic(mine_pre.numel(), mine_pre.element_size())["exchange"].bytes_sent,
                          exchanges=1, comm_seconds=dt, wait_seconds=dt if stalled else 0.0)

    def _wait_pending(self) -> None:
        if self._pending is not None:
            t0 = time.perf_counter()
            pending, self._pending = self._pending, None
            pending.result()
            self.counters.add(wait_seconds=time.perf_counter() - t0)
        if self._landing is not None:
            with self._lock:
                self._flat.add_(self._landing)
            self._landing = None

    def _say_goodbye(self) -> None:
        if self._said_goodbye or not self.ctx.distributed or not self.active:
            return
        self._said_goodbye = True
        header = torch.tensor([_GOODBYE, self._round], dtype=torch.int64)
        for passive in topology.passive_ranks(self.ctx.world_size):
            if self.membership is not None and self.membership.is_lost(passive):
                continue
            try:
                self._wait(dist.isend(header, group=self._group, group_dst=passive, tag=_HEADER), passive)
            except RuntimeError as exc:
                self._lose(passive, exc, f"adpsgd goodbye to rank {passive}")

    def _answer_loop(self) -> None:
        """Passive side: answer whoever asks, in arrival order, until every active said goodbye
        (or is lost)."""
        try:
            actives = set(topology.active_ranks(self.ctx.world_size))
            header = torch.empty(2, dtype=torch.int64)
            theirs, mine = self._staging(), self._staging()  # reused by every answer
            while not actives <= self._goodbyes | (self.membership.lost_ranks() if self.membership else set()):
                try:
                    source = self._receive_header(header)
                except RuntimeError as exc:
                    self._after_broken_header(exc)
                    continue
                if int(header[0]) == _GOODBYE:
                    with self._heard:
                        self._goodbyes.add(source)
                        self._heard.notify_all()
                    continue
                t0 = time.perf_counter()
                try:
                    self._answer(source, theirs, mine)
                except RuntimeError as exc:  # the active died (or hung and was stopped) mid-exchange
                    self._lose(source, exc, f"adpsgd answer to rank {source}")
                    theirs, mine = self._staging(), self._staging()  # the lost exchange may still hold the old ones
                    continue
                dt = time.perf_counter() - t0
                sent = exchange_traffic(theirs.numel(), theirs.element_size())["answer"].bytes_sent
                self.counters.add(answer_seconds=dt, comm_seconds=dt, exchanges=1, bytes_sent=sent)
        except BaseException as exc:  # reported to the training thread at its next step
            with self._heard:
                self._answer_error = exc
                self._heard.notify_all()

    def _after_broken_header(self, exc: RuntimeError) -> None:
        """The wait for anyone's header failed: gloo hands a pair's reset (an active killed with
        unread data, e.g. the end of a reply, in its socket) to the receive from any source,
        without saying whose. Go on listening once the store names a newly lost learner (the
        launcher records a dead one within a second); fail when none is named within the timeout
        or when not surviving losses."""
        if self.membership is None:
            raise exc
        known = self.membership.lost_ranks()
        end = time.monotonic() + self.ctx.timeout.total_seconds()
        while self.membership.lost_ranks() == known:
            if time.monotonic() > end:
                raise exc
            time.sleep(STORE_POLL_S)  # polling the store for the launcher's record
            self.membership.refresh()

    def _answer(self, source: int, theirs: torch.Tensor, mine: torch.Tensor) -> None:
        """One exchange, passive side: our x_pre (copied into `mine`) travels while the active's
        arrives in `theirs` (the link's two directions at once), then we move halfway towards it.
        Paused, we echo theirs instead: the exchange then changes nothing on either side."""
        with self._lock:
            paused = self._paused
            if not paused:
                mine.copy_(self._flat.detach())
        if paused:
            self._wait(dist.irecv(theirs, group=self._group, group_src=source, tag=_PAYLOAD), source)
            self._wait(dist.isend(theirs, group=self._group, group_dst=source, tag=_REPLY), source)
            return
        receive = dist.irecv(theirs, group=self._group, group_src=source, tag=_PAYLOAD)
        send = dist.isend(mine, group=self._group, group_dst=source, tag=_REPLY)
        self._wait(receive, source)
        self._wait(send, source)
        delta = theirs.sub_(mine).mul_(0.5).to(self._flat.device)
        with self._lock:
            if not self._paused:
                self._flat.add_(delta)
            elif self._deferred is None:  # a pause began meanwhile: the parameters stay put until it ends
                self._deferred = delta.clone()
            else:
                self._deferred.add_(delta)

    def _staging(self) -> torch.Tensor:
        """A CPU buffer the size of the parameters: exchanges travel through the CPU (gloo)."""
        return torch.empty(self._flat.numel(), dtype=self._flat.dtype)

    def _raise_answer_error(self) -> None:
        if self._answer_error is not None:
            exc = self._answer_error
            raise TrainingError(f"rank {self.ctx.rank}: adpsgd answering thread failed: "
                                f"{comm.transport_error(exc)}") from exc


def _simulated(config: AdpsgdConfig, job: SimJob) -> Pairwise:
    traffic = exchange_traffic(job.values)
    return Pairwise(traffic["exchange"], traffic["answer"], config.pattern, config.seed, config.delay_by_one)


ADPSGD = StrategyDescriptor(AdpsgdStrategy, Pairwise, _simulated, advised={
    "adpsgd_fixed": {"pattern": "fixed"}, "adpsgd_random": {"pattern": "random"},
    "adpsgd_delay_by_one": {"delay_by_one": True}})
