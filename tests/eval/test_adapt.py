"""Unsupervised speaker adaptation (asrdist.eval.adapt) on a hand-built CTC model whose frames say
their token plainly: a speaker whose features carry an offset is misrecognised, and the map fitted
to the model's own first-pass hypotheses undoes it."""
from __future__ import annotations

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torch import nn

from asrdist.config import EvalConfig, RunConfig
from asrdist.errors import ConfigError
from asrdist.eval.adapt import (_IMPOSSIBLE, SpeakerTransform, WordBalance, adapt_speaker, word_log_likelihoods,
                                note_held_speakers, words_implausible)
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
    assert info == {"rounds": 0, "changed": 0, "distance": 0.0, "objective": "hypotheses"}
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
    with pytest.raises(ConfigError, match="^eval.adapt_word_balance: .*CTC"):
        RunConfig(model=ModelConfig(name="dnn"), eval=EvalConfig(adapt_word_balance=1.0))


# --- information maximisation over isolated words (eval.adapt_word_balance) ---------------------

WORDS = [[(1,)], [(2,)], [(3,)]]  # three one-token words


def _blurred_speaker(seed: int, n: int = 90) -> tuple[list[torch.Tensor], list[int]]:
    """n one-token utterances, the words equally often; this speaker says word 1 two times in three
    with most of its evidence on word 2's feature (as george's "two" carries the others' "four"),
    so that the canonical model hears those utterances as word 2."""
    rng = np.random.default_rng(seed)
    feats, words = [], []
    for i in range(n):
        word = i % TOKENS + 1
        x = np.zeros((5, TOKENS + 1), dtype=np.float32)
        x[[0, 4], 0] = 1.0
        strength = rng.uniform(0.8, 1.2)
        if word == 1 and i % 9:
            x[1:4, 1], x[1:4, 2] = 0.3 * strength, 0.7 * strength
        else:
            x[1:4, word] = strength
        x += rng.normal(0, 0.02, x.shape).astype(np.float32)
        feats.append(torch.from_numpy(x))
        words.append(word)
    return feats, words


def _balance(weight: float = 1.0) -> WordBalance:
    return WordBalance(WORDS, torch.full((TOKENS,), 1.0 / TOKENS), weight)


def test_word_balance_undoes_a_confusion_that_fitting_the_hypotheses_confirms():
    model = FeatureVotes().eval()
    feats, words = _blurred_speaker(0)
    before = _errors(model, feats, words)
    assert before == 20  # the blurred word 1s heard as word 2
    settings = dict(rounds=3, steps=40, lr=0.05, l2=0.01)
    transform, _ = adapt_speaker(model, feats, ctc_greedy_decode, **settings)
    assert _errors(model, feats, words, transform) >= 17  # the hypotheses say "2": fitting them confirms it
    transform, info = adapt_speaker(model, feats, ctc_greedy_decode, balance=_balance(3.0), **settings)
    after = _errors(model, feats, words, transform)
    assert after <= 3, after
    assert info["changed"] >= before - after and info["distance"] > 0 and info["objective"] == "words"
    assert all(p.requires_grad for p in model.parameters())


def test_word_balance_leaves_a_few_utterances_of_one_word_alone():
    """Three utterances all saying word 3 are nothing unlikely under the training frequencies: they
    are fitted to their hypotheses, not pulled towards the other words."""
    model = FeatureVotes().eval()
    feats, words = _speaker(3, offset=0.0, n=40)
    threes = [(x, w) for x, w in zip(feats, words) if w == 3][:3]
    feats, words = [x for x, _ in threes], [w for _, w in threes]
    transform, info = adapt_speaker(model, feats, ctc_greedy_decode, rounds=3, steps=40, lr=0.05, l2=0.01,
                                    balance=_balance(10.0))
    assert _errors(model, feats, words, transform) == 0 and info["objective"] == "hypotheses"


def test_a_speaker_who_says_only_some_words_is_not_pulled_towards_the_others():
    """Word 1 never said: the first pass is implausible under equal frequencies, but holding the
    speaker to them would change most of its words, so the map is fitted to the hypotheses."""
    model = FeatureVotes().eval()
    feats, words = _speaker(4, offset=0.0, n=90)
    kept = [(x, w) for x, w in zip(feats, words) if w != 1]
    feats, words = [x for x, _ in kept], [w for _, w in kept]
    assert words_implausible([[w] for w in words], _balance())
    transform, info = adapt_speaker(model, feats, ctc_greedy_decode, rounds=3, steps=40, lr=0.05, l2=0.01,
                                    balance=_balance(10.0))
    assert info["objective"] == "hypotheses" and _errors(model, feats, words, transform) == 0


