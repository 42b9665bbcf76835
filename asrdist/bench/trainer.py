"""`asrdist bench trainer`: the trainer's overhead against a bare PyTorch loop.

Both loops train the default DNN on the same batches from the same `FrameSampler` (random
features in a memory-mapped store), one learner, one epoch per round; rounds alternate
bare / asrdist so machine noise hits both alike. The asrdist side is a learner from
`build_learner` with the bare loop's optimizer, trained by `Trainer.fit`. `trainer_vs_bare` =
asrdist frames/s divided by bare frames/s, medians over the rounds (target >= 0.95). `--device
cuda`: both on the GPU, each batch copied there as `Batch.to` copies it (pinned, not blocking); the
bare loop never waits for the device until its last step.
"""
from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from asrdist.bench.gpu import synchronize
from asrdist.checks import cli_device, cli_number
from asrdist.config import DataConfig, RunConfig, TrainConfig
from asrdist.data.samplers import FrameSampler
from asrdist.features.store import FeatureStore, FeatureStoreWriter
from asrdist.models.registry import ModelConfig, build_model
from asrdist.optim.build import OptimConfig
from asrdist.parallel.base import LearnerContext
from asrdist.run.learner import build_learner
from asrdist.train.synthetic import FrameTask
from asrdist.utils.throughput import job_frames_per_second

DIM, CLASSES = 40, 40


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--utterances", type=cli_number(int, at_least=1), default=300, help="utterances (100-500 frames) in the store")
    parser.add_argument("--rounds", type=cli_number(int, at_least=1), default=5)
    parser.add_argument("--threads", type=cli_number(int, at_least=0), default=1, help="torch threads (0 = all cores)")
    parser.add_argument("--device", type=cli_device, default=torch.device("cpu"),
                        help="where both loops compute: cpu (default), cuda, cuda:N")


def _store(tmp: Path, n: int):
    rng = np.random.default_rng(0)
    writer = FeatureStoreWriter(tmp / "feats", DIM)
    labels = {}
    for i in range(n):
        t = int(rng.integers(100, 501))
        utt = f"utt{i:05d}"
        writer.add(utt, rng.standard_normal((t, DIM), dtype=np.float32))
        labels[utt] = rng.integers(0, CLASSES, t).astype(np.int32)
    writer.close({"num_mel_bins": DIM, "cmvn": "none"})
    return FeatureStore(tmp / "feats"), labels


def _model(device: torch.device = torch.device("cpu")):
    torch.manual_seed(0)
    return build_model(ModelConfig(name="dnn"), DIM, CLASSES).to(device)


def _bare(model: torch.nn.Module, sampler, device: torch.device = torch.device("cpu")) -> tuple[int, float, float]:
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    sampler.set_epoch(0)
    synchronize(device)
    frames, t0, c0 = 0, time.perf_counter(), time.process_time()
    for batch in sampler:
        batch = batch.to(device)
        opt.zero_grad()
        loss = torch.nn.functional.cross_entropy(model(batch.inputs), batch.targets)
        loss.backward()
        opt.step()
        frames += batch.num_frames
    synchronize(device)
    return frames, time.perf_counter() - t0, time.process_time() - c0


def asrdist_learner(sampler, run_dir: Path, device: torch.device = torch.device("cpu")):
    """The asrdist side: `build_learner` on `_model()` and `sampler`, with the bare loop's optimizer
    (SGD, lr 0.05, momentum 0.9, constant rate), so both loops do the same work."""
    cfg = RunConfig(data=DataConfig(batch_size=sampler.batch_size), optim=OptimConfig(lr=0.05, momentum=0.9),
                    train=TrainConfig(epochs=1, log_every=50, threads=torch.get_num_threads()))
    return build_learner(cfg, run_dir, LearnerContext(device=device), FrameTask(_model(device), sampler))


def _asrdist(sampler, run_dir: Path, device: torch.device) -> tuple[int, float, float]:
    learner = asrdist_learner(sampler, run_dir, device)
    synchronize(device)
    t0, c0 = time.perf_counter(), time.process_time()
    state = learner.trainer.fit()
    synchronize(device)
    return state.frames, time.perf_counter() - t0, time.process_time() - c0


def run(args) -> dict:
    threads = args.threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    bare, ours, bare_cpu, ours_cpu = [], [], [], []
    with tempfile.TemporaryDirectory(prefix="asrdist-bench-trainer-") as tmp:
        tmp = Path(tmp)
        store, labels = _store(tmp, args.utterances)
        for r in range(args.rounds):
            s1 = FrameSampler(store, labels, batch_size=256, context=5, seed=0)
            f, t, c = _bare(_model(args.device), s1, args.device)
            bare.append(job_frames_per_second([f], [t]))
            bare_cpu.append(f / c)
            s2 = FrameSampler(store, labels, batch_size=256, context=5, seed=0)
            f, t, c = _asrdist(s2, tmp / f"run{r}", args.device)
            ours.append(job_frames_per_second([f], [t]))
            ours_cpu.append(f / c)
    med = statistics.median
    return {
        "trainer_vs_bare": med(ours) / med(bare),
        "trainer_vs_bare_cpu_time": med(ours_cpu) / med(bare_cpu),
        "asrdist_frames_per_second": med(ours),
        "bare_frames_per_second": med(bare),
        "rounds": {"asrdist": ours, "bare": bare, "asrdist_cpu": ours_cpu, "bare_cpu": bare_cpu},
        "method": "median over alternating rounds; the cpu_time variant divides by process CPU time, "
                  "which other load on the machine disturbs less",
        "model": "dnn (default: 11x40 -> 4x512 ReLU -> 40)",
        "batch_size": 256,
        "learners": 1,
        "device": str(args.device),
        "threads": threads,
        "cores": os.cpu_count(),
        "includes": "asrdist side includes metrics.jsonl/TensorBoard logging and the epoch-end checkpoint",
    }
