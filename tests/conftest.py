"""Fixtures shared by test modules."""
from __future__ import annotations

import pytest

from asrdist.cli import main
from corpus_fixture import make_tone_corpus


@pytest.fixture(scope="session")
def tone_corpus(tmp_path_factory):
    """The tone corpus with features (60 utterances x 4 speakers): the end-to-end training tests'
    small corpus, built once per test session. Tests must not write into it."""
    path = make_tone_corpus(tmp_path_factory.mktemp("tones") / "corpus", utterances_per_speaker=60, speakers=4)
    assert main(["features", str(path)]) == 0
    return path
