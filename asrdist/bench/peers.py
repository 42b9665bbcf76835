"""`asrdist bench peers`: asrdist's strategies beside what a user would pick instead in torch.

In one job per network (`--networks`), every learner (`launcher.run_learners`) trains seven
contenders from the same weights on the same minibatches with the same optimizer: asrdist's
`sync`, `onebit`, `averaging`, and torch's DistributedDataParallel plain and with torch's PowerSGD
hook at rank 1 and 4 (asrdist's `ddp` strategy), each through the trainer's own
`Trainer.train_step`, and torch's `PeriodicModelAverager` in its own loop, in alternating rounds. Keys
`sync_vs_ddp`, `onebit_vs_powersgd`, `averaging_vs_torch`; the contenders and how they are timed:
docs/benchmarks.md#asrdist-bench-peers-asrdist-beside-torchs-own-mechanisms."""
from __future__ import annotations

import argparse
import os
import tempfile
import time
from datetime import timedelta
from pathlib import Path
from typing import Any, Callable

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.model_averaging.averagers import (
    PeriodicModelAverager,
)

from asrdist.checks import cli_number
from asrdist.cluster.launcher import run_learners
from asrdist.cluster.netem import interface_counters, payload_on_wire, resolve_network
from asrdist.cluster.process_group import start_learner
from asrdist.config import config_from_tree
from asrdist.data.batch import Batch
from asrdist.errors import ConfigError
from asrdist.models.registry import ModelConfig, build_model
from asrdist.run.learner import build_learner
from asrdist.train.synthetic import FrameTask
from asrdist.utils.throughput import job_frames_per_second

SYNC_VS_DDP_TARGET = 0.97
CONTENDERS = ("sync", "ddp", "onebit", "powersgd_rank1", "powersgd_rank4", "averaging", "torch_averaging")
ASRDIST = ("sync", "ddp", "onebit", "powersgd_rank1", "powersgd_rank4", "averaging")
"""The contenders that run as asrdist strategies and count their own bytes (torch's averager does not)."""
COMPRESSED = ("onebit", "powersgd_rank1", "powersgd_rank4", "sync")
"""What `onebit_vs_powersgd` sets side by side (sync: the uncompressed reference)."""
FEATURE_DIM, CLASSES = 440, 40
LR, MOMENTUM = 0.1, 0.9


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--networks", default="loopback,1gbit", help="comma-separated: loopback and/or link rates")
    parser.add_argument("--learners", type=cli_number(int, at_least=2), default=2)
    parser.add_argument("--hidden-dim", type=cli_number(int, at_least=1), default=512,
                        help="default DNN width (4 hidden layers)")
    parser.add_argument("--local-batch", type=cli_number(int, at_least=1), default=256,
                        help="frames per learner per step")
    parser.add_argument("--steps", type=cli_number(int, at_least=1), default=40, help="steps per contender per round")
    parser.add_argument("--rounds", type=cli_number(int, at_least=2), default=5)
    parser.add_argument("--period", type=cli_number(int, at_least=1), default=4, help="averaging period in steps")
    parser.add_argument("--timeout", type=cli_number(float, above=0), default=900.0, help="seconds per learner job")


def run(args) -> dict[str, Any]:
    load_start = list(os.getloadavg())
    networks = [n.strip() for n in args.networks.split(",") if n.strip()]
    if not networks:
        raise ConfigError(f"bench peers --networks {args.networks!r}: names no network")
    job = {"hidden_dim": args.hidden_dim, "local_batch": args.local_batch, "steps": args.steps,
           "rounds": args.rounds, "period": args.period}
    per_network: dict[str, dict] = {}
    for network, label in [resolve_network(n) for n in networks]:  # every name checked before the first job
        if label in per_network:
            continue  # an emulated rate fell back to loopback, measured already
        per_network[label] = run_learners(__name__, "peer_learner", args.learners, None, network, job,
                                          timeout=args.timeout)[0]
    out: dict[str, Any] = {"sync_vs_ddp": {}, "onebit_vs_powersgd": {}, "averaging_vs_torch": {}}
    for label, r in per_network.items():
        fps, loss, diff = r["frames_per_second"], r["held_out_loss"], r["parameter_difference"]
        out["sync_vs_ddp"][label] = {
            "ratio": fps["sync"] / fps["ddp"], "target": SYNC_VS_DDP_TARGET,
            "met": fps["sync"] / fps["ddp"] >= SYNC_VS_DDP_TARGET,
            "parameters_max_abs_difference": diff["sync_ddp"], "parameters_bitwise_equal": diff["sync_ddp"] == 0.0,
            "same_work": diff["sync_ddp"] <= r["rounding_tolerance"]}
        out["onebit_vs_powersgd"][label] = {
            "frames_per_second": {k: fps[k] for k in ("onebit", "powersgd_rank1", "powersgd_rank4")},
            "onebit_vs_rank1": fps["onebit"] / fps["powersgd_rank1"],
            "onebit_vs_rank4": fps["onebit"] / fps["powersgd_rank4"],
            "bytes_per_step": {k: r["bytes_per_step"][k] for k in COMPRESSED},
            "held_out_loss": {k: loss[k] for k in COMPRESSED},
            "after_steps": r["steps_per_contender"]}
        out["averaging_vs_torch"][label] = {
            "ratio": fps["averaging"] / fps["torch_averaging"], "period_steps": args.period,
            "parameters_max_abs_difference": diff["averaging_torch"],
            "parameters_bitwise_equal": diff["averaging_torch"] == 0.0,
            "same_work": diff["averaging_torch"] <= r["rounding_tolerance"],
            "held_out_loss": {k: loss[k] for k in ("averaging", "torch_averaging")}}
    out.update({
        "runs": per_network, "networks": list(per_network), "learners": args.learners,
        "cores": len(os.sched_getaffinity(0)),
        "threads_per_learner": next(iter(per_network.values()))["threads"],
        "model": f"dnn {FEATURE_DIM} -> 4 x {args.hidden_dim} -> {CLASSES}",
        "local_batch_frames": args.local_batch, "steps_per_round": args.steps, "rounds": args.rounds,
        "optimizer": f"SGD lr {LR}, Nesterov momentum {MOMENTUM}",
        "frames_per_second": "job_frames_per_second: all learners' frames over the longest learner's "
                             "summed round seconds",
        "bytes": "bytes_per_step: counted = asrdist's own count (torch's: none); wire = payload the emulated hosts' "
                 "NICs carried (frames less TCP/IP/Ethernet headers per segment), all hosts",
        "load_average": {"start": load_start, "end": list(os.getloadavg())},
    })
    return out


