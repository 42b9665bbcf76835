"""Unsupervised speaker adaptation for CTC models: a per-speaker affine map of the input features
(a linear input network, Neto et al. 1995), fitted to the model's own first-pass hypotheses: the
neural counterpart of Kaldi's two-pass fMLLR decoding. The model's weights never change.

For each speaker, with x -> A x + b starting at the identity:
1. decode the speaker's utterances with the current map;
2. take `eval.adapt_steps` Adam steps on the CTC loss of those hypotheses plus `eval.adapt_l2`;
3. repeat for `eval.adapt_rounds` rounds; the final decoding uses the last map.
With `eval.adapt_word_balance` > 0 the map is fitted by information maximisation instead (Krause
et al. 2010), for speakers whose first-pass word counts fail a G-test. The steps in full, and when
word balance is used: docs/evaluation.md#the-algorithm-evaladaptpy."""
from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from scipy.stats import chi2

from asrdist.errors import DataError
from asrdist.eval.evaluate import ctc_hypothesis, on_model_device
from asrdist.eval.vocabulary import training_transcripts

# Utterances per forward pass while fitting: bounds memory on long test sets, not the result
# (the gradient is the sum over all of them before each step).
_CHUNK_FRAMES = 10_000
# The log-likelihood given to a word whose tokens need more frames than an utterance has: it never
# wins, and its gradient is zero (a finite floor: -inf would turn the softmax's gradient into NaN).
_IMPOSSIBLE = -1e4
# A words-objective fit that changes more than this share of a speaker's first-pass words is
# refused (the speaker is fitted to the hypotheses instead): a confusion the map undoes is a
# minority of a voice's words; moving most of them means the speaker's words are not the training
# frequencies (three digits said 50 times each, none of the others: 73-78% errors held to them).
_MOST_CHANGED = 0.3


class SpeakerTransform:
    """x -> x Aᵀ + b for [T, D] or [B, T, D] features on `device` (the model's)."""

    def __init__(self, dim: int, device: torch.device | None = None):
        self.A = torch.eye(dim, device=device, requires_grad=True)
        self.b = torch.zeros(dim, device=device, requires_grad=True)

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        return feats @ self.A.T + self.b

    def penalty(self) -> torch.Tensor:
        return ((self.A - torch.eye(self.A.shape[0], device=self.A.device)) ** 2).sum() + (self.b ** 2).sum()

    def distance(self) -> float:
        """|A - I| + |b| (Frobenius): how far the map moved from the identity."""
        with torch.no_grad():
            return float((self.A - torch.eye(self.A.shape[0], device=self.A.device)).norm() + self.b.norm())


def _chunks(feats: Sequence[torch.Tensor]) -> list[list[int]]:
    chunks, current, frames = [], [], 0
    for i in sorted(range(len(feats)), key=lambda i: feats[i].shape[0]):
        if current and frames + feats[i].shape[0] > _CHUNK_FRAMES:
            chunks.append(current)
            current, frames = [], 0
        current.append(i)
        frames += feats[i].shape[0]
    return chunks + ([current] if current else [])


def _batch(transform: SpeakerTransform, feats: Sequence[torch.Tensor], chunk: list[int]
           ) -> tuple[torch.Tensor, torch.Tensor]:
    """The mapped utterances `chunk` of `feats`, padded into [B, T, D], and their lengths."""
    x = torch.nn.utils.rnn.pad_sequence([transform(feats[i]) for i in chunk], batch_first=True)
    return x, torch.tensor([feats[i].shape[0] for i in chunk])


def _backward_hypothesis_loss(model, transform: SpeakerTransform, feats: Sequence[torch.Tensor],
                              hyps: Sequence[Sequence[int]], scale: float) -> None:
    """Accumulate into the map's gradients those of `scale` x the summed CTC loss of `hyps`,
    chunk by chunk (utterances with an empty hypothesis left out)."""
    for chunk in _chunks(feats):
        chunk = [i for i in chunk if hyps[i]]
        if not chunk:
            continue
        log_probs, out_lengths = model(*_batch(transform, feats, chunk))
        targets = torch.cat([torch.tensor(hyps[i], dtype=torch.long) for i in chunk]).to(log_probs.device)
        target_lengths = torch.tensor([len(hyps[i]) for i in chunk])
        loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths, blank=model.blank,
                          reduction="sum", zero_infinity=True)
        (scale * loss).backward()