def test_the_g_test_finds_word_counts_the_training_frequencies_do_not_explain():
    balance = _balance()
    assert not words_implausible([[1], [2], [3]] * 10, balance)
    assert not words_implausible([[3]] * 3, balance)  # three files of one word: 1 in 9 by chance
    assert words_implausible([[3]] * 12, balance)  # twelve: 1 in 3^11
    assert words_implausible([[2]] * 20 + [[3]] * 10, balance)  # word 1 never heard in 30
    assert not words_implausible([[1, 2], [], [9]] * 10, balance)  # no single vocabulary word: no counts
    skewed = WordBalance(WORDS, torch.tensor([0.1, 0.3, 0.6]), 1.0)
    assert not words_implausible([[1]] * 3 + [[2]] * 9 + [[3]] * 18, skewed)
    assert words_implausible([[1], [2], [3]] * 10, skewed)


def test_word_log_likelihoods_are_ctc_probabilities_summed_over_spellings():
    torch.manual_seed(0)
    log_probs = torch.log_softmax(torch.randn(2, 6, 4), -1)
    lengths = torch.tensor([6, 2])
    spellings = [[(1, 2)], [(3,), (1, 3)], [(2, 2, 2)]]
    scores = word_log_likelihoods(log_probs, lengths, spellings, blank=0)
    assert scores.shape == (2, 3)
    for b in range(2):
        for w, spelled in enumerate(spellings):
            exact = []
            for ids in spelled:
                need = len(ids) + sum(x == y for x, y in zip(ids, ids[1:]))
                if int(lengths[b]) >= need:
                    exact.append(-F.ctc_loss(log_probs[b, : int(lengths[b])].unsqueeze(1), torch.tensor([ids]),
                                             lengths[b:b + 1], torch.tensor([len(ids)]), reduction="sum"))
            expected = torch.logsumexp(torch.stack(exact), 0) if exact else torch.tensor(_IMPOSSIBLE)
            torch.testing.assert_close(scores[b, w], expected)
    assert scores[1, 2] == _IMPOSSIBLE  # three 2s need five frames; the second utterance has two


def test_word_balance_is_checked():
    for value in (-0.5, 101.0, float("nan")):
        with pytest.raises(ConfigError, match="^eval.adapt_word_balance:"):
            EvalConfig(adapt_word_balance=value)
    assert EvalConfig(adapt_word_balance=2.5).adapt_word_balance == 2.5


def test_speakers_held_to_the_word_frequencies_are_named(capsys):
    note_held_speakers([], 3)
    assert capsys.readouterr().err == ""
    note_held_speakers([f"s{i}" for i in range(7)], 9)
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "7 of 9 speaker(s) (s0, s1, s2, s3, s4 and 2 more)" in err
    assert "--adapt-word-balance 0" in err


def test_word_balance_takes_the_training_word_frequencies(tmp_path, capsys):
    from asrdist.io.kaldi_dir import Utterance, write_data_dir
    from asrdist.data.targets import CharTokenizer
    from asrdist.eval.adapt import word_balance
    from asrdist.eval.vocabulary import VocabularySearch

    said = ["one"] * 5 + ["two"] * 2 + ["One"]  # words match as the tokenizer normalises them
    write_data_dir(tmp_path / "train", [Utterance(f"u{i}", "s", "x.wav", w) for i, w in enumerate(said)])
    search = VocabularySearch(["one", "two", "nine"], CharTokenizer(list("eintow")), beam=4)
    balance = word_balance(EvalConfig(adapt_rounds=1, adapt_word_balance=2.0), search, tmp_path / "train")
    assert balance.weight == 2.0 and [len(s) for s in balance.spellings] == [1, 1, 1]
    # nine, one, two (sorted), add-one: 1, 7, 3 of 11
    torch.testing.assert_close(balance.prior, torch.tensor([1 / 11, 7 / 11, 3 / 11]))
    assert word_balance(EvalConfig(adapt_rounds=0, adapt_word_balance=2.0), search, tmp_path / "train") is None
    # the transcripts gone (a vocabulary file, the corpus moved): equal frequencies, said in a note
    balance = word_balance(EvalConfig(adapt_rounds=1, adapt_word_balance=1.0), search, tmp_path / "gone")
    torch.testing.assert_close(balance.prior, torch.full((3,), 1 / 3))
    err = capsys.readouterr().err
    assert "the training transcripts" in err and "the words are taken as equally frequent" in err
