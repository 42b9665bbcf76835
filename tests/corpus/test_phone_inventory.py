"""Phone sets from the data: a Kaldi phones.txt (`<eps>`, position-dependent phones, disambiguation
symbols) or a lexicon's own phones define a corpus' inventory; ARPAbet sources keep the default
table. Imports of real FSDD recordings with a made-up language's words."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from asrdist.cli import main
from asrdist.corpus.lexicon import Lexicon, lexicon_phone_tokens
from asrdist.corpus.phones import PHONES, PhoneTable, inventory
from asrdist.errors import DataError
from asrdist.io.audio import num_frames, read_wav
from asrdist.io.kaldi_dir import read_data_dir
from tests.support.fsdd_kaldi import FSDD, make_kaldi_tree

# A made-up language: its words (the digits 0-2 of FSDD's recordings) and their phones.
WORDS = {"zero": "ɲatʃa", "one": "ŋ̊a", "two": "tʃaɲ"}
LEXICON = "ɲatʃa ɲ a tʃ a\nŋ̊a ŋ̊ a\ntʃaɲ tʃ a ɲ\ntʃaɲ tʃ a ɲ a\n"
OWN = ("sil", "a", "tʃ", "ŋ̊", "ɲ")  # silence first, then the phones as written, sorted
KALDI_PHONES = ["<eps>", "SIL", "SIL_B", "SIL_E", "SIL_I", "SIL_S", "SPN", "SPN_S",
                *(f"{p}_{pos}" for p in ("a", "ɲ", "tʃ", "ŋ̊") for pos in "BEIS"), "#0", "#1"]


def _kaldi_phones(path: Path, symbols=KALDI_PHONES) -> Path:
    path.write_text("".join(f"{s} {i}\n" for i, s in enumerate(symbols)), encoding="utf-8")
    return path


def test_a_kaldi_phones_txt_becomes_the_inventory_with_its_ids_mapped(tmp_path: Path):
    table = PhoneTable.read(_kaldi_phones(tmp_path / "phones.txt"))
    assert table.symbols == OWN and table.silence_id == 0
    kaldi = {s: i for i, s in enumerate(KALDI_PHONES)}
    ids = np.array([kaldi["SIL"], kaldi["ɲ_B"], kaldi["a_I"], kaldi["tʃ_E"], kaldi["ŋ̊_S"], kaldi["SPN_S"]])
    assert [table.symbol(i) for i in table.map_ids(ids, "x")] == ["sil", "ɲ", "a", "tʃ", "ŋ̊", "sil"]
    for bad in (kaldi["<eps>"], kaldi["#1"], len(KALDI_PHONES)):
        with pytest.raises(DataError, match=rf"ali: unknown phone id {bad} \(phone table has {len(KALDI_PHONES)}"):
            table.map_ids(np.array([kaldi["a_B"], bad]), "ali")
    # written in asrdist's form, read back as it is
    table.write(tmp_path / "own.txt")
    again = PhoneTable.read(tmp_path / "own.txt")
    assert again.symbols == OWN and again.kaldi_ids is None


def test_an_arpabet_kaldi_phones_txt_keeps_the_default_table(tmp_path: Path):
    """A CMU-based Kaldi recipe's phones (stress, positions) map onto ARPAbet, as its lexicon does."""
    symbols = ["<eps>", "SIL", "SIL_B", "AA0_B", "AA1_E", "AH0_I", "NG_S", "#0"]
    table = PhoneTable.read(_kaldi_phones(tmp_path / "phones.txt", symbols))
    assert table.symbols == PHONES and table.is_default
    assert [table.symbol(i) for i in table.map_ids(np.arange(1, 7), "x")] == ["sil", "sil", "aa", "aa", "ah", "ng"]


def test_a_lexicon_defines_its_own_phones_unless_they_are_arpabet(tmp_path: Path):
    path = tmp_path / "lexicon.txt"
    path.write_text(LEXICON + "<sil> SIL\n", encoding="utf-8")
    lexicon = Lexicon.read(path)
    assert lexicon.table.symbols == OWN
    t = lexicon.table
    tʃaɲ = (t.id("tʃ"), t.id("a"), t.id("ɲ"))
    assert lexicon.pronunciations("tʃaɲ") == [tʃaɲ, (*tʃaɲ, t.id("a"))]
    assert lexicon.pronunciations("<sil>") == [(0,)]
    lexicon.write(tmp_path / "out.txt")  # in the table's symbols, read back the same against it
    assert Lexicon.read(tmp_path / "out.txt", t).entries == lexicon.entries
    path.write_text("hello HH AH0 L OW1\n")
    assert Lexicon.read(path).table.is_default
    # Tones are phones: digits are not stress marks outside ARPAbet.
    assert inventory(["a1", "a2", "ma"]).symbols == ("sil", "a1", "a2", "ma")
    # Against a given table, a phone it lacks is an error naming the line.
    path.write_text("ŋ̊a ŋ̊ a\nbad a ʔ\n", encoding="utf-8")
    with pytest.raises(DataError, match=r"lexicon.txt:2: phone 'ʔ' is not in the phone table"):
        Lexicon.read(path, PhoneTable(OWN))


