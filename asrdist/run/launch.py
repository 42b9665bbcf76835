"""`asrdist train`: resolve the config, prepare the run directory, start the learners.

One learner runs in this process. N learners run `asrdist.run.worker RUN_DIR` through the
cluster launcher (`asrdist.cluster.launcher`: torch's own elastic launcher, as torchrun on a cluster).
"""
from __future__ import annotations

import contextlib
import os
import platform
import shutil
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import numpy
import torch
import yaml

from asrdist import __version__
from asrdist.cluster import cpushare, netem
from asrdist.cluster.cpushare import HostCpuPlan
from asrdist.cluster.launcher import launch_learners
from asrdist.cluster.netem import parse_rate
from asrdist.cluster.process_group import JobEnv, start_learner
from asrdist.cluster.supervisor import LOG_NAME, stopped_error
from asrdist.config import RunConfig, apply_override, config_from_tree, read_config_tree
from asrdist.data.labels import (
    CTC_TARGETS,
    check_alignment_ids,
    note_short_utterances,
)
from asrdist.errors import AsrdistError, ConfigError, TrainingError
from asrdist.eval.vocabulary import training_lm_sentences
from asrdist.eval.wordlm import LM_NAME, write_training_lm
from asrdist.features.augment import build_augmented_store, check_front_end
from asrdist.features.store import FeatureStore, has_features
from asrdist.io.atomic import (
    file_above,
    output_errors,
    signals_raise,
    write_json_atomic,
    write_text_atomic,
)
from asrdist.io.kaldi_dir import read_alignments
from asrdist.optim import ngsgd
from asrdist.parallel import STRATEGIES
from asrdist.run import rundir
from asrdist.run.learner import run_learner
from asrdist.run.prepare import build_targets, ensure_features, save_targets
from asrdist.run.rundir import CONFIG_NAME, ENV_NAME, run_config_path
from asrdist.run.summary import SUMMARY_NAME, DedicatedHosts, RunSummary
from asrdist.run.task import model_kind
from asrdist.sim.cluster import parameter_count
from asrdist.sim.scenario import config_shapes
from asrdist.train import checkpoint as ckpt
from asrdist.train import state as run_state
from asrdist.utils.machine import machine_info


class HeldNotes:
    """While `asrdist train` checks its job, its notes wait here: a note before an error line would
    read as part of the error. `release` prints them once the checks have passed; after an error
    they are dropped."""

    def __init__(self):
        self.lines: list[str] | None = []
        """The notes held; None once released (later notes are printed at once)."""

    def release(self) -> None:
        held, self.lines = self.lines or [], None
        for line in held:
            print(line, file=sys.stderr, flush=True)


def _note(notes: HeldNotes | None, text: str) -> None:
    """`[asrdist] note: text` on stderr, or in `notes` until the job's checks have passed."""
    line = f"[asrdist] note: {text}"
    if notes is not None and notes.lines is not None:
        notes.lines.append(line)
    else:
        print(line, file=sys.stderr, flush=True)


def resolve_config(args, notes: HeldNotes | None = None) -> RunConfig:
    overrides = list(args.overrides or [])
    given = {o.split("=", 1)[0].strip(): o for o in overrides if "=" in o}
    flag_overrides = []
    for flag, key, value in (("--data", "data.corpus", args.data), ("--epochs", "train.epochs", args.epochs),
                             ("--learners", "train.learners", args.learners)):
        if value is None:
            continue
        if key in given:  # which would win is not for asrdist to guess
            raise ConfigError(f"{key}: given twice, as {flag} {value} and as {given[key]}; keep one")
        flag_overrides.append(f"{key}={value}")
    if args.resume is not None:
        first = args.resume / CONFIG_NAME
        if not first.is_file():
            raise ConfigError(f"{first}: missing; --resume needs a run directory made by asrdist train")
        tree = read_config_tree(run_config_path(args.resume))  # what the last start ran with
    else:
        tree = read_config_tree(args.config)
    recipe_strategy = tree.get("strategy") or {}
    if args.strategy is not None and recipe_strategy.get("name") != args.strategy:
        tree["strategy"] = {"name": args.strategy}
        dropped = sorted(k for k in recipe_strategy if k != "name" and f"strategy.{k}" not in given)
        if dropped:  # they belong to the recipe's strategy; the new one starts from its defaults
            _note(notes, f"--strategy {args.strategy}: the recipe's settings of strategy {recipe_strategy.get('name')} "
                 f"({', '.join(dropped)}) are not used; give strategy.KEY=VALUE to set them")
    for o in flag_overrides + overrides:
        apply_override(tree, o)
    return config_from_tree(tree)


