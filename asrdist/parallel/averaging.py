"""`averaging`: periodic model averaging (Povey, Zhang & Khudanpur 2015; Kaldi's parallel training).

Every learner starts from rank 0's parameters, trains alone on its own shard and:
1. counts its minibatches, each as `samples_per_step` samples (or the first one's, if 0): a count
   every learner keeps identically, so all reach step 2 at the same step without a collective;
2. every `average_every` samples, replaces its parameters (and float buffers, and by default the
   optimizer's momentum/accumulator: `average_momentum`) by the weighted mean over learners, ONE
   flattened allreduce; learner i contributes w_i·x_i, the sum divided by Σ w_i;
3. with `exclude_threshold`, a learner whose mean objective since the last average is worse than
   the best by more than it (or non-finite) gets w_i = 0 (Kaldi's "successful models" rule);
4. `lr_scale()` is 1 unless `scale_lr` (the factor n is already in the trainer's split batch);
5. with block momentum (BMUF, Chen & Huo 2016; CNTK's BlockMomentumSGD), after the average x̄:
   G = x̄ − b, Δ ← ηΔ + ζG, x_g = b + Δ; learners restart from b ← x_g (+ ηΔ with Nesterov), no
   extra communication; η = 0, ζ = 1 (the default) is plain averaging, bit for bit;
6. `finalize()` averages once more: every learner ends with the identical consensus model (with
   block momentum, the global model x_g without the Nesterov look-ahead).
Why momentum is averaged, the learning-rate argument and block momentum's default:
docs/strategies.md#averaging-periodic-model-averaging-parallelaveragingpy."""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from asrdist.checks import check_field
from asrdist.errors import ConfigError, TrainingError
from asrdist.parallel import comm
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.descriptor import LockStep, SimJob, StrategyDescriptor


@dataclass
class AveragingConfig:
    average_every: int = 20000
    """Samples (frames for the DNN) each learner trains on between two averages, counted as
    minibatches x `samples_per_step` so that every learner averages at the same step. Kaldi averages
    about every 400k samples; on the built-in corpus (~230k training frames) 20k is about 3
    averages per epoch with 4 learners, and configs/averaging.yaml uses 10k (about 6)."""
    samples_per_step: int = 0
    """Samples one learner's minibatch counts for (its nominal size, e.g. data.batch_size / n
    frames): learners average every ceil(average_every / samples_per_step) minibatches, a count
    that is the same on every learner whatever frames each minibatch actually has (reports are
    not added to it). 0: the learner's nominal minibatch (`LearnerContext.samples_per_step`, set
    by the learner builder: frames, chunks x chunk length, or CTC's frame budget), else the size of
    the first minibatch reported with `note_samples(n)`; a later report of another size then
    stops training with an error."""
    scale_lr: bool = False
    """true: lr_scale() = number of learners (Kaldi's rule, right when each learner's batch stays
    the size lr was tuned for); false (default): the global batch is split, the mean over B/n
    frames already carries the factor n (module docstring)."""
    exclude_threshold: float | None = None
    """Leave out of an average every learner whose mean objective since the last average exceeds
    the best learner's by more than this (objective units, e.g. nats/frame; Kaldi uses 1.0);
    None disables exclusion and its tiny extra allreduce."""
    average_momentum: bool = True
    """Also average the optimizer's per-parameter state tensors (momentum buffers; AdaGrad's
    accumulator), if it has any; false keeps them local to each learner."""

    block_momentum: Any = 0.0
    """η of block momentum (BMUF): a number in [0, 1), or auto = CNTK's default 1 − 1/n for n
    learners. 0 with block_lr 1 (the default) is plain averaging; see docs/strategies.md for why
    the default is not CNTK's (this trainer's split batch already carries the factor n)."""
    block_lr: float = 1.0
    """ζ of block momentum (BMUF's block learning rate): the averaged change's weight in Δ."""
    block_nesterov: bool = True
    """Nesterov-style block momentum (CNTK's default): learners restart from x_g + ηΔ."""

    def __post_init__(self):
        self.block_momentum = check_block_momentum(self.block_momentum)
        check_field("strategy.block_lr", self.block_lr, float, above=0)
        check_field("strategy.block_nesterov", self.block_nesterov, bool)
        check_field("strategy.average_every", self.average_every, at_least=1)
        check_field("strategy.samples_per_step", self.samples_per_step, at_least=0)
        if self.exclude_threshold is not None:
            check_field("strategy.exclude_threshold", self.exclude_threshold, float, at_least=0)
        for name in ("scale_lr", "average_momentum"):
            check_field(f"strategy.{name}", getattr(self, name), bool)


