"""Forced alignment: the Viterbi search against brute force, and `asrdist align` end to end."""
from __future__ import annotations

import itertools
import shutil
from pathlib import Path

import numpy as np
import pytest

from asrdist.eval.align_graph import build_graph, viterbi_align
from asrdist.errors import DataError

SIL = 0


def brute_force(scores: np.ndarray, words, min_duration: int) -> float:
    """Best score over every segmentation of every pronunciation choice, with optional silences."""
    T = len(scores)
    best = -np.inf
    for prons in itertools.product(*words):
        for sils in itertools.product([False, True], repeat=len(words) + 1):
            units = []
            for i, pron in enumerate(prons):
                if sils[i]:
                    units.append(SIL)
                units.extend(pron)
            if sils[-1]:
                units.append(SIL)
            n = len(units)
            # durations d_i >= min_duration summing to T
            for cuts in itertools.combinations(range(1, T), n - 1):
                bounds = (0, *cuts, T)
                if any(b - a < min_duration for a, b in zip(bounds, bounds[1:])):
                    continue
                total = sum(scores[a:b, u].sum() for u, a, b in zip(units, bounds, bounds[1:]))
                best = max(best, total)
    return best


@pytest.mark.parametrize("seed, min_duration", [(0, 1), (1, 2), (2, 1)])
def test_viterbi_finds_the_best_path(seed: int, min_duration: int):
    rng = np.random.default_rng(seed)
    scores = np.log(rng.dirichlet(np.ones(5), size=9))
    words = [[(1, 2), (3,)], [(4,)]]  # word 0 has two pronunciations
    path, total = viterbi_align(scores, build_graph(words, SIL, min_duration))
    assert total == pytest.approx(brute_force(scores, words, min_duration))
    assert total == pytest.approx(scores[np.arange(len(path)), path].sum())
    runs = np.split(path, np.flatnonzero(np.diff(path)) + 1)
    assert all(len(r) >= min_duration for r in runs)


def test_clear_scores_give_the_true_alignment_and_pick_the_pronunciation():
    truth = np.array([0] * 4 + [1] * 5 + [2] * 3 + [0] * 3 + [4] * 6 + [0] * 2)
    scores = np.full((len(truth), 5), np.log(0.05))
    scores[np.arange(len(truth)), truth] = np.log(0.8)
    path, _ = viterbi_align(scores, build_graph([[(3, 3), (1, 2)], [(4,)]], SIL, min_duration=2))
    np.testing.assert_array_equal(path, truth)


def test_too_few_frames_is_a_data_error():
    with pytest.raises(DataError, match="no alignment fits 2 frames"):
        viterbi_align(np.zeros((2, 5)), build_graph([[(1, 2, 3)]], SIL, min_duration=1))


@pytest.fixture(scope="module")
def hybrid_run(tmp_path_factory):
    """A DNN trained briefly on a small tone corpus (words = phone names)."""
    from asrdist.cli import main
    from tests.support.corpus_fixture import make_tone_corpus

    root = tmp_path_factory.mktemp("align")
    corpus = make_tone_corpus(root / "corpus", utterances_per_speaker=16, speakers=4, seed=3)
    run = root / "run"
    assert main(["train", "configs/default.yaml", "--data", str(corpus), "--out", str(run), "--epochs", "2",
                 "--no-progress", "model.hidden_layers=2", "model.hidden_dim=128", "train.log_every=1000",
                 "data.batch_size=64", "optim.warmup_steps=10", "train.threads=1", "train.validate_every_epochs=2"]) == 0
    return corpus, run


def test_align_cli_recovers_the_corpus_alignments(hybrid_run, tmp_path: Path, capsys):
    import torch

    from asrdist.cli import main
    from asrdist.io.kaldi_dir import read_alignments, read_data_dir
    from asrdist.corpus.phones import PHONES

    corpus, run = hybrid_run
    data = tmp_path / "data"
    shutil.copytree(corpus, data, ignore=shutil.ignore_patterns("feats"))
    truth = {s: read_alignments(data / s) for s in ("train", "test")}
    for split in ("train", "valid", "test"):
        (data / split / "alignment.scp").unlink()
        (data / split / "alignment.ark").unlink()
    lexicon = tmp_path / "lexicon.txt"
    words = {w for s in ("train", "valid", "test") for u in read_data_dir(data / s).utterances.values()
             for w in u.text.split()}
    dropped = sorted(words)[0]  # one word missing from the lexicon: its utterances are skipped
    lexicon.write_text("".join(f"{w.upper()} {w.upper()}1\n" for w in sorted(words - {dropped}) if w in PHONES))
    assert main(["align", str(run), "--data", str(data), "--lexicon", str(lexicon), "--no-progress"]) == 0
    err = capsys.readouterr().err
    assert f"1 word(s) not in the lexicon: {dropped}" in err
    for split in ("train", "test"):
        aligned = read_alignments(data / split)
        texts = {u: d.text.split() for u, d in read_data_dir(data / split).utterances.items()}
        assert set(aligned) == {u for u, words in texts.items() if dropped not in words}
        agree = [np.mean(aligned[u][:len(truth[split][u])] == truth[split][u][:len(aligned[u])]) for u in aligned]
        assert np.mean(agree) > 0.9, (split, np.mean(agree))
    assert (data / "lexicon.txt").is_file()
    # one split of the corpus, aligned alone, reads the lexicon its corpus keeps; --device cpu is the
    # default's device where torch sees no GPU: the same alignments
    (data / "test" / "alignment.scp").unlink()
    assert main(["align", str(run), "--data", str(data / "test"), "--no-progress", "--device", "cpu"]) == 0
    alone = read_alignments(data / "test")
    assert set(alone) == set(aligned)
    if not torch.cuda.is_available():
        assert all(np.array_equal(alone[u], aligned[u]) for u in aligned)


def test_align_refuses_a_character_model_before_writing(tmp_path: Path, capsys):
    import torch

    from asrdist.cli import main
    from asrdist.config import load_config
    from asrdist.data.targets import CharTokenizer, Targets
    from asrdist.run.prepare import save_targets
    from asrdist.run.task import build_model_for

    cfg = load_config("configs/fsdd.yaml")
    targets = Targets(kind="chars", phones=["sil"], silence_id=0, tokenizer=CharTokenizer.fit(["one"]), num_classes=4)
    run = tmp_path / "run"
    run.mkdir()
    save_targets(run, targets)
    model = build_model_for(cfg, 40, targets)
    torch.save({"model": model.state_dict(), "config": cfg.to_dict(), "input_dim": 40}, run / "model.pt")
    assert main(["align", str(run), "--data", str(tmp_path / "nowhere"), "--lexicon", str(tmp_path / "x")]) != 0
    assert "character CTC model cannot align phones" in capsys.readouterr().err
