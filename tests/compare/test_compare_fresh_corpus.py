"""`asrdist compare` on a corpus without features: they are extracted before the first run's
microbenchmarks are timed, so its first strategy is predicted like the others (issue 58, item 5).
The calibration is real (one learner, in this process); the training is stood in for."""
from __future__ import annotations

import json

import asrdist.run.launch as launch
from asrdist.cli import main
from asrdist.features.store import has_features
from tests.support.compare_fixture import CONFIG, fabricate_runs
from tests.support.corpus_fixture import make_tone_corpus

TINY = ["model.hidden_dim=16", "model.hidden_layers=1", "data.batch_size=64", "train.epochs=2"]


def test_the_first_run_on_a_corpus_without_features_is_predicted(tmp_path, monkeypatch):
    corpus = make_tone_corpus(tmp_path / "corpus", utterances_per_speaker=4, speakers=3)
    assert not has_features(corpus / "train")
    made = fabricate_runs(tmp_path / "made", corpus, ["single"], overrides=TINY)
    trained = []

    def train(args):  # stands in for `asrdist train`: the run ends with its files
        trained.append((args.strategy, has_features(corpus / "train")))
        args.out.mkdir(parents=True)
        for name in ("config.yaml", "metrics.jsonl", "summary.json"):
            (args.out / name).write_text((made[args.strategy] / name).read_text())
        return 0
    monkeypatch.setattr(launch, "train_command", train)
    out = tmp_path / "cmp"
    assert main(["compare", str(CONFIG), "--strategies", "single", "--out", str(out), "--data", str(corpus),
                 *TINY]) == 0
    assert trained == [("single", True)]
    (record,) = json.loads((out / "summary.json").read_text())["runs"]
    assert record["prediction"] == "simulated" and record["predicted_frames_per_second"] > 0
    calibration = json.loads((out / "calibration" / "single.json").read_text())
    assert calibration["when"] == "before it trained"
