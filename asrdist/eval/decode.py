"""Decoding: hybrid phone-loop Viterbi (frame models) and greedy / prefix-beam CTC search.

Hybrid decoding turns network posteriors into scaled likelihoods, log p(x|c) + const =
log P(c|x) - log P(c), and searches a phone loop: every phone is a chain of `min_duration`
states (the last one loops on itself), and leaving a phone for the next costs the bigram
log P(next | phone) plus a `transition_penalty` (negative values discourage insertions).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from asrdist.data.bigram import NEG_INF, PhoneBigram  # noqa: F401  (decoding's bigram; its home is data)
from asrdist.errors import DataError

TIED_REDUCTIONS = ("sum", "max")


def phone_log_likelihoods(log_posteriors: np.ndarray, log_priors: np.ndarray, class_to_phone: np.ndarray,
                          num_phones: int, tied: str = "sum") -> np.ndarray:
    """[T, K] class log-posteriors -> [T, P] scaled phone log-likelihoods.

    Several classes (tied states) may map to one phone. "sum" (default) scores a phone by its
    total posterior over its own prior, log sum_c P(c|x) - log sum_c P(c): the exact scaled
    likelihood of a context-independent phone. "max" takes the best class, max_c log P(c|x) - log P(c)
    (the Viterbi choice of state). They agree for monophone targets. A class whose prior is 0
    (never seen in training) is left out; a phone with no class gets -inf.
    """
    log_posteriors = np.asarray(log_posteriors, dtype=np.float64)
    log_priors = np.asarray(log_priors, dtype=np.float64)
    class_to_phone = np.asarray(class_to_phone, dtype=np.int64)
    if log_posteriors.ndim != 2 or log_priors.shape != log_posteriors.shape[1:] \
            or class_to_phone.shape != log_priors.shape:
        raise DataError(f"decode: log_posteriors {log_posteriors.shape}, log_priors {log_priors.shape} and "
                        f"class_to_phone {class_to_phone.shape} do not fit")
    if class_to_phone.size and (class_to_phone.min() < 0 or class_to_phone.max() >= num_phones):
        raise DataError(f"decode: class_to_phone has phone ids outside [0, {num_phones})")
    if tied not in TIED_REDUCTIONS:
        raise DataError(f"decode: tied must be one of {TIED_REDUCTIONS}, got '{tied}'")
    usable = np.isfinite(log_priors)
    out = np.full((log_posteriors.shape[0], num_phones), NEG_INF)
    if tied == "max":
        scores = log_posteriors - np.where(usable, log_priors, 0.0)
        for phone in range(num_phones):
            cols = np.flatnonzero((class_to_phone == phone) & usable)
            if cols.size:
                out[:, phone] = scores[:, cols].max(axis=1)
        return out
    if not usable.any():
        return out
    post, prior, owner = log_posteriors[:, usable], log_priors[usable], class_to_phone[usable]
    membership = np.zeros((owner.size, num_phones))
    membership[np.arange(owner.size), owner] = 1.0
    frame_max = post.max(axis=1, keepdims=True)
    frame_max = np.where(np.isfinite(frame_max), frame_max, 0.0)
    with np.errstate(divide="ignore"):
        phone_post = np.log(np.exp(post - frame_max) @ membership) + frame_max
        phone_prior = np.log(np.exp(prior - prior.max()) @ membership) + prior.max()
    has_class = np.isfinite(phone_prior)
    out[:, has_class] = phone_post[:, has_class] - phone_prior[has_class]
    return out


def viterbi_segments(phone_scores: np.ndarray, bigram: PhoneBigram, min_duration: int = 3,
                     transition_penalty: float = 0.0) -> list[tuple[int, int, int]]:
    """Best phone-loop path through [T, P] frame scores as (phone, start, end) segments, end exclusive.

    State graph: phone p has states (p, 0) .. (p, d-1), d = min(min_duration, T); (p, k) -> (p, k+1)
    and (p, d-1) -> (p, d-1) are free; (p, d-1) -> (q, 0) costs log_trans[p, q] + transition_penalty.
    The search is vectorized over all P x d states per frame: O(T P^2) for the phone transitions.
    """
    scores = np.asarray(phone_scores, dtype=np.float64)
    num_frames, num_phones = scores.shape
    if num_phones != bigram.num_phones:
        raise DataError(f"decode: {num_phones} phone scores but a bigram over {bigram.num_phones} phones")
    if num_frames == 0:
        return []
    d = max(1, min(int(min_duration), num_frames))
    trans = bigram.log_trans + transition_penalty
    phones = np.arange(num_phones)
    entered_from = np.zeros((num_frames, num_phones), dtype=np.int32)  # best predecessor of (q, 0) at t
    stayed = np.zeros((num_frames, num_phones), dtype=bool)  # (q, d-1) at t came from its own self-loop
    delta = np.full((num_phones, d), NEG_INF)
    delta[:, 0] = bigram.log_start + scores[0]
    for t in range(1, num_frames):
        last = delta[:, d - 1]
        candidates = last[:, None] + trans
        best = candidates.argmax(axis=0)
        entry = candidates[best, phones]
        new = np.empty_like(delta)
        if d == 1:
            stay = last >= entry  # ties keep the phone: fewer insertions
            new[:, 0] = np.where(stay, last, entry)
        else:
            new[:, 0] = entry
            new[:, 1:d - 1] = delta[:, 0:d - 2]
            stay = last >= delta[:, d - 2]
            new[:, d - 1] = np.where(stay, last, delta[:, d - 2])
        stayed[t] = stay
        entered_from[t] = best
        new += scores[t][:, None]
        delta = new
    final = delta[:, d - 1] + bigram.log_end
    phone = int(final.argmax())
    if not np.isfinite(final[phone]):
        raise DataError("decode: no path through the phone loop has a finite score (check priors and bigram)")
    segments: list[tuple[int, int, int]] = []
    end, t = num_frames, num_frames - 1
    while True:
        # Walk back through the self-loop, then through the d-1 forced states, to the phone's entry.
        while t > 0 and stayed[t, phone]:
            t -= 1
        start = t - (d - 1)
        segments.append((phone, start, end))
        if start == 0:
            break
        phone, end, t = int(entered_from[start, phone]), start, start - 1
    segments.reverse()
    return segments


def viterbi_decode(log_posteriors: np.ndarray, log_priors: np.ndarray, class_to_phone: np.ndarray,
                   bigram: PhoneBigram, min_duration: int = 3, acoustic_scale: float = 1.0,
                   transition_penalty: float = 0.0, silence_id: int | None = 0, tied: str = "sum") -> list[int]:
    """Hybrid phone recognition of one utterance: the phone sequence of the best phone-loop path,
    silence (`silence_id`; None keeps it) removed. Frame scores are acoustic_scale x the scaled phone
    log-likelihoods of `phone_log_likelihoods`; the bigram enters with weight 1."""
    scores = acoustic_scale * phone_log_likelihoods(log_posteriors, log_priors, class_to_phone,
                                                    bigram.num_phones, tied)
    segments = viterbi_segments(scores, bigram, min_duration, transition_penalty)
    return [p for p, _, _ in segments if p != silence_id]


def collapse_labels(frame_labels: Sequence[int] | np.ndarray, silence_id: int | None = 0) -> list[int]:
    """Frame labels -> the phone sequence: runs merged, silence dropped (a reference for PER)."""
    labels = np.asarray(frame_labels, dtype=np.int64)
    if labels.size == 0:
        return []
    keep = np.ones(labels.size, dtype=bool)
    keep[1:] = labels[1:] != labels[:-1]
    return [int(x) for x in labels[keep] if x != silence_id]


def ctc_greedy_decode(log_probs: np.ndarray, blank: int = 0) -> list[int]:
    """Best path: argmax per frame, repeats merged, blanks dropped."""
    log_probs = np.asarray(log_probs)
    if log_probs.ndim != 2:
        raise DataError(f"ctc decode: expected [time, vocab] log-probs, got shape {log_probs.shape}")
    best = log_probs.argmax(axis=1)
    keep = np.ones(best.size, dtype=bool)
    keep[1:] = best[1:] != best[:-1]
    return [int(x) for x in best[keep] if x != blank]


def ctc_beam_decode(log_probs: np.ndarray, beam: int = 8, blank: int = 0) -> list[int]:
    """CTC prefix beam search: the labelling with the highest summed path probability among `beam`
    prefixes kept per frame. Each prefix tracks log P(its paths end in blank) and P(end in a token);
    all prefix x token extensions of a frame are scored at once with numpy."""
    log_probs = np.asarray(log_probs, dtype=np.float64)
    if log_probs.ndim != 2:
        raise DataError(f"ctc decode: expected [time, vocab] log-probs, got shape {log_probs.shape}")
    if beam < 1:
        raise DataError(f"ctc decode: beam must be >= 1, got {beam}")
    vocab = log_probs.shape[1]
    prefixes: list[tuple[int, ...]] = [()]
    p_blank, p_token = np.zeros(1), np.full(1, NEG_INF)
    for frame in log_probs:
        total = np.logaddexp(p_blank, p_token)
        last = np.array([p[-1] if p else -1 for p in prefixes])
        rows = np.flatnonzero(last >= 0)
        stay_blank = total + frame[blank]
        stay_token = np.full(len(prefixes), NEG_INF)  # the last token repeated: same labelling
        stay_token[rows] = p_token[rows] + frame[last[rows]]
        extend = total[:, None] + frame[None, :]
        # A repeat of the last token starts a new occurrence only after a blank.
        extend[rows, last[rows]] = p_blank[rows] + frame[last[rows]]
        extend[:, blank] = NEG_INF
        # An extension that equals a prefix already in the beam merges into it.
        index = {p: i for i, p in enumerate(prefixes)}
        for i, p in enumerate(prefixes):
            parent = index.get(p[:-1]) if p else None
            if parent is not None:
                stay_token[i] = np.logaddexp(stay_token[i], extend[parent, p[-1]])
                extend[parent, p[-1]] = NEG_INF
        scores = np.concatenate([np.logaddexp(stay_blank, stay_token), extend.ravel()])
        keep = np.argsort(-scores, kind="stable")[:beam]
        keep = keep[np.isfinite(scores[keep])] if np.isfinite(scores[keep[0]]) else keep[:1]
        new_prefixes, new_blank, new_token = [], [], []
        for k in keep:
            if k < len(prefixes):
                new_prefixes.append(prefixes[k])
                new_blank.append(stay_blank[k])
                new_token.append(stay_token[k])
            else:
                b, v = divmod(int(k) - len(prefixes), vocab)
                new_prefixes.append(prefixes[b] + (v,))
                new_blank.append(NEG_INF)
                new_token.append(extend[b, v])
        prefixes, p_blank, p_token = new_prefixes, np.array(new_blank), np.array(new_token)
    best = int(np.argmax(np.logaddexp(p_blank, p_token)))
    return list(prefixes[best])
