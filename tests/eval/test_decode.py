"""Phone bigram, phone-loop Viterbi (vs brute force), CTC decoding, error rates, `asrdist decode` ids."""
from __future__ import annotations

import itertools
import math
from pathlib import Path

import numpy as np
import pytest
import torch

from asrdist.errors import DataError
from asrdist.eval.decode import (PhoneBigram, collapse_labels, ctc_beam_decode, ctc_greedy_decode,
                                 phone_log_likelihoods, viterbi_decode, viterbi_segments)
from asrdist.eval.scoring import cer, error_rate, frame_accuracy, per, wer


# -- bigram -------------------------------------------------------------------------------
def test_bigram_counts_with_smoothing():
    bigram = PhoneBigram.fit([[0, 1, 2, 0], [1, 2]], num_phones=3, smoothing=0.5)
    # starts: 0 once, 1 once -> (1.5, 1.5, 0.5) / 3.5
    np.testing.assert_allclose(np.exp(bigram.log_start), np.array([1.5, 1.5, 0.5]) / 3.5)
    # row 2: 2->0 once, ends once (second sentence) -> counts (1.5, .5, .5 | end 1.5) / 4
    np.testing.assert_allclose(np.exp(bigram.log_trans[2]), np.array([1.5, 0.5, 0.5]) / 4.0)
    assert np.exp(bigram.log_end[2]) == pytest.approx(1.5 / 4.0)
    # every row (transitions + end) is a distribution
    np.testing.assert_allclose(np.exp(bigram.log_trans).sum(1) + np.exp(bigram.log_end), 1.0)
    again = PhoneBigram.from_dict(bigram.to_dict())
    np.testing.assert_array_equal(again.log_trans, bigram.log_trans)
    with pytest.raises(DataError, match="sequence 1"):
        PhoneBigram.fit([[0], [3]], num_phones=3)


# -- scaled likelihoods -------------------------------------------------------------------
def test_phone_likelihoods_for_tied_states():
    rng = np.random.default_rng(0)
    log_post = np.log(rng.dirichlet(np.ones(5), size=4))
    log_prior = np.log(np.array([0.1, 0.2, 0.3, 0.15, 0.25]))
    class_to_phone = np.array([0, 0, 1, 2, 2])
    identity = phone_log_likelihoods(log_post, log_prior, np.arange(5), 5)
    np.testing.assert_allclose(identity, log_post - log_prior)
    summed = phone_log_likelihoods(log_post, log_prior, class_to_phone, 4, tied="sum")
    post = np.exp(log_post)
    np.testing.assert_allclose(summed[:, 0], np.log(post[:, 0] + post[:, 1]) - np.log(0.3))
    np.testing.assert_allclose(summed[:, 2], np.log(post[:, 3] + post[:, 4]) - np.log(0.4))
    assert np.all(summed[:, 3] == -np.inf)  # phone 3 has no class
    best = phone_log_likelihoods(log_post, log_prior, class_to_phone, 4, tied="max")
    np.testing.assert_allclose(best[:, 0], np.maximum(log_post[:, 0] - log_prior[0], log_post[:, 1] - log_prior[1]))
    # A class never seen in training (prior 0) is left out instead of scoring +inf.
    unseen = phone_log_likelihoods(log_post, np.array([math.log(0.1), -np.inf, 0.0, 0.0, 0.0]), class_to_phone, 4)
    np.testing.assert_allclose(unseen[:, 0], log_post[:, 0] - np.log(0.1))


# -- Viterbi ------------------------------------------------------------------------------
def _posteriorgram(phones, durations, num_phones, rng, boost=3.5, noise=1.2):
    frames = np.repeat(phones, durations)
    logits = rng.normal(scale=noise, size=(len(frames), num_phones))
    logits[np.arange(len(frames)), frames] += boost
    return torch.log_softmax(torch.from_numpy(logits), -1).numpy(), frames


