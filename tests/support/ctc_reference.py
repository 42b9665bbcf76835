"""Brute-force references for word-constrained CTC decoding (eval/test_vocab_decode.py,
test_phone_vocabulary.py, test_wordlm.py): a labelling's summed CTC path probability (torch's
ctc_loss) or its best path's (Viterbi, what flashlight-text's decoders maximise), and every token
sequence a vocabulary allows."""
from __future__ import annotations

import math

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


def best_path_log_prob(log_probs: np.ndarray, labels, single=()) -> float:
    """The log probability of the single most probable CTC path of `labels` (Viterbi; -inf when it
    does not fit in the frames): what flashlight-text's decoders maximise (log_add off). The labels
    at the positions `single` last one frame each."""
    ext, once = [0], set()
    for i, label in enumerate(labels):
        if i in single:
            once.add(len(ext))
        ext += [int(label), 0]
    t_len, s_len = log_probs.shape[0], len(ext)
    score = np.full(s_len, -np.inf)
    score[0] = log_probs[0, 0]
    if s_len > 1:
        score[1] = log_probs[0, ext[1]]
    for t in range(1, t_len):
        new = np.full(s_len, -np.inf)
        for s in range(s_len):
            best = max(score[s] if s not in once else -np.inf, score[s - 1] if s >= 1 else -np.inf)
            if s >= 2 and ext[s] != 0 and ext[s] != ext[s - 2]:
                best = max(best, score[s - 2])
            new[s] = best + log_probs[t, ext[s]]
        score = new
    return float(max(score[-1], score[-2] if s_len > 1 else -np.inf))


def following_words_best_paths(search, log_probs, words) -> dict:
    """{token sequence: its best path's log probability} over every sequence of `words`, on the
    lexicon decoder's own emissions (`search.emissions`): each word led by the separator (if any),
    ending on its last token, which then lasts one frame, or on a BREAK (the blank's copy) after it.
    The sequences are the decoder's tokens (the first separator left out)."""
    em = search.emissions(log_probs).astype(np.float64)
    lead = (search.separator,) if search.separator is not None else ()
    scores: dict = {}

    def grow(seq, labels, single):
        for word in (lead + tuple(w) for w in words):
            for brk in (False, True):
                nxt = labels + list(word) + [search.brk] * brk
                if len(nxt) + (not brk) > len(em):
                    continue
                once = single if brk else single | {len(nxt) - 1}
                key = seq + tuple(word)
                final = nxt if brk else nxt + [search.brk]  # the last word ends on the final frame's BREAK
                scores[key] = max(scores.get(key, -math.inf), best_path_log_prob(em, final, once))
                grow(key, nxt, once)

    grow((), [], frozenset())
    return {s[len(lead):]: v for s, v in scores.items() if math.isfinite(v)}
