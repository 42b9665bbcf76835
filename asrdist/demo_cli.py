"""`asrdist demo` arguments (the demo itself: `asrdist.demo`)."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import cli_number
from asrdist.commands import help_of

DEMO_STRATEGIES = "sync,onebit,averaging,adpsgd"
DEMO_REPEATS = 2
"""Two interleaved rounds, for intervals: a fresh clone's `make demo` took 23 min 31 s on the idle
2-core machine (2026-12-02, set-up included; docs/comparing.md). `--repeats 1` takes about half."""


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("demo", help=help_of("demo"))
    p.add_argument("--workdir", type=Path, default=Path("demo"))
    p.add_argument("--utterances", type=cli_number(int, at_least=3), default=1000, help="espeak corpus size")
    p.add_argument("--flite-utterances", type=cli_number(int, at_least=3), default=150)
    p.add_argument("--epochs", type=cli_number(int, at_least=1), default=None,
                   help="epochs of every run, baseline and comparison alike (default: the recipe's own, "
                        "train.epochs: each strategy's recipe is compared where its schedule ends)")
    p.add_argument("--learners", type=cli_number(int, at_least=1), default=4, help="learners of each strategy in the comparison")
    p.add_argument("--strategies", default=DEMO_STRATEGIES, help=f"compared (default: {DEMO_STRATEGIES})")
    p.add_argument("--config", type=Path, default=Path(__file__).resolve().parent.parent / "configs" / "default.yaml")
    p.add_argument("--repeats", type=cli_number(int, at_least=1), default=DEMO_REPEATS, metavar="K",
                   help=f"runs of each strategy in the comparison, in interleaved rounds (default: {DEMO_REPEATS}; "
                        "the baseline is round 1's single run)")
    p.add_argument("--same-recipe", action="store_true",
                   help="every strategy with the default recipe's optimizer (default: each its own, configs/recipes/)")
    p.set_defaults(func=_demo)


def _demo(args) -> int:
    from asrdist.demo import demo_command  # imported when the demo runs: it loads torch

    return demo_command(args)
