"""`adpsgd`: asynchronous decentralized parallel SGD (Lian et al. 2018; IBM ICASSP 2019,
Interspeech 2019, ICASSP 2020), DESIGN.md §5.5.

Learners sit on a ring split into a fixed *active* set (even positions) and a fixed *passive* set
(`asrdist.parallel.topology`): actives start every exchange, passives only answer, whoever asks,
in arrival order, from a communication thread while their trainer computes. Nobody waits for
anybody but the partner of the exchange in progress: no barrier or collective inside an epoch.

One exchange between active i and passive j (both sides apply x ← x + (x_other_pre − x_pre)/2):
1. i takes x_i_pre (its parameters after its last local step) and sends it to j;
2. j, under its parameter lock, copies x_j_pre and adds (x_i_pre − x_j_pre)/2, then returns
   x_j_pre; 3. i adds (x_j_pre − x_i_pre)/2 under its lock. Both end at the average of the
   pre-exchange values plus whatever local step ran meanwhile, so averaging and the local step
   x ← x − η·g (taken under the same lock, `apply_update`) never lose an update, and the sum of
   all parameters is preserved exactly by the averaging.
Partners: `fixed` alternates each active between its two ring neighbours; `random` draws every
round's partners from a permutation seeded by (strategy.seed, round), so nothing is negotiated.
`delay_by_one`: the exchange of step k runs on the active's communication thread while step k+1's
gradient is computed (x_{k+1} = W_k x_k − η g(x_{k−1})).

While a passive is paused (its trainer checkpoints or validates) it answers by echoing x_i_pre:
the exchange then changes nothing on either side. At the end every active says goodbye to every
passive; when a passive has heard all of them its thread ends, and `finalize` leaves the average
of all learners (one allreduce) in the model. Transport: torch.distributed point-to-point on one
gloo group of the strategy's learners (CPU staging on GPUs: NCCL cannot receive from any source).
"""
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

from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import comm, topology
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.consensus import average_into, consensus_distance

_HEADER, _PAYLOAD, _REPLY = 1, 2, 3  # message tags
_EXCHANGE, _GOODBYE = 1, 2  # header kinds
_PASSIVE_WAIT = timedelta(days=1)  # a passive may hear nothing for a whole validation


@dataclass
class AdpsgdConfig:
    pattern: str = "fixed"
    """fixed: each active alternates between its ring neighbours; random: partners from a
    permutation every learner draws from `seed` and the round (IBM ICASSP 2020)."""
    delay_by_one: bool = False
    """Overlap the exchange of step k with the gradient of step k+1."""
    seed: int = 0
    """Seed of the random pattern's permutations (the same on every learner)."""

    def __post_init__(self):
        if self.pattern not in topology.PATTERNS:
            raise ConfigError(f"strategy.pattern: expected one of {', '.join(topology.PATTERNS)}, got {self.pattern!r}")
        if not isinstance(self.delay_by_one, bool):
            raise ConfigError(f"strategy.delay_by_one: expected true or false, got {self.delay_by_one!r}")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or self.seed < 0:
            raise ConfigError(f"strategy.seed: expected an integer >= 0, got {self.seed!r}")


def exchange_traffic(numel: int, element_size: int = 4) -> dict[str, comm.Transfer]:
    """One pairwise exchange of `numel` parameters as each side sends it: the active's header
    (two int64) and parameters, the passive's reply. The strategy counts exactly these."""
    return {"exchange": comm.Transfer("exchange", "pair", 2, 2 * 8 + numel * element_size, numel),
            "answer": comm.Transfer("answer", "pair", 2, numel * element_size, numel)}


def exchange_group(ranks: list[int] | None):
    """The gloo group pairwise exchanges travel on (every rank of the job must call this)."""
    return dist.new_group(ranks, timeout=_PASSIVE_WAIT, backend="gloo")


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