@dataclass
class WordBalance:
    """The vocabulary of the information-maximisation objective: each word's token sequences
    (`spellings[w]`: a character model's spelling, a phone model's pronunciations), their training
    frequencies `prior` ([W], summing to 1), and the weight that holds a speaker's words to them."""
    spellings: list[list[tuple[int, ...]]]
    prior: torch.Tensor
    weight: float


def word_balance(eval_cfg, search, train_dir: Path) -> WordBalance | None:
    """The run's WordBalance (`eval.adapt_word_balance` > 0), or None: off, or (with a note) not
    possible, as the decoding has no vocabulary or the model says more than one word per utterance;
    the speakers are then fitted to their hypotheses. `search` is the run's VocabularySearch or None."""
    if eval_cfg.adapt_word_balance <= 0 or eval_cfg.adapt_rounds <= 0:
        return None
    why = ("the decoding has no vocabulary (eval.vocabulary=none)" if search is None else
           "the model was trained on more than one word per utterance" if not search.one_word else None)
    if why:
        print(f"[asrdist] note: eval.adapt_word_balance: {why}; each speaker's map is fitted to its "
              "hypotheses instead", file=sys.stderr, flush=True)
        return None
    words = sorted(search.spellings)
    counts = torch.ones(len(words), dtype=torch.float64)  # add-one: a vocabulary word training never said
    try:
        index = {w: i for i, w in enumerate(words)}
        for transcript in training_transcripts(train_dir):
            if len(transcript) == 1 and search.word_key(transcript[0]) in index:
                counts[index[search.word_key(transcript[0])]] += 1
    except DataError:
        print(f"[asrdist] note: eval.adapt_word_balance: the training transcripts ({train_dir}/text) are gone; "
              "the words are taken as equally frequent", file=sys.stderr, flush=True)
    return WordBalance([search.spellings[w] for w in words], (counts / counts.sum()).float(),
                       eval_cfg.adapt_word_balance)


def adapt_speaker(model, feats: Sequence[torch.Tensor], decode: Callable[[np.ndarray], list[int]], *,
                  rounds: int, steps: int, lr: float, l2: float, balance: WordBalance | None = None
                  ) -> tuple[SpeakerTransform, dict]:
    """The map for one speaker's utterances `feats` ([T, D] each) and what fitting it did:
    {rounds, changed (hypotheses that differ from the first pass), distance (|A - I| + |b|),
    objective (hypotheses | words)}. `balance`: fitted by information maximisation over its words
    (module docstring) where the first pass's words are implausible, else to the hypotheses. The map
    and the features computed with live where the model computes."""
    feats = [on_model_device(model, f) for f in feats]
    first = _decode_all(model, SpeakerTransform(feats[0].shape[1], feats[0].device), feats, decode)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        objective = "hypotheses"
        if balance is not None and words_implausible(first, balance):
            transform, changed = _fitted(model, feats, decode, first, rounds, steps, lr, l2, balance)
            objective = "words" if changed <= _MOST_CHANGED * len(feats) else objective
        if objective == "hypotheses":
            transform, changed = _fitted(model, feats, decode, first, rounds, steps, lr, l2, None)
    finally:
        for p in trainable:
            p.requires_grad_(True)
    return transform, {"rounds": rounds, "changed": changed, "distance": round(transform.distance(), 4),
                       "objective": objective}


