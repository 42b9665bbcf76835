"""`asrdist train CONFIG [overrides] --out RUN_DIR`."""
from __future__ import annotations

import argparse
from pathlib import Path

from asrdist.checks import cli_number
from asrdist.commands import help_of


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("train", help=help_of("train"))
    add_job_arguments(p, out=dict(default=None, help="run directory (default: runs/CONFIG-YYYYmmdd-HHMMSS)"),
                      learners_help="number of local learners")
    p.add_argument("--resume", type=Path, default=None, help="resume RUN_DIR from its last checkpoint")
    add_emulated_cluster_options(p, "the learners")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=_train)


def add_emulated_cluster_options(p: argparse.ArgumentParser, whose: str) -> None:
    """`--nodes A --network RATE` of `asrdist train` and `asrdist compare`."""
    p.add_argument("--nodes", type=cli_number(int, at_least=1), default=1,
                   help=f"run {whose} on this many emulated hosts (network namespaces joined by shaped "
                        "links, one torchrun agent each; needs root): a cluster on one machine")
    p.add_argument("--network", default="1gbit", help="link rate between emulated hosts, e.g. 1gbit, 10gbit")
    add_cpus_per_host_option(p)


def add_cpus_per_host_option(p: argparse.ArgumentParser) -> None:
    """`--cpus-per-host X`: every emulated host computes on its own CPU share (a cgroup quota)."""
    p.add_argument("--cpus-per-host", type=cpus_per_host_arg, default=None, metavar="X",
                   help="cores each emulated host may use (a cgroup CPU quota of its own, so a host computes "
                        "at that speed whether its neighbours are busy or idle; a straggler's host gets "
                        "X / slowdown); default with emulated hosts: this machine's cores / hosts less a "
                        "margin; 'shared': no quota (every learner shares every core); needs root")


def cpus_per_host_arg(text: str):
    """'shared', or a number of cores above 0."""
    if text.strip().lower() == "shared":
        return "shared"
    return cli_number(float, above=0)(text)


def _train(args):
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.run.launch import train_command
    return train_command(args)


def add_job_arguments(p: argparse.ArgumentParser, out: dict, learners_help: str) -> None:
    """What `train` and `prepare` share: the recipe, its overrides, the run directory (`out`: its
    argparse settings), the corpus, epochs, learners and strategy."""
    p.add_argument("config", type=Path, help="YAML recipe, e.g. configs/default.yaml")
    p.add_argument("overrides", nargs="*", default=[], help="section.key=value overrides")
    p.add_argument("--out", type=Path, **out)
    p.add_argument("--data", type=Path, default=None, help="corpus directory (overrides the recipe's)")
    p.add_argument("--epochs", type=cli_number(int, at_least=1), default=None)
    p.add_argument("--learners", type=cli_number(int, at_least=1), default=None, help=learners_help)
    p.add_argument("--strategy", default=None, help="sync | onebit | averaging | ...")
