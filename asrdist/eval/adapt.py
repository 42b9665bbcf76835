"""Unsupervised speaker adaptation for CTC models: a per-speaker affine map of the input features
(a linear input network, Neto et al. 1995), fitted to the model's own first-pass hypotheses: the
neural counterpart of Kaldi's two-pass fMLLR decoding. The model's weights never change.

For each speaker of the split, with x -> A x + b starting at A = I, b = 0:
1. Decode every utterance of the speaker with the current map (the run's own search).
2. Take `eval.adapt_steps` Adam steps (`eval.adapt_lr`) on the CTC loss of those hypotheses per
   input frame, all the speaker's utterances at once, plus `eval.adapt_l2` (|A - I|^2 + |b|^2);
   utterances whose hypothesis is empty or cannot be aligned to their frames sit the round out.
3. Repeat from 1 for `eval.adapt_rounds` rounds; the final decoding uses the last map.
A speaker's map is fitted on that speaker alone, so nothing of one test speaker leaks into another.
"""
from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F

# Utterances per forward pass while fitting: bounds memory on long test sets, not the result
# (the gradient is the sum over all of them before each step).
_CHUNK_FRAMES = 10_000


class SpeakerTransform:
    """x -> x Aᵀ + b for [T, D] or [B, T, D] features."""

    def __init__(self, dim: int):
        self.A = torch.eye(dim, requires_grad=True)
        self.b = torch.zeros(dim, requires_grad=True)

    def __call__(self, feats: torch.Tensor) -> torch.Tensor:
        return feats @ self.A.T + self.b

    def penalty(self) -> torch.Tensor:
        return ((self.A - torch.eye(self.A.shape[0])) ** 2).sum() + (self.b ** 2).sum()

    def distance(self) -> float:
        """|A - I| + |b| (Frobenius): how far the map moved from the identity."""
        with torch.no_grad():
            return float((self.A - torch.eye(self.A.shape[0])).norm() + self.b.norm())


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
        targets = torch.cat([torch.tensor(hyps[i], dtype=torch.long) for i in chunk])
        target_lengths = torch.tensor([len(hyps[i]) for i in chunk])
        loss = F.ctc_loss(log_probs.transpose(0, 1), targets, out_lengths, target_lengths, blank=model.blank,
                          reduction="sum", zero_infinity=True)
        (scale * loss).backward()


def adapt_speaker(model, feats: Sequence[torch.Tensor], decode: Callable[[np.ndarray], list[int]], *,
                  rounds: int, steps: int, lr: float, l2: float) -> tuple[SpeakerTransform, dict]:
    """The map for one speaker's utterances `feats` ([T, D] each) and what fitting it did:
    {rounds, changed (hypotheses that differ from the first pass), distance (|A - I| + |b|)}."""
    transform = SpeakerTransform(feats[0].shape[1])
    optimizer = torch.optim.Adam([transform.A, transform.b], lr=lr)
    first = hyps = _decode_all(model, transform, feats, decode)
    trainable = [p for p in model.parameters() if p.requires_grad]
    for p in trainable:
        p.requires_grad_(False)
    try:
        for _ in range(rounds):
            with torch.enable_grad():  # evaluation runs under no_grad
                _fit(model, transform, optimizer, feats, hyps, steps, l2)
            hyps = _decode_all(model, transform, feats, decode)
    finally:
        for p in trainable:
            p.requires_grad_(True)
    changed = sum(list(a) != list(b) for a, b in zip(first, hyps))
    return transform, {"rounds": rounds, "changed": changed, "distance": round(transform.distance(), 4)}


def adapt_as_recipe(model, feats: Sequence[torch.Tensor], decode: Callable[[np.ndarray], list[int]],
                    eval_cfg) -> tuple[SpeakerTransform, dict]:
    """`adapt_speaker` with a run's `eval.adapt_*` settings (`asrdist eval` and `asrdist decode`)."""
    return adapt_speaker(model, feats, decode, rounds=eval_cfg.adapt_rounds, steps=eval_cfg.adapt_steps,
                         lr=eval_cfg.adapt_lr, l2=eval_cfg.adapt_l2)


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
        for row, i in enumerate(chunk):
            hyps[i] = list(decode(log_probs[row, : int(out_lengths[row])].double().numpy()))
    return hyps
