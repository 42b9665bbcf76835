"""adpsgd's two recurrences on gloo learners that train through `Trainer.train_step`, against the
same recurrences computed in one process (`_reference`), with SGD + momentum as the optimizer:

plain (Lian et al. 2018, Alg. 1)  x_{k+1} = W_k x_k − η u(g(x_k)): the gradient of the model
                                  before averaging, the average, then the step;
delay_by_one (IBM)                x_{k+1} = W_k x_k − η u(g(x_{k−1})) on every learner, passives too;

u is the optimizer's step (momentum: each learner's own buffer, never averaged). Plain `adpsgd` (an
active and a passive), `hierarchical` and `hybrid` (two nodes of two learners: each node's g is the
mean of its members', the leaders average) follow the same recurrence, hybrid after synchronous steps
(every learner steps with the mean of all four gradients).

Determinism, without sleeps: in the passive's process its answers are gated. Exchange j is answered
only once the passive's trainer has computed the gradient the recurrence pairs with it (plain: step
j−1's; delay: step j's) and the passive steps only once that exchange has landed; an active's
parameters change only on its own thread. Before issue 63 (x ← W(x − ηg); passives stepping with
their current gradient under delay-by-one; a hybrid leader holding gradients in its synchronous
epochs) every case fails."""
from __future__ import annotations

import threading
from dataclasses import replace

import pytest
import torch
import torch.distributed as dist

from asrdist.cluster.process_group import build_groups
from asrdist.parallel.adpsgd import AdpsgdConfig, AdpsgdStrategy
from asrdist.parallel.hierarchical import HierarchicalConfig, HierarchicalStrategy, HybridConfig, HybridStrategy
from tests.support.dist_utils import TIMEOUT, learner_context, run_distributed
from tests.support.engine_fixture import ListOrder, mse_loss
from tests.support.strategy_harness import make_trainer, train_steps

pytestmark = pytest.mark.slow

LR, MOMENTUM, STEPS = 0.05, 0.9, 5
WAIT_S = 60.0


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 3), torch.nn.Tanh(), torch.nn.Linear(3, 1))


def _batches(rank: int, steps: int):
    return ListOrder(steps, seed=1 + rank).batches  # every learner its own data


def _start(unit: int, flat: torch.Tensor) -> torch.Tensor:
    """The node's starting point: apart from the other node's, so that every exchange moves both."""
    return flat + torch.randn(flat.shape, generator=torch.Generator().manual_seed(10 + unit))


def _vector(model: torch.nn.Module) -> torch.Tensor:
    return torch.nn.utils.parameters_to_vector(model.parameters()).detach().clone()


class _Gate:
    """The passive's side of the schedule: `ready` exchanges may be answered, `answered` were."""

    def __init__(self):
        self.cond = threading.Condition()
        self.ready = 0
        self.answered = 0

    def allow(self, j: float) -> None:
        with self.cond:
            self.ready = j
            self.cond.notify_all()

    def wait_answered(self, j: int) -> None:
        with self.cond:
            if not self.cond.wait_for(lambda: self.answered >= j, WAIT_S):
                raise AssertionError(f"exchange {j} was not answered within {WAIT_S} s")

    def gate_answers(self) -> None:
        """Every exchange this process answers waits for `allow` (AdpsgdStrategy._answer, class-wide:
        hierarchical builds its adpsgd at setup, which starts the answering thread)."""
        original = AdpsgdStrategy._answer

        def gated(strategy, source, theirs, mine):
            with self.cond:
                if not self.cond.wait_for(lambda: self.ready > self.answered, WAIT_S):
                    raise AssertionError("the passive's trainer never allowed an answer")
            original(strategy, source, theirs, mine)
            with self.cond:
                self.answered += 1
                self.cond.notify_all()
        AdpsgdStrategy._answer = gated


def _build(name: str, delay_by_one: bool, sync_epochs: int, rank: int, world_size: int):
    ctx = learner_context()
    if name == "adpsgd":
        return AdpsgdStrategy(AdpsgdConfig(delay_by_one=delay_by_one)), ctx, rank, rank == 1
    ctx = replace(ctx, groups=build_groups(rank, world_size, 2, TIMEOUT), group_size=2)
    if name == "hierarchical":
        strategy = HierarchicalStrategy(HierarchicalConfig(delay_by_one=delay_by_one))
    else:
        strategy = HybridStrategy(HybridConfig(delay_by_one=delay_by_one, sync_epochs=sync_epochs))
    return strategy, ctx, rank // 2, rank == 2  # node 1's leader is the passive leader


