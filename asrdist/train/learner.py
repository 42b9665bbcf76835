"""One learner's whole run: build everything from the run directory, train, finalize, report.

Called in-process for one learner and by `asrdist.train.worker` under torch.distributed.run.
"""
from __future__ import annotations

import os
import time
from datetime import timedelta
from pathlib import Path

import torch
import torch.distributed as dist

from asrdist.config import RunConfig
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
    hooks.lr_at = lambda step, epoch: schedule.lr_at(step)
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