def test_viterbi_recovers_a_synthetic_phone_sequence():
    rng = np.random.default_rng(1)
    num_phones = 40
    truth = [0] + list(rng.choice(np.arange(1, num_phones), size=30)) + [0]
    truth = [p for i, p in enumerate(truth) if i == 0 or p != truth[i - 1]]
    durations = rng.integers(4, 12, size=len(truth))
    log_post, frames = _posteriorgram(truth, durations, num_phones, rng)
    assert (log_post.argmax(1) != frames).mean() > 0.15  # frame-wise argmax is often wrong
    bigram = PhoneBigram.fit([], num_phones)  # uniform: the acoustics alone must carry it
    uniform_prior = np.full(num_phones, -math.log(num_phones))
    hyp = viterbi_decode(log_post, uniform_prior, np.arange(num_phones), bigram, min_duration=3)
    assert hyp == [p for p in truth if p != 0]
    segments = viterbi_segments(phone_log_likelihoods(log_post, uniform_prior, np.arange(num_phones), num_phones),
                                bigram, min_duration=3)
    assert [s for _, s, _ in segments] == list(np.concatenate([[0], np.cumsum(durations)[:-1]]))
    assert segments[-1][2] == len(frames)


def test_tied_states_decode_to_their_phones():
    rng = np.random.default_rng(2)
    truth, durations = [0, 1, 2, 1, 0], [5, 6, 4, 7, 5]
    class_to_phone = np.array([0, 1, 1, 2, 2, 2])
    classes = [0, 2, 4, 1, 0]  # one tied state of each phone
    log_post, _ = _posteriorgram(classes, durations, 6, rng)
    bigram = PhoneBigram.fit([truth], 3)
    hyp = viterbi_decode(log_post, np.log(np.full(6, 1 / 6)), class_to_phone, bigram, min_duration=3)
    assert hyp == [1, 2, 1]


def test_min_duration_suppresses_one_frame_blips():
    num_phones = 4
    frames = [1] * 8 + [2] + [1] * 8  # a confident 1-frame blip of phone 2 inside phone 1
    log_post = np.full((len(frames), num_phones), math.log(0.02))
    log_post[np.arange(len(frames)), frames] = math.log(0.94)
    bigram = PhoneBigram.fit([], num_phones)  # uniform
    prior = np.full(num_phones, -math.log(num_phones))
    assert viterbi_decode(log_post, prior, np.arange(4), bigram, min_duration=3) == [1]
    assert viterbi_decode(log_post, prior, np.arange(4), bigram, min_duration=1) == [1, 2, 1]


def test_silence_removed_and_transition_penalty_discourages_insertions():
    log_post = np.log(np.array([[0.9, 0.05, 0.05]] * 4 + [[0.05, 0.9, 0.05]] * 4 + [[0.9, 0.05, 0.05]] * 4))
    bigram = PhoneBigram.fit([], 3)
    prior = np.log(np.full(3, 1 / 3))
    assert viterbi_decode(log_post, prior, np.arange(3), bigram, min_duration=2) == [1]
    assert viterbi_decode(log_post, prior, np.arange(3), bigram, min_duration=2, silence_id=None) == [0, 1, 0]
    assert viterbi_decode(log_post, prior, np.arange(3), bigram, min_duration=2, transition_penalty=-50) == []


def _path_score(segments, scores, bigram, penalty):
    total = bigram.log_start[segments[0][0]] + bigram.log_end[segments[-1][0]]
    for i, (p, s, e) in enumerate(segments):
        total += scores[s:e, p].sum()
        if i:
            total += bigram.log_trans[segments[i - 1][0], p] + penalty
    return total


def _compositions(total, minimum):
    if total == 0:
        yield []
        return
    for first in range(minimum, total + 1):
        for rest in _compositions(total - first, minimum):
            yield [first] + rest


