"""The GPU path, written once for any device: every test takes the device as a parameter, so its
CPU variant runs everywhere and its CUDA variant (marked `cuda`, skipped without a CUDA device)
runs on a GPU, through `scripts/gpu_check.sh` (`pytest -m cuda`).

Covered: models and minibatches on the device through the trainer's own step; every strategy's
exchange on device tensors between 2 gloo learners (gloo's all-to-all and all-gather take CPU
tensors: asrdist stages those through the CPU, which the CPU variant exercises by staging CPU
tensors as if they lived on a device); a checkpoint written on the device, read on the CPU and
restored on both; `asrdist eval --device` and `asrdist decode --device` of a run trained on the
device, on it and on the CPU (the same figures to float tolerance), a phone CTC run's too, with
speaker adaptation (CUDA only: its CPU variant would compare the CPU with itself).
"""
from __future__ import annotations

import json
import types
from dataclasses import replace
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from asrdist.cli import main
from asrdist.data.batch import IGNORE_INDEX, Batch
from asrdist.models.registry import ModelConfig, build_model
from asrdist.parallel import build_strategy, strategy_config_class
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.train import checkpoint as ckpt
from asrdist.train.loop import LoopConfig
from asrdist.train.synthetic import SyntheticSampler
from asrdist.run.task import SpeechTask
from asrdist.train.trainer import Trainer, TrainerHooks
from tests.support.dist_utils import learner_context, run_distributed
from tests.support.strategy_harness import make_trainer, train_steps

NO_CUDA = "needs a CUDA device (scripts/gpu_check.sh runs these on a GPU)"
CUDA = pytest.param("cuda", marks=[pytest.mark.cuda, pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)])
DEVICES = ["cpu", CUDA]
MODELS = {
    "dnn": ModelConfig(name="dnn", hidden_layers=2, hidden_dim=32, context=2),
    "blstm": ModelConfig(name="blstm", hidden_layers=1, hidden_dim=16, chunk=7),
    "ctc": ModelConfig(name="ctc", hidden_layers=1, hidden_dim=16, subsample=2, conv_channels=4),
}
FEATURES, CLASSES = 8, 6


def exact_float32() -> None:
    """No TF32 on a GPU (cuDNN's LSTMs use it by default): device and CPU then agree to float32's
    rounding, which the comparisons below allow for."""
    torch.backends.cuda.matmul.allow_tf32 = False
    torch.backends.cudnn.allow_tf32 = False


@pytest.fixture(autouse=True)
def _no_tf32():
    saved = torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32
    exact_float32()
    yield
    torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32 = saved


def _batch(cfg: ModelConfig, model: torch.nn.Module, seed: int) -> Batch:
    """A minibatch shaped as the model's sampler makes it (see `Batch`), on the CPU."""
    gen = torch.Generator().manual_seed(seed)
    if cfg.kind == "frame":
        inputs = torch.randn(24, model.input_dim, generator=gen)
        return Batch(inputs, torch.randint(0, CLASSES, (24,), generator=gen), 24)
    if cfg.kind == "chunk":
        targets = torch.randint(0, CLASSES, (4, cfg.chunk), generator=gen)
        targets[-1, -2:] = IGNORE_INDEX  # the last chunk of an utterance is padded
        return Batch(torch.randn(4, cfg.chunk, FEATURES, generator=gen), targets, 4 * cfg.chunk - 2,
                     input_lengths=torch.tensor([cfg.chunk] * 3 + [cfg.chunk - 2]))
    lengths, target_lengths = torch.tensor([20, 13, 9]), torch.tensor([4, 3, 2])
    inputs = torch.randn(3, 20, FEATURES, generator=gen) * (torch.arange(20) < lengths[:, None])[..., None]
    targets = torch.randint(1, CLASSES, (3, 4), generator=gen) * (torch.arange(4) < target_lengths[:, None])
    return Batch(inputs, targets, int(lengths.sum()), input_lengths=lengths, target_lengths=target_lengths)


