"""Communication helpers shared by the strategies.

- Timed collectives (`allreduce`, `all_to_all`, `broadcast`, `reduce_scatter`, `all_gather`) that
  account payload bytes and seconds in a `CommCounters` and always wait with a timeout; a
  failure becomes a one-line `CommError` (a `TrainingError`) naming the rank. Launch with `async_op=True` to
  overlap, then `Pending.wait()`.
- Byte accounting: what this learner puts on the wire (ring allreduce 2·S·(n−1)/n).
- Flat packing of tensor lists.

Counters: `comm_seconds` is wall time inside communication calls (launching and waiting, in any
thread); `wait_seconds` is the part during which the training thread was blocked waiting for a
collective to finish, i.e. communication that was not hidden behind computation.
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Sequence

import torch
import torch.distributed as dist

from asrdist.errors import CommError
from asrdist.parallel.base import DEFAULT_TIMEOUT_SECONDS, CommCounters

DEFAULT_TIMEOUT = timedelta(seconds=DEFAULT_TIMEOUT_SECONDS)


# ---------------------------------------------------------------------------- byte accounting

def ring_allreduce_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one learner sends in a ring allreduce of `nbytes`: reduce-scatter + all-gather."""
    return 2 * nbytes * (world_size - 1) // world_size


def all_to_all_bytes(send_split_bytes: Sequence[int], rank: int) -> int:
    """Bytes one learner sends in an all-to-all: every split but the one it keeps."""
    return sum(send_split_bytes) - send_split_bytes[rank]


def reduce_scatter_bytes(nbytes: int, world_size: int) -> int:
    """Bytes one learner sends in a reduce-scatter of `nbytes` in all, or in an all-gather into
    `nbytes` in all: (n−1)/n of it (ring, or one part to each peer)."""
    return nbytes * (world_size - 1) // world_size


@dataclass(frozen=True)
class Transfer:
    """One communication of a strategy's step as one learner sees it: each strategy module's
    `*_traffic` function lists them, from the same layout and byte accounting its run uses, and
    the scaling simulator (`asrdist.sim`) times them."""

    kind: str
    """allreduce | reduce_scatter | all_gather | all_to_all | broadcast | exchange | answer."""
    group: str
    """world | node (this learner's node) | rail (one learner per node) | pair (one partner)."""
    size: int
    """Learners in the group."""
    bytes_sent: int
    """What this learner puts on the wire (as `CommCounters.bytes_sent` counts it)."""
    values: int = 0
    """Entries of the tensor it carries (gradient or parameter values; int32 words for 1-bit)."""


# ------------------------------------------------------------------------ timed collectives

class Pending:
    """An asynchronous collective in flight; `wait()` blocks (with the timeout) until it is done."""

    __slots__ = ("_work", "_counters", "_what", "_timeout", "_done")

    def __init__(self, work, counters: CommCounters, what: str, timeout: timedelta):
        self._work, self._counters, self._what, self._timeout = work, counters, what, timeout
        self._done = False

    def wait(self, stalled: bool = True) -> None:
        """Finish the collective. `stalled`: the training thread is the one waiting (counted in
        wait_seconds); False for a communication thread."""
        if self._done:
            return
        t0 = time.perf_counter()
        try:
            guarded(f"{self._what} (timeout {self._timeout.total_seconds():g} s)",
                   lambda: self._work.wait(self._timeout))
        finally:
            dt = time.perf_counter() - t0
            self._counters.add(comm_seconds=dt, wait_seconds=dt if stalled else 0.0)
            self._done = True


def _rank() -> int:
    return dist.get_rank() if dist.is_initialized() else 0


_GLOO_SOURCE = re.compile(r"^\[[^\]]*\.(?:cc|cpp|h):\d+\]\s*")


def transport_error(exc: BaseException) -> str:
    """A transport error in one line for a user: the first line, without gloo's source location
    and advice ("[.../pair.cc:553] Connection closed by peer [127.0.0.1]:41660. This is typically
    caused by ..." -> "Connection closed by peer [127.0.0.1]:41660")."""
    line = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
    return _GLOO_SOURCE.sub("", line).split(". This is typically caused by")[0].strip() or type(exc).__name__


def guarded(what: str, fn):
    """`fn()`, a torch.distributed call; its transport failure becomes a one-line `CommError`."""
    try:
        return fn()
    except RuntimeError as e:  # DistBackendError and gloo timeouts are RuntimeErrors
        raise CommError(f"rank {_rank()}: {what} failed: {transport_error(e)}") from e


