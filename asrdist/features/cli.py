"""`asrdist features DATA`: log-mel filterbanks + CMVN into the feature store."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import cli_number
from asrdist.commands import help_of


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("features", help=help_of("features"))
    p.add_argument("data", type=Path, help="a corpus directory (all its splits) or one split directory")
    p.add_argument("--num-mel-bins", type=cli_number(int, at_least=10, at_most=128), default=40,
                   help="filterbank size, 10 to 128 (Kaldi's default is 23; default: %(default)s)")
    p.add_argument("--cmvn", choices=["global", "speaker", "none"], default="global")
    p.add_argument("--jobs", type=cli_number(int, at_least=0), default=0, help="worker processes, >= 0 (default 0: all cores for a split of 30 min of audio or more, this process for a smaller one)")
    p.add_argument("--export-kaldi", action="store_true", help="also write feats.scp/feats.ark")
    p.add_argument("--channel", type=cli_number(int, at_least=0), default=None, metavar="K",
                   help="use channel K (0-based) of multi-channel audio, which is an error without it; "
                        "the store records it, and train / eval / align re-extract with it")
    p.add_argument("--skip-bad", action="store_true", help="leave out and count utterances whose audio cannot be read")
    p.add_argument("--overwrite", action="store_true", help="replace the split's existing feature store")
    p.set_defaults(func=_features)


def _features(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.features.extract import features_command
    return features_command(args)
