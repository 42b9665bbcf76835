"""train.average_last in the engine (`asrdist.train.epoch_average`, the trainer's window), in-process
with one learner: the mean of state dicts against hand-computed figures, which epochs' models the
trainer averages, that 1 changes nothing, and that --resume averages the same models."""
from __future__ import annotations

import pytest
import torch

from asrdist.errors import ConfigError
from asrdist.parallel.base import Strategy
from asrdist.run.launch import print_summary
from asrdist.run.summary import RunSummary
from asrdist.train import checkpoint as ckpt
from asrdist.train.epoch_average import EpochAverage, average_state_dicts, cpu_state
from tests.support.engine_fixture import ListOrder, linear_trainer


def test_the_average_of_state_dicts_is_the_hand_computed_mean():
    states = [{"w": torch.tensor([[1.0, 2.0], [3.0, 4.0]]), "b": torch.tensor([0.5], dtype=torch.float64),
               "n": torch.tensor(10)},
              {"w": torch.tensor([[3.0, 2.0], [0.0, -4.0]]), "b": torch.tensor([1.0], dtype=torch.float64),
               "n": torch.tensor(20)},
              {"w": torch.tensor([[2.0, 5.0], [0.0, 3.0]]), "b": torch.tensor([2.25], dtype=torch.float64),
               "n": torch.tensor(30)}]
    kept = [{k: v.clone() for k, v in s.items()} for s in states]
    mean = average_state_dicts(states)
    assert torch.equal(mean["w"], torch.tensor([[2.0, 3.0], [1.0, 1.0]]))
    assert torch.equal(mean["b"], torch.tensor([1.25], dtype=torch.float64))
    assert mean["n"].item() == 30 and mean["n"].dtype == torch.int64  # an integer counter: the last one's
    assert mean["w"].dtype == torch.float32
    assert all(torch.equal(s[k], c[k]) for s, c in zip(states, kept) for k in s)  # the inputs are left alone
    with pytest.raises(ValueError):
        average_state_dicts([])


def test_batch_norm_statistics_are_averaged_and_its_batch_count_is_the_last_ones():
    norms = []
    for seed, batches in ((1, 2), (2, 5)):
        torch.manual_seed(seed)
        bn = torch.nn.BatchNorm1d(3)
        for _ in range(batches):
            bn(torch.randn(8, 3) * seed)
        norms.append(cpu_state(bn))
    mean = average_state_dicts(norms)
    for key in ("weight", "bias", "running_mean", "running_var"):
        assert torch.allclose(mean[key], (norms[0][key] + norms[1][key]) / 2, rtol=1e-6, atol=0), key
    assert mean["num_batches_tracked"].item() == 5


def _epoch_models(tmp_path, **kw):
    """A trainer of the engine tests' linear model with a validation that keeps a copy of the model
    it is given at every epoch end (one learner: the model itself, the consensus of one)."""
    seen: list[dict] = []

    def validate(model):
        seen.append(cpu_state(model))
        return {"valid_loss": 0.5}

    tr = linear_trainer(tmp_path, Strategy(), ListOrder(3), validate=validate, **kw)
    return tr, seen


def test_the_trainer_averages_the_last_n_epochs_models(tmp_path):
    tr, seen = _epoch_models(tmp_path, epochs=4, average_last=3)
    tr.fit()
    assert len(seen) == 4
    averaged = tr.averaged()
    assert averaged.epochs == [1, 2, 3]
    for key in seen[-1]:
        expected = ((seen[1][key].double() + seen[2][key].double() + seen[3][key].double()) / 3).float()
        assert torch.equal(averaged.state[key], expected), key
        assert torch.equal(tr.model.state_dict()[key], seen[3][key]), key  # the model itself is the last epoch's
    assert not torch.equal(averaged.state["weight"], seen[3]["weight"])  # averaging changed something
    # only the window's epochs were kept, and the last epoch's checkpoint holds them for a resume
    last = torch.load(ckpt.latest_step_dir(tmp_path) / "rank-0.pt", weights_only=False)
    assert [k["epoch"] for k in last["epoch_average"]["kept"]] == [1, 2]