def environment_record(cfg: RunConfig) -> dict:

    return {"asrdist": __version__, "seed": cfg.seed, "argv": sys.argv, "torch": torch.__version__,
            "numpy": numpy.__version__, "python": platform.python_version(), "machine": machine_info(),
            "started": time.strftime("%Y-%m-%dT%H:%M:%S%z")}


def prepare_run_dir(cfg: RunConfig, run_dir: Path, progress: bool, notes: HeldNotes | None = None,
                    held: contextlib.ExitStack | None = None) -> None:
    """Features, targets, then the run directory's files, written while this command holds the
    directory (`rundir.locked`; into `held` to go on holding it after)."""
    corpus = Path(cfg.data.corpus)
    prepare_features(cfg, progress)
    targets = build_targets(corpus, cfg, model_kind(cfg))  # a model that does not fit fails before the run dir
    check_frames_against_alignments(corpus, targets.kind in ("monophone", "tied", "phones"), notes)
    if targets.kind in CTC_TARGETS:
        note_short_utterances(corpus / "train", targets, cfg.model.subsample)
    with output_errors(run_dir, creating=True):
        run_dir.mkdir(parents=True, exist_ok=True)
    with contextlib.ExitStack() as own:  # held from before the first file is written (`held`: by the caller)
        (held if held is not None else own).enter_context(rundir.locked(run_dir, rundir.busy_new_run(run_dir)))
        if any(not rundir.is_report(path) for path in run_dir.iterdir()):  # a run written here meanwhile
            raise rundir.RunDirBusy(f"{run_dir}: another asrdist command wrote a run in this directory while this "
                                    f"one prepared; pick another --out")
        save_targets(run_dir, targets)
        if targets.kind in ("chars", "phones") and (corpus / "train" / "text").is_file():  # the default word LM of eval and decode (eval.lm: train)
            write_training_lm(run_dir / LM_NAME, training_lm_sentences(corpus / "train", targets))
        write_text_atomic(run_dir / CONFIG_NAME, yaml.safe_dump(cfg.to_dict(), sort_keys=False))
        write_json_atomic(run_dir / ENV_NAME, environment_record(cfg))
        run_state.write_state(run_dir, "prepared", learners=cfg.train.learners)


def prepare_features(cfg: RunConfig, progress: bool = True) -> None:
    """The corpus' features as `cfg` trains on them: extracted where missing or stale, the
    augmented copies built where the recipe asks for them. What a run prepares first, and what
    `asrdist compare` prepares before it times a run's microbenchmarks (`calibrate.microbench`)."""
    corpus = Path(cfg.data.corpus)
    check_alignment_ids(corpus, cfg.data.targets)  # before features are (re-)extracted into the corpus
    ensure_features(corpus, cfg, progress=progress)
    check_front_end(corpus / "train", cfg.data)
    build_augmented_store(corpus / "train", cfg.data, cfg.seed, progress=progress)


