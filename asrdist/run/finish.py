"""Rank 0's end of a run (`finish_run`): the final evaluation, model.pt, and summary.json."""
from __future__ import annotations

import os
from pathlib import Path

import torch

from asrdist.cluster.process_group import JobEnv
from asrdist.config import RunConfig
from asrdist.data.targets import Targets
from asrdist.eval.evaluate import evaluate_split
from asrdist.models.registry import count_parameters
from asrdist.run.gossip import write_gossip
from asrdist.run.report import plot_report
from asrdist.run.rundir import MODEL_NAME
from asrdist.run.summary import (ERROR_KEYS, CommTotals, EpochRecord, FinalFigures, LearnerFigures, LostLearner,
                                 RunSummary, ValidationRecord)
from asrdist.train.checkpoint import save_model
from asrdist.train.epoch_average import Averaged
from asrdist.utils.contention import machine_cores, shared_cores
from asrdist.utils.throughput import job_frames_per_second


def hosts(env: JobEnv) -> dict:
    """`nodes` (torchrun's GROUP_WORLD_SIZE: its agents, one per host) and `network`, the link
    between them as asrdist's launcher set it up (`loopback` on one machine; None where another
    launcher started the job: a real cluster's network is not asrdist's to know)."""
    return {"nodes": env.num_nodes, "network": env.network if env.network is not None else
            "loopback" if env.num_nodes == 1 else None}


def busiest_host(per_learner: list[LearnerFigures]) -> float | None:
    """The largest share of its machine's CPU time that a learner's host (the hypervisor) took while
    the learner trained this start (steal, `asrdist.utils.machine.steal_share`); None where no
    learner could read it. A run with much of it was slowed by work outside this machine: its
    times are not this machine's speed."""
    return max((p.steal_share for p in per_learner if p.steal_share is not None), default=None)


def _figures(evaluated: dict) -> dict:
    """The validation figures of an `evaluate_split` result, as summary.json's `final` names them."""
    figures = {"valid_loss": evaluated["loss"]}
    figures.update({k: evaluated[k] for k in ERROR_KEYS if k in evaluated})
    return figures


def finish_run(cfg: RunConfig, run_dir: Path, model: torch.nn.Module, task, targets: Targets,
               state, per_learner: list[dict], wall_seconds: float, threads: int,
               lost_learners: list[dict] | None = None, averaged: Averaged | None = None, *,
               env: JobEnv, load: tuple[float | None, float | None] = (None, None),
               gossip: tuple[dict, list] | None = None) -> RunSummary:
    """`model`: the job's final model; `averaged` (train.average_last): the average of the last
    epochs' models, which replaces it in `model` and model.pt; `final` then holds the average's
    figures, `final.averaged_epochs` its epochs (from 1) and `final.unaveraged` the figures of
    the final model alone (the last epoch's: what averaging changed). `env`: the learner's
    `JobEnv` (its hosts, network and restarts). `load`: the machine's load average when this
    learner's training started and ended; with the learners' CPU figures, `cpu_share` and
    `contended` on shared cores (`asrdist.utils.contention`; `launch.run_workers` sets them again
    on dedicated hosts, from their quotas). `gossip` (`asrdist.run.gossip.gossip_summary`): a
    gossiping job's exchanges, written to RUN/gossip.tsv, and their mixing, summary.json's `gossip`."""
    final_figures = _figures(evaluate_split(model, task.valid_dir, targets, cfg))
    train_loss = state.history[-1]["train_loss"] if state.history else None
    final = {"train_loss": train_loss, **final_figures}
    if averaged is not None:
        unaveraged = final_figures
        model.load_state_dict(averaged.state)
        final = {"train_loss": train_loss, **_figures(evaluate_split(model, task.valid_dir, targets, cfg)),
                 "averaged_epochs": [e + 1 for e in averaged.epochs], "unaveraged": unaveraged}
    save_model(run_dir / MODEL_NAME, model, {"config": cfg.to_dict(), "input_dim": task.store.dim})
    learners = [LearnerFigures.from_json(p) for p in per_learner]
    n = len(learners)  # the learners that finished
    lost = [LostLearner.from_json(x) for x in lost_learners or []]
    summary = RunSummary(
        strategy=cfg.strategy_name, learners=n + len(lost), lost_learners=lost, cores=os.cpu_count(),
        threads_per_learner=threads, **hosts(env), model=cfg.model.name, parameters=count_parameters(model),
        epochs=cfg.train.epochs, steps=state.step, train_frames=sum(p.frames for p in learners),
        frames_per_second=job_frames_per_second([p.frames for p in learners], [p.stepping_seconds for p in learners]),
        skipped_nonfinite=max(p.skipped_nonfinite or 0 for p in learners),
        wall_seconds=max(state.wall_seconds, wall_seconds), wall_seconds_last_start=wall_seconds,
        steal_share=busiest_host(learners),
        # the first start, each --resume, and the last one's restarts by torch's launcher (max_restarts)
        starts=1 + len(list(run_dir.glob("config-resume-*.yaml"))) + env.restart,
        final=FinalFigures.from_json(final),
        comm=CommTotals(bytes_sent=sum(p.bytes_sent for p in learners),
                        comm_seconds=sum(p.comm_seconds for p in learners) / n,
                        wait_seconds=sum(p.wait_seconds for p in learners) / n, per_learner=learners),
        history=[EpochRecord.from_json(r) for r in state.history],
        load={"start": load[0], "end": load[1], "cores": machine_cores()},
        validations=[ValidationRecord.from_json(r) for r in state.validations] if cfg.train.validate_every else None,
        gossip=None if gossip is None else gossip[0])
    if gossip is not None:
        write_gossip(run_dir, gossip[1])
    summary.set_cpu_share(shared_cores(summary.learners))
    # the report first: summary.json marks the run finished, so a disk that fills up on the report
    # must fail the run before it (a resume then finishes it) rather than leave it without one
    plot_report(run_dir, title=f"{cfg.model.name} / {cfg.strategy_name} / {n} learner(s) on {os.cpu_count()} cores")
    summary.write(run_dir)
    return summary
