"""The comparison's outputs: DIR/summary.json (every figure, per run) and DIR/report.html, one
self-contained page (the plots are PNGs embedded as base64; nothing is fetched from a network)."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import asdict
from pathlib import Path

from asrdist.compare.contention import CONTENDED_SHARE, contended_lines, mark
from asrdist.compare.prediction import (
    mark_contended,
    nearest_validated,
    ranking_line,
    time_to_target_check,
    uncertainty_line,
)
from asrdist.compare.runs import run_config, run_record
from asrdist.compare.target import (
    Target,
    behind_sync,
    busy_host,
    default_target,
    recommendation,
    time_to_target,
)
from asrdist.compare.disk import NOT_RUN
from asrdist.errors import AsrdistError
from asrdist.io.atomic import write_json_atomic, write_text_atomic

TABLE = (("strategy", "strategy", "{}"), ("learners", "learners", "{}"),
         ("time_to_target_seconds", "s to target", "{:.1f}"), ("error_rate", "{metric}", "{:.4f}"),
         ("frame_accuracy", "frame acc", "{:.4f}"), ("frames_per_second", "frames/s", "{:,.0f}"),
         ("predicted_frames_per_second", "simulated frames/s", "{:,.0f}"),
         ("prediction_error", "simulator error", "{:+.1%}"), ("mb_sent", "MB sent", "{:,.1f}"),
         ("comm_seconds", "comm s", "{:.2f}"), ("wait_seconds", "wait s", "{:.2f}"),
         ("wall_seconds", "wall s", "{:.1f}"), ("cpu_share", "CPU share", "{:.0%}"))
"""(key in a run's record, column heading, format): the summary table of the page and the JSON.
A run that finished without reaching the target shows `never` as its time to target; a contended
run's CPU share and simulator error are marked (`compare.contention`)."""
NEVER = "never"


def cell(value, fmt: str, marked: str = "") -> str:
    """A table cell: '-' for no figure, text as it is (`never`), a number formatted (then `marked`)."""
    return "-" if value is None else value if isinstance(value, str) and fmt != "{}" else fmt.format(value) + marked


def _cells(summary: dict) -> list[list[str]]:
    """The table's rows as text, each contended run's marked cells marked."""
    runs = summary["runs"]
    return [[cell(v, fmt, mark(runs[i], key) if i < len(runs) else "") for v, (key, _, fmt) in zip(row, TABLE)]
            for i, row in enumerate(summary["table"]["rows"])]


def failed_record(run_dir: Path, strategy: str, learners: int, reason: str) -> dict:
    """A run that did not finish: its row says why; every figure is None."""
    keys = [k for k, _, _ in TABLE] + ["metric", "cores", "threads_per_learner", "compute_seconds_per_frame",
                                       "step_seconds_per_frame", "nodes", "network", "contended", "load"]
    return {**dict.fromkeys(keys), "run": Path(run_dir).name, "path": str(run_dir), "strategy": strategy,
            "learners": learners, "curve": [], "points": [], "failed": reason}


def build_summary(run_dirs: dict[str, Path], setup: dict, failed: dict[str, str] | None = None,
                  learners: dict[str, int] | None = None, calibrations: dict | None = None,
                  target: float | None = None) -> dict:
    """summary.json's content: `setup` (what was asked), the runs' records with the simulator's
    prediction beside the measured frames/s, the summary table, and where the runs of several
    learners trained (`nodes`, `network`: from their summaries; `mixed` if they differ). Runs in
    `failed` (strategy -> reason; `learners` gives their learner count) get a row saying why.
    `calibrations`: strategy -> its run's `RunCalibration` (`calibrate.microbench`: microbenchmarks of
    one learner of its config, timed just before it trained), or why there is none; each run is
    predicted from its own alone. `target`: the error rate each run's time is measured to (None:
    within 5% of the best final figure)."""
    failed, learners, calibrations = failed or {}, learners or {}, calibrations or {}
    runs = [failed_record(d, n, learners.get(n), failed[n]) if n in failed else {**run_record(d), "failed": None}
            for n, d in run_dirs.items()]
    calibrated = {}
    for record, (name, run_dir) in zip(runs, run_dirs.items()):
        if record["failed"]:
            record["prediction"] = NOT_RUN if record["failed"] == NOT_RUN else "training failed"
            continue
        calibration = calibrations.get(name, "not calibrated (no microbenchmarks of its learner were timed)")
        predicted, record["prediction"], calibrated[name] = _predict(record, run_dir, calibration)
        record["predicted_frames_per_second"] = predicted
        measured = record["frames_per_second"]
        record["prediction_error"] = (predicted - measured) / measured if predicted is not None and measured else None
        record["prediction_nearest_validated"] = nearest_validated(record)
        mark_contended(record)
    metric = next((r["metric"] for r in runs if r["metric"]), "per")
    goal = time_to_targets(runs, metric, target)
    columns = [heading.format(metric=metric.upper()) for _, heading, _ in TABLE]
    rows = [[r[key] for key, _, _ in TABLE] for r in runs]
    hosts = {(r["nodes"], r["network"]) for r in runs if not r["failed"] and r["learners"] != 1}
    nodes, network = next(iter(hosts)) if len(hosts) == 1 else ((None, "mixed") if hosts else (1, "loopback"))
    cores = next((r["cores"] for r in runs if r["cores"]), None)
    times = {r["run"]: r["time_to_target_seconds"] for r in runs if not r["failed"]}
    times = {run: None if t == NEVER else t for run, t in times.items()}
    return {**setup, "metric": metric, "nodes": nodes, "network": network, "target": goal and asdict(goal),
            "recommendation": recommendation(goal, times, sharing_line(runs, cores)), "cores": cores,
            "calibration": calibrated, "runs": runs,
            "time_to_target_prediction": time_to_target_check(runs, goal.value if goal else None),
            "behind_sync": behind_sync(runs, metric), "busy_host": busy_host(runs),
            "contended_runs": contended_lines(runs),
            "table": {"columns": columns, "rows": rows}}


def _predict(record: dict, run_dir: Path, calibration) -> tuple[float | None, str, dict | str]:
    """(the simulator's frames/s of a finished run or None, "simulated" or why not, what summary.json
    keeps of its calibration: when it was timed, the microbenchmarks, the inputs calibrated from
    them and what each was calibrated on; or why there is none)."""
    if isinstance(calibration, str):
        return None, calibration, calibration
    try:
        from asrdist.calibrate.microbench import predict  # optional: the report says when the simulator is missing

        prediction, inputs = predict(calibration, run_config(run_dir), record["strategy"], record["nodes"] or 1,
                                     record["network"] or "loopback")
    except ImportError as exc:
        return None, f"simulator not available ({exc})", f"simulator not available ({exc})"
    except AsrdistError as exc:
        return None, f"simulator: {exc}", f"simulator: {exc}"
    kept = {**calibration.to_json(), "inputs": asdict(inputs)}
    kept.pop("config")  # the run's own config.yaml
    return prediction.frames_per_second, "simulated", kept


def time_to_targets(runs: list[dict], metric: str, value: float | None) -> Target | None:
    """Set every run's `time_to_target_seconds` (NEVER when it finished without reaching it, None
    when it failed) and `reached_target`; returns the target (None: no run has a final figure)."""
    if value is not None:
        goal = Target(metric, float(value), "given (--target)")
    else:
        goal = default_target({r["run"]: r["error_rate"] for r in runs if not r["failed"]}, metric)
    for r in runs:
        seconds = time_to_target(r["points"], goal.value) if goal is not None and not r["failed"] else None
        r["reached_target"] = None if r["failed"] or goal is None else seconds is not None
        r["time_to_target_seconds"] = NEVER if r["reached_target"] is False else seconds
    return goal


def format_table(summary: dict) -> str:
    """The summary table as text (what `asrdist compare` prints)."""
    cells = [summary["table"]["columns"], *_cells(summary)]
    widths = [max(len(r[i]) for r in cells) for i in range(len(TABLE))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    return "\n".join([lines[0], "-" * len(lines[0]), *lines[1:]])


def note_lines(summary: dict) -> list[str]:
    """The notes after the table and in the report: strategies behind sync's accuracy, runs whose
    host was busy, runs that were contended (a summary written before any kind simply has none)."""
    return [*summary.get("behind_sync", []), *summary.get("busy_host", []), *summary.get("contended_runs", [])]


def sharing_line(runs: list[dict], cores: int | None) -> str:
    """How many learners shared how many cores, with how many threads."""
    shapes = sorted({(r["learners"], r["threads_per_learner"] or 1) for r in runs if not r["failed"]})
    return f"{', '.join(f'{n} learner(s) x {t} thread(s)' for n, t in shapes)} sharing {cores} CPU core(s)"


def target_line(summary: dict) -> str:
    """What the time to target measured to, and how the target was set."""
    goal = summary.get("target")
    if not goal:
        return "Time to target: no run has a final error rate to set a target from."
    return (f"Time to target: the job's wall seconds (since training started) to its first validation, or "
            f"its final evaluation, with {goal['metric'].upper()} <= {goal['value']:.4f}: {goal['how']}.")


def setup_line(summary: dict) -> str:
    """How many learners shared how many cores, with how many threads, on which network."""
    runs = sharing_line(summary["runs"], summary["cores"])
    where = (f"as {summary['nodes']} emulated hosts joined by {summary['network']} links (single alone)"
             if (summary.get("nodes") or 1) > 1 else f"talking over {summary['network']}")
    own = sorted(name for name, overrides in (summary.get("recipes") or {}).items() if overrides)
    recipes = ("; every strategy on the same recipe (--same-recipe)" if summary.get("same_recipe")
               else f"; their own optimizer recipes (configs/recipes/) for {', '.join(own)}" if own else "")
    return (f"{runs}, {where}; recipe "
            f"{summary['config']}" + (f" with {' '.join(summary['overrides'])}" if summary["overrides"] else "")
            + recipes)


def simulator_line(summary: dict) -> str:
    """What the simulated frames/s were computed from (empty when no run was calibrated)."""
    kept = {run: c for run, c in (summary.get("calibration") or {}).items() if isinstance(c, dict)}
    if not kept:
        return ""
    after = sorted(run for run, c in kept.items() if not c["when"].startswith("before"))
    line = (" Simulated frames/s: asrdist's simulator, calibrated for each run on microbenchmarks of one "
            "learner of its config alone (its training step, epoch end, gradient coding and averaging, and the "
            "link between two learners), timed just before the run trained; no timing of the runs themselves")
    if after:
        line += f" (timed after training for {', '.join(after)}: no calibration was saved before)"
    return line + "."


def _png(fig) -> str:
    import matplotlib.pyplot as plt  # matplotlib only where a figure is drawn: a second of import time

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90)
    plt.close(fig)
    return base64.b64encode(buf.getvalue()).decode("ascii")


def _figures(summary: dict) -> list[tuple[str, str]]:
    """(caption, base64 PNG) of each plot."""
    # matplotlib only where a figure is drawn (a second of import time), its file backend chosen first
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt  # after the file backend is chosen
    from matplotlib.ticker import MaxNLocator  # after the file backend is chosen

    runs, label = summary["runs"], summary["metric"].upper()
    names = [r["run"] for r in runs]
    fig, (by_epoch, by_time) = plt.subplots(1, 2, figsize=(11, 3.8))
    for r in runs:
        curve = r["curve"]
        if not curve:  # a run that failed has none: no empty legend entry
            continue
        by_epoch.plot([p["epoch"] for p in curve], [p[r["metric"]] for p in curve], "o-", label=r["run"])
        timed = r["points"]  # the validations' and the final evaluation's wall seconds
        by_time.plot([t for t, _ in timed], [e for _, e in timed], "o-", label=r["run"])
    if summary.get("target"):
        by_time.axhline(summary["target"]["value"], color="0.4", linestyle="--", linewidth=1, label="target")
    by_epoch.xaxis.set_major_locator(MaxNLocator(integer=True))
    for ax, xlabel in ((by_epoch, "epoch"), (by_time, "wall time since training started (s)")):
        ax.set_xlabel(xlabel)
        ax.set_ylabel(f"validation {label}")
        ax.grid(alpha=0.3)
        if ax.get_legend_handles_labels()[0]:  # every run failed: no curve, no (warning about an) empty legend
            ax.legend()
    fig.tight_layout()
    curves = _png(fig)

    fig, (speed, sent, comm) = plt.subplots(1, 3, figsize=(13, 3.8))
    x = range(len(runs))
    w = 0.4
    speed.bar([i - w / 2 for i in x], [r["frames_per_second"] or 0 for r in runs], w, label="measured")
    speed.bar([i + w / 2 for i in x], [r["predicted_frames_per_second"] or 0 for r in runs], w, label="simulated")
    speed.set_ylabel("frames/s (whole job)")
    speed.legend(fontsize="small")
    sent.bar(list(x), [r["mb_sent"] or 0 for r in runs], 0.6, color="tab:green")
    sent.set_ylabel("MB sent (all learners)")
    comm.bar([i - w / 2 for i in x], [r["comm_seconds"] or 0 for r in runs], w, label="communicating")
    comm.bar([i + w / 2 for i in x], [r["wait_seconds"] or 0 for r in runs], w, label="waiting for peers")
    comm.set_ylabel("seconds per learner")
    comm.legend(fontsize="small")
    for ax in (speed, sent, comm):
        ax.set_ylim(bottom=0)
        ax.set_xticks(list(x), names, rotation=20)
        ax.grid(alpha=0.3, axis="y")
    fig.tight_layout()
    costs = _png(fig)
    return [(f"Validation {label} of the consensus model against epoch and against wall time (the last point: "
             f"the final evaluation; dashed: the target)", curves),
            ("Throughput (measured, and the simulator's prediction from each run's microbenchmarks), "
             "bytes sent and time spent communicating / waiting", costs)]


def _why_failed(reason: str) -> str:
    """A failed run's note: a run the disk stopped was not run, which says nothing of its strategy."""
    return reason if reason == NOT_RUN else f"training failed: {reason}"


def render_html(summary: dict) -> str:
    esc = html.escape
    title = f"asrdist compare: {', '.join(r['run'] for r in summary['runs'])}"
    head = "".join(f"<th>{esc(c)}</th>" for c in summary["table"]["columns"])
    body = "".join("<tr>" + "".join(f"<td>{esc(text)}</td>" for text in row) + "</tr>\n" for row in _cells(summary))
    notes = "".join(f"<li>{esc(r['run'])}: {esc(_why_failed(r['failed']))}</li>" if r["failed"] else
                    f"<li>{esc(r['run'])}: simulated frames/s: {esc(r['prediction'])}</li>"
                    for r in summary["runs"] if r["failed"] or r["prediction"] != "simulated")
    notes += "".join(f"<li>{esc(line)}</li>" for line in note_lines(summary))
    figures = "".join(f'<figure><img alt="{esc(cap)}" src="data:image/png;base64,{png}">'
                      f"<figcaption>{esc(cap)}</figcaption></figure>\n" for cap, png in _figures(summary))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse}}