# ------------------------------------------------------------------------------ the learners

class _TeacherBatches:
    """Minibatches of a synthetic frame task: Gaussian inputs labelled by a fixed random linear
    teacher (the same on every learner), each learner drawing its own inputs; the Trainer's
    sampler protocol (one epoch = every minibatch once)."""

    def __init__(self, rank: int, count: int, frames: int):

        teacher = torch.randn(FEATURE_DIM, CLASSES, generator=torch.Generator().manual_seed(7))
        gen = torch.Generator().manual_seed(1000 + rank)

        def draw(n: int) -> Batch:
            x = torch.randn(n, FEATURE_DIM, generator=gen)
            return Batch(inputs=x, targets=(x @ teacher).argmax(dim=1), num_frames=n)

        self.batches = [draw(frames) for _ in range(count)]
        self.held_out = draw(4096)
        self.batch_size = frames

    def set_epoch(self, epoch: int) -> None:
        pass

    def __iter__(self):
        return iter(self.batches)

    def __len__(self) -> int:
        return len(self.batches)

    def state_dict(self) -> dict:
        return {}

    def load_state_dict(self, state: dict) -> None:
        pass


class _Contender:
    """One model being trained: `step(batch)`, its model, and what it counts it sent."""

    def __init__(self, model, step: Callable, counted: Callable[[], int] | None = None):
        self.model, self.step, self.counted = model, step, counted or (lambda: 0)