def check_frames_against_alignments(corpus: Path, learns_from_alignments: bool = False,
                                    notes: HeldNotes | None = None) -> None:
    """Features of other audio than the corpus' alignments (a corpus rebuilt without re-extracting,
    an edited store) would train on misaligned labels: their frame counts must match. Where the
    targets come from the alignments, utterances without one are left out, and a note says so."""
    for split in (corpus / "train", corpus / "valid"):
        if (split / "alignment.scp").is_file() and has_features(split):
            lengths = {utt: len(a) for utt, a in read_alignments(split).items()}
            store = FeatureStore(split)
            store.check_frames(lengths, split / "alignment.scp")
            if learns_from_alignments:
                unaligned = [u for u in store.utt_ids if u not in lengths]
                if unaligned:
                    _note(notes, f"{split}: {len(unaligned)} of {len(store.utt_ids)} utterances have no alignment in "
                         f"alignment.scp (first: {unaligned[0]}); their targets come from it, so they are left out")


def check_new_run_dir(run_dir: Path, corpus: Path, hint: str = "pick another --out or --resume it",
                      notes: HeldNotes | None = None) -> None:
    """One line when `run_dir` cannot take a new run: a file, a directory already holding anything
    (a run, a prepared run, a user's files, which the run's files would replace), or a place inside
    the corpus (a run's files would become part of a split). A directory holding only the failure
    reports of an earlier start (`rundir.is_report`) is emptied of them and taken. A directory
    another command holds (`rundir.locked`: preparing or training a run) is refused as such."""
    run_dir, corpus = Path(run_dir), Path(corpus).resolve()
    if run_dir.exists() and not run_dir.is_dir():
        raise AsrdistError(f"{run_dir}: run directory is an existing file; pick another --out")
    above = file_above(run_dir)
    if above is not None:
        raise AsrdistError(f"{run_dir}: cannot be a run directory: {above} is a file; pick another --out")
    where = run_dir.resolve()
    if where == corpus or corpus in where.parents:
        raise AsrdistError(f"{run_dir}: run directory inside the corpus {corpus}; pick another --out")
    if run_dir.is_dir() and rundir.held_elsewhere(run_dir):  # before its files are read as a prepared run's
        raise rundir.RunDirBusy(rundir.busy_new_run(run_dir))
    entries = list(run_dir.iterdir()) if run_dir.is_dir() else []
    if entries and all(path.is_file() and rundir.is_report(path) for path in entries):
        # a start that failed before its first checkpoint left only the reasons: start again here
        for path in entries:
            path.unlink()
        reports = ", ".join(sorted(p.name for p in entries))
        _note(notes, f"{run_dir}: a start that failed left only its reports ({reports}); removed, starting again")
    elif entries:
        if rundir.prepared_not_started(run_dir):
            raise AsrdistError(rundir.start_prepared_advice(run_dir))
        if run_state.read_state(run_dir) is not None and rundir.has_no_checkpoint(run_dir):
            # a start killed before its first checkpoint (SIGKILL, out of memory): --resume starts it over
            raise AsrdistError(f"{run_dir}: a run that ended before its first checkpoint ({rundir.describe(run_dir)}); "
                               f"`asrdist train --resume {run_dir}` trains it again from the start, or pick another --out")
        used = any((run_dir / name).exists() for name in (SUMMARY_NAME, ckpt.CHECKPOINTS_DIR, CONFIG_NAME))
        what = "run directory already used" if used else "run directory exists and is not empty"
        raise AsrdistError(f"{run_dir}: {what}; {hint}")


def _given_overrides(args) -> list[str]:
    """The flags and overrides of this command line, as a resume records them."""
    flags = [f"--{name} {getattr(args, name)}" for name in ("data", "epochs", "learners", "strategy")
             if getattr(args, name) is not None]
    return flags + list(args.overrides or [])


LEARNER_MIB = 150
"""Memory of one CPU learner before its model's copies (torch, its data, gloo), shared libraries
counted once: 115-220 MiB (PSS) measured on a 4-learner run of a tiny DNN; the check takes the
low end, so that it only refuses what cannot fit."""


