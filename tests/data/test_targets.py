"""Training targets: tied triphone states, CTC tokens, character tokenizer, label priors."""
import json

import numpy as np
import pytest

from asrdist.data.targets import (CharTokenizer, Targets, TiedStates, label_priors, monophone_labels,
                                  phone_tokens)
from asrdist.errors import ConfigError, DataError


def naive_triphones(alignment, edge):
    """(left, center, right) per frame by walking the segments one frame at a time."""
    segments = []  # [phone, length]
    for p in alignment:
        if segments and segments[-1][0] == p:
            segments[-1][1] += 1
        else:
            segments.append([int(p), 1])
    out = []
    for i, (p, n) in enumerate(segments):
        left = segments[i - 1][0] if i > 0 else edge
        right = segments[i + 1][0] if i + 1 < len(segments) else edge
        out += [(left, p, right)] * n
    return out


def random_alignments(rng, num_utts, num_phones):
    out = {}
    for i in range(num_utts):
        segs = rng.integers(0, num_phones, size=rng.integers(1, 12))
        out[f"u{i:03d}"] = np.repeat(segs, rng.integers(1, 6, size=len(segs))).astype(np.int32)
    return out


def test_tied_states_follow_the_documented_rule():
    rng = np.random.default_rng(0)
    num_phones, num_states = 6, 14
    alignments = random_alignments(rng, 40, num_phones)
    tied = TiedStates.fit(alignments, num_phones, num_states)

    counts = {}
    for a in alignments.values():
        for tri in naive_triphones(a, num_phones):
            counts[tri] = counts.get(tri, 0) + 1
    ranked = sorted(counts, key=lambda t: (-counts[t], t))
    expected = ranked[: num_states - num_phones]
    assert tied.num_classes == num_states
    assert [tuple(int(x) for x in row) for row in tied.triphones] == expected
    class_of = {t: num_phones + i for i, t in enumerate(expected)}
    assert list(tied.class_to_phone) == list(range(num_phones)) + [t[1] for t in expected]

    for utt, a in alignments.items():
        want = [class_of.get(t, t[1]) for t in naive_triphones(a, num_phones)]
        got = tied.map(a)
        assert got.dtype == np.int32
        assert list(got) == want, utt
        assert np.array_equal(tied.class_to_phone[got], a)


def test_tied_states_back_off_and_context_independent_phones():
    a = np.array([0, 0, 1, 1, 1, 2, 2, 0, 0, 0], dtype=np.int32)
    tied = TiedStates.fit({"u": a}, num_phones=4, num_states=100, context_independent=[0])
    # Only triphones with a non-silence center get classes: (0,1,2) and (1,2,0).
    assert tied.num_classes == 4 + 2
    assert set(map(tuple, tied.triphones.tolist())) == {(0, 1, 2), (1, 2, 0)}
    labels = tied.map(a)
    assert list(labels[:2]) == [0, 0] and list(labels[7:]) == [0, 0, 0]
    # An unseen context backs off to the monophone class.
    assert list(tied.map(np.array([3, 1, 1, 3]))) == [3, 1, 1, 3]
    assert tied.map(np.array([], dtype=np.int32)).shape == (0,)


def test_tied_states_min_frames_and_edges():
    a = np.array([1, 2, 2, 2, 1], dtype=np.int32)
    tied = TiedStates.fit({"u": a}, num_phones=3, num_states=10, min_frames=2)
    assert tied.triphones.tolist() == [[1, 2, 1]]  # the edge triphones have 1 frame each
    tied_all = TiedStates.fit({"u": a}, num_phones=3, num_states=10)
    edge = 3
    assert {tuple(t) for t in tied_all.triphones.tolist()} == {(edge, 1, 2), (1, 2, 1), (2, 1, edge)}


def test_tied_states_round_trip_through_json():
    rng = np.random.default_rng(1)
    alignments = random_alignments(rng, 20, 5)
    tied = TiedStates.fit(alignments, 5, 12, context_independent=[0])
    back = TiedStates.from_dict(json.loads(json.dumps(tied.to_dict())))
    assert back.num_classes == tied.num_classes
    assert np.array_equal(back.class_to_phone, tied.class_to_phone)
    for a in alignments.values():
        assert np.array_equal(back.map(a), tied.map(a))
    assert -1 in sum(tied.to_dict()["triphones"], [])  # edges are stored as -1


