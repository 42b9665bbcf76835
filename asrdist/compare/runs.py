"""The runs of a comparison: one `asrdist train` run per strategy under OUT/<strategy>, trained
only when not finished yet, and what the report needs from each (summary.json, metrics.jsonl).

Every run goes through the launcher path of `asrdist train` (train/launch.py): there is no second
training loop here.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import yaml

from asrdist.cluster import cpushare
from asrdist.compare import disk
from asrdist.compare.target import run_points
from asrdist.config import RunConfig, config_from_tree, read_config_tree
from asrdist.errors import ConfigError, DataError, Stopped, TrainingError
from asrdist.parallel import STRATEGIES
from asrdist.run import launch, rundir
from asrdist.run.launch import check_job, host_cpu_plan, resolve_config
from asrdist.run.rundir import run_config_path
from asrdist.run.summary import Figures, RunSummary
from asrdist.train.checkpoint import latest_step_dir
from asrdist.train.metrics import read_metrics

ERROR_METRICS = ("per", "wer", "cer")
"""The first of these a run's final evaluation holds is its error rate (hybrid: PER; CTC: WER/CER)."""


def parse_strategies(text: str) -> list[str]:
    """`sync,onebit,...` -> names, each a known strategy, none twice."""
    names = [s.strip() for s in text.split(",") if s.strip()]
    if not names:
        raise ConfigError("--strategies names no strategy")
    for name in names:
        if name not in STRATEGIES:
            raise ConfigError(f"--strategies: unknown strategy '{name}' (known: {', '.join(STRATEGIES)})")
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ConfigError(f"--strategies: '{twice[0]}' given twice")
    return names


@dataclass(frozen=True)
class Hosts:
    """Where a comparison's runs train: on this machine (`nodes` 1, loopback) or on `nodes` emulated
    hosts joined by `network` links (`asrdist train --nodes --network`); `single` always alone."""

    nodes: int = 1
    network: str = "1gbit"
    cpus_per_host: float | str | None = None
    """`--cpus-per-host` (None: train's default); `single` trains on a host of the same share."""

    @classmethod
    def resolved(cls, nodes: int, network: str, cpus_per_host: float | str | None) -> "Hosts":
        """Hosts whose CPU share is settled here, so that `single`, alone on one host, gets the
        share the others' hosts get by default."""
        if cpus_per_host is None and nodes > 1 and network != "loopback":
            cpus_per_host = cpushare.default_cpus_per_host(nodes)
        return cls(nodes, network, cpus_per_host)

    @property
    def network_name(self) -> str:
        """What summary.json's `network` says of such a run."""
        return "loopback" if self.nodes == 1 else self.network

    def of(self, strategy: str) -> "Hosts":
        return Hosts(1, self.network, self.cpus_per_host) if strategy == "single" else self


def resolve_all(config: Path, strategies: list[str], learners: int, data: Path | None,
                overrides: list[str], hosts: Hosts = Hosts(),
                recipes: dict[str, list[str]] | None = None) -> dict[str, RunConfig]:
    """The resolved config of every strategy's run, exactly as `asrdist train` would resolve it
    (`recipes`: strategy -> its recipe's overrides, placed before `overrides`; `compare.recipes`).
    Checks everything before anything is trained: a bad override or strategy fails here, and so
    does a learner count the emulated hosts cannot share."""
    bad = [o for o in overrides if "=" not in o or o.startswith("-")]
    if bad:
        raise ConfigError(f"expected section.key=value overrides, got {bad[0]!r}")
    configs = {}
    for name in strategies:
        cfg = resolve_config(_train_args(config, name, learners_of(name, learners), data,
                                         (recipes or {}).get(name, []) + overrides, out=None))
        cfg.data.corpus = str(Path(cfg.data.corpus).resolve())  # as train_command records it
        where = hosts.of(name)
        try:
            check_job(cfg, where.nodes, where.network, note=False)
            host_cpu_plan(cfg, where.nodes, where.network, where.cpus_per_host)  # its quotas, as train checks them
        except ConfigError as e:
            raise ConfigError(f"{name}: {e}") from None
        configs[name] = cfg
    corpus = Path(next(iter(configs.values())).data.corpus)
    if not (corpus / "train").is_dir():
        raise DataError(f"{corpus}: not a corpus (no train/ split); build one with `asrdist corpus synth` "
                        "or pass --data")
    return configs


def learners_of(strategy: str, learners: int) -> int:
    """`single` is the one-learner baseline of a comparison; every other strategy runs `learners`."""
    return 1 if strategy == "single" else learners


def _train_args(config: Path, strategy: str, learners: int, data: Path | None, overrides: list[str],
                out: Path | None, resume: Path | None = None, hosts: Hosts = Hosts()) -> argparse.Namespace:
    hosts = hosts.of(strategy)
    return argparse.Namespace(config=config, overrides=list(overrides), out=out, data=data, epochs=None,
                              learners=learners, strategy=strategy, resume=resume, no_progress=True,
                              nodes=hosts.nodes, network=hosts.network, cpus_per_host=hosts.cpus_per_host)