def _fitted(model, feats, decode, first, rounds: int, steps: int, lr: float, l2: float,
            balance: WordBalance | None) -> tuple[SpeakerTransform, int]:
    """A map fitted from the identity (to the hypotheses, or by `balance`) and how many of the
    first pass's hypotheses `first` it changed."""
    transform = SpeakerTransform(feats[0].shape[1], feats[0].device)
    optimizer = torch.optim.Adam([transform.A, transform.b], lr=lr)
    hyps = first
    for done in range(1, rounds + 1):
        # evaluation runs under no_grad; the model stays in eval mode, whose recurrent layers cuDNN
        # cannot differentiate: torch's own kernels then (the same arithmetic)
        with torch.enable_grad(), torch.backends.cudnn.flags(enabled=False):
            if balance is None:
                _fit(model, transform, optimizer, feats, hyps, steps, l2)
            else:
                _fit_words(model, transform, optimizer, feats, balance, steps, l2)
        if balance is None or done == rounds:  # the words objective reads no hypotheses
            hyps = _decode_all(model, transform, feats, decode)
    return transform, sum(list(a) != list(b) for a, b in zip(first, hyps))


class RecipeAdaptation:
    """A run's speaker adaptation (`eval.adapt_*`) as `asrdist eval` and `asrdist decode` apply it:
    `fit(speaker, feats)` for each speaker, then `finish()` names the speakers held to the word
    frequencies (one note) and returns the summary for eval.json. `constrained`: the run's
    vocabulary search, or None."""

    def __init__(self, model, cfg, constrained):
        self.model, self.settings = model, cfg.eval
        self.decode = lambda log_probs: ctc_hypothesis(log_probs, cfg, constrained)
        self.balance = word_balance(cfg.eval, constrained, Path(cfg.data.corpus) / "train")
        self.changed, self.distances, self.held = 0, [], []

    def fit(self, speaker: str, feats: Sequence[torch.Tensor]) -> SpeakerTransform:
        e = self.settings
        transform, info = adapt_speaker(self.model, feats, self.decode, rounds=e.adapt_rounds, steps=e.adapt_steps,
                                        lr=e.adapt_lr, l2=e.adapt_l2, balance=self.balance)
        self.changed += info["changed"]
        self.distances.append(info["distance"])
        if info["objective"] == "words":
            self.held.append(speaker)
        return transform

    def finish(self) -> dict:
        e, speakers = self.settings, len(self.distances)
        note_held_speakers(self.held, speakers)
        return {"speakers": speakers, "rounds": e.adapt_rounds, "steps": e.adapt_steps,
                "word_balance": 0.0 if self.balance is None else self.balance.weight,
                "speakers_held_to_word_frequencies": len(self.held), "hypotheses_changed": self.changed,
                "mean_distance": round(float(np.mean(self.distances)), 4) if self.distances else 0.0}


def note_held_speakers(held: Sequence[str], speakers: int) -> None:
    """One line on stderr naming the speakers whose words were held to the training frequencies,
    as that rests on an assumption only the user can check."""
    if held:
        names = ", ".join(held[:5]) + (f" and {len(held) - 5} more" if len(held) > 5 else "")
        print(f"[asrdist] note: {len(held)} of {speakers} speaker(s) ({names}) first heard saying some words far "
              "more often than the training speakers did: adapted with their words held to the training "
              "frequencies (eval.adapt_word_balance); if they do say those words more often, use "
              "--adapt-word-balance 0", file=sys.stderr, flush=True)


def words_implausible(hyps: Sequence[Sequence[int]], balance: WordBalance, level: float = 0.01) -> bool:
    """Whether one speaker's first-pass words (`hyps`, token sequences; those that are no single
    vocabulary word left out) are counts that the training frequencies give less often than `level`
    (G-test: 2 sum O ln(O / E) is about chi-squared with W - 1 degrees of freedom)."""
    index = {tuple(ids): w for w, spelled in enumerate(balance.spellings) for ids in spelled}
    said = np.array([index[tuple(h)] for h in hyps if tuple(h) in index], dtype=np.int64)
    counts = np.bincount(said, minlength=len(balance.spellings)).astype(np.float64)
    n = counts.sum()
    if n == 0 or len(balance.spellings) < 2:
        return False
    expected = n * balance.prior.double().numpy()
    seen = counts > 0
    g = 2 * float((counts[seen] * np.log(counts[seen] / expected[seen])).sum())
    return g > float(chi2.ppf(1 - level, len(balance.spellings) - 1))