def _fresh_model(hidden_dim: int):

    torch.manual_seed(0)  # the same initial weights for every contender, on every learner
    return build_model(ModelConfig(name="dnn", hidden_dim=hidden_dim, hidden_layers=4), FEATURE_DIM // 11, CLASSES)


def _asrdist(spec, ctx, sampler, run_dir: Path, args: dict, strategy: dict) -> _Contender:
    cfg = config_from_tree({
        "seed": 0, "model": {"name": "dnn", "hidden_dim": args["hidden_dim"], "hidden_layers": 4},
        "optim": {"name": "sgd", "lr": LR, "momentum": MOMENTUM, "nesterov": True},
        "strategy": strategy, "data": {"batch_size": int(args["local_batch"]) * spec.world_size},
        "train": {"epochs": 1, "learners": spec.world_size, "threads": spec.num_threads,
                  "timeout_seconds": float(spec.timeout_s)}})
    learner = build_learner(cfg, run_dir, ctx, FrameTask(_fresh_model(args["hidden_dim"]), sampler))
    trainer = learner.trainer
    learner.strategy.start_epoch(0)

    def step(batch) -> None:
        trainer.train_step(batch)
        trainer.state.step += 1

    return _Contender(learner.model, step, lambda: learner.strategy.counters.bytes_sent)


def _torch_step(model, optimizer, after: Callable[[], None] | None = None) -> Callable:
    def step(batch) -> None:
        F.cross_entropy(model(batch.inputs), batch.targets).backward()
        optimizer.step()
        if after is not None:
            after()  # before zero_grad: torch's averager averages the parameters that have a gradient
        optimizer.zero_grad(set_to_none=True)

    return step


def _sgd(params):
    return torch.optim.SGD(params, lr=LR, momentum=MOMENTUM, nesterov=True)


def _powersgd(rank: int) -> dict[str, Any]:
    """DDP with PowerSGD at `rank` from its third step, in one bucket (as measured before the ddp
    strategy: docs/benchmarks.md)."""
    return {"name": "ddp", "hook": "powersgd", "powersgd_rank": rank, "powersgd_start_iter": 2, "bucket_cap_mb": 1024}


def _torch_averaging(args: dict) -> _Contender:
    model = _fresh_model(args["hidden_dim"])
    period = int(args["period"])
    # torch averages after its steps w, w + K, ... (0-based); asrdist after every K-th minibatch
    averager = PeriodicModelAverager(period=period, warmup_steps=period - 1)
    return _Contender(model, _torch_step(model, _sgd(model.parameters()),
                                         lambda: averager.average_parameters(list(model.parameters()))))


def peer_learner(spec, args: dict[str, Any]) -> dict[str, Any]:
    """Learner function (run by run_learners): every contender, rounds alternating."""

    ctx = start_learner(spec, seed=0, timeout=timedelta(seconds=spec.timeout_s), backend="gloo")
    steps, rounds, local_batch = int(args["steps"]), int(args["rounds"]), int(args["local_batch"])
    sampler = _TeacherBatches(spec.rank, steps * rounds, local_batch)
    period = int(args["period"])
    with tempfile.TemporaryDirectory(prefix="asrdist-peers-") as tmp:
        make = {
            "sync": lambda: _asrdist(spec, ctx, sampler, Path(tmp) / "sync", args, {"name": "sync"}),
            "ddp": lambda: _asrdist(spec, ctx, sampler, Path(tmp) / "ddp", args, {"name": "ddp"}),
            "onebit": lambda: _asrdist(spec, ctx, sampler, Path(tmp) / "onebit", args, {"name": "onebit"}),
            "powersgd_rank1": lambda: _asrdist(spec, ctx, sampler, Path(tmp) / "powersgd_rank1", args, _powersgd(1)),
            "powersgd_rank4": lambda: _asrdist(spec, ctx, sampler, Path(tmp) / "powersgd_rank4", args, _powersgd(4)),
            "averaging": lambda: _asrdist(spec, ctx, sampler, Path(tmp) / "averaging", args,
                                          {"name": "averaging", "average_every": period * local_batch,
                                           "average_momentum": False}),
            "torch_averaging": lambda: _torch_averaging(args),
        }
        contenders = {name: make[name]() for name in CONTENDERS}  # same order everywhere: setups are collective
        reads_wire = spec.network != "loopback" and spec.local_rank == 0
        seconds = {name: 0.0 for name in CONTENDERS}
        rounds_seconds: dict[str, list[float]] = {name: [] for name in CONTENDERS}
        counted = {name: 0 for name in CONTENDERS}
        wire = {name: 0 for name in CONTENDERS}
        for r in range(rounds):
            for name in CONTENDERS if r % 2 == 0 else CONTENDERS[::-1]:
                c = contenders[name]
                dist.barrier()
                w0, b0 = interface_counters() if reads_wire else None, c.counted()
                t0 = time.perf_counter()
                for batch in sampler.batches[r * steps:(r + 1) * steps]:
                    c.step(batch)
                rounds_seconds[name].append(time.perf_counter() - t0)
                seconds[name] += rounds_seconds[name][-1]
                dist.barrier()  # every sent byte has arrived (bench comm's wire measure)
                counted[name] += c.counted() - b0
                if reads_wire:
                    wire[name] += payload_on_wire(w0, interface_counters())["payload_bytes"]
        with torch.no_grad():
            losses = {name: float(F.cross_entropy(c.model(sampler.held_out.inputs), sampler.held_out.targets))
                      for name, c in contenders.items()}
        params = {name: torch.cat([p.detach().reshape(-1) for p in c.model.parameters()])
                  for name, c in contenders.items()}
    everyone: list = [None] * spec.world_size
    dist.all_gather_object(everyone, {"seconds": seconds, "rounds": rounds_seconds, "counted": counted, "wire": wire})
    total_steps = steps * rounds
    fps = {name: job_frames_per_second([local_batch * total_steps] * spec.world_size,
                                       [e["seconds"][name] for e in everyone]) for name in CONTENDERS}
    per_step = lambda key, name: sum(e[key][name] for e in everyone) / total_steps  # noqa: E731
    diff = lambda a, b: float((params[a] - params[b]).abs().max())  # noqa: E731
    return {
        "rank": spec.rank, "network": spec.network, "threads": torch.get_num_threads(),
        "frames_per_second": fps,
        "seconds": {name: max(e["seconds"][name] for e in everyone) for name in CONTENDERS},
        # each round's slowest learner: how much the machine's noise moved a contender's pace
        "round_seconds": {name: [max(e["rounds"][name][r] for e in everyone) for r in range(rounds)]
                          for name in CONTENDERS},
        "bytes_per_step": {name: {"counted": per_step("counted", name) if name in ASRDIST else None,
                                  "wire": per_step("wire", name) if spec.network != "loopback" else None}
                           for name in CONTENDERS},
        "held_out_loss": losses,
        "parameter_difference": {"sync_ddp": diff("sync", "ddp"),
                                 "averaging_torch": diff("averaging", "torch_averaging")},
        # a gradient mean in another summation order moves a weight by a few float32 ulps per step
        "rounding_tolerance": float(1e-5 * params["ddp"].abs().max()),
        "steps_per_contender": total_steps,
        "parameters": int(params["sync"].numel()),
    }
