"""`asrdist bench compare`: strategies side by side. PER, frame accuracy, frames/s, bytes sent and
time communicating of finished runs, read from each run's summary.json:

    asrdist bench compare RUN_DIR [RUN_DIR ...] [--json OUT]

or train first, one run per strategy under OUT/<strategy>, then print the table:

    asrdist bench compare --train configs/default.yaml --learners 4 --strategies sync,onebit \\
        --out runs/compare4 [--data CORPUS] [--same-recipe] [--json OUT] [section.key=value ...]

Training and reading the runs is `asrdist compare`'s (asrdist/compare/runs.py), which also writes
the HTML report; this is its table only. The table is the output; `--json` is optional here
(unlike the other benchmarks) because the runs' summary.json files already hold every figure. The
JSON has one row per run under `runs`.
"""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import cli_number
from asrdist.compare import runs as compare_runs
from asrdist.compare.recipes import recipes_for
from asrdist.errors import ConfigError

JSON_REQUIRED = False
"""The table is printed either way; `--json OUT` also writes it (see bench/cli.py)."""
COLUMNS = (("run", "{}"), ("strategy", "{}"), ("learners", "{}"), ("PER", "{:.4f}"), ("frame acc", "{:.4f}"),
           ("frames/s", "{:,.0f}"), ("MB sent", "{:,.1f}"), ("comm s", "{:.2f}"), ("wait s", "{:.2f}"),
           ("wall s", "{:.1f}"))
DEFAULT_STRATEGIES = "sync,onebit"
DEFAULT_LEARNERS = 4
DEFAULT_OUT = Path("runs/compare")
_TRAIN_ONLY = ("learners", "strategies", "out", "data")


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("runs", nargs="*", metavar="RUN_DIR",
                        help="finished run directories (with --train: section.key=value overrides)")
    parser.add_argument("--train", metavar="CONFIG", help="train one run per strategy first")
    parser.add_argument("--strategies", default=None, help=f"with --train (default: {DEFAULT_STRATEGIES})")
    parser.add_argument("--learners", type=cli_number(int, at_least=1), default=None, help=f"with --train (default: {DEFAULT_LEARNERS})")
    parser.add_argument("--out", type=Path, default=None, help=f"with --train: parent of the runs (default: {DEFAULT_OUT})")
    parser.add_argument("--data", type=Path, default=None, help="with --train: corpus directory (default: the recipe's)")
    parser.add_argument("--same-recipe", action="store_true",
                        help="with --train: every strategy on CONFIG's optimizer "
                             "(default: each its own, configs/recipes/)")
    parser.set_defaults(overrides=[])  # `section.key=value` after the options (asrdist.cli appends them)


def run(args) -> dict:
    if args.train:
        overrides = [*args.runs, *args.overrides]
        strategies = compare_runs.parse_strategies(args.strategies or DEFAULT_STRATEGIES)
        learners = args.learners or DEFAULT_LEARNERS
        recipes = recipes_for(strategies, args.same_recipe, Path(args.train), overrides)  # as `compare` trains them
        configs = compare_runs.resolve_all(Path(args.train), strategies, learners, args.data, overrides,
                                           recipes=recipes)
        runs = list(compare_runs.train_missing(Path(args.train), configs, args.out or DEFAULT_OUT,
                                               args.data, overrides, recipes=recipes).values())
    else:
        given = [f"--{name}" for name in _TRAIN_ONLY if getattr(args, name) is not None]
        given += ["--same-recipe"] if args.same_recipe else []
        given += [o for o in [*args.runs, *args.overrides] if "=" in o and not Path(o).is_dir()]
        if given:
            raise ConfigError(f"bench compare: {' '.join(given)}: only with --train CONFIG")
        if not args.runs:
            raise ConfigError("bench compare: give run directories, or --train CONFIG")
        runs = [Path(r) for r in args.runs]
    rows = [load_row(r) for r in runs]
    result = {"runs": rows, "columns": [name for name, _ in COLUMNS]}
    if args.train:
        result["trained"] = {"config": args.train, "learners": args.learners or DEFAULT_LEARNERS,
                             "out": str(args.out or DEFAULT_OUT), "overrides": overrides}
    return result


def format_result(result: dict) -> str:
    """What `asrdist bench compare` prints: the table."""
    return format_table(result["runs"])


def load_row(run_dir: Path) -> dict:
    """One table row of a finished run (all learners' bytes; seconds per learner, mean)."""
    r = compare_runs.run_record(run_dir)
    return {"run": r["run"], "strategy": r["strategy"], "learners": r["learners"],
            "PER": r["error_rate"] if r["metric"] == "per" else None, "frame acc": r["frame_accuracy"],
            "frames/s": r["frames_per_second"], "MB sent": r["mb_sent"], "comm s": r["comm_seconds"],
            "wait s": r["wait_seconds"], "wall s": r["wall_seconds"], "path": r["path"]}


def format_table(rows: list[dict]) -> str:
    cells = [[name for name, _ in COLUMNS]]
    for row in rows:
        cells.append(["-" if row[name] is None else fmt.format(row[name]) for name, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])