def check_job(cfg: RunConfig, nodes: int = 1, network: str = "1gbit", note: bool = True,
              notes: HeldNotes | None = None) -> None:
    """What `asrdist train` checks of a resolved config before it writes anything; `asrdist compare`
    checks every strategy's run with it before it trains the first."""
    check_this_machine(cfg, note, notes)
    if nodes != 1:
        check_emulated_cluster(cfg.train.learners, nodes, network)
    learners = cfg.train.learners
    if (note and STRATEGIES[cfg.strategy_name].moves_by_node and nodes == 1 and learners > 1
            and cfg.train.group_size in (0, learners)):
        _note(notes, f"{cfg.strategy_name} with one node of {learners} learners (train.group_size "
                          f"{cfg.train.group_size or 'unset'}, no --nodes) has no other node to exchange with: it "
                          f"trains as sync; set train.group_size (e.g. {learners // 2 if learners % 2 == 0 else 1}) "
                          f"or --nodes")
    if survives_lost_learners(cfg, nodes) and cfg.train.max_restarts:
        raise ConfigError(f"train.max_restarts: {cfg.strategy_name} goes on without a lost learner instead of "
                          "restarting; set it to 0")


def check_this_machine(cfg: RunConfig, note: bool = True, notes: HeldNotes | None = None) -> None:
    """`asrdist train` starts every learner on this machine: refuse a job whose learners cannot fit
    in its memory (300 learners filled 24 GiB, and the kernel's OOM killer ended the job), and say
    (`note`) when their threads outnumber its cores."""
    learners, cores = cfg.train.learners, os.cpu_count() or 1
    per_learner = LEARNER_MIB * 2 ** 20 + 4 * 4 * parameter_count(config_shapes(cfg))  # weights, grads, 2 states
    available = _available_memory()
    if available is not None and learners * per_learner > available:
        raise ConfigError(f"train.learners: {learners} learners need about {learners * per_learner / 2 ** 30:.1f} GiB "
                          f"here ({per_learner / 2 ** 20:.0f} MiB each), this machine has "
                          f"{available / 2 ** 30:.1f} GiB available; start fewer, or spread them over hosts with "
                          f"`asrdist prepare` and torchrun")
    if note and cfg.train.threads and learners * cfg.train.threads > cores:
        _note(notes, f"train.threads={cfg.train.threads} x {learners} learner(s) = "
                          f"{learners * cfg.train.threads} threads on {cores} core(s): oversubscribed, each step "
                          f"slower (train.threads=0 shares the cores out)")


def _available_memory() -> int | None:
    """MemAvailable of /proc/meminfo in bytes (None where there is none)."""
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        pass
    return None


def train_command(args) -> int:
    notes = HeldNotes()  # printed once the job is checked and its run directory prepared
    code = _train(args, notes)
    notes.release()
    return code


