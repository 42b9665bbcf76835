"""`asrdist compare CONFIG --strategies sync,onebit,... --learners N --out DIR [--data D] [--nodes A
--network RATE] [--target ERROR|baseline|best+N%] [--repeats K] [--same-recipe] [section.key=value ...]`

Trains the recipe K times per strategy (default once) in interleaved rounds into DIR/<strategy>
and DIR/<strategy>-r<round> (through `asrdist train`; each strategy with its own optimizer
recipe, `compare.recipes`, unless --same-recipe; `compare.repeats`), skipping runs already
finished with the same config, then writes DIR/summary.json and DIR/report.html, led by the wall
time each strategy took to reach the target error rate (`compare.target`: by default the
baseline's final error). Just before a strategy's first run trains, one learner of its config is
timed alone (`calibrate.microbench`, kept in DIR/calibration/<strategy>.json); the simulator's
prediction beside the strategy comes from that alone.
"""
from __future__ import annotations

import argparse
from importlib import import_module
from pathlib import Path

from asrdist.checks import cli_number
from asrdist.commands import help_of
from asrdist.errors import ConfigError, OutputError, TrainingError
from asrdist.run.train_cli import add_emulated_cluster_options

DEFAULT_STRATEGIES = "single,sync,onebit,averaging,adpsgd"
"""With `single`, the one-learner baseline."""
DEFAULT_LEARNERS = 4


def _target(text: str):
    """--target's argparse type (`compare.target.cli_target`, imported when the option is given)."""
    from asrdist.compare.target import cli_target  # when the option is given: `asrdist --help` stays light

    return cli_target(text)


_target.__name__ = "target"


def register(sub: argparse._SubParsersAction, path: list[str] | None = None) -> None:
    p = sub.add_parser("compare", help=help_of("compare"))
    p.add_argument("config", type=Path, help="YAML recipe, e.g. configs/default.yaml")
    p.add_argument("overrides", nargs="*", default=[], help="section.key=value overrides, applied to every run")
    p.add_argument("--strategies", default=DEFAULT_STRATEGIES, help=f"comma-separated (default: {DEFAULT_STRATEGIES})")
    p.add_argument("--learners", type=cli_number(int, at_least=1), default=DEFAULT_LEARNERS,
                   help=f"learners of every run but single's (default: {DEFAULT_LEARNERS})")
    p.add_argument("--out", type=Path, required=True, help="directory of the runs and the report")
    p.add_argument("--data", type=Path, default=None, help="corpus directory (overrides the recipe's)")
    p.add_argument("--target", type=_target, default=None, metavar="ERROR|baseline|best+N%",
                   help="error rate (the runs' PER, CER or WER) each run's time is measured to: a number, "
                        "'baseline' (the default: single's final figure when it runs, else sync's) or 'best+N%%' "
                        "(within N%% relative of the best strategy's final figure)")
    p.add_argument("--repeats", type=cli_number(int, at_least=1), default=1, metavar="K",
                   help="train each strategy K times, in interleaved rounds with seeds seed..seed+K-1; the table "
                        "gives medians and ranges (default: 1)")
    p.add_argument("--same-recipe", action="store_true",
                   help="train every strategy with CONFIG's optimizer (default: each its own: CONFIG's variant "
                        "beside it, CONFIG-stem_STRATEGY.yaml, where there is one, else configs/recipes/)")
    add_emulated_cluster_options(p, "every run but single's")
    p.set_defaults(func=compare_command)