def _normal(tree: dict) -> dict:
    return yaml.safe_load(yaml.safe_dump(tree, sort_keys=True))


def _differences(recorded: dict, wanted: dict, prefix: str = "") -> list[str]:
    """Keys set differently in both (a key only one side has came or went with another version)."""
    out = []
    for key in sorted(set(recorded) & set(wanted)):
        a, b = recorded.get(key), wanted.get(key)
        if isinstance(a, dict) and isinstance(b, dict):
            out += _differences(a, b, f"{prefix}{key}.")
        elif a != b:
            out.append(f"{prefix}{key}: {a!r} there, {b!r} asked")
    return out


def check_same_recipe(run_dir: Path, cfg: RunConfig) -> None:
    """A run found under OUT must have been trained with the config asked for now."""
    path = run_dir / "config.yaml"
    if not path.is_file():
        return  # nothing of a run there yet
    recorded = _normal(read_config_tree(path))
    diffs = _differences(recorded, _normal(cfg.to_dict()))
    if diffs:
        raise ConfigError(f"{run_dir}: trained with another config ({diffs[0]}); pick another --out")


def check_same_hosts(run_dir: Path, hosts: Hosts) -> None:
    """A finished run found under OUT must have trained on the hosts asked for now (runs from
    before summary.json said so trained on this machine)."""
    path = run_dir / "summary.json"
    if not path.is_file():
        return
    summary = RunSummary.read(run_dir)
    there = (summary.nodes, summary.network)
    if there != (hosts.nodes, hosts.network_name):
        raise ConfigError(f"{run_dir}: trained on {there[0]} host(s) over {there[1]}, {hosts.nodes} over "
                          f"{hosts.network_name} asked; pick another --out")


@dataclass(frozen=True)
class Round:
    """One run of a comparison with repeats: its strategy, round (1-based) and the overrides of
    its round (the seed) after the user's."""

    strategy: str
    round: int = 1
    overrides: tuple[str, ...] | list[str] = ()


def resolve_rounds(config: Path, strategies: list[str], learners: int, data: Path | None,
                   overrides: list[str], repeats: int, hosts: Hosts = Hosts(),
                   recipes: dict[str, list[str]] | None = None) -> tuple[dict[str, RunConfig], dict[str, Round]]:
    """The resolved configs of every run of a comparison of `repeats` rounds (run name -> config)
    in the order they train, interleaved (round 1: every strategy once, then round 2, ...), and
    each run's `Round`. Round r trains with the recipe's seed + r - 1 (a `seed=` override after
    the user's); round 1 is the comparison without repeats, run for run."""
    from asrdist.compare.repeats import run_name  # the names of the runs of each round

    first = resolve_all(config, strategies, learners, data, overrides, hosts, recipes)
    configs, rounds = {}, {}
    for r in range(1, repeats + 1):
        extra = [] if r == 1 else [f"seed={first[strategies[0]].seed + r - 1}"]
        resolved = first if r == 1 else resolve_all(config, strategies, learners, data, overrides + extra,
                                                    hosts, recipes)
        for name in strategies:
            run = run_name(name, r)
            configs[run], rounds[run] = resolved[name], Round(name, r, extra)
    return configs, rounds


def train_missing(config: Path, configs: dict[str, RunConfig], out: Path, data: Path | None,
                  overrides: list[str], failed: dict[str, str] | None = None,
                  hosts: Hosts = Hosts(), recipes: dict[str, list[str]] | None = None,
                  before: Callable[[str], None] | None = None,
                  files_of: Callable[[str], list[Path]] | None = None,
                  rounds: dict[str, Round] | None = None) -> dict[str, Path]:
    """`asrdist train` for each run whose directory OUT/<run> is not finished (a run a start got as
    far as its config is resumed: `resume_from`); finished runs are kept. `configs`: run -> its
    config, in training order; `rounds`: run -> its `Round` (None: each run is the strategy of its
    name, once). Returns run -> run directory. With `failed`, a run that fails in training (a
    TrainingError: it diverged, a learner died) is recorded there (run -> reason) and the others
    still train. `before(strategy)` is called just before a strategy's first round starts training
    (a comparison times the run's microbenchmarks there, `files_of(strategy)`: the files it writes;
    later rounds are predicted from it). A full disk in a step (`before` and the training) undoes
    the step and stops the comparison (`disk.DiskFull`)."""
    rounds = rounds or {name: Round(name) for name in configs}
    runs = {name: out / name for name in configs}
    for name, run_dir in runs.items():  # all of them before the first training starts
        check_same_recipe(run_dir, configs[name])
        check_same_hosts(run_dir, hosts.of(rounds[name].strategy))
    for name, run_dir in runs.items():
        if (run_dir / "summary.json").is_file():
            print(f"[compare] {name}: finished run {run_dir}, not trained again", flush=True)
            continue
        resume = resume_from(name, run_dir)
        learners = configs[name].train.learners
        strategy, round_ = rounds[name].strategy, rounds[name].round
        step = disk.Step(out, run_dir, files_of(strategy) if files_of and round_ == 1 else [])
        try:
            if before is not None and round_ == 1:
                before(strategy)
            print(f"[compare] {name}: {'resuming' if resume else 'training'} {run_dir} "
                  f"({learners} learner(s){f', round {round_}' if round_ > 1 else ''})", flush=True)
            launch.train_command(_train_args(config, strategy, learners, data,
                                             (recipes or {}).get(strategy, []) + overrides
                                             + list(rounds[name].overrides),
                                             out=run_dir, resume=resume, hosts=hosts))
        except Exception as exc:
            if not isinstance(exc, Stopped) and disk.is_disk_full(exc):  # the machine's fault: not a row
                kept = step.undo()
                raise disk.DiskFull(disk.disk_full_line(out, name, exc, kept), name) from None
            if failed is None or not isinstance(exc, TrainingError) or isinstance(exc, Stopped):
                raise  # a stopped run stops the comparison
            failed[name] = str(exc)
            print(f"[compare] {name}: training failed: {exc}", flush=True)
    return runs