def _train_on(device: str, name: str, steps: int = 3):
    """The trainer's own step with the speech task's loss (which moves each minibatch to the
    model's device) on `steps` minibatches; returns (losses, model)."""
    cfg = MODELS[name]
    torch.manual_seed(0)
    model = build_model(cfg, FEATURES, CLASSES).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    strategy = Strategy()
    ctx = LearnerContext(device=torch.device(device))
    strategy.setup(model, opt, ctx)
    loss_fn = SpeechTask.loss.__get__(types.SimpleNamespace(kind=cfg.kind))
    trainer = make_trainer(model, opt, strategy, ctx=ctx, loss_fn=loss_fn, lr=0.05)
    losses = train_steps(trainer, [_batch(cfg, model, seed) for seed in range(steps)])
    return losses, model


@pytest.mark.parametrize("name", sorted(MODELS))
@pytest.mark.parametrize("device", DEVICES)
def test_models_and_minibatches_train_on_the_device(device, name):
    losses, model = _train_on(device, name)
    assert all(p.device.type == device for p in model.parameters())
    assert all(p.grad is None or p.grad.device.type == device for p in model.parameters())
    assert all(torch.isfinite(torch.tensor(losses)))
    if device != "cpu":  # the same arithmetic as on the CPU, to float tolerance
        cpu_losses, cpu_model = _train_on("cpu", name)
        torch.testing.assert_close(torch.tensor(losses), torch.tensor(cpu_losses), rtol=1e-4, atol=1e-5)
        for p, q in zip(model.parameters(), cpu_model.parameters()):
            torch.testing.assert_close(p.detach().cpu(), q.detach(), rtol=1e-3, atol=1e-5)


@pytest.mark.parametrize("name", sorted(MODELS))
def test_a_models_forward_makes_every_tensor_on_its_inputs_device(name):
    """On the meta device a tensor made on the CPU inside forward (a mask, a range) meets the meta
    inputs and raises: the CPU catches what would break on a GPU (CTC's lengths stay on the CPU,
    as pack_padded_sequence wants them)."""
    cfg = MODELS[name]
    batch = _batch(cfg, None if cfg.kind != "frame" else build_model(cfg, FEATURES, CLASSES), 0)
    with torch.device("meta"):
        model = build_model(cfg, FEATURES, CLASSES)
    inputs = batch.inputs.to("meta")
    if cfg.kind == "ctc":  # the convolutional front end alone: the BLSTM packs by CPU lengths
        out = model.frontend(inputs, batch.input_lengths.to("meta"))
    else:
        out = model(inputs)
    assert out.device.type == "meta"


# ------------------------------------------------------------------ strategies, 2 learners

STRATEGY_NAMES = ("sync", "ddp", "onebit", "averaging", "adpsgd", "hierarchical", "hybrid")
EXACT = ("sync", "ddp", "onebit", "averaging")
"""Lock-step strategies: the same seed gives the same parameters, staged or not."""
STEPS = 4


def _strategy_run(name: str, device: torch.device, ctx: LearnerContext, rank: int, world_size: int) -> list:
    exact_float32()
    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(6, 16), torch.nn.Tanh(), torch.nn.Linear(16, 3)).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
    config_class = strategy_config_class(name)
    extra = {"average_every": 32} if name == "averaging" else {}
    strategy = build_strategy(name, config_class(**extra) if config_class else None)
    strategy.setup(model, opt, ctx)
    strategy.start_epoch(0)
    gen = torch.Generator().manual_seed(1)
    x, y = torch.randn(STEPS, 16, 6, generator=gen), torch.randint(0, 3, (STEPS, 16), generator=gen)
    per = 16 // world_size
    mine = slice(rank * per, (rank + 1) * per)

    def loss(model, batch):
        batch = batch.to(next(model.parameters()).device)
        return torch.nn.functional.cross_entropy(model(batch.inputs), batch.targets), batch.num_frames

    trainer = make_trainer(model, opt, strategy, ctx=ctx, loss_fn=loss, lr=0.1)
    train_steps(trainer, [(x[t, mine], y[t, mine]) for t in range(STEPS)])
    strategy.close(None)
    strategy.finalize()
    assert all(p.device.type == device.type for p in model.parameters()), name
    return [p.detach().cpu().clone() for p in model.parameters()]


