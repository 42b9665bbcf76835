"""One learner's whole run: build everything from the run directory, train, finalize, report.

Called in-process for one learner and by `asrdist.run.worker` under torch.distributed.run.
`build_learner` is the one place a learner is put together (runs and benchmarks). With a strategy
that asks for it (onebit's auto_batch_size), every epoch after the first starts with CNTK's
minibatch-size search (`asrdist.optim.batch_search`) run by all learners in lock step.
"""
from __future__ import annotations

import math
import time
from dataclasses import dataclass, fields, replace
from pathlib import Path

import torch
import torch.distributed as dist

from asrdist.cluster.process_group import JobEnv, cores_per_learner, stop_learner
from asrdist.config import RunConfig
from asrdist.data.job_sampler import JobEpochSampler
from asrdist.errors import ConfigError
from asrdist.optim.batch_search import EpochStartTrials, check_search_sizes, search_batch_size
from asrdist.optim.build import build_optimizer
from asrdist.optim.max_change import clip_change
from asrdist.optim.ng_layers import (
    apply_natural_gradient,
    load_natural_gradient_state,
    natural_gradient_state,
)
from asrdist.optim.schedules import LRSchedule
from asrdist.parallel import build_strategy, comm
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.consensus import job_totals
from asrdist.parallel.membership import survival_wait
from asrdist.run.finish import finish_run
from asrdist.run.gossip import gossip_summary
from asrdist.run.prepare import load_targets
from asrdist.run.summary import RunSummary
from asrdist.run.task import SpeechTask
from asrdist.train.loop import LoopConfig, Task
from asrdist.train.state import write_state
from asrdist.train.trainer import Trainer, TrainerHooks
from asrdist.utils.contention import load_average, read_cpu, received
from asrdist.utils.machine import machine_steal_ticks, steal_share
from asrdist.utils.memory import keep_freed_memory


def set_threads(configured: int, given: int, local_world_size: int) -> int:
    """Torch threads for this learner: `train.threads` if set; else the share its launcher gave
    (`JobEnv.num_threads`); else this process' cores over the node's learners."""
    n = configured or given or cores_per_learner(local_world_size)
    torch.set_num_threads(n)
    return n


def flush_denormals() -> None:
    """Compute floats below float32's smallest normal (1.2e-38) as zero in this process. Without
    it, a CPU does arithmetic on such values in microcode, many times slower. Momentum buffers of
    weights whose gradient stays zero decay into that range: a 4-learner sync run of `make demo`
    ended with 181,394 of them (17% of its momentum values), its later epochs 40-50% slower than
    its first. Its recipe, rerun for 2 epochs, took 2.7x as long over the second as the first;
    with this, both epochs took the same time and the run ended with the same losses to every
    digit (docs/measurements.md, 2026-11-29)."""
    torch.set_flush_denormal(True)  # False where the CPU cannot (no SSE3): nothing to do then


def _agree(ctx: LearnerContext):
    """The mean of a value over all learners, so every learner takes the same decision."""
    if not ctx.distributed or ctx.world_size == 1:
        return lambda value: value

    def mean(value: float) -> float:
        total, = job_totals([value], world_size=ctx.world_size, device=ctx.device, group=ctx.group,
                            timeout=ctx.timeout)
        return total / ctx.world_size
    return mean


