"""`asrdist eval RUN_DIR --data DATA_DIR` and `asrdist decode RUN_DIR WAV...`."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a trained run on a data split (writes eval.json)")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--data", type=Path, required=True, help="a split directory or a corpus directory (uses test)")
    p.add_argument("--out", type=Path, default=None,
                   help="output JSON (default RUN_DIR/eval.json); hypotheses go to hyp.txt beside it")
    _vocabulary_option(p)
    p.add_argument("--adapt-rounds", type=int, default=None, metavar="N",
                   help="CTC: rounds of unsupervised speaker adaptation (a feature map per speaker fitted to the "
                        "model's own hypotheses; 0 = off); default: the recipe's eval.adapt_rounds")
    p.set_defaults(func=_eval)

    d = sub.add_parser("decode", help="transcribe WAV files with a trained run (prints `utt text` lines)")
    d.add_argument("run_dir", type=Path)
    d.add_argument("wavs", type=Path, nargs="+", metavar="WAV")
    d.add_argument("--out", type=Path, default=None, help="also write the lines to this file")
    _vocabulary_option(d)
    d.set_defaults(func=_decode)


def _vocabulary_option(p: argparse.ArgumentParser) -> None:
    p.add_argument("--vocabulary", default=None, metavar="none|train|PATH",
                   help="character CTC: hypotheses only from these words (the training transcripts' or a "
                        "word list / lexicon file's); default: the recipe's eval.vocabulary")


def _eval(args):
    from asrdist.eval.run import eval_command
    return eval_command(args)


def _decode(args):
    from asrdist.eval.transcribe import decode_command
    return decode_command(args)