def test_tied_states_bad_input():
    with pytest.raises(ConfigError, match="at least one per phone"):
        TiedStates.fit({"u": np.zeros(3, dtype=np.int32)}, num_phones=5, num_states=4)
    with pytest.raises(DataError, match="utterance bad: phone id 7"):
        TiedStates.fit({"bad": np.array([0, 7])}, num_phones=5, num_states=10)
    with pytest.raises(DataError, match="phone id"):
        monophone_labels({"u": np.array([-1, 0])}, 5)
    with pytest.raises(DataError, match="malformed"):
        TiedStates.from_dict({"triphones": []})


def test_phone_tokens_collapse_repeats_then_drop_silence():
    assert phone_tokens(np.array([0, 0, 3, 3, 0, 3, 5, 5, 0]), silence_id=0) == [3, 3, 5]
    assert phone_tokens(np.array([4, 4, 4]), silence_id=0) == [4]
    assert phone_tokens(np.array([0, 0]), silence_id=0) == []
    assert phone_tokens(np.array([], dtype=np.int32), silence_id=0) == []


def test_char_tokenizer():
    tok = CharTokenizer.fit(["Hello  world", "zero one\ttwo"])
    assert tok.blank_id == 0
    assert tok.vocab_size == len(set("hello world" + "zero one two")) + 1
    ids = tok.encode("  HELLO   two ")
    assert 0 not in ids
    assert tok.decode(ids) == "hello two"
    assert tok.decode([0] + ids + [0]) == "hello two"
    with pytest.raises(DataError, match="utt7: character 'q'"):
        tok.encode("quick", where="utt7")
    back = CharTokenizer.from_dict(json.loads(json.dumps(tok.to_dict())))
    assert back.encode("hello world") == tok.encode("hello world")
    cased = CharTokenizer.fit(["Ab"], lowercase=False)
    assert cased.decode(cased.encode("Ab")) == "Ab"
    with pytest.raises(DataError):
        CharTokenizer.fit(["   "])


def test_label_priors():
    priors = label_priors([np.array([0, 0, 1]), np.array([1, 1, 0, 3])], num_classes=5, floor=1e-3)
    counts = np.array([3, 3, 0, 1, 0]) / 7
    expected = np.maximum(counts, 1e-3)
    np.testing.assert_allclose(priors, expected / expected.sum())
    assert priors.sum() == pytest.approx(1.0)
    assert priors[2] > 0
    with pytest.raises(DataError, match="outside"):
        label_priors([np.array([5])], num_classes=5)
    with pytest.raises(DataError, match="no labelled frames"):
        label_priors([np.array([], dtype=np.int32)], num_classes=5)


def test_utterances_too_short_for_their_ctc_labels_are_noted(tmp_path, capsys):
    """CTC emits each label on a frame of its own, with a blank between equal neighbours: 'zero'
    needs 4 output frames and 'three' 6; with subsample 3, 12 input frames give 4."""
    from asrdist.io.kaldi_dir import Utterance, write_data_dir
    from asrdist.features.store import FeatureStore, FeatureStoreWriter
    from asrdist.data.labels import note_short_utterances

    rows = {"a": ("zero", 12), "b": ("three", 12), "c": ("three", 18), "d": ("zero", 9)}
    write_data_dir(tmp_path, [Utterance(u, "spk", f"{u}.wav", text) for u, (text, _) in rows.items()])
    writer = FeatureStoreWriter(tmp_path, 3)
    for u, (_, frames) in rows.items():
        writer.add(u, np.zeros((frames, 3), dtype=np.float32))
    writer.close({})
    assert len(FeatureStore(tmp_path)) == 4
    tokenizer = CharTokenizer.fit(["zero", "three"])
    targets = Targets(kind="chars", phones=[], silence_id=0, num_classes=tokenizer.vocab_size, tokenizer=tokenizer)
    assert note_short_utterances(tmp_path, targets, subsample=3) == 2  # b (4 < 6) and d (3 < 4)
    note = capsys.readouterr().err
    assert f"{tmp_path}: 2 of 4 utterance(s) are too short for their transcripts (e.g. b: 4 output frame(s) for 6 CTC " \
           f"labels and blanks)" in note
    assert note_short_utterances(tmp_path, targets, subsample=1) == 0 and capsys.readouterr().err == ""
