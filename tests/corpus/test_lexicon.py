"""Lexicons: Kaldi / lexiconp / CMU formats onto asrdist's phones, missing words, phone CTC targets."""
from __future__ import annotations

from pathlib import Path

import pytest

from asrdist.io.kaldi_dir import Utterance, write_data_dir
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


@pytest.mark.parametrize("line, message", [("word qq", "phone 'qq' is not an ARPAbet phone"), ("word", "no phones")])
def test_bad_lines_name_file_and_line(tmp_path: Path, line: str, message: str):
    """Read onto the default table (a corpus whose phones.txt is ARPAbet's), a phone outside it is an error."""
    path = tmp_path / "lex.txt"
    path.write_text(f"ok ow k ey\n{line}\n")
    with pytest.raises(DataError, match=rf"lex.txt:2: .*{message}"):
        Lexicon.read(path, PhoneTable())


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


def test_import_kaldi_stores_the_lexicon_and_refuses_a_bad_one_up_front(tmp_path: Path, capsys):
    from asrdist.cli import main
    from asrdist.io.kaldi_dir import read_data_dir
    from tests.support.corpus_fixture import make_tone_corpus

    src = make_tone_corpus(tmp_path / "src", utterances_per_speaker=2, speakers=4, seed=0)
    for split in ("train", "valid", "test"):  # an unaligned corpus
        (src / split / "alignment.scp").unlink()
        (src / split / "alignment.ark").unlink()
    bad = tmp_path / "bad.dict"
    bad.write_text("aa zz\n")
    assert main(["corpus", "import-kaldi", str(src), str(tmp_path / "nope"), "--lexicon", str(bad)]) != 0
    assert "bad.dict:1: phone 'zz'" in capsys.readouterr().err and not (tmp_path / "nope").exists()
    words = sorted({w for s in ("train", "valid", "test") for u in read_data_dir(src / s).utterances.values()
                    for w in u.text.split()})
    lexicon = tmp_path / "cmu.dict"
    lexicon.write_text("".join(f"{w.upper()}  {w.upper()}1\n" for w in words[1:]) + "UNUSED  AA1\n")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--lexicon", str(lexicon)]) == 0
    assert f"not in the lexicon: {words[0]}" in capsys.readouterr().err
    assert "unused" not in (out / "lexicon.txt").read_text()
    tokens = lexicon_phone_tokens(out / "train")
    texts = {u: d.text for u, d in read_data_dir(out / "train").utterances.items()}
    assert tokens and set(tokens) == {u for u, t in texts.items() if words[0] not in t.split()}
    assert all(tokens[u] == [T.id(w) for w in texts[u].split()] for u in tokens)


def _unaligned_tone_corpus(root: Path) -> Path:
    from tests.support.corpus_fixture import make_tone_corpus

    src = make_tone_corpus(root, utterances_per_speaker=2, speakers=4, seed=0)
    for split in ("train", "valid", "test"):
        (src / split / "alignment.scp").unlink()
        (src / split / "alignment.ark").unlink()
    return src


@pytest.mark.parametrize("single", [False, True])
def test_a_lexicon_with_none_of_the_transcript_words_fails_the_import(tmp_path: Path, capsys, single: bool):
    from asrdist.cli import main

    src = _unaligned_tone_corpus(tmp_path / "src")
    src = src / "train" if single else src
    wrong = tmp_path / "other.dict"
    wrong.write_text("HELLO  HH AH0 L OW1\nWORLD  W ER1 L D\n")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src), str(out), "--lexicon", str(wrong)]) != 0
    err = [line for line in capsys.readouterr().err.splitlines() if line.startswith("asrdist: error")]
    assert len(err) == 1 and "other.dict: no transcript word" in err[0] and "e.g. " in err[0], err
    assert not out.exists() and not [p for p in tmp_path.iterdir() if p.name.startswith(".corpus")]
    with pytest.raises(DataError, match="no transcript word of .* is in this lexicon"):
        store_lexicon(wrong, tmp_path / "c", ["aa ae", "ah"])


def test_a_directory_or_a_binary_file_is_no_lexicon(tmp_path: Path):
    with pytest.raises(DataError, match="is a directory, not a lexicon file"):
        Lexicon.read(tmp_path)
    path = tmp_path / "lex.bin"
    for data, where in ((b"\x7fELF\x02\x01\x01\x00\x00\x00\xff\xfe", "byte 0, line 1"),
                        (b"ok ow k ey\nyes y eh s\n\x00\x01\xff\x1b[2J", "byte 22, line 3"),
                        ("n\u00e9e n ey\nx\x00\n".encode("utf-8"), "byte 11, line 2")):  # valid UTF-8, but NUL
        path.write_bytes(data)
        with pytest.raises(DataError) as info:
            Lexicon.read(path)
        message = str(info.value)
        assert f"lex.bin: not a UTF-8 text file ({where})" in message and message.isprintable(), message
    path.write_bytes("caf\u00e9 k ae f ey\n".encode("latin-1"))  # older CMU releases: Latin-1 text still reads
    assert Lexicon.read(path).pronunciations("caf\u00e9") == [ids("k", "ae", "f", "ey")]
    path.write_bytes(b"\xef\xbb\xbfok ow k ey\n")  # a byte order mark is not part of the first word
    assert "ok" in Lexicon.read(path)
