"""One learner's training step per frame, timed alone on this machine through `Trainer.train_step`
on the run's recipe, at the run's share of the minibatch and threads: the compute the simulator is
calibrated on (`asrdist.calibrate.microbench`). Why not a linear guess:
docs/calibration.md#a-learners-step-alone-calibratestepcost."""
from __future__ import annotations

import dataclasses
import statistics
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path

import torch

from asrdist.cluster.process_group import default_backend, device_for_backend
from asrdist.config import config_from_tree
from asrdist.data.targets import Targets
from asrdist.errors import DataError
from asrdist.parallel.base import LearnerContext
from asrdist.run.learner import build_learner
from asrdist.run.task import SpeechTask
from asrdist.train.loop import StragglerConfig

ROUNDS, WARMUP, SECONDS, MIN_STEPS = 9, 4, 0.5, 8
"""Each learner's steps are timed in ROUNDS windows, the learners' windows taking turns (so that
a slower spell of the machine hits all alike), each of at least MIN_STEPS steps and SECONDS, after
WARMUP untimed steps (first touch of the buffers); a learner's figure is the windows' mean. A run's
throughput is its frames over its whole time, the machine's slow spells (seconds long, on this
machine) included: the mean of windows spanning several seconds estimates that, where their median
(until 2026-11-28) dropped the slow spells, and 0.2 s windows spanned too little time to meet one."""


def config_step_seconds_per_frame(requests: dict, rounds: int = ROUNDS, seconds: float = SECONDS,
                                  epoch_ends: int = 0, ends_of=None) -> tuple[dict, dict]:
    """({key: seconds per frame of one learner's training step}, {key: median seconds of its
    epoch's end: validation and checkpoint, over `epoch_ends` of them; empty if 0}) for
    `requests` = {key: (resolved run config, targets, learners, threads)}, timed alone as
    `step_seconds_per_frame` does; the epoch ends of the keys in `ends_of` only (None: every key).
    Raises AsrdistError or OSError."""
    threads_before, rng_state = torch.get_num_threads(), torch.get_rng_state()
    try:
        with ExitStack() as stack:
            timers = {key: StepTimer(stack, *request) for key, request in requests.items()}
            for timer in timers.values():
                timer.window(WARMUP, 0.0)
            windows = {key: [] for key in timers}
            for _ in range(rounds):
                for key, timer in timers.items():
                    windows[key].append(timer.window(MIN_STEPS, seconds))
            ends = {key: statistics.median(timer.epoch_end() for _ in range(epoch_ends))
                    for key, timer in timers.items() if ends_of is None or key in ends_of} if epoch_ends else {}
    finally:
        torch.set_num_threads(threads_before)
        torch.set_rng_state(rng_state)
    return {key: statistics.fmean(w) for key, w in windows.items()}, ends


class StepTimer:
    """One learner of a run's recipe, alone, whose steps are timed window by window."""

    def __init__(self, stack: ExitStack, cfg, targets: Targets, learners: int, threads: int):

        tree = cfg.to_dict()
        tree["strategy"] = {"name": "single"}
        # one learner alone: nothing of the job's layout (nodes, a straggler's rank) applies to it
        tree["train"].update(learners=1, threads=threads, group_size=0,
                             straggler=dataclasses.asdict(StragglerConfig()))
        tree["data"]["batch_size"] = tree["data"]["batch_size"] // learners
        cfg = config_from_tree(tree)
        torch.manual_seed(cfg.seed)
        self.task = SpeechTask(cfg, targets, 0, 1)
        self.device = device_for_backend(default_backend(), 0)  # where a lone learner of the run computed
        tmp = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="asrdist-stepcost-")))
        self.trainer = build_learner(cfg, tmp, LearnerContext(device=self.device), self.task).trainer
        self.threads, self.corpus = threads, cfg.data.corpus
        self.batches = _batches(self.task.sampler)

    def epoch_end(self) -> float:
        """Seconds of what an epoch's end costs a lone learner: validating its model on the valid
        split, and its checkpoint."""
        torch.set_num_threads(self.threads)
        start = time.perf_counter()
        self.task.validate(self.trainer.model)
        self.trainer.save_checkpoint()
        return time.perf_counter() - start

    def window(self, steps: int, seconds: float) -> float:
        """Seconds per frame over the next `steps` steps and at least `seconds` of them; a step is
        what the learner's loop does per minibatch: draw it from the sampler (assembling its
        features and targets) and train on it."""
        torch.set_num_threads(self.threads)
        sync = torch.cuda.synchronize if self.device.type == "cuda" else (lambda: None)
        timed, frames, done = 0.0, 0, 0
        while done < steps or timed < seconds:
            sync()
            start = time.perf_counter()
            n = self.step()
            sync()
            timed += time.perf_counter() - start
            frames, done = frames + n, done + 1
        return timed / max(frames, 1)

    def step(self) -> int:
        """One step of the learner's loop: the next minibatch drawn and trained on; its frames."""
        batch = next(self.batches, None)
        if batch is None:
            raise DataError(f"{self.corpus}: no training minibatch to time")
        _, n = self.trainer.train_step(batch)
        self.trainer.state.step += 1
        return n


def _batches(sampler):
    """The sampler's (a `ShardedSampler`'s) minibatches, epoch after epoch (none if an epoch has none)."""
    epoch = 0
    while True:
        sampler.set_epoch(epoch)
        empty = True
        for batch in sampler:
            empty = False
            yield batch
        if empty:
            return
        epoch += 1
