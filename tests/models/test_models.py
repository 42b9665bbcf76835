"""Models (shapes, registry, configs) and objectives against direct computations."""
from __future__ import annotations

import math

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asrdist.errors import ConfigError
from asrdist.models import (SWBD_FEATURE_DIM, SWBD_NUM_CLASSES, ModelConfig, build_model, count_parameters,
                            model_kind)
from asrdist.models.objectives import chunk_cross_entropy, ctc_objective, frame_cross_entropy

torch.set_num_threads(1)


def _small(name: str, **kw) -> ModelConfig:
    return ModelConfig(name=name, hidden_layers=kw.pop("hidden_layers", 2), hidden_dim=kw.pop("hidden_dim", 16), **kw)


# -- configs ------------------------------------------------------------------------------
def test_defaults_are_resolved_per_name():
    dnn = ModelConfig()
    assert (dnn.name, dnn.hidden_layers, dnn.hidden_dim, dnn.activation, dnn.context) == ("dnn", 4, 512, "relu", 5)
    swbd = ModelConfig(name="swbd")
    assert (swbd.hidden_layers, swbd.hidden_dim, swbd.activation) == (7, 2048, "sigmoid")
    lstm = ModelConfig(name="lstm")
    assert lstm.activation is None and lstm.chunk == 21 and lstm.hidden_layers >= 1
    assert ModelConfig(name="dnn", hidden_dim=64).hidden_dim == 64
    assert [model_kind(ModelConfig(name=n)) for n in ("dnn", "swbd", "lstm", "blstm", "ctc")] == \
        ["frame", "frame", "chunk", "chunk", "ctc"]


@pytest.mark.parametrize("kwargs, field", [
    ({"name": "cnn"}, "model.name"),
    ({"hidden_layers": 0}, "model.hidden_layers"),
    ({"hidden_dim": True}, "model.hidden_dim"),
    ({"activation": "tanh"}, "model.activation"),
    ({"name": "lstm", "activation": "relu"}, "model.activation"),
    ({"context": -1}, "model.context"),
    ({"dropout": 1.0}, "model.dropout"),
    ({"subsample": 2}, "model.subsample"),
    ({"conv_channels": 8}, "model.conv_channels"),
    ({"name": "ctc", "conv_channels": -1}, "model.conv_channels"),
    ({"name": "lstm", "chunk": 0}, "model.chunk"),
])
def test_bad_config_names_the_field(kwargs, field):
    with pytest.raises(ConfigError, match=f"^{field}:"):
        ModelConfig(**kwargs)


def test_build_model_rejects_bad_dimensions():
    with pytest.raises(ConfigError, match="input_dim"):
        build_model(ModelConfig(), 0, 10)
    with pytest.raises(ConfigError, match="num_classes"):
        build_model(_small("ctc"), 10, 1)


# -- DNN ----------------------------------------------------------------------------------
def test_dnn_shapes_and_plain_linear_layers():
    model = build_model(ModelConfig(hidden_layers=3, hidden_dim=32, context=2), 10, 7)
    assert model.kind == "frame" and model.input_dim == 50 and model.context == 2
    assert model(torch.randn(4, 50)).shape == (4, 7)
    # Every parameter lives in a plain nn.Linear (the NG-SGD helper wraps exactly those).
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    assert len(linears) == 4 and all(type(m) is nn.Linear for m in linears)
    assert sum(p.numel() for m in linears for p in m.parameters()) == count_parameters(model)
    assert count_parameters(model) == 50 * 32 + 32 + 2 * (32 * 32 + 32) + 32 * 7 + 7
    assert model.output is linears[-1]
    with pytest.raises(ValueError, match="11 x 10|5 x 10"):
        model(torch.randn(4, 10))


def test_dnn_activation_and_dropout():
    sig = build_model(ModelConfig(activation="sigmoid", hidden_layers=2, hidden_dim=8, dropout=0.5, context=0), 3, 2)
    kinds = [type(m) for m in sig.hidden]
    assert kinds == [nn.Linear, nn.Sigmoid, nn.Dropout, nn.Linear, nn.Sigmoid, nn.Dropout]


