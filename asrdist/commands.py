"""The command table of `asrdist`: each command's name, one line of help, and the module that
defines its arguments (`register(sub, path)`). `asrdist --help` reads this table alone; a command's
module is imported only when that command is given. A command module defines arguments and
nothing more: its work lives in modules it imports when the command runs."""
from __future__ import annotations

COMMANDS: dict[str, tuple[str, str]] = {
    "corpus": ("asrdist.corpus.cli", "build or import a speech corpus"),
    "features": ("asrdist.features.cli", "extract fbank features into the feature store"),
    "train": ("asrdist.run.train_cli", "train an acoustic model with N learners"),
    "prepare": ("asrdist.run.prepare_cli", "prepare a run directory for torchrun / SLURM (starts no learner)"),
    "eval": ("asrdist.run.eval_cli", "evaluate a trained run on a data split (writes eval.json)"),
    "decode": ("asrdist.run.eval_cli", "transcribe WAV files with a trained run (prints `utt text` lines)"),
    "align": ("asrdist.run.align_cli", "write frame-level phone alignments into a corpus with a trained model"),
    "bench": ("asrdist.bench.cli", "benchmarks (JSON out)"),
    "compare": ("asrdist.compare.cli", "train one recipe under several strategies; HTML report and summary.json"),
    "topology": ("asrdist.topology_cli", "spectral gap of ADPSGD gossip patterns (fixed vs random ring)"),
    "simulate": ("asrdist.sim.cli", "scaling simulator and strategy advisor (--validate: the papers' figures)"),
    "demo": ("asrdist.demo_cli", "build the default corpus, train the default DNN, evaluate, compare strategies"),
}


def help_of(command: str) -> str:
    return COMMANDS[command][1]