class AdpsgdStrategy(Strategy):
    name = "adpsgd"
    config_class = AdpsgdConfig
    lockstep = False

    def __init__(self, config: AdpsgdConfig | None = None):
        super().__init__(config)
        self._lock = threading.Lock()
        self._paused = False
        self._round = 0
        self._flat: torch.Tensor | None = None
        self._group = None
        self._executor: ThreadPoolExecutor | None = None
        self._pending: Future | None = None
        self._answerer: threading.Thread | None = None
        self._answer_error: BaseException | None = None
        self._said_goodbye = False
        self.p2p_group = None
        """The group exchanges travel on (default: made at setup over the strategy's learners);
        a hierarchical strategy makes it on every rank, leaders only take part."""

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
        self._group = self.p2p_group or exchange_group(
            None if ctx.group is None else dist.get_process_group_ranks(ctx.group))
        self.active = topology.is_active(ctx.rank, ctx.world_size)
        if self.active and self.config.delay_by_one:
            self._executor = ThreadPoolExecutor(1, thread_name_prefix="adpsgd-exchange")
        if not self.active:
            self._answerer = threading.Thread(target=self._answer_loop, name="adpsgd-answer", daemon=True)
            self._answerer.start()

    @property
    def _cpu(self) -> bool:
        return self._flat is not None and self._flat.device.type == "cpu"

    # -- the trainer's hooks ---------------------------------------------------------------
    def apply_update(self, step_fn: Callable[[], None]) -> None:
        with self._lock:
            step_fn()

    def after_step(self) -> None:
        self._raise_answer_error()
        if not self.ctx.distributed or not self.active:
            return
        partner = topology.partner(self.ctx.rank, self.ctx.world_size, self._round, self.config.pattern,
                                   self.config.seed)
        self._round += 1
        if self._executor is None:
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

    def epoch_end_metrics(self) -> dict:
        distance = consensus_distance(self.model, world_size=self.ctx.world_size, group=self.ctx.group,
                                      timeout=self.ctx.timeout)
        return {"consensus_distance": distance}

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
        self._wait_pending()
        self._say_goodbye()
        if self._answerer is not None:
            self._answerer.join(self.ctx.timeout.total_seconds())
            if self._answerer.is_alive():
                raise TrainingError(f"rank {self.ctx.rank}: adpsgd: not every active learner said goodbye "
                                    f"within {self.ctx.timeout.total_seconds():g} s")
        self._raise_answer_error()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        with torch.no_grad():
            average_into(self.model, self.counters, group=self.ctx.group, timeout=self.ctx.timeout)

    def state_dict(self) -> dict:
        return {**super().state_dict(), "round": self._round}

    def load_state_dict(self, state: dict) -> None:
        super().load_state_dict(state)
        self._round = int(state.get("round", 0))

    # -- the exchange ------------------------------------------------------------------------
    def _snapshot(self) -> torch.Tensor:
        with self._lock:
            return self._flat.detach().to("cpu", copy=True)

    def _exchange(self, partner: int, mine_pre: torch.Tensor, stalled: bool) -> None:
        """Active side: send x_pre, get the partner's x_pre back, move halfway towards it."""
        t0 = time.perf_counter()
        what = f"adpsgd exchange with rank {partner}"
        header = torch.tensor([_EXCHANGE, self._round], dtype=torch.int64)
        comm._guard(what, lambda: dist.send(header, group=self._group, group_dst=partner, tag=_HEADER))
        comm._guard(what, lambda: dist.send(mine_pre, group=self._group, group_dst=partner, tag=_PAYLOAD))
        theirs = torch.empty_like(mine_pre)
        work = comm._guard(what, lambda: dist.irecv(theirs, group=self._group, group_src=partner, tag=_REPLY))
        comm._guard(f"{what} (timeout {self.ctx.timeout.total_seconds():g} s)",
                    lambda: work.wait(self.ctx.timeout))
        delta = theirs.sub_(mine_pre).mul_(0.5).to(self._flat.device)
        with self._lock:
            self._flat.add_(delta)
        dt = time.perf_counter() - t0
        self.counters.bytes_sent += exchange_traffic(mine_pre.numel(), mine_pre.element_size())["exchange"].bytes_sent
        self.counters.exchanges += 1
        self.counters.comm_seconds += dt
        if stalled:
            self.counters.wait_seconds += dt

    def _wait_pending(self) -> None:
        if self._pending is not None:
            t0 = time.perf_counter()
            pending, self._pending = self._pending, None
            pending.result()
            self.counters.wait_seconds += time.perf_counter() - t0

    def _say_goodbye(self) -> None:
        if self._said_goodbye or not self.ctx.distributed or not self.active:
            return
        self._said_goodbye = True
        header = torch.tensor([_GOODBYE, self._round], dtype=torch.int64)
        for passive in topology.passive_ranks(self.ctx.world_size):
            comm._guard(f"adpsgd goodbye to rank {passive}",
                        lambda: dist.send(header, group=self._group, group_dst=passive, tag=_HEADER))

    def _answer_loop(self) -> None:
        """Passive side: answer whoever asks, in arrival order, until every active said goodbye."""
        try:
            actives = len(topology.active_ranks(self.ctx.world_size))
            goodbyes = 0
            header = torch.empty(2, dtype=torch.int64)
            theirs = torch.empty(self._flat.numel(), dtype=self._flat.dtype)
            while goodbyes < actives:
                source = dist.get_group_rank(self._group, dist.recv(header, group=self._group, tag=_HEADER))
                if int(header[0]) == _GOODBYE:
                    goodbyes += 1
                    continue
                dist.recv(theirs, group=self._group, group_src=source, tag=_PAYLOAD)
                t0 = time.perf_counter()
                with self._lock:
                    if self._paused:
                        reply = theirs  # an echo: the exchange changes nothing on either side
                    else:
                        mine = self._flat.detach().to("cpu", copy=True)
                        self._flat.add_(theirs.sub(mine).mul_(0.5).to(self._flat.device))
                        reply = mine
                dist.send(reply, group=self._group, group_dst=source, tag=_REPLY)
                self.counters.answer_seconds += time.perf_counter() - t0
                self.counters.comm_seconds += time.perf_counter() - t0
                self.counters.bytes_sent += exchange_traffic(reply.numel(), reply.element_size())["answer"].bytes_sent
                self.counters.exchanges += 1
        except BaseException as exc:  # reported to the training thread at its next step
            self._answer_error = exc

    def _raise_answer_error(self) -> None:
        if self._answer_error is not None:
            exc = self._answer_error
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise TrainingError(f"rank {self.ctx.rank}: adpsgd answering thread failed: {first}") from exc
