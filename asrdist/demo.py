"""`asrdist demo`: the main job on the built-in default data."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("demo", help="build the default corpus, train, evaluate, report")
    p.add_argument("--workdir", type=Path, default=Path("demo"))
    p.set_defaults(func=demo_command)


def demo_command(args) -> int:
    from asrdist.corpus.synth import synth_command

    corpus = args.workdir / "corpus"
    if not (corpus / "summary.json").is_file():
        ns = argparse.Namespace(out=corpus, utterances=1000, seed=0, synthesizer="espeak", jobs=0,
                                noise_snr=None, skip_bad=False, overwrite=False)
        synth_command(ns)
    print((corpus / "summary.json").read_text())
    return 0