def test_swbd_has_the_papers_46m_shape():
    with torch.device("meta"):  # shapes only: no 180 MB allocation, no training
        model = build_model(ModelConfig(name="swbd"), SWBD_FEATURE_DIM, SWBD_NUM_CLASSES)
    assert model.input_dim == 429
    widths = [(m.in_features, m.out_features) for m in model.modules() if isinstance(m, nn.Linear)]
    assert widths == [(429, 2048)] + [(2048, 2048)] * 6 + [(2048, 9304)]
    expected = 429 * 2048 + 2048 + 6 * (2048 * 2048 + 2048) + 2048 * 9304 + 9304
    assert count_parameters(model) == expected == 45_122_648
    assert abs(expected / 46e6 - 1) < 0.02  # the paper's "46M"
    assert all(isinstance(m, (nn.Linear, nn.Sigmoid, nn.Sequential, type(model))) for m in model.modules())


# -- LSTM / BLSTM -------------------------------------------------------------------------
def test_chunk_models_shapes_and_directionality():
    torch.manual_seed(0)
    x = torch.randn(3, 21, 5)
    y = x.clone()
    y[:, -1] += 1.0  # change only the last frame
    for name, future_matters in (("lstm", False), ("blstm", True)):
        model = build_model(_small(name), 5, 9).eval()
        assert model.kind == "chunk" and model.chunk == 21
        out_x, out_y = model(x), model(y)
        assert out_x.shape == (3, 21, 9)
        earlier_changed = not torch.allclose(out_x[:, :-1], out_y[:, :-1])
        assert earlier_changed == future_matters


# -- CTC ----------------------------------------------------------------------------------
def test_ctc_model_log_probs_and_padding_invariance():
    torch.manual_seed(0)
    model = build_model(_small("ctc"), 6, 5).eval()
    assert model.kind == "ctc" and model.blank == 0
    a, b = torch.randn(7, 6), torch.randn(4, 6)
    batch = torch.randn(2, 7, 6) * 10  # padding holds garbage that must not leak in
    batch[0], batch[1, :4] = a, b
    log_probs, lengths = model(batch, torch.tensor([7, 4]))
    assert log_probs.shape == (2, 7, 5) and lengths.tolist() == [7, 4]
    torch.testing.assert_close(log_probs.exp().sum(-1), torch.ones(2, 7))
    alone, _ = model(b[None], torch.tensor([4]))
    torch.testing.assert_close(log_probs[1, :4], alone[0], atol=1e-5, rtol=1e-5)


def test_ctc_subsampling_stacks_frames():
    model = build_model(_small("ctc", subsample=3), 4, 6)
    log_probs, lengths = model(torch.randn(2, 10, 4), torch.tensor([10, 5]))
    assert log_probs.shape == (2, 4, 6) and lengths.tolist() == [4, 2]
    with pytest.raises(ValueError, match="lengths"):
        model(torch.randn(2, 10, 4), torch.tensor([11, 5]))


def test_ctc_conv_front_end_ignores_padding_and_pools_bins():
    torch.manual_seed(0)
    model = build_model(_small("ctc", conv_channels=3, subsample=2), 10, 5).eval()
    assert model.frontend.output_dim == 3 * 2 and model.lstm.input_size == 2 * 3 * 2  # 10 bins -> 5 -> 2
    a, b = torch.randn(9, 10), torch.randn(5, 10)
    batch = torch.randn(2, 9, 10) * 10  # padding holds garbage that must not leak in
    batch[0], batch[1, :5] = a, b
    log_probs, lengths = model(batch, torch.tensor([9, 5]))
    assert log_probs.shape == (2, 5, 5) and lengths.tolist() == [5, 3]
    alone, _ = model(b[None], torch.tensor([5]))
    torch.testing.assert_close(log_probs[1, :3], alone[0], atol=1e-5, rtol=1e-5)
    # a frame's outputs see its neighbours through the 3 x 3 kernels: two layers reach 2 frames away
    frames = model.frontend(a[None], torch.tensor([9]))
    moved = a.clone()
    moved[8] += 1.0
    changed = (model.frontend(moved[None], torch.tensor([9])) - frames).abs().sum(-1)[0]
    assert changed[:6].eq(0).all() and changed[6:].gt(0).all()
    with pytest.raises(ConfigError, match="^model.conv_channels: .* at least 4 features"):
        build_model(_small("ctc", conv_channels=3), 3, 5)


