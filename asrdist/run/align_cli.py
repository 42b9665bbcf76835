"""`asrdist align RUN_DIR --data CORPUS [--lexicon FILE]`."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.commands import help_of
from asrdist.run.eval_cli import device_option


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("align", help=help_of("align"))
    p.add_argument("run_dir", type=Path, help="a finished run of a phone CTC or hybrid model")
    p.add_argument("--data", type=Path, required=True, help="corpus (every split) or one split directory")
    p.add_argument("--lexicon", type=Path, default=None,
                   help="Kaldi or CMU pronunciation dictionary (default: CORPUS/lexicon.txt)")
    p.add_argument("--no-progress", action="store_true")
    device_option(p)
    p.set_defaults(func=_align)


def _align(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.run.align import align_command
    return align_command(args)