HALF_PREPARED = ("targets.pt", "env.json", "state.json")
"""What a start killed while it prepared its run directory can have written before config.yaml."""


def resume_from(name: str, run_dir: Path) -> Path | None:
    """How the unfinished run of `name` in `run_dir` trains on: `--resume` (its run directory) where
    a start of it got as far as config.yaml, with or without a checkpoint (`asrdist train --resume`
    trains a run killed before its first checkpoint from the start, removing what that checkpoint
    left half-written); None (a new start) where there is none, or only what a start killed while
    preparing wrote, which goes first. A run another command is training is refused."""
    if not run_dir.is_dir():
        return None
    if rundir.held_elsewhere(run_dir):
        raise ConfigError(f"{run_dir}: another asrdist command is training this run now; run this comparison "
                          f"again when that one has ended, or pick another --out")
    if (run_dir / rundir.CONFIG_NAME).is_file():
        if latest_step_dir(run_dir) is None:
            print(f"[compare] {name}: {run_dir} ended before its first checkpoint ({rundir.describe(run_dir)}); "
                  f"training it again from the start", flush=True)
        return run_dir
    entries = list(run_dir.iterdir())
    if entries and all(p.name in HALF_PREPARED or rundir.is_report(p) or
                       (p.name.startswith(".") and p.name.endswith(".tmp")) for p in entries):
        print(f"[compare] {name}: {run_dir} was left while its run was prepared "
              f"({', '.join(sorted(p.name for p in entries))}); removed, training it from the start", flush=True)
        for path in entries:
            path.unlink()
    return None


def error_metric(final: Figures) -> str | None:
    return final.error_rate(ERROR_METRICS)[0]


def run_record(run_dir: Path) -> dict:
    """What the comparison reports of one finished run: the summary's figures, its epoch curves
    (error rate against epoch and against the job's wall seconds, from metrics.jsonl) and the
    points time to a target is read from (`compare.target.run_points`)."""
    s = RunSummary.read(run_dir)
    final, comm = s.final, s.comm
    metric, error_rate = final.error_rate(ERROR_METRICS)
    curve = []
    for r in read_metrics(run_dir):
        if r.get("kind") == "epoch" and metric in r:
            curve.append({"epoch": r["epoch"], "step": r["step"], "seconds": r.get("seconds"),
                          "wall_seconds": r.get("wall_seconds"), metric: r[metric],
                          "valid_loss": r.get("valid_loss"), "frame_accuracy": r.get("frame_accuracy")})
    compute = sum(p.compute_seconds or 0.0 for p in comm.per_learner)
    stepping = sum(p.train_seconds for p in comm.per_learner)
    frames = sum(p.frames for p in comm.per_learner)
    return {
        "run": Path(run_dir).name, "path": str(run_dir), "strategy": s.strategy, "learners": s.learners,
        "cores": s.cores, "threads_per_learner": s.threads_per_learner,
        "nodes": s.nodes, "network": s.network,
        "metric": metric, "error_rate": error_rate,
        "frame_accuracy": final.frame_accuracy, "epochs": s.epochs,
        "frames_per_second": s.frames_per_second, "mb_sent": comm.bytes_sent / 1e6,
        "mb_wire": s.wire.payload_bytes / 1e6 if s.wire is not None else None,
        "comm_seconds": comm.comm_seconds, "wait_seconds": comm.wait_seconds,
        "wall_seconds": s.wall_seconds, "steal_share": s.steal_share,
        "contended": s.contended, "load": s.load, "cpu_share": s.cpu_share,
        "compute_seconds_per_frame": compute / frames if frames and compute else None,
        "step_seconds_per_frame": stepping / frames if frames and stepping else None,
        "curve": curve,
        "points": run_points(s.history, metric, error_rate, s.wall_seconds) if metric else [],
    }


def run_config(run_dir: Path) -> RunConfig:
    """The resolved config a run was (last) started with."""
    return config_from_tree(read_config_tree(run_config_path(Path(run_dir))))