# -- objectives ---------------------------------------------------------------------------
def test_frame_cross_entropy_matches_definition():
    torch.manual_seed(0)
    logits, targets = torch.randn(6, 4), torch.tensor([0, 3, 1, 1, 2, 0])
    loss, count = frame_cross_entropy(logits, targets)
    manual = -torch.log_softmax(logits, -1)[torch.arange(6), targets].mean()
    torch.testing.assert_close(loss, manual)
    assert count == 6


def test_chunk_cross_entropy_ignores_padding():
    torch.manual_seed(0)
    logits = torch.randn(2, 3, 4, requires_grad=True)
    targets = torch.tensor([[1, 2, -100], [0, -100, -100]])
    loss, count = chunk_cross_entropy(logits, targets)
    lp = torch.log_softmax(logits, -1)
    manual = -(lp[0, 0, 1] + lp[0, 1, 2] + lp[1, 0, 0]) / 3
    torch.testing.assert_close(loss, manual)
    assert count == 3
    loss.backward()
    assert logits.grad[0, 2].abs().sum() == 0  # padded frames get no gradient


def test_ctc_objective_normalizations_and_infeasible_utterances():
    torch.manual_seed(0)
    log_probs = torch.randn(2, 6, 4).log_softmax(-1).requires_grad_()
    targets = torch.tensor([[1, 2, 2], [3, 0, 0]])
    in_lens, tgt_lens = torch.tensor([6, 5]), torch.tensor([3, 1])
    per_utt = F.ctc_loss(log_probs.transpose(0, 1), targets, in_lens, tgt_lens, reduction="none")
    loss, count = ctc_objective(log_probs, targets, in_lens, tgt_lens)
    torch.testing.assert_close(loss, per_utt.sum() / 11)
    assert count == 11
    loss_u, count_u = ctc_objective(log_probs, targets, in_lens, tgt_lens, normalize="utterances")
    torch.testing.assert_close(loss_u, per_utt.sum() / 2)
    assert count_u == 2
    loss_t, count_t = ctc_objective(log_probs, targets, in_lens, tgt_lens, normalize="tokens")
    torch.testing.assert_close(loss_t, per_utt.sum() / 4)
    assert count_t == 4
    loss.backward()
    assert torch.isfinite(log_probs.grad).all()
    # "1 2 2" needs 4 frames (a blank between the 2s): with 3 frames it is impossible -> zeroed.
    bad, _ = ctc_objective(log_probs[:1, :3], targets[:1], torch.tensor([3]), torch.tensor([3]))
    assert bad.item() == 0.0


def test_small_dnn_learns_a_toy_problem():
    """The pieces work together: a few SGD steps fit a linearly separable frame task."""
    torch.manual_seed(0)
    model = build_model(ModelConfig(hidden_layers=1, hidden_dim=16, context=0), 4, 3)
    centres = torch.randn(3, 4) * 3
    labels = torch.randint(0, 3, (256,))
    x = centres[labels] + torch.randn(256, 4) * 0.3
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    first = None
    for _ in range(60):
        loss, _ = frame_cross_entropy(model(x), labels)
        first = first if first is not None else loss.item()
        opt.zero_grad()
        loss.backward()
        opt.step()
    assert loss.item() < 0.2 * first and math.isfinite(loss.item())
