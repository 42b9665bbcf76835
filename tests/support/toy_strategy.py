"""`toy`: a strategy in one file, for tests/e2e/test_toy_strategy.py, which copies it into a copy of
the package as asrdist/parallel/toy.py and adds one line to `parallel.STRATEGIES`. Every learner
sums its gradients with the others', one allreduce per parameter, and steps with the mean."""
from __future__ import annotations

import math

from asrdist.parallel import comm
from asrdist.parallel.base import LearnerContext, Strategy, parameters_with_grad
from asrdist.parallel.descriptor import LockStep, SimJob, StrategyDescriptor


class ToyStrategy(Strategy):
    name = "toy"

    def setup(self, model, optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        if ctx.distributed:  # every learner starts from rank 0's parameters
            comm.broadcast_module(model, self.counters, src=0, group=ctx.group, timeout=ctx.timeout)

    def after_backward(self) -> None:
        if not self.ctx.distributed:
            return
        for p in parameters_with_grad(self.model):  # the tone corpus's models use every parameter
            comm.allreduce(p.grad, self.counters, group=self.ctx.group, timeout=self.ctx.timeout)
            p.grad.div_(self.ctx.world_size)
        self.counters.add(exchanges=1)


def traffic(config: None, job: SimJob) -> LockStep:
    """One step as a learner sends it: a ring allreduce of each parameter, after backward."""
    n = job.learners
    return LockStep([[comm.Transfer("allreduce", "world", n, comm.ring_allreduce_bytes(4 * values, n), values)]
                     for values in (math.prod(s) for s in reversed(job.shapes))])


TOY = StrategyDescriptor(ToyStrategy, LockStep, traffic)