td,th{{border:1px solid #bbb;padding:4px 10px;text-align:right}} td:first-child,th:first-child{{text-align:left}}
th{{background:#eee}} img{{max-width:100%}} figcaption{{color:#555;font-size:90%}}</style></head>
<body><h1>{esc(title)}</h1>
<p id="recommendation"><strong>{esc(summary['recommendation'])}</strong></p>
<p>{esc(target_line(summary))}</p>
<p>{esc(setup_line(summary))}. Error rate: validation {esc(summary['metric'].upper())} of the final
(consensus) model; frames/s: the whole job's training frames per second; MB sent: all learners;
comm / wait s: per learner, mean; CPU share: the CPU the learners received over the CPU they were
entitled to, marked (contended) under {CONTENDED_SHARE:.0%}.{esc(simulator_line(summary))}
{esc(uncertainty_line(summary))}{esc(ranking_line(summary))}</p>
<table id="summary"><thead><tr>{head}</tr></thead><tbody>
{body}</tbody></table>
{f'<ul>{notes}</ul>' if notes else ''}
{figures}</body></html>
"""


def write_outputs(out: Path, summary: dict) -> tuple[Path, Path]:
    """DIR/summary.json and DIR/report.html, each written whole or not at all."""
    page = render_html(summary)  # everything rendered before the first file is written
    write_json_atomic(out / "summary.json", summary)
    write_text_atomic(out / "report.html", page)
    return out / "report.html", out / "summary.json"