def compare(config: Path, strategies: str, learners: int, out: Path, data: Path | None,
            overrides: list[str], nodes: int = 1, network: str = "1gbit", target=None,
            same_recipe: bool = False, cpus_per_host: float | str | None = None, repeats: int = 1) -> dict:
    """Train what is missing, then build the report; returns summary.json's content. With `nodes`
    > 1 every run but single's runs on that many emulated hosts joined by `network` links; each
    strategy with its own recipe unless `same_recipe`; time to `target` (a `TargetSpec`, a number
    or --target's text; None: the baseline's final error); each strategy `repeats` times."""
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.compare.recipes import not_applied, recipes_for
    from asrdist.compare.disk import NOT_RUN, DiskFull, is_disk_full
    from asrdist.compare.report import build_summary
    from asrdist.compare.runs import Hosts, parse_strategies, resolve_rounds, train_missing
    from asrdist.compare.target import parse_target

    names = parse_strategies(strategies)
    spec = parse_target(target) if not hasattr(target, "kind") else target  # a bad one fails before training
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out}: exists and is not a directory")
    hosts = Hosts.resolved(nodes, network, cpus_per_host)
    recipes = recipes_for(names, same_recipe, config, overrides)
    configs, rounds = resolve_rounds(config, names, learners, data, overrides, repeats, hosts, recipes=recipes)
    failed: dict[str, str] = {}
    calibrations: dict = {}
    try:  # the simulator is optional: without it the page says so
        import_module("asrdist.sim")  # what microbench calibrates for, checked first
        from asrdist.calibrate import microbench
    except ImportError as exc:
        microbench, calibrations = None, dict.fromkeys(names, f"simulator not available ({exc})")

    def calibrate(name: str) -> None:  # just before the run trains: this machine's speed moves in spells
        where = hosts.of(name)
        calibrations[name] = microbench.measure_and_save(out, name, configs[name], where.nodes,
                                                         where.network_name, "before it trained")
        if isinstance(calibrations[name], str) and is_disk_full(calibrations[name]):  # the step stops
            raise OutputError(calibrations[name].removeprefix("not calibrated: "))

    setup = {"config": str(config), "strategies": names, "learners": learners, "out": str(out),
             "data": None if data is None else str(data), "overrides": list(overrides),
             "same_recipe": same_recipe, "recipes": recipes,
             "recipes_not_applied": not_applied(names, same_recipe, config, overrides),
             "cpus_per_host": hosts.cpus_per_host}
    learner_counts = {n: configs[n].train.learners for n in names}
    try:
        run_dirs = train_missing(config, configs, out, data, overrides, failed=failed, hosts=hosts, recipes=recipes,
                                 before=calibrate if microbench else None, rounds=rounds,
                                 files_of=lambda name: [out / "calibration" / f"{name}.json"])
    except DiskFull as exc:  # the report, if it fits, says which runs the disk stopped
        runs = {name: out / name for name in configs}
        stopped = {n: NOT_RUN for n, d in runs.items() if n not in failed and not (d / "summary.json").is_file()}
        calibrations = {n: c for n, c in calibrations.items() if n not in stopped}
        written = out.is_dir() and write_report(out, lambda: build_summary(runs, setup, {**failed, **stopped},
                                                                           learner_counts, calibrations=calibrations,
                                                                           target=spec, rounds=rounds))
        if written:
            raise DiskFull(f"{exc}; the report of the runs so far: {out / 'report.html'}", exc.strategy) from None
        raise
    for name in names:  # each strategy predicted from its first run's calibration
        if microbench and name not in calibrations and name not in failed:  # trained earlier: its saved one
            where = hosts.of(name)
            calibrations[name] = microbench.saved_or_measured(out, name, configs[name], where.nodes,
                                                              where.network_name)
    summary = build_summary(run_dirs, setup, failed, learner_counts, calibrations=calibrations, target=spec,
                            rounds=rounds)
    write_report(out, lambda: summary, stop=True)
    if failed:
        name, reason = next(iter(failed.items()))
        raise TrainingError(f"{', '.join(failed)}: training failed ({name}: {reason}); the report shows it "
                            f"beside the others: {out / 'report.html'}")
    return summary


def write_report(out: Path, summary_of, stop: bool = False) -> dict | None:
    """Write summary.json and report.html of `summary_of()`; on a full disk put back what was
    there and raise DiskFull (`stop`) or return None. Returns the summary written."""
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.compare.disk import DiskFull, Step, disk_full_line, is_disk_full
    from asrdist.compare.report import write_outputs

    step = Step(out, None, [out / "summary.json", out / "report.html"])
    try:
        summary = summary_of()
        write_outputs(out, summary)
        return summary
    except Exception as exc:
        if not is_disk_full(exc):
            raise
        step.undo()
        if stop:
            raise DiskFull(disk_full_line(out, None, exc)) from None
        return None


def compare_command(args) -> int:
    # the command's work, imported when it runs: `asrdist --help` stays light
    from asrdist.compare.report import format_table, kinds_line, note_lines, repeats_line, target_line

    summary = compare(args.config, args.strategies, args.learners, args.out, args.data, list(args.overrides or []),
                      nodes=args.nodes, network=args.network, target=args.target, same_recipe=args.same_recipe,
                      cpus_per_host=args.cpus_per_host, repeats=args.repeats)
    print(summary["recommendation"])
    print(target_line(summary))
    print(repeats_line(summary))
    print()
    print(format_table(summary))
    print(kinds_line(summary))
    for line in note_lines(summary):
        print(f"note: {line}")
    print(f"\nreport: {args.out / 'report.html'}   summary: {args.out / 'summary.json'}")
    return 0
