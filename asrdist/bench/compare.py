"""Strategies side by side: PER, frame accuracy, frames/s, bytes sent and time communicating of
finished runs, read from each run's summary.json.

    python -m asrdist.bench.compare RUN_DIR [RUN_DIR ...]

or train first, one run per strategy under OUT/<strategy>, then print the table:

    python -m asrdist.bench.compare --train configs/default.yaml --learners 4 \\
        --strategies sync,onebit --out runs/compare4 [--data CORPUS] [section.key=value ...]
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

from asrdist.errors import AsrdistError, DataError

COLUMNS = (("run", "{}"), ("strategy", "{}"), ("learners", "{}"), ("PER", "{:.4f}"), ("frame acc", "{:.4f}"),
           ("frames/s", "{:,.0f}"), ("MB sent", "{:,.1f}"), ("comm s", "{:.2f}"), ("wait s", "{:.2f}"),
           ("wall s", "{:.1f}"))


def load_row(run_dir: Path) -> dict:
    """One table row from RUN_DIR/summary.json (all learners' bytes; seconds per learner, mean)."""
    path = Path(run_dir) / "summary.json"
    try:
        s = json.loads(path.read_text())
        final, comm = s["final"], s["comm"]
        return {"run": Path(run_dir).name, "strategy": s["strategy"], "learners": s["learners"],
                "PER": final.get("per"), "frame acc": final.get("frame_accuracy"),
                "frames/s": s["frames_per_second"], "MB sent": comm["bytes_sent"] / 1e6,
                "comm s": comm["comm_seconds"], "wait s": comm["wait_seconds"], "wall s": s["wall_seconds"]}
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


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m asrdist.bench.compare", description=__doc__.splitlines()[0])
    p.add_argument("runs", nargs="*", help="run directories to compare (or overrides with --train)")
    p.add_argument("--train", metavar="CONFIG", help="train one run per strategy first")
    p.add_argument("--strategies", default="sync,onebit")
    p.add_argument("--learners", type=int, default=4)
    p.add_argument("--out", type=Path, default=Path("runs/compare"))
    p.add_argument("--data", type=Path, default=None, help="corpus directory (default: the recipe's)")
    args = p.parse_args(argv)
    try:
        if args.train:
            strategies = [s.strip() for s in args.strategies.split(",") if s.strip()]
            runs = train_all(args.train, strategies, args.learners, args.out, args.data, args.runs)
        else:
            if not args.runs:
                p.error("give run directories, or --train CONFIG")
            runs = [Path(r) for r in args.runs]
        print(format_table([load_row(r) for r in runs]))
    except AsrdistError as exc:
        print(f"asrdist: error: {exc}", file=sys.stderr)
        return exc.exit_code
    return 0


if __name__ == "__main__":
    sys.exit(main())