def _learner(rank: int, world_size: int, name: str, delay_by_one: bool, sync_steps: int, steps: int,
             accumulate: int = 1):
    strategy, ctx, unit, gated = _build(name, delay_by_one, 1 if sync_steps else 0, rank, world_size)
    gate = _Gate()
    if gated:
        gate.gate_answers()
    model = _model()
    opt = torch.optim.SGD(model.parameters(), lr=LR, momentum=MOMENTUM)
    strategy.setup(model, opt, ctx)
    with torch.no_grad():  # in place: the parameters are views of the strategy's flat buffer
        start = _start(unit, _vector(model))
        for p, value in zip(model.parameters(), torch.split(start, [p.numel() for p in model.parameters()])):
            p.copy_(value.reshape(p.shape))
    dist.barrier()  # every starting point set before the first exchange
    trainer = make_trainer(model, opt, strategy, lr=LR, accumulate=accumulate)
    step = {"k": 0, "async": False}
    if gated:
        hook = strategy.after_backward

        def after_backward():  # the gradient of step k is computed: the exchange it pairs with may run
            hook()
            if step["async"]:
                k = step["k"] - sync_steps
                j = k if delay_by_one else k + 1
                gate.allow(j)
                gate.wait_answered(j)
        strategy.after_backward = after_backward
    trajectory = []

    def record():
        trajectory.append(_vector(model))
        step["k"] += 1
    batches = _batches(rank, steps)
    if sync_steps:
        strategy.start_epoch(0)
        train_steps(trainer, batches[:sync_steps], after_each=record)
        strategy.start_epoch(1)
    step["async"] = True
    train_steps(trainer, batches[sync_steps:], after_each=record)
    gate.allow(float("inf"))
    outer = strategy if name == "adpsgd" else strategy.outer
    if outer is not None:  # a leader: the last exchange lands, the passive hears the goodbye
        outer.end_exchanges()
        outer.await_goodbyes([0, 1])
    return {"trajectory": trajectory, "end": _vector(model)}


def _flat_grad(x: torch.Tensor, batch) -> torch.Tensor:
    model = _model()
    torch.nn.utils.vector_to_parameters(x, model.parameters())
    loss, _ = mse_loss(model, batch)
    return torch.cat([g.reshape(-1) for g in torch.autograd.grad(loss, list(model.parameters()))])


def _reference(x0: list[torch.Tensor], batches: list[list[list]], delay_by_one: bool, sync_steps: int, steps: int):
    """Two units (learners, or nodes whose members' gradients are averaged): `sync_steps` steps
    with the mean gradient of every member, then the recurrence; returns each unit's parameters
    after every step and at the end (delay-by-one: the exchange of x_K, in flight, lands)."""
    xs = [x.clone() for x in x0]
    models = [_model() for _ in xs]
    opts = [torch.optim.SGD(m.parameters(), lr=LR, momentum=MOMENTUM) for m in models]
    held = [None, None]
    trajectories = [[], []]

    def step(u, g):
        torch.nn.utils.vector_to_parameters(xs[u], models[u].parameters())
        for p, v in zip(models[u].parameters(), torch.split(g, [p.numel() for p in models[u].parameters()])):
            p.grad = v.reshape(p.shape).clone()
        opts[u].step()
        xs[u] = torch.nn.utils.parameters_to_vector(models[u].parameters()).detach().clone()

    def average():
        mean = (xs[0] + xs[1]) / 2
        xs[0], xs[1] = mean.clone(), mean.clone()

    for k in range(steps):
        g = [torch.stack([_flat_grad(xs[u], member[k]) for member in batches[u]]).mean(0) for u in (0, 1)]
        if k < sync_steps:
            every = (g[0] + g[1]) / 2
            g = [every, every]
            for u in (0, 1):
                step(u, g[u])
        elif not delay_by_one:
            average()  # W_k x_k, then − η u(g(x_k))
            for u in (0, 1):
                step(u, g[u])
        else:
            if k > sync_steps:  # W_k x_k: the exchange of x_k (none before the first asynchronous step)
                average()
            for u in (0, 1):
                if held[u] is not None:  # − η u(g(x_{k−1}))
                    step(u, held[u])
            held = g
        for u in (0, 1):
            trajectories[u].append(xs[u].clone())
    if delay_by_one:
        average()
    return trajectories, xs


CASES = [("adpsgd", False, 0, 1), ("adpsgd", True, 0, 1), ("hierarchical", False, 0, 1), ("hierarchical", True, 0, 1),
         ("hybrid", True, 2, 1),
         # train.accumulate: each step's gradient from 3 micro-batches (uneven: 8 rows), one exchange
         # a step; hierarchical's node sync holds its hooks back until the last micro-batch
         ("adpsgd", False, 0, 3), ("hierarchical", True, 0, 3)]


@pytest.mark.parametrize("name,delay_by_one,sync_steps,accumulate", CASES)
def test_the_update_is_the_papers_recurrence(tmp_path, name, delay_by_one, sync_steps, accumulate):
    n = 2 if name == "adpsgd" else 4
    results = run_distributed(_learner, n, tmp_path, name, delay_by_one, sync_steps, STEPS, accumulate)
    per_unit = 1 if n == 2 else 2
    units = [list(range(u * per_unit, (u + 1) * per_unit)) for u in (0, 1)]
    x0 = [_start(u, _vector(_model())) for u in (0, 1)]
    batches = [[_batches(r, STEPS) for r in members] for members in units]
    trajectories, ends = _reference(x0, batches, delay_by_one, sync_steps, STEPS)
    for u, members in enumerate(units):
        for r in members:  # every learner of the unit, after every step (hierarchical: after the broadcast)
            for k, (got, want) in enumerate(zip(results[r]["trajectory"], trajectories[u])):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-6, msg=f"rank {r} after step {k}")
        torch.testing.assert_close(results[members[0]]["end"], ends[u], rtol=0, atol=1e-6)
    # the recurrence is not the other one under another name
    other, _ = _reference(x0, batches, not delay_by_one, sync_steps, STEPS)
    assert (other[0][-1] - trajectories[0][-1]).abs().max() > 1e-4

