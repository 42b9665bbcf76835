"""One learner's whole run: build everything from the run directory, train, finalize, report.

Called in-process for one learner and by `asrdist.train.worker` under torch.distributed.run.
With onebit's auto_batch_size, every epoch after the first starts with CNTK's minibatch-size search
(`asrdist.optim.batch_search`) run by all learners in lock step.
"""
from __future__ import annotations

import math
import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from asrdist.config import RunConfig
from asrdist.errors import ConfigError
from asrdist.parallel import build_strategy
from asrdist.parallel.base import LearnerContext
from asrdist.train.trainer import Trainer, TrainerHooks


def set_threads(threads: int, local_world_size: int) -> int:
    n = threads or max(1, (os.cpu_count() or 1) // max(1, local_world_size))
    torch.set_num_threads(n)
    return n


def _barrier(ctx: LearnerContext):
    if ctx.world_size > 1 and dist.is_initialized():
        return lambda: dist.barrier()
    return lambda: None


def _agree(ctx: LearnerContext):
    """The mean of a value over all learners, so every learner takes the same decision."""
    if not ctx.distributed or ctx.world_size == 1:
        return lambda value: value

    def mean(value: float) -> float:
        t = torch.tensor([value], dtype=torch.float64)
        dist.all_reduce(t)
        return float(t.item()) / ctx.world_size
    return mean


def batch_search_hooks(cfg: RunConfig, task, ctx: LearnerContext) -> tuple:
    """(batch_search, sampler_at) for TrainerHooks: onebit's automatic minibatch-size search.

    Trials start from an in-memory snapshot of the epoch start (model, optimizer, strategy
    residuals and byte counters, RNG), so neither their updates nor their traffic count.
    """
    from asrdist.optim.batch_search import MULTIPLE, EpochStartTrials, search_batch_size

    base, n = cfg.data.batch_size, ctx.world_size
    if base % MULTIPLE or MULTIPLE % n:
        raise ConfigError(f"strategy.auto_batch_size: needs data.batch_size a multiple of {MULTIPLE} "
                          f"(got {base}) and {n} learners dividing {MULTIPLE}")
    agree = _agree(ctx)

    def sampler_at(size: int, epoch: int | None = None):
        sampler = task.sampler_for((size or base) // n)
        if epoch is not None:
            sampler.set_epoch(epoch)
        return sampler

    def search(tr: Trainer) -> None:
        epoch, previous = tr.state.epoch, tr.state.batch_size or base
        compute_seconds = tr.compute_seconds
        trials = EpochStartTrials(tr.train_step, lambda size: sampler_at(size, epoch), tr.snapshot,
                                  tr.restore_snapshot, cfg.strategy.batch_search_minibatches, agree)

        def train_minibatches(size: int) -> float:
            try:
                sampler_at(size)
            except ConfigError:  # no batch of this size fits a shard: the same on every learner
                return math.inf
            return trials(size)

        log: list[tuple[int, float]] = []
        chosen = search_batch_size(train_minibatches, base, previous, log=log)
        trials.restore()
        tr.compute_seconds = compute_seconds  # the epoch's compute, not the search's
        tr.sampler = sampler_at(chosen, epoch)
        tr.state.batch_size = chosen
        tr.metrics.log("batch_search", tr.state.step, epoch=epoch, previous=previous, chosen=chosen,
                       trials=[[size, loss] for size, loss in log])
        if ctx.rank == 0:
            shown = ", ".join(f"{size}: {loss:.4f}" for size, loss in log)
            print(f"[asrdist] epoch {epoch}: minibatch {chosen} (trials {shown})", flush=True)

    return search, sampler_at


def run_learner(cfg: RunConfig, run_dir: Path, ctx: LearnerContext, resume: bool = False,
                progress: bool = True) -> dict | None:
    from asrdist.optim.build import build_optimizer
    from asrdist.optim.schedules import LRSchedule
    from asrdist.train.prepare import load_targets
    from asrdist.train.task import SpeechTask

    threads = set_threads(cfg.train.threads, ctx.local_world_size)
    torch.manual_seed(cfg.seed)  # identical initial model on every learner
    targets = load_targets(run_dir)
    task = SpeechTask(cfg, targets, ctx.rank, ctx.world_size)
    model = task.model
    hooks = TrainerHooks(loss_fn=task.loss, validate_fn=task.validate)
    if cfg.strategy_name == "onebit" and cfg.strategy.auto_batch_size:
        hooks.batch_search, hooks.sampler_at = batch_search_hooks(cfg, task, ctx)
        hooks.base_batch_size = cfg.data.batch_size
    if cfg.optim.natural_gradient:
        from asrdist.optim.ng_layers import (apply_natural_gradient, load_natural_gradient_state,
                                             natural_gradient_state)

        apply_natural_gradient(model, convert_lstm=task.kind == "chunk", seed=cfg.seed)
        hooks.extra_state = lambda: {"natural_gradient": natural_gradient_state(model)}
        hooks.load_extra_state = lambda s: load_natural_gradient_state(model, s["natural_gradient"])
    if cfg.optim.max_change:
        from asrdist.optim.max_change import clip_change

        hooks.before_optimizer_step = lambda lr: clip_change(model, lr)
    optimizer = build_optimizer(cfg.optim, model.parameters())
    schedule = LRSchedule(cfg.optim, steps_per_epoch=len(task.sampler), total_epochs=cfg.train.epochs,
                          global_batch=cfg.data.batch_size)
    strategy = build_strategy(cfg.strategy_name, cfg.strategy)
    strategy.setup(model, optimizer, ctx)
    torch.manual_seed(cfg.seed * 1000 + ctx.rank)  # per-learner randomness (dropout) from here on
    # the trainer's epoch: steps per epoch change when the batch-size search picks another size
    hooks.lr_at = lambda step, epoch: schedule.lr_at(step, epoch)
    tc = cfg.train
    trainer = Trainer(model, optimizer, strategy, task.sampler, hooks, ctx, run_dir,
                      epochs=tc.epochs, max_steps=tc.max_steps, log_every=tc.log_every,
                      checkpoint_every=tc.checkpoint_every, validate_every_epochs=tc.validate_every_epochs,
                      emulate_compute_ms=tc.emulate_compute_ms, straggler_ranks=tc.straggler.ranks,
                      straggler_slowdown=tc.straggler.slowdown, straggler_jitter=tc.straggler.jitter,
                      progress=progress, barrier=_barrier(ctx))
    t0 = time.perf_counter()
    state = trainer.fit(resume=resume)
    wall = time.perf_counter() - t0
    per_learner = {"rank": ctx.rank, "frames": state.frames, "train_seconds": state.train_seconds,
                   "compute_seconds": trainer.compute_seconds, **strategy.counters.as_dict()}
    if ctx.world_size > 1:
        gathered: list = [None] * ctx.world_size
        dist.all_gather_object(gathered, per_learner)
    else:
        gathered = [per_learner]
    if ctx.rank != 0:
        return None
    from asrdist.train.summary import finish_run

    return finish_run(cfg, run_dir, model, task, targets, state, gathered, wall, threads)
