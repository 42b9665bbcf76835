"""`train.accumulate: K` and `train.precision: bf16` through the trainer's own step.

K micro-batches of B/K give the parameters of one batch of B: on one learner (the step alone), on
gloo learners for the strategies that exchange during backward (sync's hooks, which hold back
inside `no_sync()`) and after it (onebit, averaging), each against the same run with K = 1;
adpsgd's, hierarchical's and ddp's are in their own tests (test_adpsgd_order, test_ddp). bf16:
the forward under autocast, weights and gradients fp32, every model kind trains."""
from __future__ import annotations

import functools
import math

import pytest
import torch
import torch.nn.functional as F

from asrdist.data.batch import Batch
from asrdist.errors import ConfigError, TrainingError
from asrdist.models.registry import ModelConfig, build_model
from asrdist.optim.ng_layers import apply_natural_gradient
from asrdist.parallel.averaging import AveragingConfig, AveragingStrategy
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.onebit import OneBitConfig, OneBitStrategy
from asrdist.parallel.sync import SyncConfig, SyncStrategy
from asrdist.run.task import minibatch_loss
from asrdist.train.loop import LoopConfig
from tests.support.dist_utils import run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

STEPS, ROWS = 4, 12


def _model(seed: int = 0) -> torch.nn.Module:
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 5))


def _batches(seed: int = 1, steps: int = STEPS, rows: int = ROWS) -> list[Batch]:
    gen = torch.Generator().manual_seed(seed)
    return [Batch(inputs=torch.randn(rows, 6, generator=gen), targets=torch.randint(0, 5, (rows,), generator=gen),
                  num_frames=rows) for _ in range(steps)]


def _parameters(model: torch.nn.Module) -> list[torch.Tensor]:
    return [p.detach().clone() for p in model.parameters()]


# ------------------------------------------------------------------------------- the split

def test_split_cuts_rows_evenly_and_counts_each_parts_frames():
    frames = Batch(inputs=torch.arange(10.0).reshape(10, 1), targets=torch.arange(10), num_frames=10)
    parts = frames.split(4)
    assert [p.size for p in parts] == [3, 3, 2, 2] and [p.num_frames for p in parts] == [3, 3, 2, 2]
    assert torch.equal(torch.cat([p.inputs for p in parts]), frames.inputs)
    assert frames.split(1) == [frames]
    assert [p.size for p in frames.split(64)] == [1] * 10  # never an empty micro-batch
    lengths = torch.tensor([5, 2, 7, 1])
    utterances = Batch(inputs=torch.zeros(4, 7, 3), targets=torch.zeros(4, 2, dtype=torch.long), num_frames=15,
                       input_lengths=lengths, target_lengths=torch.tensor([2, 1, 2, 1]))
    halves = utterances.split(2)
    assert [p.num_frames for p in halves] == [7, 8]
    assert [p.target_lengths.tolist() for p in halves] == [[2, 1], [2, 1]]
    with pytest.raises(ValueError):
        frames.split(0)


# ------------------------------------------------------------------------- one learner

@pytest.mark.parametrize("accumulate", [2, 5, ROWS])
def test_k_micro_batches_give_the_parameters_of_one_batch(accumulate):
    runs = {}
    for k in (1, accumulate):
        model = _model()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        strategy = Strategy()
        strategy.setup(model, optimizer, LearnerContext())
        losses = train_steps(make_trainer(model, optimizer, strategy, lr=0.1, accumulate=k), _batches())
        runs[k] = (_parameters(model), losses)
    for got, want in zip(*(runs[k][0] for k in (accumulate, 1))):
        torch.testing.assert_close(got, want, rtol=0, atol=1e-6)
    # the step's loss is the whole batch's mean, as without accumulation
    assert runs[accumulate][1] == pytest.approx(runs[1][1], rel=1e-6)
    # and accumulation is not a no-op that trains on one micro-batch: that run ends elsewhere
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    strategy = Strategy()
    strategy.setup(model, optimizer, LearnerContext())
    train_steps(make_trainer(model, optimizer, strategy, lr=0.1), [b.split(accumulate)[0] for b in _batches()])
    assert max((a - b).abs().max() for a, b in zip(_parameters(model), runs[1][0])) > 1e-3


class _Recorder(Strategy):
    """Counts the trainer's calls: micro-batches inside no_sync, exchanges, the gradient exchanged."""

    def __init__(self):
        super().__init__()
        self.inside, self.exchanges, self.grads = 0, 0, []

    def no_sync(self):
        self.inside += 1
        return super().no_sync()

    def after_backward(self):
        self.exchanges += 1
        self.grads.append([p.grad.clone() for p in self.model.parameters()])


def test_the_strategy_sees_one_exchange_of_the_whole_batchs_gradient():
    model = _model()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.0)
    strategy = _Recorder()
    strategy.setup(model, optimizer, LearnerContext())
    batch = _batches(steps=1)[0]
    train_steps(make_trainer(model, optimizer, strategy, lr=0.0, accumulate=3), [batch])
    assert (strategy.inside, strategy.exchanges) == (2, 1)
    F.cross_entropy(model(batch.inputs), batch.targets).backward()
    for got, p in zip(strategy.grads[0], model.parameters()):
        torch.testing.assert_close(got, p.grad, rtol=0, atol=1e-7)


