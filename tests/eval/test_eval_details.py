"""eval.json's most frequent errors and per-speaker rates, on hand-made records."""
from __future__ import annotations

from asrdist.eval.details import confusions, speaker_rates, speaker_table, text_details


def test_confusions_count_substitutions_deletions_and_insertions_by_alignment():
    records = text_details(["a1", "a2", "b1", "b2"],
                           ["two", "two three", "six", "one two"],
                           ["four", "four three", "six six", "two"])
    assert confusions(records) == [{"ref": "two", "hyp": "four", "count": 2},
                                   {"ref": "", "hyp": "six", "count": 1},
                                   {"ref": "one", "hyp": "", "count": 1}]
    assert confusions(records, count=1) == [{"ref": "two", "hyp": "four", "count": 2}]
    assert confusions(text_details(["x"], ["zero"], ["zero"])) == []


def test_speaker_rates_pool_each_speakers_errors():
    records = text_details(["a1", "a2", "b1"], ["two", "two three", "six"], ["four", "two three", "six"])
    rates = speaker_rates(records, {"a1": "alice", "a2": "alice", "b1": "bob"})
    assert rates == {"alice": {"utterances": 2, "errors": 1, "ref_length": 3, "error_rate": 0.3333,
                               "sentence_accuracy": 0.5},
                     "bob": {"utterances": 1, "errors": 0, "ref_length": 1, "error_rate": 0.0,
                             "sentence_accuracy": 1.0}}


def test_speaker_table_lists_the_worst_speaker_first_and_pools_them_all():
    records = text_details(["a1", "a2", "b1", "c1"], ["two", "two three", "six", "one two"],
                           ["four", "two three", "six", "one"])
    rates = speaker_rates(records, {"a1": "alice", "a2": "alice", "b1": "bob", "c1": "carol"})
    lines = speaker_table(rates, "words").splitlines()
    assert lines[0].split() == ["speaker", "utts", "words", "errors", "error", "rate", "utts", "right"]
    assert [line.split() for line in lines[1:]] == [
        ["carol", "1", "2", "1", "0.5000", "0.0000"],
        ["alice", "2", "3", "1", "0.3333", "0.5000"],
        ["bob", "1", "1", "0", "0.0000", "1.0000"],
        ["all", "4", "6", "2", "0.3333", "0.5000"]]


def test_a_corpus_without_test_split_names_the_splits_it_has(tmp_path):
    import pytest

    from asrdist.errors import DataError
    from asrdist.run.evaluate import resolve_split

    for name in ("train", "valid"):
        (tmp_path / name).mkdir()
        (tmp_path / name / "wav.scp").write_text("")
    with pytest.raises(DataError, match=r"a corpus without a test/ split; give one of its splits "
                                        r"\(--data \S+/train, --data \S+/valid\)"):
        resolve_split(tmp_path)
    assert resolve_split(tmp_path / "valid") == tmp_path / "valid"
    with pytest.raises(DataError, match="neither a split directory"):
        resolve_split(tmp_path / "train" / "nothing")
