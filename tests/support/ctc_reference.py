"""Brute-force references for word-constrained CTC decoding (eval/test_vocab_decode.py,
test_phone_vocabulary.py, test_wordlm.py): a labelling's summed CTC path probability (torch's
ctc_loss) and every token sequence a vocabulary allows."""
from __future__ import annotations

import numpy as np
import torch


def labelling_log_prob(log_probs: np.ndarray, labels) -> float:
    if not labels:
        return float(np.sum(log_probs[:, 0]))
    lp = torch.from_numpy(log_probs)[:, None]
    loss = torch.nn.functional.ctc_loss(lp, torch.tensor([list(labels)]), torch.tensor([lp.shape[0]]),
                                        torch.tensor([len(labels)]), reduction="sum")
    return -float(loss)  # -inf when the labelling does not fit in the frames


def sequences(words, separator, max_len):
    """Every token sequence of >= 1 vocabulary words (joined by `separator`) up to `max_len` tokens."""
    out, frontier = set(), [()]
    while frontier:
        grown = []
        for seq in frontier:
            for word in words:
                nxt = seq + ((separator,) if seq and separator is not None else ()) + tuple(word)
                if len(nxt) <= max_len and nxt not in out:
                    out.add(nxt)
                    grown.append(nxt)
        frontier = grown
    return out
