"""`asrdist bench compare`: strategies side by side. PER, frame accuracy, frames/s, bytes sent and
time communicating of finished runs, read from each run's summary.json:

    asrdist bench compare RUN_DIR [RUN_DIR ...] [--json OUT]

or train first, one run per strategy under OUT/<strategy>, then print the table:

    asrdist bench compare --train configs/default.yaml --learners 4 --strategies sync,onebit \\
        --out runs/compare4 [--data CORPUS] [--json OUT] [section.key=value ...]

The table is the output; `--json` is optional here (unlike the other benchmarks) because the runs'
summary.json files already hold every figure. The JSON has one row per run under `runs`.
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

from asrdist.errors import AsrdistError, ConfigError, DataError

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
    parser.add_argument("--learners", type=int, default=None, help=f"with --train (default: {DEFAULT_LEARNERS})")
    parser.add_argument("--out", type=Path, default=None, help=f"with --train: parent of the runs (default: {DEFAULT_OUT})")
    parser.add_argument("--data", type=Path, default=None, help="with --train: corpus directory (default: the recipe's)")
    parser.set_defaults(overrides=[])  # `section.key=value` after the options (asrdist.cli appends them)


def run(args) -> dict:
    if args.train:
        overrides = [*args.runs, *args.overrides]
        not_overrides = [o for o in overrides if "=" not in o or o.startswith("-")]
        if not_overrides:
            raise ConfigError(f"bench compare --train: expected section.key=value overrides, got {not_overrides}")
        strategies = [s.strip() for s in (args.strategies or DEFAULT_STRATEGIES).split(",") if s.strip()]
        if not strategies:
            raise ConfigError("bench compare: --strategies names no strategy")
        runs = train_all(args.train, strategies, args.learners or DEFAULT_LEARNERS, args.out or DEFAULT_OUT,
                         args.data, overrides)
    else:
        given = [f"--{name}" for name in _TRAIN_ONLY if getattr(args, name) is not None]
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
    """One table row from RUN_DIR/summary.json (all learners' bytes; seconds per learner, mean)."""
    path = Path(run_dir) / "summary.json"
    try:
        s = json.loads(path.read_text())
        final, comm = s["final"], s["comm"]
        return {"run": Path(run_dir).name, "strategy": s["strategy"], "learners": s["learners"],
                "PER": final.get("per"), "frame acc": final.get("frame_accuracy"),
                "frames/s": s["frames_per_second"], "MB sent": comm["bytes_sent"] / 1e6,
                "comm s": comm["comm_seconds"], "wait s": comm["wait_seconds"], "wall s": s["wall_seconds"],
                "path": str(run_dir)}
    except FileNotFoundError:
        raise DataError(f"{path}: missing; is {run_dir} a finished asrdist run?") from None
    except (json.JSONDecodeError, KeyError, TypeError) as exc:
        raise DataError(f"{path}: not an asrdist summary ({type(exc).__name__}: {exc})") from None


def format_table(rows: list[dict]) -> str:
    cells = [[name for name, _ in COLUMNS]]
    for row in rows:
        cells.append(["-" if row[name] is None else fmt.format(row[name]) for name, fmt in COLUMNS])
    widths = [max(len(r[i]) for r in cells) for i in range(len(COLUMNS))]
    lines = ["  ".join(c.ljust(w) if i < 2 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def train_all(config: str, strategies: list[str], learners: int, out: Path, data: Path | None,
              overrides: list[str]) -> list[Path]:
    """`asrdist train` once per strategy into OUT/<strategy>; the run directories."""
    from asrdist.cli import main as asrdist_main

    runs = []
    for name in strategies:
        run_dir = out / name
        argv = ["train", config, *overrides, "--learners", str(learners), "--strategy", name,
                "--out", str(run_dir), "--no-progress"]
        if data is not None:
            argv += ["--data", str(data)]
        if asrdist_main(argv) != 0:
            raise AsrdistError(f"training with strategy '{name}' failed (run directory {run_dir})")
        runs.append(run_dir)
    return runs