def test_a_non_finite_micro_batch_stops_naming_it_or_drops_the_whole_step():
    batch = _batches(steps=1)[0]
    batch.inputs[-1, 0] = math.nan  # in the last of three micro-batches
    for nonfinite in ("stop", "skip"):
        model = _model()
        before = _parameters(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy = Strategy()
        strategy.setup(model, optimizer, LearnerContext())
        trainer = make_trainer(model, optimizer, strategy, lr=0.1, accumulate=3, nonfinite=nonfinite)
        if nonfinite == "stop":
            with pytest.raises(TrainingError, match="micro-batch 3 of 3"):
                trainer.train_step(batch)
        else:
            loss, _ = trainer.train_step(batch)
            assert math.isnan(loss) and trainer.stepper.skipped == 1
            assert all(torch.equal(a, b) for a, b in zip(_parameters(model), before))


@pytest.mark.parametrize("fields", [{"accumulate": 0}, {"accumulate": 1.5}, {"accumulate": 5000},
                                    {"precision": "fp16"}, {"precision": None}])
def test_bad_values_name_the_key(fields):
    key = next(iter(fields))
    with pytest.raises(ConfigError, match=f"train.{key}"):
        LoopConfig(epochs=1, **fields)


# ---------------------------------------------------------------------- gloo learners

CASES = {
    "sync": lambda: SyncStrategy(SyncConfig(bucket_cap_mb=1e-4)),  # a bucket per parameter, launched in backward
    "onebit": lambda: OneBitStrategy(OneBitConfig()),
    "averaging": lambda: AveragingStrategy(AveragingConfig(average_every=2 * ROWS)),
}


def _learner(rank: int, world_size: int) -> dict:
    out = {}
    for name, build in CASES.items():
        for k in (1, 3):
            model = _model(seed=rank)  # learners start apart: setup makes them one
            optimizer = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
            strategy = build()
            strategy.setup(model, optimizer, LearnerContext(rank=rank, world_size=world_size))
            trainer = make_trainer(model, optimizer, strategy, lr=0.1, accumulate=k)
            train_steps(trainer, _batches(seed=1 + rank))
            strategy.finalize()
            out[(name, k)] = (_parameters(model), strategy.counters.exchanges)
    return out


@pytest.mark.slow
def test_on_gloo_learners_k_micro_batches_train_as_one_batch(tmp_path):
    results = run_distributed(_learner, 2, tmp_path)
    for rank, res in enumerate(results):
        for name in CASES:
            (one, exchanges_one), (three, exchanges_three) = res[(name, 1)], res[(name, 3)]
            assert exchanges_three == exchanges_one > 0, name  # one exchange a step, not one a micro-batch
            for got, want in zip(three, one):
                torch.testing.assert_close(got, want, rtol=0, atol=1e-5, msg=f"{name}, rank {rank}")


# ------------------------------------------------------------------------------- bf16

def _kind_batches(kind: str, steps: int = 3) -> list[Batch]:
    gen = torch.Generator().manual_seed(2)
    if kind == "dnn":
        return [Batch(inputs=torch.randn(32, 11 * 8, generator=gen), targets=torch.randint(0, 6, (32,), generator=gen),
                      num_frames=32) for _ in range(steps)]
    if kind == "lstm":
        return [Batch(inputs=torch.randn(4, 9, 8, generator=gen), targets=torch.randint(0, 6, (4, 9), generator=gen),
                      num_frames=36, input_lengths=torch.full((4,), 9)) for _ in range(steps)]
    lengths = torch.tensor([20, 14, 9])
    return [Batch(inputs=torch.randn(3, 20, 8, generator=gen), targets=torch.randint(1, 6, (3, 4), generator=gen),
                  num_frames=43, input_lengths=lengths, target_lengths=torch.tensor([4, 3, 2])) for _ in range(steps)]


@pytest.mark.parametrize("kind", ["dnn", "lstm", "ctc", "ngsgd"])
def test_bf16_trains_every_model_kind_with_fp32_weights_and_gradients(kind):
    runs = {}
    for precision in ("fp32", "bf16"):
        torch.manual_seed(0)
        model = build_model(ModelConfig(name="dnn" if kind == "ngsgd" else kind, hidden_dim=16, hidden_layers=2), 8, 6)
        if kind == "ngsgd":
            apply_natural_gradient(model)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        strategy = _Recorder()
        strategy.setup(model, optimizer, LearnerContext())
        loss_fn = functools.partial(minibatch_loss, kind=model.kind)
        trainer = make_trainer(model, optimizer, strategy, lr=0.1, loss_fn=loss_fn, precision=precision)
        losses = train_steps(trainer, _kind_batches("dnn" if kind == "ngsgd" else kind))
        assert {g.dtype for grads in strategy.grads for g in grads} == {torch.float32}
        assert {p.dtype for p in model.parameters()} == {torch.float32}
        runs[precision] = (losses, _parameters(model))
    assert runs["bf16"][0] == pytest.approx(runs["fp32"][0], rel=0.02)
    difference = max((a - b).abs().max() for a, b in zip(runs["bf16"][1], runs["fp32"][1]))
    assert 0 < difference < 0.05  # bf16 did the arithmetic (not bit-equal), close to fp32's
