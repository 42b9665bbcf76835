"""The simulator's traffic is the strategies' own: for every strategy, 4 real gloo learners train
a few steps through `Trainer.train_step`, and every learner's counted bytes equal the bytes the
simulator's learner sends in the same steps (2 nodes x 2 learners where nodes matter)."""
from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from asrdist.parallel import build_strategy, comm, strategy_config_class
from asrdist.sim.cluster import Cluster
from asrdist.sim.engine import simulate
from asrdist.sim.spec import SimSpec
from tests.support.dist_utils import learner_context, run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

STEPS, BATCH = 4, 8
CASES = {  # name -> (strategy, settings, group size)
    "sync": ("sync", {"hierarchical": "false", "bucket_cap_mb": 0.0001}, 4),
    "sync_hierarchical": ("sync", {"hierarchical": "true"}, 2),
    "ddp": ("ddp", {}, 4),
    "ddp_fp16": ("ddp", {"hook": "fp16"}, 4),  # (powersgd: its plain first steps are not simulated)
    "onebit": ("onebit", {}, 4),
    "onebit_double_buffering": ("onebit", {"double_buffering": True}, 4),
    "onebit_hierarchical": ("onebit", {"hierarchical": "true"}, 2),
    "averaging": ("averaging", {"average_every": 2 * BATCH, "samples_per_step": BATCH}, 4),
    "adpsgd": ("adpsgd", {}, 4),
    "adpsgd_random_delay_by_one": ("adpsgd", {"pattern": "random", "delay_by_one": True}, 4),
    "hierarchical": ("hierarchical", {}, 2),
    "hybrid_synchronous": ("hybrid", {"sync_epochs": 1}, 2),
    "averaging_momentum": ("averaging", {"average_every": 2 * BATCH, "samples_per_step": BATCH}, 4),
}
MOMENTUM = {"averaging_momentum": 0.9}
"""Cases whose learners' SGD keeps a momentum buffer (averaging averages it with the parameters)."""


def _model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.Tanh(), torch.nn.Linear(5, 3))


def _numel() -> int:
    return sum(p.numel() for p in _model().parameters())


def _consensus_bytes(strategy: str, rank: int, world: int, group: int, copies: int = 1) -> int:
    """What `finalize` sends (the final average; hierarchical: the leaders', then the node broadcast)."""
    size = 4 * _numel() * copies
    if strategy in ("adpsgd", "averaging"):
        return comm.ring_allreduce_bytes(size, world)
    if strategy in ("hierarchical", "hybrid") and rank % group == 0:
        return comm.ring_allreduce_bytes(size, world // group) + size * (group - 1)
    return 0


def _learn(rank: int, world: int) -> dict[str, int]:
    from asrdist.parallel.groups import build_groups

    base = learner_context()
    node_groups = build_groups(rank, world, 2, base.timeout)  # every rank, same order
    gen = torch.Generator().manual_seed(rank)
    batches = [(torch.randn(BATCH, 7, generator=gen), torch.randint(0, 3, (BATCH,), generator=gen))
               for _ in range(STEPS)]
    sent = {}
    for name, (strategy_name, settings, group) in CASES.items():
        ctx = base if group == world else replace(base, groups=node_groups, group_size=group)
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=MOMENTUM.get(name, 0.0))
        strategy = build_strategy(strategy_name, strategy_config_class(strategy_name)(**settings))
        strategy.setup(model, optimizer, ctx)
        strategy.start_epoch(0)
        before = strategy.counters.bytes_sent  # set-up's broadcast is not a step's
        # a passive answers on its own thread: no active may step before every passive read `before`
        torch.distributed.barrier()
        train_steps(make_trainer(model, optimizer, strategy, lr=0.1), batches)
        strategy.close(None)
        strategy.finalize()
        final = _consensus_bytes(strategy_name, rank, world, group, copies=1 + (name in MOMENTUM))
        sent[name] = strategy.counters.bytes_sent - before - final
    return sent


@pytest.mark.slow
def test_simulated_bytes_equal_the_counted_bytes_of_every_strategy(tmp_path):
    counted = run_distributed(_learn, 4, tmp_path)
    shapes = [tuple(p.shape) for p in _model().parameters()]
    for name, (strategy_name, settings, group) in CASES.items():
        spec = SimSpec(strategy_name, strategy_config_class(strategy_name)(**settings), shapes,
                       Cluster(4 // group, group), BATCH, 1e-3, steps=STEPS, synchronous=name.startswith("hybrid"),
                       state_copies=int(name in MOMENTUM))
        simulated = simulate(spec).bytes_sent
        assert simulated == [c[name] for c in counted], name
        assert sum(simulated) > 0, name


def test_onebit_exchange_bytes_from_the_shared_plan_equal_each_ranks_own_plan():
    """The simulator builds one 1-bit plan per (shapes, learners, chunks): what every owner holds
    must be what each rank's own plan says, for any rank, size and chunking."""
    from asrdist.parallel.onebit_plan import _Chunks, _Plan, shared_owner_numel

    shapes = ((512, 441), (512, 513), (40, 513), (7, 3))
    for n in (2, 3, 5, 8, 17):
        for chunks in (1, 2, 3):
            shared = shared_owner_numel(shapes, n, chunks)
            for rank in range(n):
                assert _Chunks(_Plan(list(shapes), n, rank), chunks).owner_numel == shared, (n, chunks, rank)
