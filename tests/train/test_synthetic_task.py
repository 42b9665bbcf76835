"""The benchmarks' learners come from `build_learner` with `asrdist.train.synthetic`'s tasks:
the tasks' minibatches and loss, `bench scaling`'s run config, `bench ngsgd`'s identical starting
weights and `bench trainer`'s fair comparison. The benches' end-to-end runs and JSON keys are
tests/bench/test_bench_cli.py's."""
from __future__ import annotations

import pytest
import torch

from asrdist.errors import ConfigError
from asrdist.models.registry import ModelConfig, build_model
from asrdist.parallel.base import LearnerContext
from asrdist.train.loop import LoopConfig, Sampler, Task
from asrdist.train.synthetic import FrameTask, SyntheticSampler, SyntheticTask


@pytest.fixture(autouse=True)
def _keep_threads():
    """build_learner sets torch's thread count: leave the test process as it was."""
    threads = torch.get_num_threads()
    yield
    torch.set_num_threads(threads)


def _dnn(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return build_model(ModelConfig(name="dnn", hidden_layers=1, hidden_dim=16), 8, 5)


def test_emulated_task_yields_empty_minibatches_and_refuses_the_loss():
    task = SyntheticTask(_dnn(), local_batch=64, steps=3, emulate=True)
    batches = list(task.sampler)
    assert len(task.sampler) == 3 and [b.num_frames for b in batches] == [64] * 3
    assert all(b.inputs.numel() == 0 for b in batches) and task.batch is None
    assert task.kind == "frame" and task.validate is None and task.samples_per_step == 64
    with pytest.raises(RuntimeError, match="compute emulation"):
        task.loss(task.model, batches[0])


def test_the_benchmarks_tasks_are_what_the_loop_takes():
    """The loop's protocols (`asrdist.train.loop`), and its config built from `train.*` once."""
    from asrdist.config import RunConfig, TrainConfig
    from asrdist.run.learner import loop_config

    task = SyntheticTask(_dnn(), local_batch=8, steps=2)
    assert isinstance(task, Task) and isinstance(FrameTask(_dnn(), task.sampler), Task)
    assert isinstance(task.sampler, Sampler) and isinstance(task.sampler_for(4), Sampler)
    cfg = RunConfig(train=TrainConfig(epochs=3, max_steps=7, nonfinite="skip", average_last=2))
    loop = loop_config(cfg, progress=False)
    assert (loop.epochs, loop.max_steps, loop.nonfinite, loop.average_last, loop.progress) == (3, 7, "skip", 2, False)
    assert loop.straggler == cfg.train.straggler and loop.checkpoint_minutes == cfg.train.checkpoint_minutes
    with pytest.raises(ConfigError, match="log_every"):
        LoopConfig(epochs=1, log_every=0)


def test_real_task_repeats_one_fixed_batch_with_a_finite_loss():
    task = SyntheticTask(_dnn(), local_batch=32, steps=2, seed=3)
    first, second = list(task.sampler)
    assert first is second is task.batch and first.inputs.shape == (32, 88) and first.num_frames == 32
    loss, frames = task.loss(task.model, first)
    assert torch.isfinite(loss) and frames == 32
    other = task.sampler_for(16, rank=1, world_size=2)  # the same data on every rank
    assert other.batch.num_frames == 16 and len(other) == 2
    again = SyntheticTask(_dnn(), local_batch=32, steps=2, seed=3).batch
    assert torch.equal(again.inputs, first.inputs) and torch.equal(again.targets, first.targets)


def test_frame_task_serves_only_its_own_sampler_size():
    sampler = SyntheticSampler(8, steps=1)
    task = FrameTask(_dnn(), sampler)
    assert task.sampler_for(8, rank=0, world_size=1) is sampler and task.local_batch == 8
    with pytest.raises(ConfigError, match="8 frames, not 16"):
        task.sampler_for(16)


def test_synthetic_learner_trains_through_the_builder(tmp_path):
    from asrdist.config import DataConfig, RunConfig, TrainConfig
    from asrdist.run.learner import build_learner

    task = SyntheticTask(_dnn(), local_batch=16, steps=4)
    cfg = RunConfig(data=DataConfig(batch_size=16), train=TrainConfig(epochs=2, threads=1))
    learner = build_learner(cfg, tmp_path, LearnerContext(), task)
    state = learner.trainer.fit()
    assert state.step == 8 and state.frames == 8 * 16
    assert state.history[1]["train_loss"] < state.history[0]["train_loss"]  # it learns the fixed batch


def test_a_built_learner_computes_tiny_floats_as_zero(tmp_path):
    """Momentum of weights whose gradient stays zero decays below float32's smallest normal, where
    a CPU's arithmetic is many times slower (`asrdist.run.learner.flush_denormals`)."""
    from asrdist.config import DataConfig, RunConfig, TrainConfig
    from asrdist.run.learner import build_learner

    if not torch.set_flush_denormal(False):
        pytest.skip("this CPU cannot flush denormals")
    tiny = torch.tensor([1e-39])  # a denormal float32
    try:
        assert (tiny * 1.0).item() != 0.0
        task = SyntheticTask(_dnn(), local_batch=16, steps=1)
        build_learner(RunConfig(data=DataConfig(batch_size=16), train=TrainConfig(epochs=1, threads=1)), tmp_path,
                      LearnerContext(), task)
        assert (tiny * 1.0).item() == 0.0 and (tiny + 0.0).item() == 0.0
    finally:
        torch.set_flush_denormal(False)


# ------------------------------------------------------------------------ bench scaling

def _spec(world_size: int = 1, rank: int = 0):
    from asrdist.cluster.process_group import JobEnv

    return JobEnv(rank=rank, world_size=world_size, local_rank=rank, local_world_size=world_size, node_rank=0,
                  num_nodes=1, master_addr="127.0.0.1", master_port=0, network="loopback", num_threads=1,
                  timeout_s=30)


_ARGS = {"model": {"name": "dnn", "hidden_layers": 1, "hidden_dim": 16}, "feature_dim": 8, "num_classes": 10,
         "optim": {"name": "sgd", "lr": 0.1}, "compute_ms": 5.0, "local_batch": 64, "steps": 3, "warmup": 1}


def test_scaling_config_reads_the_job_args():
    from asrdist.bench.scaling_worker import scaling_config

    cfg = scaling_config(_spec(world_size=4), {**_ARGS, "strategy": "adpsgd", "strategy_config": {"pattern": "random"},
                                               "straggler_rank": 3, "slowdown": 3.0})
    assert cfg.strategy_name == "adpsgd" and cfg.strategy.pattern == "random"
    assert cfg.data.batch_size == 4 * 64 and cfg.train.learners == 4 and cfg.train.epochs == 1
    assert cfg.train.threads == 1 and cfg.train.emulate_compute_ms == 5.0 and cfg.optim.lr == 0.1
    assert cfg.train.straggler.ranks == [3] and cfg.train.straggler.slowdown == 3.0
    plain = scaling_config(_spec(), {**_ARGS, "strategy": "sync"})
    assert plain.train.straggler.ranks == [] and plain.train.straggler.slowdown == 1.0
    with pytest.raises(ConfigError, match="strategy.bogus"):
        scaling_config(_spec(), {**_ARGS, "strategy": "sync", "strategy_config": {"bogus": 1}})


def test_scaling_learner_slows_its_straggler():
    """One learner in this process: the straggler sleeps (slowdown - 1) x its compute after each step."""
    from asrdist.bench.scaling_worker import scaling_learner

    r = scaling_learner(_spec(), {**_ARGS, "strategy": "sync", "straggler_rank": 0, "slowdown": 3.0})
    assert r["frames"] == 3 * 64 and r["steps"] == 3 and r["threads"] == 1
    assert r["compute_seconds_per_step"] >= 0.005
    assert r["seconds_per_step"] >= 3 * r["compute_seconds_per_step"]
    assert r["sum_of_learner_rates"] == pytest.approx(r["frames_per_second"])


# ------------------------------------------------------------------------ bench ngsgd

def test_ngsgd_learners_start_from_identical_weights(tmp_path):
    from asrdist.bench.ngsgd import build_learners, flop_ratio
    from asrdist.optim.ng_layers import natural_gradient_layers

    torch.manual_seed(123)  # whatever came before, both start from the same weights
    learners = build_learners(ModelConfig(name="dnn", hidden_layers=2, hidden_dim=16), 8, 5, 32, tmp_path)
    plain, natural = learners["sgd"], learners["ngsgd"]
    assert not natural_gradient_layers(plain.model) and len(natural_gradient_layers(natural.model)) == 3
    plain_params, natural_params = list(plain.model.parameters()), list(natural.model.parameters())
    assert len(plain_params) == len(natural_params) == 6
    for p, q in zip(plain_params, natural_params):
        torch.testing.assert_close(p, q, rtol=0, atol=0)
    assert torch.equal(plain.task.batch.inputs, natural.task.batch.inputs)
    assert plain.optimizer.param_groups[0]["lr"] == natural.optimizer.param_groups[0]["lr"] == 0.01
    plain.trainer.train_step(plain.task.batch)
    natural.trainer.train_step(natural.task.batch)
    assert not torch.equal(plain_params[0], natural_params[0])  # preconditioning changes the update
    assert flop_ratio(natural.model, 32) > 1.0


# ------------------------------------------------------------------------ bench trainer

def test_bench_trainer_sides_do_the_same_work(tmp_path):
    """The builder's learner, from the same weights on the same batches, ends exactly where the bare
    loop does: only the trainer's overhead separates their frames/s."""
    from asrdist.bench import trainer as bench
    from asrdist.data.samplers import FrameSampler

    store, labels = bench._store(tmp_path, 3)
    bare = bench._model()
    bench._bare(bare, FrameSampler(store, labels, batch_size=256, context=5, seed=0))
    learner = bench.asrdist_learner(FrameSampler(store, labels, batch_size=256, context=5, seed=0), tmp_path / "run")
    group = learner.optimizer.param_groups[0]
    assert (group["lr"], group["momentum"], group["nesterov"], group["weight_decay"]) == (0.05, 0.9, False, 0.0)
    state = learner.trainer.fit()
    assert state.step >= 2
    for p, q in zip(bare.parameters(), learner.model.parameters()):
        torch.testing.assert_close(p, q)