def test_average_last_1_keeps_nothing_and_leaves_the_final_model_as_it_was(tmp_path):
    plain, _ = _epoch_models(tmp_path / "plain", epochs=3)
    plain.fit()
    one, _ = _epoch_models(tmp_path / "one", epochs=3, average_last=1)
    one.fit()
    assert one.averaged() is None and plain.averaged() is None
    for key, value in plain.model.state_dict().items():
        assert torch.equal(one.model.state_dict()[key], value), key
    last = torch.load(ckpt.latest_step_dir(tmp_path / "one") / "rank-0.pt", weights_only=False)
    assert last["epoch_average"]["kept"] == []


def test_more_epochs_than_trained_average_them_all_and_a_bad_n_is_refused(tmp_path):
    tr, seen = _epoch_models(tmp_path, epochs=2, average_last=5)
    tr.fit()
    averaged = tr.averaged()
    assert averaged.epochs == [0, 1]
    assert torch.equal(averaged.state["bias"], ((seen[0]["bias"].double() + seen[1]["bias"].double()) / 2).float())
    with pytest.raises(ConfigError, match="average_last"):
        linear_trainer(tmp_path / "bad", Strategy(), ListOrder(3), epochs=2, average_last=0)


def test_a_run_stopped_inside_an_epoch_averages_the_window_it_reached(tmp_path):
    # 3 minibatches an epoch: step 8 is inside epoch 2 (0-based), whose model stands in for the last
    tr, seen = _epoch_models(tmp_path, epochs=4, average_last=3, max_steps=8)
    tr.fit()
    assert len(seen) == 2
    averaged = tr.averaged()
    assert averaged.epochs == [1, 2]
    final = cpu_state(tr.model)
    assert torch.equal(averaged.state["weight"], ((seen[1]["weight"].double() + final["weight"].double()) / 2).float())


def test_resume_averages_the_same_models_as_an_uninterrupted_run(tmp_path):
    whole, _ = _epoch_models(tmp_path / "whole", epochs=4, average_last=3)
    whole.fit()
    cut, _ = _epoch_models(tmp_path / "cut", epochs=4, average_last=3, max_steps=8)  # cut inside epoch 2
    cut.fit()
    resumed, _ = _epoch_models(tmp_path / "cut", epochs=4, average_last=3)
    resumed.fit(resume=True)
    a, b = whole.averaged(), resumed.averaged()
    assert a.epochs == b.epochs == [1, 2, 3]
    for key, value in a.state.items():
        assert torch.equal(b.state[key], value), key


def test_a_resume_that_moves_the_window_drops_the_models_outside_it():
    model = torch.nn.Linear(2, 1)
    planned = EpochAverage(3, 4)  # window: epochs 1, 2, 3 (3 the final model)
    assert [e for e in range(4) if planned.wants(e, final=e == 3)] == [1, 2]
    for epoch in (1, 2):
        planned.add(epoch, model)
    state = planned.state_dict()
    longer = EpochAverage(3, 8)  # train.epochs raised on resume: window 5, 6, 7
    longer.load_state_dict(state)
    assert longer.kept == []
    fewer = EpochAverage(2, 4)  # average_last lowered: window 2, 3
    fewer.load_state_dict(state)
    assert [e for e, _ in fewer.kept] == [2]
    old = EpochAverage(3, 4)
    old.load_state_dict(None)  # a checkpoint from before averaging
    assert old.kept == [] and old.result(model, 3) is None
    assert not EpochAverage(1, 4).wants(2, final=False)


def test_the_end_of_train_prints_the_unaveraged_figures_beside_the_average(tmp_path, capsys):
    final = {"train_loss": 0.2, "valid_loss": 0.19, "cer": 0.2075, "averaged_epochs": [4, 5, 6],
             "unaveraged": {"valid_loss": 0.16, "cer": 0.1663}}
    summary = {"final": final, "strategy": "single", "learners": 1, "model": "ctc", "parameters": 10,
               "frames_per_second": 100.0, "wall_seconds": 1.0,
               "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0}}
    print_summary(tmp_path, RunSummary.from_json(summary))
    out = capsys.readouterr().out
    assert "cer=0.2075" in out.splitlines()[0]
    assert ("[asrdist] model.pt averages epochs 4, 5, 6; the last epoch's model alone: "
            "valid_loss=0.1600, cer=0.1663") in out
    del final["averaged_epochs"], final["unaveraged"]
    print_summary(tmp_path, RunSummary.from_json(summary))
    assert "averages" not in capsys.readouterr().out