def _made_up_tree(root: Path) -> Path:
    """FSDD's Kaldi tree with the digits' words replaced by the made-up language's."""
    src = make_kaldi_tree(root)
    for text in src.glob("*/text"):
        lines = [line.split() for line in text.read_text().splitlines()]
        text.write_text("".join(f"{u} {WORDS[w]}\n" for u, w in lines), encoding="utf-8")
    return src


needs_fsdd = pytest.mark.skipif(not FSDD.is_dir(), reason=f"FSDD recordings not found at {FSDD}")


@needs_fsdd
def test_import_with_a_made_up_language_lexicon_takes_its_phones(tmp_path: Path):
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text(LEXICON, encoding="utf-8")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(_made_up_tree(tmp_path)), str(out), "--lexicon", str(lexicon)]) == 0
    table = PhoneTable.read(out / "phones.txt")
    assert table.symbols == OWN
    assert "tʃaɲ tʃ a ɲ\n" in (out / "lexicon.txt").read_text(encoding="utf-8")
    tokens = lexicon_phone_tokens(out / "train")
    one = [u for u in tokens if u.split("-")[1] == "1"]  # the word ŋ̊a
    assert one and all(tokens[u] == [table.id("ŋ̊"), table.id("a")] for u in one)


@needs_fsdd
def test_import_reads_a_kaldi_phones_txt_and_maps_its_alignments(tmp_path: Path, capsys):
    src = _made_up_tree(tmp_path)
    kaldi = {s: i for i, s in enumerate(KALDI_PHONES)}
    for split in ("train", "test"):
        _kaldi_phones(src / split / "phones.txt")
        lines = []
        for line in (src / split / "wav.scp").read_text().splitlines():
            utt, wav = line.split()
            frames = num_frames(len(read_wav(src / split / wav)[0]), 8000)
            ids = [kaldi["SIL_B"]] * 3 + [kaldi["a_S"]] * (frames - 6) + [kaldi["SIL_E"]] * 3
            lines.append(f"{utt} {' '.join(map(str, ids))}\n")
        (src / split / "ali.txt").write_text("".join(lines))
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text(LEXICON, encoding="utf-8")
    out = tmp_path / "corpus"
    assert main(["corpus", "import-kaldi", str(src / "train"), str(out), "--lexicon", str(lexicon),
                 "--alignments", str(src / "train" / "ali.txt")]) == 0
    assert PhoneTable.read(out / "phones.txt").symbols == OWN
    alignment = read_data_dir(out).utterances["george-0-0"].alignment
    assert set(alignment[:3]) == {0} and set(alignment[3:-3]) == {OWN.index("a")}
    # a lexicon phone the phones.txt lacks is named by its line
    lexicon.write_text(LEXICON + "ʔa ʔ a\n", encoding="utf-8")
    capsys.readouterr()
    assert main(["corpus", "import-kaldi", str(src / "train"), str(tmp_path / "bad"), "--lexicon", str(lexicon)]) != 0
    err = capsys.readouterr().err
    assert "lexicon.txt:5: phone 'ʔ' is not in the phone table" in err and not (tmp_path / "bad").exists()


@needs_fsdd
def test_alignments_without_a_phones_txt_do_not_fit_a_made_up_lexicon(tmp_path: Path, capsys):
    src = _made_up_tree(tmp_path)
    lines = [f"{line.split()[0]} " + " ".join(["0"] * num_frames(len(read_wav(src / "train" / line.split()[1])[0]),
                                                                  8000)) + "\n"
             for line in (src / "train" / "wav.scp").read_text().splitlines()]
    (src / "train" / "ali.txt").write_text("".join(lines))
    lexicon = tmp_path / "lexicon.txt"
    lexicon.write_text(LEXICON, encoding="utf-8")
    assert main(["corpus", "import-kaldi", str(src / "train"), str(tmp_path / "out"), "--lexicon", str(lexicon),
                 "--alignments", str(src / "train" / "ali.txt")]) != 0
    err = capsys.readouterr().err
    assert "its phones are not ARPAbet" in err and "put the phones.txt" in err
    assert not (tmp_path / "out").exists()