def _every_strategy(rank: int, world_size: int, device_name: str) -> dict:
    from asrdist.parallel.groups import build_groups
    from asrdist.parallel import comm

    device = torch.device(device_name)
    base = learner_context()
    # two nodes of one learner: hierarchical and hybrid then exchange between nodes too
    two_nodes = replace(base, groups=build_groups(rank, world_size, 1, timedelta(seconds=30)), group_size=1)
    unstaged = comm.needs_staging
    out = {}
    for name in STRATEGY_NAMES:
        ctx = replace(two_nodes if name in ("hierarchical", "hybrid") else base, device=device)
        if device.type == "cpu":  # stage the CPU tensors as if they were a device's, and compare
            out[f"{name}/unstaged"] = _strategy_run(name, device, ctx, rank, world_size)
            comm.needs_staging = lambda t, group=None: dist.get_backend(group) == "gloo"
        try:
            out[name] = _strategy_run(name, device, ctx, rank, world_size)
        finally:
            comm.needs_staging = unstaged
        if device.type != "cpu" and name in EXACT:
            out[f"{name}/cpu"] = _strategy_run(name, torch.device("cpu"), replace(ctx, device=torch.device("cpu")),
                                               rank, world_size)
    return out


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_every_strategy_exchanges_device_tensors_over_gloo(tmp_path, device):
    results = run_distributed(_every_strategy, 2, tmp_path, device)
    for name in STRATEGY_NAMES:
        for a, b in zip(results[0][name], results[1][name]):  # the consensus model is everyone's
            torch.testing.assert_close(a, b, rtol=0, atol=0, msg=name)
        assert all(torch.isfinite(p).all() for p in results[0][name]), name
        if name in EXACT:
            reference = results[0][f"{name}/unstaged" if device == "cpu" else f"{name}/cpu"]
            for a, b in zip(results[0][name], reference):
                if device == "cpu":  # staging copies bytes: bit for bit
                    assert torch.equal(a, b), name
                else:
                    torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5, msg=name)


# ------------------------------------------------------------------------------ checkpoints

def _checkpoint_trainer(device: str, run_dir, seed: int) -> Trainer:
    cfg = MODELS["dnn"]
    torch.manual_seed(seed)
    model = build_model(cfg, FEATURES, CLASSES).to(device)
    opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
    ctx = LearnerContext(device=torch.device(device))
    strategy = Strategy()
    strategy.setup(model, opt, ctx)
    loss_fn = SpeechTask.loss.__get__(types.SimpleNamespace(kind=cfg.kind))
    hooks = TrainerHooks(loss_fn=loss_fn, lr_at=lambda step, epoch: 0.05)
    sampler = SyntheticSampler(24, 8, _batch(cfg, model, 0))
    return Trainer(model, opt, strategy, sampler, hooks, ctx, run_dir, LoopConfig(epochs=1, progress=False))


def _tensors(value):
    if isinstance(value, torch.Tensor):
        yield value
    elif isinstance(value, dict):
        for v in value.values():
            yield from _tensors(v)
    elif isinstance(value, (list, tuple)):
        for v in value:
            yield from _tensors(v)


def _parameters(trainer: Trainer) -> list[torch.Tensor]:
    return [p.detach().cpu().clone() for p in trainer.model.parameters()]


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_saved_on_the_device_loads_on_the_cpu_and_back(tmp_path, device):
    import copy

    trained = _checkpoint_trainer(device, tmp_path / "run", seed=0)
    batches = [_batch(MODELS["dnn"], trained.model, s) for s in range(3)]
    train_steps(trained, batches[:2])
    trained.save_checkpoint()
    state = ckpt.load_learner(tmp_path / "run", 0, 1)
    assert all(t.device.type == "cpu" for t in _tensors(state))
    on_cpu = _checkpoint_trainer("cpu", tmp_path / "cpu", seed=1)  # another start: restoring must overwrite it
    on_cpu.restore_snapshot(copy.deepcopy(state))
    back = _checkpoint_trainer(device, tmp_path / "back", seed=1)
    back.restore_snapshot(copy.deepcopy(state))
    assert all(p.device.type == device for p in back.model.parameters())
    assert all(t.device.type == device for t in _tensors(back.optimizer.state_dict()["state"]))
    for restored in (on_cpu, back):
        for a, b in zip(_parameters(restored), _parameters(trained)):
            assert torch.equal(a, b)
    for trainer in (trained, on_cpu, back):  # all three go on from the same state
        train_steps(trainer, batches[2:])
    for a, b in zip(_parameters(back), _parameters(trained)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)
    for a, b in zip(_parameters(on_cpu), _parameters(trained)):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-6)


