"""`asrdist eval RUN_DIR --data DATA_DIR`."""
from __future__ import annotations

import argparse
from pathlib import Path


def register(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("eval", help="evaluate a trained run on a data split (writes eval.json)")
    p.add_argument("run_dir", type=Path)
    p.add_argument("--data", type=Path, required=True, help="a split directory or a corpus directory (uses test)")
    p.add_argument("--out", type=Path, default=None, help="output JSON (default RUN_DIR/eval.json)")
    p.set_defaults(func=_eval)


def _eval(args):
    from asrdist.eval.run import eval_command
    return eval_command(args)