def check_block_momentum(value: Any) -> float | str:
    """`strategy.block_momentum`: "auto", or a number in [0, 1) (as a float)."""
    if value == "auto":
        return value
    try:
        return float(check_field("strategy.block_momentum", value, float, at_least=0, below=1))
    except ConfigError:
        raise ConfigError(f"strategy.block_momentum: expected auto or a number >= 0 and < 1, got {value!r}") from None


def block_momentum_for(config: AveragingConfig, learners: int) -> float:
    """η for a job of `learners`: the configured number, or CNTK's 1 − 1/n for auto."""
    return 1.0 - 1.0 / learners if config.block_momentum == "auto" else float(config.block_momentum)


def steps_between_averages(config: AveragingConfig, samples_per_step: int) -> int:
    """Minibatches from one average to the next (`after_step`'s count reaches `average_every`)."""
    return max(1, -(-config.average_every // samples_per_step))


def average_traffic(numel: int, world_size: int, config: AveragingConfig | None = None,
                    element_size: int = 4) -> list[comm.Transfer]:
    """What one learner sends in one average of `numel` float values (parameters, floating-point
    buffers, and with `average_momentum` the optimizer's state tensors): the exclusion rule's
    n x 2 float64 table, then the flat allreduce."""
    config = config or AveragingConfig()
    if world_size < 2:
        return []
    out = []
    if config.exclude_threshold is not None:
        out.append(comm.Transfer("allreduce", "world", world_size,
                                 comm.ring_allreduce_bytes(world_size * 2 * 8, world_size), 2 * world_size))
    out.append(comm.Transfer("allreduce", "world", world_size,
                             comm.ring_allreduce_bytes(numel * element_size, world_size), numel))
    return out


class AveragingStrategy(Strategy):
    """Periodic parameter averaging; see the module docstring."""

    name = "averaging"
    config_class = AveragingConfig

    def __init__(self, config: AveragingConfig | None = None):
        super().__init__(config)
        self.samples_since_average = 0
        """Minibatches since the last average, times `samples_per_minibatch`."""
        self.samples_noted = 0
        """Samples the trainer reported (this learner's own frames; not used to decide)."""
        self.samples_per_minibatch: int | None = self.config.samples_per_step or None
        """What a minibatch counts for: `samples_per_step`, or the first report (None: none yet)."""
        self.steps = 0
        self.num_averages = 0
        self.loss_sum = 0.0
        self.loss_count = 0
        self.last_included: list[bool] = []
        """Which learners the last average used (all True without exclusion)."""
        self.block_momentum = 0.0
        """η for this job (set at setup; `auto` resolved with the number of learners)."""
        self.block_base: list[torch.Tensor] | None = None
        """Block momentum's b: the parameters every learner started the current block from (None:
        block momentum is off)."""
        self.block_delta: list[torch.Tensor] = []
        """Block momentum's Δ per parameter."""

    # -- what the trainer tells us ---------------------------------------------------------------
    def note_samples(self, n: int) -> None:
        """The trainer reports the samples (frames) of this learner's latest minibatch."""
        n = int(n)
        self.samples_noted += n
        if self.config.samples_per_step or self.ctx.samples_per_step:
            return
        if self.samples_per_minibatch is None:
            self.samples_per_minibatch = n
        elif n != self.samples_per_minibatch:
            raise TrainingError(f"averaging: rank {self.ctx.rank} reports a minibatch of {n} samples after "
                                f"minibatches of {self.samples_per_minibatch}; learners would average at "
                                f"different steps: set strategy.samples_per_step to the nominal samples per "
                                f"learner and minibatch")

    def note_loss(self, loss: float) -> None:
        """The trainer reports this learner's latest minibatch objective (mean loss)."""
        self.loss_sum += float(loss)
        self.loss_count += 1

    def lr_scale(self) -> float:
        return float(self.ctx.world_size) if self.config.scale_lr else 1.0

    # -- strategy hooks --------------------------------------------------------------------------
    def setup(self, model: torch.nn.Module, optimizer: torch.optim.Optimizer, ctx: LearnerContext) -> None:
        super().setup(model, optimizer, ctx)
        if ctx.world_size > 1:
            if not dist.is_initialized():
                raise TrainingError(f"averaging: rank {ctx.rank} of {ctx.world_size} has no process group "
                                    "(torch.distributed is not initialized)")
            comm.broadcast_module(model, self.counters, src=0, group=ctx.group, timeout=ctx.timeout)
        if not self.config.samples_per_step and ctx.samples_per_step:
            self.samples_per_minibatch = ctx.samples_per_step
        self.block_momentum = block_momentum_for(self.config, ctx.world_size)
        if self.block_on:
            self.block_base = [p.detach().clone() for p in model.parameters()]
            self.block_delta = [torch.zeros_like(p) for p in self.block_base]

    @property
    def block_on(self) -> bool:
        """Whether averages apply block momentum (η > 0 or ζ != 1)."""
        return self.block_momentum > 0 or self.config.block_lr != 1.0

    def after_step(self) -> None:
        self.steps += 1
        if self.samples_per_minibatch is None:
            if self.steps >= 2:
                raise TrainingError("averaging: the trainer reports no samples (call strategy.note_samples(n) "
                                    "per minibatch or set strategy.samples_per_step)")
            return
        self.samples_since_average += self.samples_per_minibatch
        if self.samples_since_average >= self.config.average_every:
            self.average()

    def finalize(self) -> None:
        self.average(final=True)

    # -- the average ----------------------------------------------------------------------------
    def averaged_tensors(self) -> list[torch.Tensor]:
        """The tensors one average touches, in the same order on every learner."""
        model, optimizer = self.model, self.optimizer
        tensors = [p.data for p in model.parameters()]
        tensors += [b for b in model.buffers() if b.is_floating_point()]
        if self.config.average_momentum and optimizer is not None:
            for p in model.parameters():
                state = optimizer.state.get(p, {})
                tensors += [state[k] for k in sorted(state)
                            if torch.is_tensor(state[k]) and state[k].shape == p.shape and state[k].is_floating_point()]
        return tensors

    def payload_bytes(self) -> int:
        """Bytes of one learner's contribution to an average (S in the ring cost 2·S·(n−1)/n)."""
        return sum(t.numel() * t.element_size() for t in self.averaged_tensors())

    def average(self, final: bool = False) -> None:
        """Average now (a collective: every learner must call it at the same point); `final`: the
        last one (`finalize`), which leaves block momentum's global model without the look-ahead."""
        n = self.ctx.world_size
        included = [True] * n
        if n > 1:
            if self.config.exclude_threshold is not None:
                included = self._included_learners()
            self._allreduce_average(included)
            self.counters.add(exchanges=1)
        if self.block_base is not None:
            self._block_update(final, pending=self.samples_since_average > 0 or not final)
        self.last_included = included
        self.num_averages += 1
        self.samples_since_average = 0
        self.loss_sum, self.loss_count = 0.0, 0

    def _included_learners(self) -> list[bool]:
        """Exclusion rule of step 3; the objectives travel in one small allreduce (learner i
        fills row i of an n×2 zero matrix with its mean objective and its number of losses)."""
        n, rank = self.ctx.world_size, self.ctx.rank
        table = torch.zeros(n, 2, dtype=torch.float64, device=self.ctx.device)
        if self.loss_count:
            table[rank, 0] = self.loss_sum / self.loss_count
            table[rank, 1] = self.loss_count
        comm.allreduce(table, self.counters, group=self.ctx.group, timeout=self.ctx.timeout)
        losses = [(float(loss), int(count)) for loss, count in table.tolist()]
        reported = [loss for loss, count in losses if count > 0]
        finite = [loss for loss in reported if math.isfinite(loss)]
        if reported and not finite:
            raise TrainingError("averaging: every learner's objective is non-finite; nothing to average")
        best = min(finite) if finite else 0.0
        threshold = self.config.exclude_threshold
        return [count == 0 or (math.isfinite(loss) and loss - best <= threshold) for loss, count in losses]

    def _allreduce_average(self, included: list[bool]) -> None:
        divisor = sum(included)
        # One flat allreduce per (device, dtype): a single one for an all-float32 model.
        for same in comm.group_by_kind(self.averaged_tensors()).values():
            flat = comm.flatten(same)
            if not included[self.ctx.rank]:
                flat.zero_()  # contributes nothing (and no NaN) to the sum
            comm.allreduce(flat, self.counters, group=self.ctx.group, timeout=self.ctx.timeout)
            flat.div_(divisor)
            with torch.no_grad():
                comm.unflatten_into(flat, same)

    def _block_update(self, final: bool, pending: bool) -> None:
        """Block momentum (step 5) on the averaged parameters, the same arithmetic on every learner.
        `pending` false (finalize right after an average): no new block, only the look-ahead is
        taken back, so the final model is x_g either way."""
        eta, zeta = self.block_momentum, self.config.block_lr
        lookahead = eta if self.config.block_nesterov else 0.0
        with torch.no_grad():
            for p, base, delta in zip(self.model.parameters(), self.block_base, self.block_delta):
                if pending:
                    delta.mul_(eta).add_(p.data - base, alpha=zeta)  # Δ = ηΔ + ζ(x̄ − b)
                    target = base + delta  # x_g = b + Δ
                else:
                    target = base - lookahead * delta  # b = x_g + ηΔ
                if not final:
                    target.add_(delta, alpha=lookahead)  # the next block starts at x_g + ηΔ
                base.copy_(target)
                p.data.copy_(target)

    # -- checkpoints -----------------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        state = super().state_dict()
        state.update(samples_since_average=self.samples_since_average, samples_noted=self.samples_noted,
                     steps=self.steps, num_averages=self.num_averages, loss_sum=self.loss_sum,
                     loss_count=self.loss_count, samples_per_minibatch=self.samples_per_minibatch)
        if self.block_base is not None:
            state.update(block_base=[t.clone() for t in self.block_base],
                         block_delta=[t.clone() for t in self.block_delta])
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        for key in ("samples_since_average", "samples_noted", "steps", "num_averages", "loss_count"):
            setattr(self, key, int(state.get(key, 0)))
        self.loss_sum = float(state.get("loss_sum", 0.0))
        if not (self.config.samples_per_step or self.ctx.samples_per_step):  # None (not reported yet, or an older checkpoint): the next report
            size = state.get("samples_per_minibatch")
            self.samples_per_minibatch = None if size is None else int(size)
        if self.block_base is not None:
            self._load_block_state(state)

    def _load_block_state(self, state: dict[str, Any]) -> None:
        """b and Δ from a checkpoint; one saved without them (block momentum off, or an older
        asrdist) starts a block at the loaded parameters with Δ = 0."""
        mine = self.block_base + self.block_delta
        saved = state.get("block_base", []) + state.get("block_delta", [])
        if not saved:
            saved = [p.detach() for p in self.model.parameters()] + [torch.zeros_like(d) for d in self.block_delta]
        if len(saved) != len(mine) or any(a.shape != b.shape for a, b in zip(mine, saved)):
            raise TrainingError("averaging: the checkpoint's block momentum state does not fit this model")
        for t, value in zip(mine, saved):
            t.copy_(value)


def _simulated(config: AveragingConfig, job: SimJob) -> LockStep:
    return LockStep(average=average_traffic(job.averaged_values, job.learners, config),
                    average_every=steps_between_averages(config, job.local_batch))


AVERAGING = StrategyDescriptor(AveragingStrategy, LockStep, _simulated, advised={"averaging": {}})