def _launch(what: str, counters: CommCounters, nbytes: int, timeout: timedelta | None,
            async_op: bool, stalled: bool, start) -> Pending | None:
    t0 = time.perf_counter()
    work = guarded(what, start)
    counters.add(comm_seconds=time.perf_counter() - t0, bytes_sent=nbytes)
    pending = Pending(work, counters, what, timeout or DEFAULT_TIMEOUT)
    if async_op:
        return pending
    pending.wait(stalled)
    return None


def allreduce(tensor: torch.Tensor, counters: CommCounters, *, group=None, async_op: bool = False,
              timeout: timedelta | None = None, stalled: bool = True) -> Pending | None:
    """Sum `tensor` in place over the group."""
    n = dist.get_world_size(group)
    nbytes = ring_allreduce_bytes(tensor.numel() * tensor.element_size(), n)
    return _launch("allreduce", counters, nbytes, timeout, async_op, stalled,
                   lambda: dist.all_reduce(tensor, group=group, async_op=True))


def all_to_all(output: torch.Tensor, input: torch.Tensor, output_splits: Sequence[int],
               input_splits: Sequence[int], counters: CommCounters, *, group=None,
               async_op: bool = False, timeout: timedelta | None = None,
               stalled: bool = True) -> Pending | _Then | None:
    """Send input[split s] to rank s and receive rank s's split into output[split s]."""
    rank = dist.get_rank(group)
    nbytes = all_to_all_bytes([n * input.element_size() for n in input_splits], rank)
    return _staged("all_to_all", counters, nbytes, timeout, async_op, stalled, output, input, group,
                   lambda out, inp: dist.all_to_all_single(out, inp, list(output_splits), list(input_splits),
                                                           group=group, async_op=True))


def broadcast(tensor: torch.Tensor, src: int, counters: CommCounters, *, group=None,
              timeout: timedelta | None = None) -> None:
    """Copy `tensor` from rank `src` of `group` to all (counted as the root's n−1 sends)."""
    n = dist.get_world_size(group)
    nbytes = tensor.numel() * tensor.element_size() * (n - 1) if dist.get_rank(group) == src else 0
    _launch("broadcast", counters, nbytes, timeout, False, True,
            lambda: dist.broadcast(tensor, group=group, group_src=src, async_op=True))


# torch 2.13 names them *_single; an older CUDA build (pyproject: >= 2.6) has only the old names.
_reduce_scatter_single = getattr(dist, "reduce_scatter_single", None) or dist.reduce_scatter_tensor
_all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


class _Then:
    """A collective in flight whose result needs one more local step once it has arrived."""

    __slots__ = ("_pending", "_then")

    def __init__(self, pending: Pending, then):
        self._pending, self._then = pending, then

    def wait(self, stalled: bool = True) -> None:
        if self._then is None:
            return
        self._pending.wait(stalled)
        then, self._then = self._then, None
        then()


def needs_staging(tensor: torch.Tensor, group=None) -> bool:
    """gloo moves device (CUDA) tensors itself only in allreduce and broadcast: its all-to-all and
    all-gather take CPU tensors, so those travel through a CPU copy (torch's backend table)."""
    return tensor.device.type != "cpu" and dist.get_backend(group) == "gloo"


def _staged(what: str, counters: CommCounters, nbytes: int, timeout: timedelta | None, async_op: bool,
            stalled: bool, output: torch.Tensor, input: torch.Tensor, group, start) -> Pending | _Then | None:
    """`start(output, input)` as a timed collective; through CPU copies of both where
    `needs_staging`, the result copied back onto the device once it has arrived."""
    if not needs_staging(input, group):
        return _launch(what, counters, nbytes, timeout, async_op, stalled, lambda: start(output, input))
    host_out, host_in = torch.empty(output.shape, dtype=output.dtype), input.cpu()
    pending = _launch(what, counters, nbytes, timeout, True, stalled, lambda: start(host_out, host_in))
    done = _Then(pending, lambda: output.copy_(host_out))
    if async_op:
        return done
    done.wait(stalled)
    return None


