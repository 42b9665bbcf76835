"""One learner of `asrdist bench scaling`: the real model, optimizer, strategy and `Trainer`, fed
synthetic minibatches, with the trainer's compute emulation (DESIGN.md §5.8).

`scaling_learner(spec, args)` is run by `netem_launch.run_learners`. It builds everything the
way `run_learner` does (same seed on every learner, the strategy's `setup`), then calls the
trainer's own `Trainer.train_step` on `warmup + steps` minibatches of `local_batch` frames and
times the last `steps`. `emulate_compute_ms` makes the trainer sleep instead of computing and
write synthetic gradients of the model's shapes, so the step's real work is the strategy's
communication and the optimizer update.
"""
from __future__ import annotations

import tempfile
import time
from datetime import timedelta
from typing import Any, Iterator

import torch

from asrdist.data.batch import Batch


class SyntheticSampler:
    """`steps` minibatches of `frames` frames each, with empty tensors (the emulation never reads
    them); the sampler protocol the Trainer expects."""

    def __init__(self, frames: int, steps: int):
        self.frames, self.steps = frames, steps
        self._epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self._epoch = epoch

    def __iter__(self) -> Iterator[Batch]:
        for _ in range(self.steps):
            yield Batch(inputs=torch.empty(0), targets=torch.empty(0, dtype=torch.int64), num_frames=self.frames)

    def __len__(self) -> int:
        return self.steps

    def state_dict(self) -> dict:
        return {"epoch": self._epoch, "position": 0}

    def load_state_dict(self, state: dict) -> None:
        self._epoch = int(state["epoch"])


def _unused_loss(model, batch):
    raise RuntimeError("scaling benchmark: the loss is never computed (compute emulation is on)")


def scaling_learner(spec, args: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    from asrdist.config import from_dict
    from asrdist.models.registry import ModelConfig, build_model, count_parameters
    from asrdist.optim.build import OptimConfig, build_optimizer
    from asrdist.parallel import build_strategy, strategy_config_class
    from asrdist.parallel.base import LearnerContext
    from asrdist.train.trainer import Trainer, TrainerHooks

    if args["compute_ms"] <= 0:
        raise ValueError("scaling benchmark: compute_ms must be > 0")
    from asrdist.cluster.process_group import JobEnv, start_learner

    distributed = spec.world_size > 1
    env = JobEnv(rank=spec.rank, world_size=spec.world_size, local_rank=spec.local_rank,
                 local_world_size=spec.local_world_size)
    ctx = start_learner(env, seed=0, timeout=timedelta(seconds=spec.timeout_s), init_method=spec.init_method,
                        backend="gloo")
    torch.manual_seed(0)  # the same initial model everywhere, as run_learner does
    model = build_model(ModelConfig(**args["model"]), args["feature_dim"], args["num_classes"])
    optim_cfg = OptimConfig(**args["optim"])
    optimizer = build_optimizer(optim_cfg, model.parameters())
    name = args["strategy"]
    cfg_class = strategy_config_class(name)
    strategy = build_strategy(name, from_dict(cfg_class, args.get("strategy_config", {}), "strategy")
                              if cfg_class else None)
    strategy.setup(model, optimizer, ctx)
    warmup, steps = int(args["warmup"]), int(args["steps"])
    sampler = SyntheticSampler(int(args["local_batch"]), warmup + steps)
    hooks = TrainerHooks(loss_fn=_unused_loss, lr_at=lambda step, epoch: optim_cfg.lr)
    with tempfile.TemporaryDirectory(prefix="asrdist-scaling-") as run_dir:
        straggler = args.get("straggler_rank")
        trainer = Trainer(model, optimizer, strategy, sampler, hooks, ctx, run_dir, epochs=1,
                          emulate_compute_ms=float(args["compute_ms"]), progress=False,
                          straggler_ranks=[] if straggler is None else [int(straggler)],
                          straggler_slowdown=float(args.get("slowdown", 1.0)))
        frames = 0
        t0 = time.perf_counter()
        counters0 = compute0 = None
        for i, batch in enumerate(sampler):
            if i == warmup:  # the timed window starts together on every learner
                if distributed:
                    dist.barrier()
                t0 = time.perf_counter()
                counters0, compute0 = dict(strategy.counters.as_dict()), trainer.compute_seconds
            _, n = trainer.train_step(batch)
            trainer.state.step += 1
            if i >= warmup:
                frames += n
        elapsed = time.perf_counter() - t0
    strategy.finalize()
    counters = {k: v - counters0[k] for k, v in strategy.counters.as_dict().items()}
    totals = torch.tensor([elapsed, frames], dtype=torch.float64)
    rates = torch.tensor([frames / elapsed], dtype=torch.float64)
    if distributed:
        slowest = totals[:1].clone()
        dist.all_reduce(slowest, op=dist.ReduceOp.MAX)
        all_frames = totals[1:].clone()
        dist.all_reduce(all_frames)
        dist.all_reduce(rates)
        elapsed_max, frames_all = float(slowest), float(all_frames)
    else:
        elapsed_max, frames_all = elapsed, float(frames)
    return {
        "rank": spec.rank,
        "network": spec.network if distributed else "none (one learner)",
        "threads": torch.get_num_threads(),
        "parameters": count_parameters(model),
        "frames_per_second": frames_all / elapsed_max,
        # each learner's own frames/s, summed: the aggregate when learners move at their own pace
        "sum_of_learner_rates": float(rates),
        "seconds": elapsed_max,
        "frames": frames_all,
        "steps": steps,
        "seconds_per_step": elapsed / steps,
        "compute_seconds_per_step": (trainer.compute_seconds - compute0) / steps,
        "comm_seconds_per_step": counters["comm_seconds"] / steps,
        "wait_seconds_per_step": counters["wait_seconds"] / steps,
        "bytes_sent_per_step": counters["bytes_sent"] / steps,
    }
