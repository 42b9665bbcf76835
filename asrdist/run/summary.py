"""End of a run (rank 0): final evaluation, the consensus model, summary.json and report.png.

After `--resume` the summary accounts the whole run: frames, training seconds and wall time of
every start up to the checkpoint the next one resumed from (kept in the checkpoints' loop state),
plus the last start; `wall_seconds_last_start` and `starts` tell the last start apart.
"""
from __future__ import annotations

import os
from pathlib import Path

import torch

from asrdist.cluster.process_group import JobEnv
from asrdist.config import RunConfig
from asrdist.data.targets import Targets
from asrdist.eval.evaluate import evaluate_split
from asrdist.io.atomic import write_json_atomic
from asrdist.models.registry import count_parameters
from asrdist.run.report import plot_report
from asrdist.train.checkpoint import save_model
from asrdist.train.epoch_average import Averaged
from asrdist.utils.throughput import job_frames_per_second


def hosts(env: JobEnv) -> dict:
    """`nodes` (torchrun's GROUP_WORLD_SIZE: its agents, one per host) and `network`, the link
    between them as asrdist's launcher set it up (`loopback` on one machine; None where another
    launcher started the job: a real cluster's network is not asrdist's to know)."""
    return {"nodes": env.num_nodes, "network": env.network if env.network is not None else
            "loopback" if env.num_nodes == 1 else None}


ERROR_KEYS = ("frame_accuracy", "per", "cer", "wer", "sentence_accuracy")


def busiest_host(per_learner: list[dict]) -> float | None:
    """The largest share of its machine's CPU time that a learner's host (the hypervisor) took while
    the learner trained this start (steal, `asrdist.utils.machine.steal_share`); None where no
    learner could read it. A run with much of it was slowed by work outside this machine: its
    times are not this machine's speed."""
    shares = [p["steal_share"] for p in per_learner if p.get("steal_share") is not None]
    return max(shares, default=None)


def _figures(evaluated: dict) -> dict:
    """The validation figures of an `evaluate_split` result, as summary.json's `final` names them."""
    figures = {"valid_loss": evaluated["loss"]}
    figures.update({k: evaluated[k] for k in ERROR_KEYS if k in evaluated})
    return figures


def finish_run(cfg: RunConfig, run_dir: Path, model: torch.nn.Module, task, targets: Targets,
               state, per_learner: list[dict], wall_seconds: float, threads: int,
               lost_learners: list[dict] | None = None, averaged: Averaged | None = None, *,
               env: JobEnv) -> dict:
    """`model`: the job's final model; `averaged` (train.average_last): the average of the last
    epochs' models, which replaces it in `model` and model.pt; `final` then holds the average's
    figures, `final.averaged_epochs` its epochs (0-based) and `final.unaveraged` the figures of
    the final model alone (the last epoch's: what averaging changed). `env`: the learner's
    `JobEnv` (its hosts, network and restarts)."""
    final_figures = _figures(evaluate_split(model, task.valid_dir, targets, cfg))
    train_loss = state.history[-1]["train_loss"] if state.history else None
    final = {"train_loss": train_loss, **final_figures}
    if averaged is not None:
        unaveraged = final_figures
        model.load_state_dict(averaged.state)
        final = {"train_loss": train_loss, **_figures(evaluate_split(model, task.valid_dir, targets, cfg)),
                 "averaged_epochs": averaged.epochs, "unaveraged": unaveraged}
    save_model(run_dir / "model.pt", model, {"config": cfg.to_dict(), "input_dim": task.store.dim})
    frames = sum(p["frames"] for p in per_learner)
    loop_seconds = [p.get("loop_seconds") or p["train_seconds"] for p in per_learner]
    n = len(per_learner)  # the learners that finished
    lost = lost_learners or []
    summary = {
        "strategy": cfg.strategy_name,
        "learners": n + len(lost),
        "lost_learners": lost,
        "cores": os.cpu_count(),
        "threads_per_learner": threads,
        **hosts(env),
        "model": cfg.model.name,
        "parameters": count_parameters(model),
        "epochs": cfg.train.epochs,
        "steps": state.step,
        "train_frames": frames,
        "frames_per_second": job_frames_per_second([p["frames"] for p in per_learner], loop_seconds),
        "skipped_nonfinite": max(p.get("skipped_nonfinite", 0) for p in per_learner),
        "wall_seconds": max(state.wall_seconds, wall_seconds),
        "wall_seconds_last_start": wall_seconds,
        "steal_share": busiest_host(per_learner),
        # the first start, each --resume, and the last one's restarts by torch's launcher (max_restarts)
        "starts": (1 + len(list(run_dir.glob("config-resume-*.yaml")))
                   + env.restart),
        "final": final,
        "comm": {
            "bytes_sent": sum(p["bytes_sent"] for p in per_learner),
            "comm_seconds": sum(p["comm_seconds"] for p in per_learner) / n,
            "wait_seconds": sum(p["wait_seconds"] for p in per_learner) / n,
            "per_learner": per_learner,
        },
        "history": state.history,
    }
    # the report first: summary.json marks the run finished, so a disk that fills up on the report
    # must fail the run before it (a resume then finishes it) rather than leave it without one
    plot_report(run_dir, title=f"{cfg.model.name} / {cfg.strategy_name} / {n} learner(s) on {os.cpu_count()} cores")
    write_json_atomic(run_dir / "summary.json", summary)
    return summary
