"""`asrdist demo`: what asrdist is for, on the built-in data, start to finish.

Builds the espeak-ng corpus (and a flite corpus as an unseen-synthesizer test set) when absent,
extracts features, trains the default DNN with one learner (the baseline), evaluates it on the
held-out speakers and on flite speech next to a prior-only model, then trains the same model and
data with 4 learners under each strategy, each with its own optimizer recipe unless --same-recipe
(`asrdist compare`, each strategy --repeats times in interleaved rounds), and prints which
strategy reached the target first, whether its runs' times separate it from the next, and where
the report is. Runs already finished under the work directory are reused.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np
import torch

from asrdist.compare.cli import compare
from asrdist.calibrate.microbench import measure_and_save
from asrdist.compare.recipes import recipes_for
from asrdist.compare.report import format_table, kinds_line, note_lines, repeats_line, target_line
from asrdist.compare.runs import parse_strategies, resolve_all, train_missing
from asrdist.corpus.synth import synth_command
from asrdist.eval.evaluate import evaluate_split
from asrdist.run.evaluate import evaluate_run, load_run_model


class PriorOnlyModel(torch.nn.Module):
    """A 'model' whose posteriors are the label priors: the baseline every acoustic model must beat."""

    kind = "frame"

    def __init__(self, priors: np.ndarray):
        super().__init__()
        self.register_buffer("log_priors", torch.log(torch.as_tensor(priors, dtype=torch.float32)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.log_priors.expand(x.shape[0], -1)


def _corpus(out: Path, utterances: int, synthesizer: str) -> None:
    if (out / "summary.json").is_file():
        print(f"[demo] using existing corpus {out}")
        return
    ns = argparse.Namespace(out=out, utterances=utterances, seed=0, synthesizer=synthesizer, jobs=0,
                            noise_snr=None, skip_bad=False, overwrite=False)
    synth_command(ns)


def demo_command(args) -> int:
    strategies = ["single", *[n for n in parse_strategies(args.strategies) if n != "single"]]
    work = args.workdir
    corpus, flite, out = work / "corpus", work / "flite", work / "compare"
    # Kaldi's max-change keeps every strategy of the comparison stable at 4 learners (without it sync
    # and averaging diverge within the first epoch); configs/default.yaml has it on already, the
    # override keeps it for a --config recipe that does not; the baseline shares it
    overrides = ([f"train.epochs={args.epochs}"] if args.epochs is not None else []) + ["optim.max_change=true"]
    _corpus(corpus, args.utterances, "espeak")
    _corpus(flite, args.flite_utterances, "flite")
    recipes = recipes_for(strategies, args.same_recipe, args.config, overrides)
    resolve_all(args.config, strategies, args.learners, corpus, overrides, recipes=recipes)  # all checked first
    # the one-learner baseline: the comparison's `single` run
    single = resolve_all(args.config, ["single"], 1, corpus, overrides)
    run_dir = train_missing(args.config, single, out, corpus, overrides,  # timed alone just before it trains, as
                            # the comparison times each of its runs (`calibrate.microbench`), which reuses this
                            before=lambda name: measure_and_save(out, name, single[name], 1, "loopback",
                                                                 "before it trained"))["single"]
    _, cfg, targets, _ = load_run_model(run_dir)
    rows = []
    for name, data in (("espeak, held-out speakers", corpus / "test"), ("flite (unseen synthesizer)", flite / "test")):
        result = evaluate_run(run_dir, data)
        baseline = evaluate_split(PriorOnlyModel(targets.priors), data, targets, cfg)
        rows.append((name, result["utterances"], result["frame_accuracy"], result["per"], baseline["per"]))
    table = {"run": str(run_dir), "rows": [dict(zip(("test set", "utterances", "frame_accuracy", "per",
                                                      "prior_only_per"), r)) for r in rows]}
    (work / "demo.json").write_text(json.dumps(table, indent=2) + "\n")
    print()
    print(f"{'test set':30s} {'utts':>5s} {'frame acc':>10s} {'PER':>7s} {'prior-only PER':>15s}")
    for name, n, acc, per, base in rows:
        print(f"{name:30s} {n:5d} {acc:10.3f} {per:7.3f} {base:15.3f}")
    print("(flite's voices come from another synthesizer, never seen in training: the gap to the held-out\n"
          " espeak speakers measures that mismatch; PER can exceed 1 when a decoder inserts many phones)")
    print(f"\nbaseline: {run_dir}   table: {work / 'demo.json'}")
    print(f"\n[demo] the same model and data with {args.learners} learners under {', '.join(strategies[1:])}"
          f"{' (one recipe)' if args.same_recipe else ', each with its own recipe'}", flush=True)
    summary = compare(args.config, ",".join(strategies), args.learners, out, corpus, overrides,
                      same_recipe=args.same_recipe, repeats=args.repeats)
    print()
    print(summary["recommendation"])
    print(target_line(summary))
    print(repeats_line(summary))
    print()
    print(format_table(summary))
    print(kinds_line(summary))
    for line in note_lines(summary):
        print(f"note: {line}")
    print(f"\nreport: {(out / 'report.html').resolve()}   (open it in a browser)   summary: {out / 'summary.json'}")
    return 0
