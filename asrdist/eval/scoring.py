"""Error rates by edit distance (kaldialign) and frame accuracy.

Rates are fractions (0.25 = 25 %), summed over the corpus: total errors / total reference length.
"""
from __future__ import annotations

from typing import Hashable, Sequence

import kaldialign
import numpy as np

from asrdist.errors import DataError


def error_rate(refs: Sequence[Sequence[Hashable]], hyps: Sequence[Sequence[Hashable]]) -> dict:
    """Corpus-level edit distance of hypotheses against references (Levenshtein, unit costs).

    Returns {errors, ref_length, rate, substitutions, deletions, insertions}; rate is errors /
    ref_length, 0.0 for an empty reference with no errors and inf for an empty one with errors.
    """
    if len(refs) != len(hyps):
        raise DataError(f"error rate: {len(refs)} references but {len(hyps)} hypotheses")
    subs = dels = ins = ref_length = 0
    for ref, hyp in zip(refs, hyps):
        result = kaldialign.edit_distance(list(ref), list(hyp))
        subs += result["sub"]
        dels += result["del"]
        ins += result["ins"]
        ref_length += len(ref)
    errors = subs + dels + ins
    if ref_length:
        rate = errors / ref_length
    else:
        rate = 0.0 if errors == 0 else float("inf")
    return {"errors": errors, "ref_length": ref_length, "rate": rate,
            "substitutions": subs, "deletions": dels, "insertions": ins}


def counts_of(result: dict) -> dict:
    """An `error_rate` result as eval.json keeps it: {errors, ref_length, ins, del, sub} (Kaldi's names)."""
    return {"errors": result["errors"], "ref_length": result["ref_length"], "ins": result["insertions"],
            "del": result["deletions"], "sub": result["substitutions"]}


def per(refs: Sequence[Sequence[int]], hyps: Sequence[Sequence[int]]) -> dict:
    """Phone error rate over phone-id sequences (silence already removed by the caller)."""
    return error_rate(refs, hyps)


def wer(refs: Sequence[str], hyps: Sequence[str]) -> dict:
    """Word error rate; texts are split on whitespace."""
    return error_rate([r.split() for r in refs], [h.split() for h in hyps])


def cer(refs: Sequence[str], hyps: Sequence[str]) -> dict:
    """Character error rate; whitespace runs count as one space character, ends are stripped."""
    return error_rate([list(" ".join(r.split())) for r in refs], [list(" ".join(h.split())) for h in hyps])


def frame_accuracy(predictions: Sequence[int] | np.ndarray, targets: Sequence[int] | np.ndarray) -> float:
    """Fraction of frames whose predicted class equals the target (0.0 for no frames)."""
    pred = np.asarray(predictions)
    gold = np.asarray(targets)
    if pred.shape != gold.shape:
        raise DataError(f"frame accuracy: predictions {pred.shape} and targets {gold.shape} differ in shape")
    if gold.size == 0:
        return 0.0
    return float((pred == gold).mean())