def _train(args, notes: HeldNotes) -> int:
    cfg = resolve_config(args, notes)
    nodes, network = getattr(args, "nodes", 1), getattr(args, "network", "1gbit")
    check_job(cfg, nodes, network, notes=notes)
    cpu = host_cpu_plan(cfg, nodes, network, getattr(args, "cpus_per_host", None))
    cfg.data.corpus = str(Path(cfg.data.corpus).resolve())
    from_start, damaged = False, None
    if args.resume is not None:
        run_dir = args.resume
        if args.out is not None and Path(args.out).resolve() != Path(run_dir).resolve():
            raise ConfigError(f"--out {args.out}: --resume {run_dir} trains on in its own run directory; drop --out")
        saved = config_from_tree(read_config_tree(run_config_path(run_dir)))
        from_start = rundir.check_resume(cfg, run_dir, saved) is None  # nothing is written before this passes
        damaged = rundir.state_problem(run_dir)
        if rundir.finished(run_dir, cfg):
            notes.release()
            print(f"[asrdist] {run_dir}: already trained as far as this config asks (its summary.json); nothing "
                  f"to resume: raise train.epochs (--epochs) or train.max_steps to train on", file=sys.stderr)
            return 0
        _note(notes, f"--resume trains with {run_config_path(run_dir)} (the recipe {args.config} is not read; "
              f"overrides on this command line apply)")
        if damaged:  # the record is rewritten below; the checkpoints and the config records speak for the run
            _note(notes, f"{run_dir / run_state.STATE_NAME}: {damaged}; not used: the run goes on from its "
                  f"{'start' if from_start else 'checkpoints'}, its starts counted from its config records "
                  f"(config.yaml, config-resume-K.yaml)")
    else:
        run_dir = args.out or Path("runs") / f"{Path(args.config).stem}-{time.strftime('%Y%m%d-%H%M%S')}"
        check_new_run_dir(run_dir, Path(cfg.data.corpus), notes=notes)
    # a `kill` or a closed terminal ends one learner (in this process) as Ctrl-C does: cleaned up,
    # one line; with several, the launcher's own handler takes over while they run
    stop = signals_raise(stopped_error, (signal.SIGTERM, signal.SIGHUP))
    # the run directory is held (`rundir.locked`) from before a resume writes anything, or from
    # when a new run has made it, until its failure is undone
    with stop, contextlib.ExitStack() as held, rundir.undone_on_failure(run_dir):
        if args.resume is not None:
            held.enter_context(rundir.locked(Path(run_dir)))
            if from_start:
                restart_from_the_start(run_dir)
            rundir.record_resume(cfg, run_dir, _given_overrides(args))
        else:
            prepare_run_dir(cfg, run_dir, progress=not args.no_progress, notes=notes, held=held)
        recount = args.resume is not None and damaged
        run_state.write_state(run_dir, "started", starts=rundir.counted_starts(run_dir) if recount else None,
                              learners=cfg.train.learners)
        notes.release()
        summary = _start_learners(cfg, run_dir, args, nodes, network,
                                  resume=args.resume is not None and not from_start, cpu=cpu)
    print_summary(run_dir, summary)
    return 0


def restart_from_the_start(run_dir: Path) -> None:
    """`--resume` of a run without a complete checkpoint (killed in its first epoch, or prepared and
    never started): it trains from the start, and says so. What a killed first checkpoint left
    half-written goes (no learner could resume from it)."""
    print(f"[asrdist] {run_dir}: no checkpoint to resume from ({rundir.describe(run_dir)}); training from the "
          f"start", file=sys.stderr, flush=True)
    shutil.rmtree(run_dir / "checkpoints", ignore_errors=True)


def _start_learners(cfg: RunConfig, run_dir: Path, args, nodes: int, network: str, resume: bool,
                    cpu: HostCpuPlan | None = None) -> RunSummary | None:
    progress = not args.no_progress  # a bar on a terminal, plain lines elsewhere (asrdist.train.progress)
    if cfg.train.learners == 1 and cfg.strategy_name == "single" and nodes == 1 and cpu is None:
        env = JobEnv(rank=0, world_size=1, local_rank=0, local_world_size=1)
        ctx = start_learner(env, seed=cfg.seed, timeout=timedelta(seconds=cfg.train.timeout_seconds))
        summary = run_learner(cfg, run_dir, env, ctx, resume=resume, progress=progress)
    else:
        prebuild_native_kernels(cfg)
        summary = run_workers(cfg, run_dir, resume=resume, progress=progress,
                              nodes=nodes, network=network, cpu=cpu)
    return summary


def prebuild_native_kernels(cfg: RunConfig) -> None:
    """Build (or find in the cache) the compiled NG-SGD preconditioner here, once, before the
    learners start: its first build takes half a minute, which the learners would otherwise spend
    at their first minibatch, one building and the others waiting on its lock. Without a compiler
    `native` stops the run here with its one-line error; `auto` warns here."""
    if cfg.optim.natural_gradient and cfg.optim.natural_gradient_kernel != "python":
        ngsgd.resolve_kernel(cfg.optim.natural_gradient_kernel)


def check_emulated_cluster(learners: int, nodes: int, network: str) -> None:
    """`--nodes A --network RATE`, checked before anything is written."""
    if nodes < 1 or learners % nodes:
        raise ConfigError(f"--nodes: {learners} learners cannot be split evenly into {nodes} emulated hosts")
    parse_rate(network)
    ok, reason = netem.available()
    if not ok:
        raise ConfigError(f"--nodes {nodes}: the emulated network is unavailable here: {reason}")


