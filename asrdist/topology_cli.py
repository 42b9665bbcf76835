"""`asrdist topology --learners N --pattern fixed|random`: spectral gap of the ADPSGD gossip patterns."""
from __future__ import annotations

import argparse
import contextlib
import os
from pathlib import Path
from typing import Iterator

from asrdist.commands import help_of
from asrdist.errors import ConfigError

PRINT_MATRIX_MAX = 16  # larger matrices do not fit a terminal
JSON_MATRIX_MAX = 64  # keeps the JSON readable (64 x 64 numbers)
EXPECTATION = {
    "fixed": "exact: the average of W^T W over one period (rounds 0 and 1)",
    "random": "exact: each round is a uniform random matching of actives to passives, "
              "so E[W^T W] = E[W] = I - L/(2p), L the complete bipartite Laplacian",
}


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("topology", help=help_of("topology"))
    p.add_argument("--learners", required=True, metavar="N", help="number of learners on the ring (>= 2)")
    p.add_argument("--pattern", required=True, metavar="fixed|random", help="gossip pattern")
    p.add_argument("--seed", default="0", metavar="S", help="shared seed of the random pattern (default 0)")
    p.add_argument("--json", type=Path, default=None, metavar="OUT",
                   help="write gaps, the curve n = 2..1024 and the round-0 mixing matrix (N <= 64)")
    p.add_argument("--plot", type=Path, default=None, metavar="OUT.png",
                   help="PNG of the gap vs n for both patterns, log-log, N marked")
    p.set_defaults(func=_topology)


def _int_option(text: str, option: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise ConfigError(f"{option}: expected an integer, got {text!r}") from None


def _check_writable(path: Path, option: str) -> None:
    """Fail before the computation, not after it, when OUT cannot be written."""
    if path.is_dir():
        raise ConfigError(f"{option} {path}: is a directory")
    parent = path.parent
    while not parent.exists():
        parent = parent.parent
    if not parent.is_dir() or not os.access(parent, os.W_OK | os.X_OK):
        raise ConfigError(f"{option} {path}: cannot write in {parent}")


def _topology(args) -> int:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.parallel import topology

    learners = _int_option(args.learners, "--learners")
    seed = _int_option(args.seed, "--seed")
    if learners < 2 or learners > topology.MAX_LEARNERS:
        raise ConfigError(f"--learners: {learners} must be in [2, {topology.MAX_LEARNERS}]")
    if args.pattern not in topology.PATTERNS:
        raise ConfigError(f"--pattern: unknown pattern {args.pattern!r} (known: {', '.join(topology.PATTERNS)})")
    if seed < 0:
        raise ConfigError(f"--seed: {seed} must be at least 0")
    for path, option in ((args.json, "--json"), (args.plot, "--plot")):
        if path is not None:
            _check_writable(path, option)

    gaps = {p: topology.pattern_gap(learners, p, seed) for p in topology.PATTERNS}
    other = next(p for p in topology.PATTERNS if p != args.pattern)
    print(f"learners {learners}, pattern {args.pattern}: spectral gap of E[W^T W] = "
          f"{gaps[args.pattern]:.6g} ({other}: {gaps[other]:.6g})")
    if learners <= PRINT_MATRIX_MAX:
        import numpy as np  # imported when the command runs: `--help` stays light

        print(f"mixing matrix W of round 0 (pairs {topology.partners_of_round(learners, 0, args.pattern, seed)}):")
        print(np.array2string(topology.mixing_matrix(learners, 0, args.pattern, seed), precision=3,
                              suppress_small=True, max_line_width=200))
    if args.json is None and args.plot is None:
        return 0

    from asrdist.io.atomic import atomic_path, write_json_atomic  # imported when the command runs: `--help` stays light

    curve = topology.gap_curve(seed=seed)
    if args.json is not None:
        result = _result(args.pattern, learners, seed, gaps, curve)
        with _output_errors(args.json, "--json"):
            write_json_atomic(args.json, result)
    if args.plot is not None:
        with _output_errors(args.plot, "--plot"), atomic_path(args.plot) as tmp:
            _plot(tmp, learners, gaps, curve)
    return 0


@contextlib.contextmanager
def _output_errors(path: Path, option: str) -> Iterator[None]:
    try:
        yield
    except OSError as exc:
        raise ConfigError(f"{option} {path}: cannot write: {exc.strerror or exc}") from None
    print(f"wrote {path}")


def _result(pattern: str, learners: int, seed: int, gaps: dict, curve: list[dict]) -> dict:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.parallel import topology

    result = {
        "learners": learners,
        "pattern": pattern,
        "seed": seed,
        "spectral_gap": gaps[pattern],
        "spectral_gaps": gaps,
        "expectation": EXPECTATION,
        "active_ranks": topology.active_ranks(learners),
        "partners_round0": topology.partners_of_round(learners, 0, pattern, seed),
        "curve": curve,
    }
    if learners <= JSON_MATRIX_MAX:
        result["mixing_matrix"] = topology.mixing_matrix(learners, 0, pattern, seed).tolist()
    return result


def _plot(tmp: Path, learners: int, gaps: dict, curve: list[dict]) -> None:
    # the command's work, imported when it runs: `asrdist --help` stays light
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # imported when the command runs: `--help` stays light
    import numpy as np  # imported when the command runs: `--help` stays light

    ns = np.array([row["learners"] for row in curve])
    fig, ax = plt.subplots(figsize=(7, 4.5))
    even = ns % 2 == 0
    for pattern, marker in (("fixed", "o"), ("random", "s")):
        gap = np.array([row[pattern] for row in curve])
        line, = ax.plot(ns[even], gap[even], f"{marker}-", ms=3, lw=1, label=f"{pattern}")
        ax.plot(ns[~even], gap[~even], marker, ms=5, mfc="none", color=line.get_color(),
                label=f"{pattern}, odd n")
        ax.plot([learners], [gaps[pattern]], "*", ms=14, color="black")
    ax.plot(ns, np.pi ** 2 / ns.astype(float) ** 2, ":", color="gray", label="π²/n²")
    ax.axvline(learners, color="black", lw=0.8, ls="--", label=f"N = {learners}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("learners n")
    ax.set_ylabel("spectral gap of E[WᵀW]")
    ax.set_title("ADPSGD gossip patterns (odd n: the fixed ring is a path)")
    ax.grid(alpha=0.3, which="both")
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
