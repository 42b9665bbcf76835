"""Unsupervised speaker adaptation (asrdist.eval.adapt) on a hand-built CTC model whose frames say
their token plainly: a speaker whose features carry an offset is misrecognised, and the map fitted
to the model's own first-pass hypotheses undoes it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
from torch import nn

from asrdist.config import EvalConfig, RunConfig
from asrdist.errors import ConfigError
from asrdist.eval.adapt import SpeakerTransform, adapt_speaker
from asrdist.eval.decode import ctc_greedy_decode
from asrdist.models import ModelConfig

torch.set_num_threads(1)
TOKENS = 3  # tokens 1..3; feature d votes for output d (output 0 is the blank)


class FeatureVotes(nn.Module):
    """A fixed 'CTC model': log_softmax(4 x features) per frame; no subsampling."""
    kind, blank = "ctc", 0

    def __init__(self):
        super().__init__()
        self.linear = nn.Linear(TOKENS + 1, TOKENS + 1, bias=False)
        with torch.no_grad():
            self.linear.weight.copy_(4 * torch.eye(TOKENS + 1))

    def forward(self, x, lengths):
        return torch.log_softmax(self.linear(x), dim=-1), torch.as_tensor(lengths)


def _speaker(seed: int, offset: float, n: int = 60) -> tuple[list[torch.Tensor], list[int]]:
    """n one-token utterances (blank, token x3, blank), token evidence of varying strength, plus
    `offset` on token 3's feature in every frame."""
    rng = np.random.default_rng(seed)
    feats, words = [], []
    for _ in range(n):
        word = int(rng.integers(1, TOKENS + 1))
        x = np.zeros((5, TOKENS + 1), dtype=np.float32)
        x[[0, 4], 0] = 1.0
        x[1:4, word] = rng.uniform(0.5, 1.5)
        x += rng.normal(0, 0.05, x.shape).astype(np.float32)
        x[:, TOKENS] += offset
        feats.append(torch.from_numpy(x))
        words.append(word)
    return feats, words


def _errors(model, feats, words, transform=None) -> int:
    wrong = 0
    with torch.no_grad():
        for x, word in zip(feats, words):
            lp, _ = model((transform(x) if transform else x)[None], torch.tensor([x.shape[0]]))
            wrong += ctc_greedy_decode(lp[0].double().numpy()) != [word]
    return wrong


def test_adaptation_takes_a_speaker_offset_out():
    model = FeatureVotes().eval()
    feats, words = _speaker(0, offset=0.0)
    assert _errors(model, feats, words) == 0  # the canonical speaker is recognised
    shifted, words = _speaker(1, offset=0.8)
    before = _errors(model, shifted, words)
    assert before >= 10  # token 3 swallows weak evidence of the others
    transform, info = adapt_speaker(model, shifted, ctc_greedy_decode, rounds=5, steps=40, lr=0.05, l2=0.01)
    after = _errors(model, shifted, words, transform)
    assert after <= before // 4
    assert info["rounds"] == 5 and info["changed"] >= before - after and info["distance"] > 0.3
    assert all(p.requires_grad for p in model.parameters())  # the model is left as it was


def test_zero_rounds_is_the_identity_and_nothing_to_fit_is_harmless():
    model = FeatureVotes().eval()
    feats, _ = _speaker(2, offset=0.5, n=8)
    transform, info = adapt_speaker(model, feats, ctc_greedy_decode, rounds=0, steps=5, lr=0.05, l2=0.01)
    assert info == {"rounds": 0, "changed": 0, "distance": 0.0}
    torch.testing.assert_close(transform(feats[0]), feats[0])
    # a decoder that finds nothing leaves no hypothesis to fit: the map stays the identity
    transform, info = adapt_speaker(model, feats, lambda lp: [], rounds=2, steps=5, lr=0.05, l2=0.01)
    assert info["distance"] == 0.0 and info["changed"] == 0


def test_speaker_transform_shapes():
    t = SpeakerTransform(3)
    x = torch.randn(2, 5, 3)
    torch.testing.assert_close(t(x), x)
    assert t.penalty().item() == 0.0


@pytest.mark.parametrize("key, value", [("adapt_rounds", -1), ("adapt_steps", 0), ("adapt_lr", 0.0),
                                        ("adapt_l2", -0.1), ("adapt_rounds", 1.5)])
def test_adaptation_settings_are_checked(key, value):
    with pytest.raises(ConfigError, match=f"^eval.{key}:"):
        EvalConfig(**{key: value})


def test_adaptation_needs_a_ctc_model():
    with pytest.raises(ConfigError, match="^eval.adapt_rounds: .*CTC"):
        RunConfig(model=ModelConfig(name="dnn"), eval=EvalConfig(adapt_rounds=2))
    assert RunConfig(model=ModelConfig(name="ctc"), eval=EvalConfig(adapt_rounds=2)).eval.adapt_rounds == 2