def host_cpu_plan(cfg: RunConfig, nodes: int, network: str, cpus_per_host: float | str | None) -> HostCpuPlan | None:
    """The CPU share of each host (`--cpus-per-host`): None (no quota) for 'shared', and by default
    on one machine or loopback hosts; by default on emulated hosts, this machine's cores shared
    out (`cpushare.default_cpus_per_host`). Refused in one line where cgroups cannot be written."""
    cpus = cpushare.resolve_cpus_per_host(cpus_per_host, nodes, network)
    if cpus is None:
        return None
    s = cfg.train.straggler
    return HostCpuPlan.make(cpus, nodes, cfg.train.learners, s.ranks, s.slowdown)


def run_workers(cfg: RunConfig, run_dir: Path, resume: bool, progress: bool, nodes: int = 1,
                network: str = "1gbit", cpu: HostCpuPlan | None = None) -> RunSummary:
    """`cfg.train.learners` workers of the prepared run through the cluster launcher (on `nodes`
    emulated hosts joined by `network` links when nodes > 1); the summary, with what the hosts
    counted (their NICs' traffic, their CPU shares) recorded in it."""
    args = [str(run_dir)] + (["--resume"] if resume else []) + ([] if progress else ["--no-progress"])
    counters = launch_learners("asrdist.run.worker", args, cfg.train.learners, run_dir, nodes=nodes, network=network,
                               max_restarts=cfg.train.max_restarts, survive_lost=survives_lost_learners(cfg, nodes),
                               cpu=cpu)
    if not (run_dir / SUMMARY_NAME).is_file():  # the learners that finished did not include the one that writes it
        raise TrainingError(f"{run_dir / SUMMARY_NAME}: not written (see {run_dir / LOG_NAME})")
    summary = RunSummary.read(run_dir)
    if counters.wire is not None or cpu is not None:
        summary.wire = counters.wire
        if cpu is not None:
            summary.dedicated = DedicatedHosts(counters.hosts, cpu.cpus_per_host, cpu.straggler_emulation(),
                                               counters.outside_hosts)
            summary.set_cpu_share(quota_cores(cpu.quotas, summary.learners))  # entitled to its host's quota
        summary.write(run_dir)
    return summary


def quota_cores(quotas: tuple[float, ...], learners: int) -> list[float]:
    """Each learner's entitled cores on dedicated hosts: its host's quota shared by the host's learners."""
    per_host = learners // len(quotas)
    return [quotas[rank // per_host] / per_host for rank in range(learners)]


def survives_lost_learners(cfg: RunConfig, nodes: int) -> bool:
    """Whether the job goes on without a lost learner (`StrategyDescriptor.survives_lost_learners`)."""
    return STRATEGIES[cfg.strategy_name].survives_lost_learners(cfg.train.learners, cfg.train.group_size, nodes)


def print_summary(run_dir: Path, summary: RunSummary | None) -> None:
    if not summary:
        return
    f = summary.final
    metrics = ", ".join(f"{k}={v:.4f}" for k, v in f.floats().items())
    print(f"[asrdist] {summary.strategy} x{summary.learners} ({summary.model}, "
          f"{summary.parameters:,} params): {metrics}; "
          f"{summary.frames_per_second:,.0f} frames/s; sent {summary.comm.bytes_sent / 1e6:.1f} MB")
    if f.averaged_epochs:  # train.average_last: what the average changed, beside the model alone
        alone = ", ".join(f"{k}={v:.4f}" for k, v in f.unaveraged.floats().items())
        print(f"[asrdist] model.pt averages epochs {', '.join(str(e) for e in f.averaged_epochs)}; "
              f"the last epoch's model alone: {alone}")
    print(f"[asrdist] run directory: {run_dir} (summary.json, report.png, metrics.jsonl, tensorboard/)")
