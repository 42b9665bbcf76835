"""Each compared run's final model scored utterance by utterance: on the eval split (the
validation split its final figure comes from), for the error rate's bootstrap interval over
utterances (Bisani and Ney 2004, through `kaldialign.bootstrap_wer_ci`), and on the corpus's
test split where it has one (`test_error_rate`).

1. Score the run's model.pt on `valid/` and `test/` (`asrdist.run.evaluate.evaluate_run`, the
   references and hypotheses of every utterance), once: kept in OUT/scores/<run>.json beside the
   model's size and time, so that a rebuilt report scores nothing again.
2. Resample the utterances with replacement (1,000 replications, seeded) and take the 2.5th and
   97.5th percentiles of the pooled error rate: the interval a new draw of utterances would move
   the figure within. A strategy trained K times pools its runs' utterances.
"""
from __future__ import annotations

import json
from pathlib import Path

import kaldialign

from asrdist.errors import AsrdistError
from asrdist.io.atomic import write_json_atomic

REPLICATIONS = 1000
"""Bootstrap replications: the interval's ends move by well under 1% relative between seeds."""
SPLITS = ("valid", "test")


def scores_path(out: Path, run: str) -> Path:
    return out / "scores" / f"{run}.json"


def _model_stamp(run_dir: Path) -> list[int] | None:
    model = run_dir / "model.pt"
    if not model.is_file():
        return None
    st = model.stat()
    return [st.st_size, st.st_mtime_ns]


def score_run(out: Path, run: str, run_dir: Path) -> dict | str:
    """{split: {error_rate, utterances, refs, hyps} or None (no such split)} of the run's final
    model, from OUT/scores/<run>.json when it is of this model.pt, else scored now and kept; or
    why it cannot be scored (one line: the report's intervals over utterances are then missing)."""
    stamp = _model_stamp(run_dir)
    if stamp is None:
        return f"{run_dir}: no model.pt to score"
    path = scores_path(out, run)
    try:
        kept = json.loads(path.read_text(encoding="utf-8"))
        if kept.get("model") == stamp:
            return kept["splits"]
    except (OSError, ValueError, KeyError, AttributeError):
        pass  # none, unreadable or of another model: scored now
    try:
        from asrdist.compare.runs import run_config  # here: runs imports the trainer's config machinery
        from asrdist.run.evaluate import evaluate_run  # loads torch: only where a model is scored

        corpus = Path(run_config(run_dir).data.corpus)
        splits = {}
        for split in SPLITS:
            if not (corpus / split).is_dir():
                splits[split] = None
                continue
            result = evaluate_run(run_dir, corpus / split, progress=False, details=True)
            records = result["per_utterance"]
            splits[split] = {"error_rate": _rate(records), "utterances": len(records),
                             "refs": [r["ref"] for r in records], "hyps": [r["hyp"] for r in records]}
    except (AsrdistError, OSError, KeyError) as exc:
        return f"not scored: {exc}"
    write_json_atomic(path, {"model": stamp, "splits": splits})
    return splits


def _rate(records: list[dict]) -> float | None:
    length = sum(r["ref_length"] for r in records)
    return sum(r["errors"] for r in records) / length if length else None


def bootstrap_interval(refs: list[str], hyps: list[str], replications: int = REPLICATIONS,
                       seed: int = 0) -> list[float] | None:
    """The 95% bootstrap interval [low, high] of the error rate over the utterances (texts of
    space-separated tokens); None without an utterance that has a reference."""
    pairs = [(r.split(), h.split()) for r, h in zip(refs, hyps) if r.split()]
    if not pairs:
        return None
    result = kaldialign.bootstrap_wer_ci([r for r, _ in pairs], [h for _, h in pairs],
                                         replications=replications, seed=seed)
    return [float(result["ci95min"]), float(result["ci95max"])]


def pooled(scores: list[dict | str | None], split: str) -> tuple[list[str], list[str]]:
    """The references and hypotheses of `split` over a strategy's scored runs."""
    refs, hyps = [], []
    for s in scores:
        if isinstance(s, dict) and s.get(split):
            refs += s[split]["refs"]
            hyps += s[split]["hyps"]
    return refs, hyps