def word_log_likelihoods(log_probs: torch.Tensor, out_lengths: torch.Tensor,
                         spellings: Sequence[Sequence[tuple[int, ...]]], blank: int) -> torch.Tensor:
    """[B, W]: log P(word | utterance) of each word under a CTC model's [B, T, V] `log_probs`, its
    token sequences' probabilities summed; `_IMPOSSIBLE` where none fits the utterance's frames."""
    lp = log_probs.transpose(0, 1)
    batch = lp.shape[1]
    out_lengths = torch.as_tensor(out_lengths, dtype=torch.long)
    columns = []
    for spelled in spellings:
        scores = []
        for ids in spelled:
            frames_needed = len(ids) + sum(a == b for a, b in zip(ids, ids[1:]))  # a blank between repeats
            loss = F.ctc_loss(lp, torch.tensor(list(ids) * batch, dtype=torch.long, device=lp.device), out_lengths,
                              torch.full((batch,), len(ids), dtype=torch.long), blank=blank, reduction="none",
                              zero_infinity=True)
            fits = (out_lengths >= frames_needed).to(loss.device)
            scores.append(torch.where(fits, -loss, torch.full_like(loss, _IMPOSSIBLE)))
        columns.append(torch.logsumexp(torch.stack(scores), 0))
    return torch.stack(columns, 1)


def _word_log_posteriors(model, transform: SpeakerTransform, feats, chunk: list[int], balance: WordBalance
                         ) -> torch.Tensor:
    """[B', W]: log q_u of the utterances of `chunk` that at least one word fits."""
    log_probs, out_lengths = model(*_batch(transform, feats, chunk))
    scores = word_log_likelihoods(log_probs, out_lengths, balance.spellings, model.blank)
    return torch.log_softmax(scores[(scores > _IMPOSSIBLE).any(1)], 1)


def _fit_words(model, transform: SpeakerTransform, optimizer, feats, balance: WordBalance, steps: int,
               l2: float) -> None:
    """`steps` Adam steps on mean_u H(q_u) + weight x KL(q̄ ‖ p) + l2 x penalty. The
    KL term's gradient with respect to q_u is (log q̄ - log p + 1) / n: a first pass without
    gradients finds q̄, the second takes the gradient chunk by chunk (the +1 adds nothing, as q_u
    sums to 1)."""
    chunks = _chunks(feats)
    log_prior = balance.prior.to(transform.A.device).log()
    for _ in range(steps):
        with torch.no_grad():
            posteriors = [_word_log_posteriors(model, transform, feats, chunk, balance).exp() for chunk in chunks]
        n = sum(q.shape[0] for q in posteriors)
        if n == 0:
            return
        mean = torch.cat(posteriors).mean(0)
        direction = mean.clamp_min(1e-12).log() - log_prior
        optimizer.zero_grad()
        for chunk in chunks:
            log_q = _word_log_posteriors(model, transform, feats, chunk, balance)
            q = log_q.exp()
            entropy = -(q * log_q).sum()  # log_q is finite: the impossible words' floor
            ((entropy + balance.weight * (q * direction).sum()) / n).backward()
        (l2 * transform.penalty()).backward()
        optimizer.step()


def _fit(model, transform: SpeakerTransform, optimizer, feats, hyps, steps: int, l2: float) -> None:
    per_frame = 1.0 / sum(f.shape[0] for f in feats)
    for _ in range(steps):
        optimizer.zero_grad()
        _backward_hypothesis_loss(model, transform, feats, hyps, per_frame)
        (l2 * transform.penalty()).backward()
        optimizer.step()


@torch.no_grad()
def _decode_all(model, transform: SpeakerTransform, feats: Sequence[torch.Tensor],
                decode: Callable[[np.ndarray], list[int]]) -> list[list[int]]:
    hyps: list[list[int]] = [[] for _ in feats]
    for chunk in _chunks(feats):
        log_probs, out_lengths = model(*_batch(transform, feats, chunk))
        log_probs = log_probs.cpu()  # the search runs on the CPU
        for row, i in enumerate(chunk):
            hyps[i] = list(decode(log_probs[row, : int(out_lengths[row])].double().numpy()))
    return hyps