@pytest.mark.parametrize("seed, min_duration", [(0, 1), (1, 2), (2, 3), (3, 2)])
def test_viterbi_is_optimal_against_brute_force(seed, min_duration):
    rng = np.random.default_rng(seed)
    num_frames, num_phones, penalty = 7, 3, -0.3
    scores = rng.normal(size=(num_frames, num_phones))
    bigram = PhoneBigram.fit([list(rng.integers(0, num_phones, size=6)) for _ in range(4)], num_phones, 0.5)
    best = -np.inf
    for lengths in _compositions(num_frames, min_duration):
        bounds = np.concatenate([[0], np.cumsum(lengths)])
        for phones in itertools.product(range(num_phones), repeat=len(lengths)):
            segs = [(p, int(bounds[i]), int(bounds[i + 1])) for i, p in enumerate(phones)]
            best = max(best, _path_score(segs, scores, bigram, penalty))
    found = viterbi_segments(scores, bigram, min_duration, penalty)
    assert all(e - s >= min_duration for _, s, e in found)
    assert found[0][1] == 0 and found[-1][2] == num_frames
    assert all(a[2] == b[1] for a, b in zip(found, found[1:]))
    assert _path_score(found, scores, bigram, penalty) == pytest.approx(best, abs=1e-9)


def test_viterbi_edge_cases():
    bigram = PhoneBigram.fit([], 3)
    assert viterbi_segments(np.zeros((0, 3)), bigram) == []
    short = viterbi_segments(np.log(np.array([[0.1, 0.8, 0.1], [0.1, 0.8, 0.1]])), bigram, min_duration=5)
    assert short == [(1, 0, 2)]  # shorter than min_duration: one phone over the whole utterance
    with pytest.raises(DataError, match="phone"):
        viterbi_segments(np.zeros((4, 2)), bigram)
    with pytest.raises(DataError, match="do not fit"):
        phone_log_likelihoods(np.zeros((4, 3)), np.zeros(2), np.arange(2), 3)


def test_collapse_labels():
    assert collapse_labels([0, 0, 3, 3, 3, 0, 5, 5, 3, 0]) == [3, 5, 3]
    assert collapse_labels([0, 0, 3, 3], silence_id=None) == [0, 3]
    assert collapse_labels([]) == []


# -- CTC ----------------------------------------------------------------------------------
def _labelling_log_prob(log_probs, labels):
    """log P(labels | x) by torch's CTC forward algorithm."""
    lp = torch.from_numpy(np.asarray(log_probs, dtype=np.float64))[:, None]
    if not labels:
        return float(lp[:, 0, 0].sum())
    loss = torch.nn.functional.ctc_loss(lp, torch.tensor([labels]), torch.tensor([lp.shape[0]]),
                                        torch.tensor([len(labels)]), reduction="sum")
    return -float(loss)


def test_ctc_greedy_collapses_repeats_and_blanks():
    path = [1, 1, 0, 1, 2, 2, 0, 0, 3]
    log_probs = np.full((len(path), 4), math.log(0.1))
    log_probs[np.arange(len(path)), path] = math.log(0.7)
    assert ctc_greedy_decode(log_probs) == [1, 1, 2, 3]
    assert ctc_beam_decode(log_probs, beam=8) == [1, 1, 2, 3]


def test_ctc_beam_beats_greedy_when_paths_add_up():
    # Per frame: blank 0.6, "a" 0.4. Greedy picks blank,blank -> "" (p = 0.36), but the three
    # paths of "a" (a a, a _, _ a) sum to 0.64.
    log_probs = np.log(np.array([[0.6, 0.4], [0.6, 0.4]]))
    assert ctc_greedy_decode(log_probs) == []
    assert ctc_beam_decode(log_probs, beam=4) == [1]
    assert _labelling_log_prob(log_probs, [1]) == pytest.approx(math.log(0.64))


