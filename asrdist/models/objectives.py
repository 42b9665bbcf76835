"""Training objectives. Each returns (scalar loss for backward, count it averages over).

The count lets the trainer (and strategies) weight losses of minibatches of different sizes:
`loss * count` is the summed objective.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100
CTC_NORMALIZATIONS = ("frames", "utterances", "tokens")


def frame_cross_entropy(logits: torch.Tensor, targets: torch.Tensor) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy of [N, K] logits against [N] class ids; count = N frames."""
    if logits.dim() != 2 or targets.shape != logits.shape[:1]:
        raise ValueError(f"frame_cross_entropy: logits {tuple(logits.shape)} vs targets {tuple(targets.shape)}")
    return F.cross_entropy(logits, targets), int(targets.shape[0])


def chunk_cross_entropy(logits: torch.Tensor, targets: torch.Tensor,
                        ignore_index: int = IGNORE_INDEX) -> tuple[torch.Tensor, int]:
    """Mean cross-entropy of [B, T, K] logits against [B, T] labels, frames labelled `ignore_index`
    (padding) excluded; count = labelled frames. A batch with none gives a zero loss that still backprops."""
    if logits.dim() != 3 or targets.shape != logits.shape[:2]:
        raise ValueError(f"chunk_cross_entropy: logits {tuple(logits.shape)} vs targets {tuple(targets.shape)}")
    flat_targets = targets.reshape(-1)
    count = int((flat_targets != ignore_index).sum())
    total = F.cross_entropy(logits.reshape(-1, logits.shape[-1]), flat_targets, ignore_index=ignore_index,
                            reduction="sum")
    return total / max(count, 1), count


def ctc_objective(log_probs: torch.Tensor, targets: torch.Tensor, input_lengths: torch.Tensor,
                  target_lengths: torch.Tensor, normalize: str = "frames") -> tuple[torch.Tensor, int]:
    """CTC negative log-likelihood, blank = 0, infeasible utterances zeroed (`zero_infinity`).

    log_probs [B, T, V] (batch first, as the CTC model emits); targets [B, L] padded or 1-D
    concatenated; lengths [B]. The summed utterance losses are divided by, and the count is:
    "frames" (default) the total of `input_lengths`, so the loss is per frame like cross-entropy;
    "utterances" the batch size; "tokens" the total of `target_lengths`.
    """
    if normalize not in CTC_NORMALIZATIONS:
        raise ValueError(f"ctc_objective: normalize must be one of {CTC_NORMALIZATIONS}, got '{normalize}'")
    if log_probs.dim() != 3:
        raise ValueError(f"ctc_objective: expected [batch, time, vocab] log-probs, got {tuple(log_probs.shape)}")
    input_lengths = torch.as_tensor(input_lengths, dtype=torch.long)
    target_lengths = torch.as_tensor(target_lengths, dtype=torch.long)
    total = F.ctc_loss(log_probs.transpose(0, 1), targets, input_lengths, target_lengths, blank=0,
                       reduction="sum", zero_infinity=True)
    if normalize == "frames":
        count = int(input_lengths.sum())
    elif normalize == "tokens":
        count = int(target_lengths.sum())
    else:
        count = int(log_probs.shape[0])
    return total / max(count, 1), count
