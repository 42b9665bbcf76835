"""Lexicons: Kaldi / lexiconp / CMU formats onto asrdist's phones, missing words, phone CTC targets."""
from __future__ import annotations

from pathlib import Path

import pytest

from asrdist.corpus.kaldi_dir import Utterance, write_data_dir
from asrdist.corpus.lexicon import Lexicon, lexicon_phone_tokens, report_missing, store_lexicon
from asrdist.corpus.phones import PhoneTable
from asrdist.errors import DataError

T = PhoneTable()


def ids(*symbols: str) -> tuple[int, ...]:
    return tuple(T.id(s) for s in symbols)


def test_cmu_kaldi_and_lexiconp_lines(tmp_path: Path):
    path = tmp_path / "lex.txt"
    path.write_text(";;; a CMU comment\n"
                    "HELLO  HH AH0 L OW1\n"
                    "HELLO(2)  HH EH0 L OW1\n"
                    "the 1.0 dh ax\n"
                    "<SIL> SIL\n"
                    "button b ah1 t en # inline comment\n", encoding="latin-1")
    lex = Lexicon.read(path)
    assert lex.pronunciations("hello") == [ids("hh", "ah", "l", "ow"), ids("hh", "eh", "l", "ow")]
    assert lex.pronunciations("THE") == [ids("dh", "ah")]  # lexiconp probability dropped, ax -> ah
    assert lex.pronunciations("<sil>") == [ids("sil")]
    assert lex.pronunciations("button") == [ids("b", "ah", "t", "n")]  # en -> n, comment dropped
    # Written in asrdist's own phones and read back unchanged.
    lex.write(tmp_path / "out.txt")
    assert Lexicon.read(tmp_path / "out.txt").entries == lex.entries


@pytest.mark.parametrize("line, message", [("word qq", "phone 'qq'"), ("word", "no phones")])
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str):
    path = tmp_path / "lex.txt"
    path.write_text(f"ok ow k ey\n{line}\n")
    with pytest.raises(DataError, match=rf"lex.txt:2: .*{message}"):
        Lexicon.read(path)


def test_missing_words_skip_their_utterances_and_are_listed_in_one_line(tmp_path: Path, capsys):
    path = tmp_path / "lex.txt"
    path.write_text("one w ah n\ntwo t uw\nsil sil\n")
    lex = Lexicon.read(path)
    tokens, missing, skipped = lex.phone_targets({"u1": "one two", "u2": "one xyzzy", "u3": "Two sil plugh"})
    assert tokens == {"u1": list(ids("w", "ah", "n", "t", "uw"))}  # silence is never a CTC target
    assert missing == ["plugh", "xyzzy"] and skipped == 2
    line = report_missing(missing, skipped, "corpus/train")
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and line in err
    assert "2 word(s) not in the lexicon: plugh xyzzy; skipped 2 utterance(s)" in line


def test_corpus_lexicon_gives_phone_targets_of_an_unaligned_split(tmp_path: Path, capsys):
    corpus = tmp_path / "corpus"
    utts = [Utterance("a-1", "a", "/x.wav", "one two"), Utterance("a-2", "a", "/x.wav", "two three")]
    write_data_dir(corpus / "train", utts)
    lexicon = tmp_path / "cmu.dict"
    lexicon.write_text("ONE W AH1 N\nTWO T UW1\nFOUR F AO1 R\n")
    summary = store_lexicon(lexicon, corpus, [u.text for u in utts])
    assert summary["missing_words"] == ["three"] and summary["utterances_without_lexicon"] == 1
    assert (corpus / "lexicon.txt").read_text() == "one w ah n\ntwo t uw\n"  # only the words the corpus uses
    tokens = lexicon_phone_tokens(corpus / "train")
    assert tokens == {"a-1": list(ids("w", "ah", "n", "t", "uw"))}
    assert "three" in capsys.readouterr().err