@pytest.mark.parametrize("seed", range(6))
def test_ctc_beam_finds_the_most_probable_labelling(seed):
    rng = np.random.default_rng(seed)
    num_frames, vocab = 5, 3
    log_probs = np.log(rng.dirichlet(np.full(vocab, 0.7), size=num_frames))
    totals: dict[tuple, float] = {}
    for path in itertools.product(range(vocab), repeat=num_frames):
        labels = tuple(t for i, t in enumerate(path) if t != 0 and (i == 0 or t != path[i - 1]))
        p = sum(log_probs[i, t] for i, t in enumerate(path))
        totals[labels] = np.logaddexp(totals.get(labels, -np.inf), p)
    best = max(totals, key=totals.get)
    beam = ctc_beam_decode(log_probs, beam=64)
    assert tuple(beam) == best
    assert _labelling_log_prob(log_probs, beam) == pytest.approx(totals[best])
    narrow = ctc_beam_decode(log_probs, beam=2)
    greedy = ctc_greedy_decode(log_probs)
    assert totals[tuple(narrow)] >= totals[tuple(greedy)] - 1e-9


# -- scoring ------------------------------------------------------------------------------
def test_error_rate_hand_computed():
    r = error_rate([["a", "b", "c", "d"]], [["a", "x", "c"]])
    assert r == {"errors": 2, "ref_length": 4, "rate": 0.5, "substitutions": 1, "deletions": 1, "insertions": 0}
    r = error_rate([[1, 2], [3, 4, 5]], [[1, 2, 9], []])
    assert (r["errors"], r["ref_length"], r["insertions"], r["deletions"]) == (4, 5, 1, 3)
    assert r["rate"] == pytest.approx(0.8)
    assert per([[1, 2, 3]], [[1, 2, 3]])["rate"] == 0.0
    assert error_rate([[]], [[]])["rate"] == 0.0
    assert error_rate([[]], [[1]])["rate"] == math.inf
    with pytest.raises(DataError, match="2 references but 1"):
        error_rate([[1], [2]], [[1]])


def test_wer_and_cer():
    w = wer(["the cat sat", "on the mat"], ["the cat sat down", "on mat"])
    assert (w["errors"], w["ref_length"], w["insertions"], w["deletions"]) == (2, 6, 1, 1)
    c = cer(["ab  c"], ["abd c "])  # whitespace normalized: "ab c" vs "abd c"
    assert (c["errors"], c["ref_length"], c["insertions"]) == (1, 4, 1)


def test_frame_accuracy():
    assert frame_accuracy([1, 2, 3, 4], np.array([1, 0, 3, 0])) == 0.5
    assert frame_accuracy([], []) == 0.0
    with pytest.raises(DataError):
        frame_accuracy([1, 2], [1])


# -- `asrdist decode`'s utterance ids -----------------------------------------------------
def test_decode_ids_are_unique_and_free_of_whitespace(tmp_path):
    from asrdist.run.decode import utterance_ids

    assert utterance_ids([Path("a/one.wav"), Path("b/two.WAV"), Path("three")]) == ["one", "two", "three"]
    assert utterance_ids([Path("cv_1.mp3"), Path("SA1.sph"), Path("x.flac"), Path("y.mp3.txt")]) == \
        ["cv_1", "SA1", "x", "y.mp3.txt"]
    # colliding names: every id is the path below the common directory, without .wav
    assert utterance_ids([tmp_path / "d1" / "x.wav", tmp_path / "d2" / "x.wav", tmp_path / "y.wav"]) == \
        ["d1/x", "d2/x", "y"]
    assert utterance_ids([Path("w 1.wav"), Path("tab\there.wav")]) == ["w_1", "tab_here"]
    # still equal after all that (the same file twice, or 'w 1' next to 'w_1'): numbered
    assert utterance_ids([Path("x.wav"), Path("x.wav"), Path("w 1.wav"), Path("w_1.wav")]) == \
        ["x", "x-2", "w_1", "w_1-2"]
    assert utterance_ids([Path(".wav")]) == [".wav"]
    # one recording in several formats: the suffix tells them apart (x-2 would read as x given twice)
    assert utterance_ids([Path("fmt/x.flac"), Path("fmt/x.ogg"), Path("fmt/x.flac"), Path("fmt/y.wav")]) == \
        ["x.flac", "x.ogg", "x.flac-2", "y"]