def batch_search_hooks(cfg: RunConfig, task: Task, ctx: LearnerContext) -> tuple:
    """(batch_search, sampler_at) for TrainerHooks: onebit's automatic minibatch-size search.

    Trials start from an in-memory snapshot of the epoch start (model, optimizer, strategy
    residuals and byte counters, RNG), so neither their updates nor their traffic count.
    """
    base, n = cfg.data.batch_size, ctx.world_size
    check_search_sizes(base, n)
    agree = _agree(ctx)

    def sampler_at(size: int, epoch: int | None = None):
        sampler = task.sampler_for((size or base) // n)
        if epoch is not None:
            sampler.set_epoch(epoch)
        return sampler

    def search(tr: Trainer) -> None:
        epoch, previous = tr.state.epoch, tr.state.batch_size or base
        compute_seconds = tr.stepper.compute_seconds
        # every trial size on the same frames: batch_search_minibatches at the base size (CNTK)
        trials = EpochStartTrials(tr.train_step, lambda size: sampler_at(size, epoch), tr.snapshot,
                                  tr.restore_snapshot, cfg.strategy.batch_search_minibatches * base, agree)

        def train_minibatches(size: int) -> float:
            try:
                sampler_at(size)
            except ConfigError:  # no batch of this size fits a shard: the same on every learner
                return math.inf
            return trials(size)

        log: list[tuple[int, float]] = []
        tr.stepper.trial = True  # a diverging trial rejects its size instead of ending the run
        try:
            chosen = search_batch_size(train_minibatches, base, previous, log=log)
        finally:
            tr.stepper.trial = False
        trials.restore()
        tr.stepper.compute_seconds = compute_seconds  # the epoch's compute, not the search's
        tr.sampler = sampler_at(chosen, epoch)
        tr.state.batch_size = chosen
        tr.metrics.log("batch_search", tr.state.step, epoch=epoch + 1, previous=previous, chosen=chosen,
                       trials=[[size, loss] for size, loss in log])
        if ctx.rank == 0:
            shown = ", ".join(f"{size}: {loss:.4f}" for size, loss in log)
            print(f"[asrdist] epoch {epoch + 1}: minibatch {chosen} (trials {shown})", flush=True)

    return search, sampler_at


@dataclass
class Learner:
    """Everything one learner trains with, built by `build_learner`."""

    model: torch.nn.Module
    optimizer: torch.optim.Optimizer
    strategy: Strategy
    trainer: Trainer
    task: Task
    threads: int


def loop_config(cfg: RunConfig, progress: bool) -> LoopConfig:
    """The training loop's config: `train.*` for every field of its name, and `progress`."""
    return LoopConfig(progress=progress, **{f.name: getattr(cfg.train, f.name) for f in fields(LoopConfig)
                                            if f.name != "progress"})


def build_learner(cfg: RunConfig, run_dir: Path, ctx: LearnerContext, task: Task, *,
                  progress: bool = False, threads: int = 0) -> Learner:
    """The one way to build a learner: the process' malloc told to keep freed memory
    (`asrdist.utils.memory`), tiny floats computed as zero (`flush_denormals`), model on its
    device, natural-gradient layers, max-change, optimizer, schedule, strategy, sampler
    (per-learner for lock-step strategies, the job's shared order otherwise) and the trainer.
    `task` supplies the model, samplers, loss and validation (`SpeechTask`, or a benchmark's
    synthetic task). `threads`: torch threads when `train.threads` is 0 (`set_threads`)."""
    keep_freed_memory()
    flush_denormals()
    threads = set_threads(cfg.train.threads, threads, ctx.local_world_size)
    ctx = replace(ctx, samples_per_step=task.samples_per_step)
    model = task.model
    hooks = TrainerHooks(loss_fn=task.loss, validate_fn=task.validate)
    if cfg.optim.natural_gradient:
        apply_natural_gradient(model, convert_lstm=task.kind == "chunk", seed=cfg.seed,
                               kernel=cfg.optim.natural_gradient_kernel)
        hooks.extra_state = lambda: {"natural_gradient": natural_gradient_state(model)}
        hooks.load_extra_state = lambda s: load_natural_gradient_state(model, s["natural_gradient"])
    model.to(ctx.device)
    if cfg.optim.max_change:
        hooks.before_optimizer_step = lambda lr: clip_change(model, lr)
    optimizer = build_optimizer(cfg.optim, model.parameters())
    strategy = build_strategy(cfg.strategy_name, cfg.strategy)
    strategy.setup(model, optimizer, ctx)
    if strategy.lockstep:
        sampler = task.sampler
        steps_per_epoch = len(sampler)
    else:
        membership = strategy.membership  # survival mode: lost learners' minibatches are trained again

        def lost_ranks() -> list[int]:
            membership.refresh()
            return sorted(membership.lost_ranks())
        sampler = JobEpochSampler(task.sampler_for(task.local_batch, rank=0, world_size=1), ctx.store,
                                  ctx.job_world_size, group_size=ctx.group_size if strategy.moves_by_node else 1,
                                  rank=ctx.job_rank, lost_ranks=None if membership is None else lost_ranks,
                                  wait_seconds=survival_wait(ctx.timeout).total_seconds())
        steps_per_epoch = sampler.steps_per_epoch
    schedule = LRSchedule(cfg.optim, steps_per_epoch=steps_per_epoch, total_epochs=cfg.train.epochs,
                          global_batch=cfg.data.batch_size)
    hooks.lr_at = lambda step, epoch: schedule.lr_at(step, epoch)
    if strategy.wants_batch_search():
        hooks.batch_search, hooks.sampler_at = batch_search_hooks(cfg, task, ctx)
        hooks.base_batch_size = cfg.data.batch_size
    torch.manual_seed(cfg.seed * 1000 + ctx.job_rank)  # per-learner randomness (dropout) from here on
    trainer = Trainer(model, optimizer, strategy, sampler, hooks, ctx, run_dir, loop_config(cfg, progress))
    return Learner(model, optimizer, strategy, trainer, task, threads)


def run_learner(cfg: RunConfig, run_dir: Path, env: JobEnv, ctx: LearnerContext, resume: bool = False,
                progress: bool = True) -> RunSummary | None:
    """Train, finalize, leave the job's process group; the summary on the learner that writes it
    (rank 0, or the first survivor when adpsgd went on without lost learners), None elsewhere.
    `env`: what this learner's launcher told it (threads, network, restarts, nodes); `ctx`: the
    job it joined (`start_learner`)."""
    torch.manual_seed(cfg.seed)  # identical initial model on every learner
    targets = load_targets(run_dir)
    task = SpeechTask(cfg, targets, ctx.job_rank, ctx.job_world_size)
    learner = build_learner(cfg, run_dir, ctx, task, progress=progress, threads=env.num_threads)
    t0, steal_before, cpu_before, load_start = time.perf_counter(), machine_steal_ticks(), read_cpu(), load_average()
    state = learner.trainer.fit(resume=resume)
    wall = time.perf_counter() - t0
    cpu_seconds, cpu_wait = received(cpu_before, read_cpu())  # the CPU this learner got while it trained
    per_learner = {"rank": ctx.job_rank, "device": str(ctx.device), "steps": state.step, "frames": state.frames,
                   "train_seconds": state.train_seconds, "loop_seconds": state.loop_seconds,
                   "compute_seconds": learner.trainer.stepper.compute_seconds,
                   "skipped_nonfinite": learner.trainer.stepper.skipped,
                   "steal_share": steal_share(steal_before, machine_steal_ticks()),
                   "cpu_seconds": cpu_seconds, "cpu_wait_seconds": cpu_wait, "cpu_wall_seconds": wall,
                   **learner.strategy.counters.as_dict(), "gossip": learner.strategy.gossip()}
    gathered = [per_learner]
    if ctx.job_world_size > 1:
        def gather(group, members: list[int]) -> list:  # every learner, or those adpsgd went on with
            everyone: list = [None] * len(members)
            comm.guarded("gathering the learners' figures", lambda: dist.all_gather_object(everyone, per_learner,
                                                                                             group=group))
            return everyone
        gathered = learner.strategy.among_survivors(gather)
    group, members = learner.strategy.survivors()
    lost = learner.strategy.lost_learners()
    stop_learner(group, destroy=not lost)
    if ctx.job_rank != members[0]:  # the first survivor writes the summary
        return None
    gossip = gossip_summary([p.pop("gossip", None) for p in gathered])  # its mixing: on this learner alone

    summary = finish_run(cfg, run_dir, learner.model, task, targets, state, gathered, wall, learner.threads, lost,
                         averaged=learner.trainer.averaged(), env=env, load=(load_start, load_average()),
                         gossip=gossip)

    write_state(run_dir, "finished", epoch=state.epoch, epochs=cfg.train.epochs)
    return summary