@pytest.mark.parametrize("device", DEVICES)
def test_a_checkpoint_resumes_the_devices_dropout_masks(tmp_path, device):
    """A learner that resumes on its device draws the dropout masks the original would have drawn:
    the checkpoint holds the device's generator too (CUDA's is its own, apart from the CPU's)."""
    import copy
    from dataclasses import replace

    cfg = replace(MODELS["dnn"], dropout=0.5)

    def trainer(seed: int, run: str) -> Trainer:
        torch.manual_seed(seed)
        model = build_model(cfg, FEATURES, CLASSES).to(device)
        opt = torch.optim.SGD(model.parameters(), lr=0.05)
        strategy = Strategy()
        strategy.setup(model, opt, LearnerContext(device=torch.device(device)))
        hooks = TrainerHooks(loss_fn=SpeechTask.loss.__get__(types.SimpleNamespace(kind=cfg.kind)),
                             lr_at=lambda step, epoch: 0.05)
        return Trainer(model, opt, strategy, SyntheticSampler(24, 8, _batch(cfg, model, 0)), hooks,
                       LearnerContext(device=torch.device(device)), tmp_path / run,
                       LoopConfig(epochs=1, progress=False))

    original = trainer(0, "run")
    batches = [_batch(cfg, original.model, s) for s in range(4)]
    train_steps(original, batches[:2])
    original.save_checkpoint()
    train_steps(original, batches[2:])
    state = ckpt.load_learner(tmp_path / "run", 0, 1)
    resumed = trainer(1, "back")  # another seed: every generator starts elsewhere until restored
    resumed.restore_snapshot(copy.deepcopy(state))  # the generators are the process's: restored after
    train_steps(resumed, batches[2:])               # the original drew from them
    for a, b in zip(_parameters(resumed), _parameters(original)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


# ----------------------------------------------------------------- a run trained on the device

TINY = ["model.hidden_dim=32", "model.hidden_layers=1", "data.batch_size=64", "train.log_every=10"]
CTC_SMALL = ["model.hidden_dim=32", "model.hidden_layers=1", "data.batch_size=1500", "optim.warmup_steps=0",
             "train.log_every=10", "eval.beam=2", "--epochs", "4"]
"""A phone CTC run that says something: on the CPU, PER 0.73 on the validation split, 0.82 adapted
(27 of 60 hypotheses changed); one epoch says nothing (PER 1.0), which would compare nothing."""


def _evaluated(run, data, out, device: str, *options: str) -> dict:
    """eval.json of `asrdist eval RUN --data DATA --device DEVICE OPTIONS...`."""
    assert main(["eval", str(run), "--data", str(data), "--out", str(out), "--device", device, *options]) == 0
    return json.loads(out.read_text())


def _decoded(run, wavs, device: str, capsys, *options: str) -> list[str]:
    """The `utt text` lines of `asrdist decode RUN WAVS --device DEVICE OPTIONS...`."""
    capsys.readouterr()
    assert main(["decode", str(run), *map(str, wavs), "--device", device, *options]) == 0
    return capsys.readouterr().out.splitlines()


def _assert_same_figures(on_device: dict, on_cpu: dict, loss_rel: float, rate_abs: float) -> None:
    """The device's eval figures are the CPU's to float32 rounding: the loss to `loss_rel`, each rate
    and accuracy to `rate_abs` (a few frames or tokens whose scores tie to that rounding)."""
    assert (on_device["utterances"], on_device["frames"]) == (on_cpu["utterances"], on_cpu["frames"])
    assert on_device["loss"] == pytest.approx(on_cpu["loss"], rel=loss_rel)
    for key in ("frame_accuracy", "per", "cer", "wer", "sentence_accuracy"):
        if key in on_cpu:
            assert on_device[key] == pytest.approx(on_cpu[key], abs=rate_abs), key


@pytest.mark.slow
@pytest.mark.parametrize("device", DEVICES)
def test_eval_and_decode_on_the_device_and_the_cpu_of_a_run_trained_on_the_device(tone_corpus, tmp_path, monkeypatch,
                                                                                  capsys, device):
    if device == "cpu":  # asrdist puts one learner on the GPU where there is one: keep this one on the CPU
        monkeypatch.setattr("asrdist.cluster.process_group.default_backend", lambda: "gloo")
    out = tmp_path / "run"
    assert main(["train", "configs/default.yaml", *TINY, "--data", str(tone_corpus), "--epochs", "1",
                 "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    assert summary["comm"]["per_learner"][0]["device"].split(":")[0] == device
    saved = torch.load(out / "model.pt", map_location="cpu", weights_only=False)
    assert all(t.device.type == "cpu" for t in _tensors(saved["model"]))
    # the validation split from model.pt, on the training device: what the run's own validation measured there
    valid = tone_corpus / "valid"
    on_device = _evaluated(out, valid, tmp_path / "valid.json", device)
    assert on_device["frame_accuracy"] == pytest.approx(summary["final"]["frame_accuracy"], abs=1e-9)
    assert on_device["frame_accuracy"] > 0.5
    wav = sorted(valid.rglob("*.wav"))[0]
    line = _decoded(out, [wav], device, capsys)[-1]
    assert line.split()[0] == wav.stem or str(wav) in line
    assert len(line.split()) >= 2  # the recording's name, then what was decoded
    if device != "cpu":  # the CPU's figures to float tolerance, and its line
        _assert_same_figures(on_device, _evaluated(out, valid, tmp_path / "cpu.json", "cpu"), 1e-4, 2e-3)
        assert _decoded(out, [wav], "cpu", capsys)[-1] == line


@pytest.mark.slow
@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason=NO_CUDA)
def test_a_ctc_runs_eval_and_decode_on_the_device_give_the_cpus_figures(tone_corpus, tmp_path, capsys):
    """A phone CTC run (a BLSTM: cuDNN's on the GPU), also with speaker adaptation (each speaker's map
    fitted on the device): `--device cuda` gives `--device cpu`'s figures to float tolerance."""
    out = tmp_path / "run"
    assert main(["train", "configs/ctc.yaml", *CTC_SMALL, "--data", str(tone_corpus), "--out", str(out),
                 "--no-progress"]) == 0
    valid = tone_corpus / "valid"
    for rounds, loss_rel, rate_abs in (("0", 1e-4, 0.01), ("1", 1e-2, 0.05)):  # the maps' fits differ by rounding
        figures = {d: _evaluated(out, valid, tmp_path / f"{d}-{rounds}.json", d, "--adapt-rounds", rounds)
                   for d in ("cuda", "cpu")}
        _assert_same_figures(figures["cuda"], figures["cpu"], loss_rel, rate_abs)
        assert figures["cpu"]["per"] < 1  # the model says something: there are hypotheses to compare
    assert figures["cuda"]["adaptation"]["speakers"] == figures["cpu"]["adaptation"]["speakers"] == 1
    assert figures["cuda"]["adaptation"]["hypotheses_changed"] > 0  # the maps were fitted, on the device
    wavs = sorted(valid.rglob("*.wav"))[:3]
    assert _decoded(out, wavs, "cuda", capsys) == _decoded(out, wavs, "cpu", capsys)
    adapted = [_decoded(out, wavs, d, capsys, "--same-speaker", "--adapt-rounds", "1") for d in ("cuda", "cpu")]
    assert [[line.split()[0] for line in lines] for lines in adapted] == [[w.stem for w in wavs]] * 2