def reduce_scatter(output: torch.Tensor, input: torch.Tensor, counters: CommCounters, *, group=None,
                   async_op: bool = False, timeout: timedelta | None = None,
                   stalled: bool = True) -> Pending | _Then | None:
    """Sum `input` (n equal parts) over the group; this rank's part of the sum goes to `output`.

    Under gloo, whose reduce-scatter is an allreduce of the whole input followed by a copy (it
    sends 2·S·(n−1)/n per learner, measured on torch 2.13 on loopback), this is an all-to-all of
    the parts and a local sum in rank order: S·(n−1)/n, as NCCL's ring reduce-scatter."""
    n = dist.get_world_size(group)
    if input.numel() != n * output.numel():
        raise ValueError(f"reduce_scatter: input has {input.numel()} values, not {n} x {output.numel()}")
    nbytes = reduce_scatter_bytes(input.numel() * input.element_size(), n)
    if dist.get_backend(group) != "gloo":
        return _launch("reduce_scatter", counters, nbytes, timeout, async_op, stalled,
                       lambda: _reduce_scatter_single(output, input, group=group, async_op=True))
    parts = torch.empty((n, output.numel()), dtype=input.dtype, device=input.device)
    pending = _staged("reduce_scatter", counters, nbytes, timeout, True, stalled, parts, input.view(n, -1), group,
                      lambda out, inp: dist.all_to_all_single(out, inp, group=group, async_op=True))
    done = _Then(pending, lambda: torch.sum(parts, dim=0, out=output.view(-1)))
    if async_op:
        return done
    done.wait(stalled)
    return None


def all_gather(output: torch.Tensor, input: torch.Tensor, counters: CommCounters, *, group=None,
               async_op: bool = False, timeout: timedelta | None = None,
               stalled: bool = True) -> Pending | _Then | None:
    """Concatenate every rank's `input`, in rank order, into `output` on all ranks."""
    n = dist.get_world_size(group)
    if output.numel() != n * input.numel():
        raise ValueError(f"all_gather: output has {output.numel()} values, not {n} x {input.numel()}")
    nbytes = reduce_scatter_bytes(output.numel() * output.element_size(), n)
    return _staged("all_gather", counters, nbytes, timeout, async_op, stalled, output, input, group,
                   lambda out, inp: _all_gather_single(out, inp, group=group, async_op=True))


def broadcast_module(module: torch.nn.Module, counters: CommCounters, *, src: int = 0, group=None,
                     timeout: timedelta | None = None, buffers: bool = True, parameters: bool = True) -> None:
    """Make every learner's parameters (and buffers) equal to rank `src`'s, one flat tensor per
    (device, dtype); `parameters=False`: the buffers alone."""
    tensors = [p.data for p in module.parameters()] if parameters else []
    if buffers:
        tensors += [b for b in module.buffers()]
    for same in group_by_kind(tensors).values():
        flat = flatten(same)
        broadcast(flat, src, counters, group=group, timeout=timeout)
        unflatten_into(flat, same)


def allreduce_mean(tensors: Sequence[torch.Tensor], counters: CommCounters, *, group=None,
                   timeout: timedelta | None = None) -> None:
    """Replace each of `tensors` in place by its mean over `group`: one flat allreduce per (device, dtype)."""
    n = dist.get_world_size(group)
    for same in group_by_kind(tensors).values():
        flat = flatten(same)
        allreduce(flat, counters, group=group, timeout=timeout)
        unflatten_into(flat.div_(n), same)


# ------------------------------------------------------------------------- flat packing

def group_by_kind(tensors: Sequence[torch.Tensor]) -> dict[tuple, list[torch.Tensor]]:
    """Tensors grouped by (device, dtype), order kept: a flat buffer holds one kind."""
    groups: dict[tuple, list[torch.Tensor]] = {}
    for t in tensors:
        groups.setdefault((t.device, t.dtype), []).append(t)
    return groups


def flatten(tensors: Sequence[torch.Tensor], out: torch.Tensor | None = None) -> torch.Tensor:
    """Concatenate the tensors' values into one 1-D tensor (`out` if given)."""
    total = sum(t.numel() for t in tensors)
    if out is None:
        out = torch.empty(total, dtype=tensors[0].dtype, device=tensors[0].device)
    elif out.numel() != total:
        raise ValueError(f"flatten: out has {out.numel()} elements, the tensors {total}")
    offset = 0
    for t in tensors:
        out[offset:offset + t.numel()].view_as(t).copy_(t)
        offset += t.numel()
    return out


def flat_views(flat: torch.Tensor, shapes: Sequence[torch.Size]) -> list[torch.Tensor]:
    """Views of `flat` shaped like `shapes`, in order."""
    views, offset = [], 0
    for shape in shapes:
        n = int(torch.Size(shape).numel())
        views.append(flat[offset:offset + n].view(shape))
        offset += n
    return views


def unflatten_into(flat: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy `flat` back into the tensors it was flattened from."""
    for t, view in zip(tensors, flat_views(flat, [t.shape for t in tensors])):
        t.copy_(view)
