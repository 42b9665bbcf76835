"""Forced-alignment graph and its Viterbi search (numpy only; no k2, no torchaudio).

The graph of an utterance is a left-to-right chain of words with optional silence:
`[sil] w1 [sil] w2 ... wN [sil]`, where each word is one of its pronunciations and each phone is
`min_duration` states (all but the last without a self-loop, so a phone lasts at least that many
frames). Viterbi over frames keeps, per state, the best of staying (last state of a phone) and
entering from any predecessor, vectorized over states; the best path ending in a final state gives
one phone id per frame. Scores are per-frame log scores over phones, [T, P] (see `asrdist.run.align`).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np

from asrdist.errors import DataError


@dataclass
class AlignmentGraph:
    phone: np.ndarray
    """[S] phone id emitted by each state."""
    self_loop: np.ndarray
    """[S] bool: the state may repeat."""
    preds: np.ndarray
    """[S, K] predecessor states, padded; index S = the start, S + 1 = none."""
    final: np.ndarray
    """State ids the path may end in."""

    @property
    def num_states(self) -> int:
        return len(self.phone)


def build_graph(words: Sequence[Sequence[Sequence[int]]], silence_id: int, min_duration: int = 1,
                optional_silence: bool = True) -> AlignmentGraph:
    """`words[i]` = the pronunciations (phone id tuples) of word i, in order."""
    if min_duration < 1:
        raise ValueError("min_duration must be >= 1")
    phone: list[int] = []
    loop: list[bool] = []
    preds: list[list[int]] = []
    start = -1  # the virtual start state, renumbered to S at the end

    def add_phone(p: int, entry_preds: list[int]) -> int:
        """Chain of min_duration states for phone p; returns its last state."""
        prev = entry_preds
        for k in range(min_duration):
            phone.append(p)
            loop.append(k == min_duration - 1)
            preds.append(list(prev))
            prev = [len(phone) - 1]
        return len(phone) - 1

    def add_silence(entry: list[int]) -> int:
        return add_phone(silence_id, entry)

    exits = [start]
    if optional_silence:
        exits = exits + [add_silence(exits)]
    for i, prons in enumerate(words):
        if not prons:
            raise DataError(f"word {i}: no pronunciation")
        word_exits = []
        for pron in prons:
            entry = exits
            for p in pron:
                entry = [add_phone(int(p), entry)]
            word_exits.extend(entry)
        exits = word_exits
        if optional_silence:
            exits = exits + [add_silence(exits)]
    if exits == [start]:
        raise DataError("empty transcript: nothing to align")
    S = len(phone)
    width = max(len(p) for p in preds)
    pred_arr = np.full((S, width), S + 1, dtype=np.int64)
    for s, ps in enumerate(preds):
        pred_arr[s, :len(ps)] = [S if q == start else q for q in ps]
    return AlignmentGraph(np.asarray(phone, dtype=np.int64), np.asarray(loop, dtype=bool), pred_arr,
                          np.asarray([s for s in exits if s != start], dtype=np.int64))


def viterbi_align(scores: np.ndarray, graph: AlignmentGraph) -> tuple[np.ndarray, float]:
    """Best state path through `graph` for frame scores [T, P]: (phone id per frame, path score).

    Raises DataError when no path fits (fewer frames than the graph's shortest path)."""
    scores = np.asarray(scores, dtype=np.float64)
    T, S = scores.shape[0], graph.num_states
    neg = -np.inf
    delta = np.full(S + 2, neg)
    delta[S] = 0.0  # only the start is reachable before frame 0
    back = np.empty((T, S), dtype=np.int64)
    emit = scores[:, graph.phone]  # [T, S]
    states = np.arange(S)
    for t in range(T):
        cand = delta[graph.preds]  # [S, K]
        best_k = cand.argmax(axis=1)
        enter = cand[states, best_k]
        came_from = graph.preds[states, best_k]
        stay = np.where(graph.self_loop, delta[:S], neg)
        use_stay = stay >= enter
        back[t] = np.where(use_stay, states, came_from)
        new = np.full(S + 2, neg)
        new[:S] = np.where(use_stay, stay, enter) + emit[t]
        delta = new
    final_scores = delta[graph.final]
    if not np.isfinite(final_scores).any():
        raise DataError(f"no alignment fits {T} frames (the transcript needs more)")
    state = int(graph.final[int(final_scores.argmax())])
    total = float(final_scores.max())
    path = np.empty(T, dtype=np.int64)
    for t in range(T - 1, -1, -1):
        path[t] = state
        state = int(back[t, state])
    return graph.phone[path].astype(np.int32), total
