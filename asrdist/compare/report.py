"""The comparison's outputs: DIR/summary.json (every figure, per run) and DIR/report.html, one
self-contained page (the plots are PNGs embedded as base64; nothing is fetched from a network)."""
from __future__ import annotations

import base64
import html
import io
from dataclasses import asdict
from pathlib import Path

from asrdist.compare.prediction import (
    mark_contended,
    nearest_validated,
    ranking_line,
    time_to_target_check,
    uncertainty_line,
)
from asrdist.compare.contention import CONTENDED_SHARE, contended_lines, mark
from asrdist.compare.disk import NOT_RUN
from asrdist.compare.repeats import NEVER, aggregate, recommendation, speedups
from asrdist.compare.runs import Round, run_config, run_record
from asrdist.compare.scores import bootstrap_interval, pooled, score_run
from asrdist.compare.target import Target, TargetSpec, behind_sync, busy_host, choose_target, parse_target, time_to_target
from asrdist.errors import AsrdistError
from asrdist.io.atomic import write_json_atomic, write_text_atomic

TABLE = (("strategy", "strategy", "{}", ""), ("learners", "learners", "{}", ""),
         ("time_to_target_seconds", "s to target", "{:.1f}", "measured"),
         ("speedup_vs_single.time_to_target", "speed-up to target", "{:.2f}x", "measured"),
         ("error_rate", "{metric}", "{:.4f}", "measured"),
         ("interval.error_rate_utterances", "{metric} 95% (utterances)", "{:.4f}", "measured"),
         ("test_error_rate", "test {metric}", "{:.4f}", "measured"),
         ("frame_accuracy", "frame acc", "{:.4f}", "measured"), ("frames_per_second", "frames/s", "{:,.0f}", "measured"),
         ("speedup_vs_single.frames_per_second", "speed-up frames/s", "{:.2f}x", "measured"),
         ("predicted_frames_per_second", "simulated frames/s", "{:,.0f}", "simulated"),
         ("prediction_error", "simulator error", "{:+.1%}", "simulated"), ("mb_sent", "MB sent", "{:,.1f}", "counted"),
         ("mb_wire", "MB on the wire", "{:,.1f}", "measured"),
         ("comm_seconds", "comm s", "{:.2f}", "measured"), ("wait_seconds", "wait s", "{:.2f}", "measured"),
         ("wall_seconds", "wall s", "{:.1f}", "measured"), ("cpu_share", "CPU share", "{:.0%}", "measured"))
"""(key in a strategy's entry, dotted into its dicts; column heading; format; measured, counted
or simulated): the summary table of the page and the JSON. A strategy that finished without
reaching the target shows `never` as its time to target. With repeats a cell is the median of
the strategy's runs, then [lowest-highest] over them."""
KINDS = {"measured": "timed or scored on this machine's runs", "simulated": "asrdist's simulator",
         "counted": "the bytes each learner's exchange hands to torch.distributed, counted from the tensors' "
                    "sizes (on loopback no wire is there to measure; on emulated hosts, --nodes, `MB on the wire` is "
                    "what their NICs carried over the whole job, start-up and validation included)"}
"""What each kind of figure is, for the line under the table."""
RANGED = {"time_to_target_seconds", "error_rate", "test_error_rate", "frames_per_second"}
"""The columns whose cell, with repeats, carries the range over the strategy's runs."""


def value_of(entry: dict, key: str):
    """A table key's value in a strategy's entry (`a.b`: entry[a][b]; None where either is missing)."""
    for part in key.split("."):
        entry = entry.get(part) if isinstance(entry, dict) else None
    return entry


def cell(value, fmt: str) -> str:
    """A table cell: '-' for no figure, text as it is (`never`), a number formatted, an interval
    [low, high] as low-high."""
    if isinstance(value, list) and len(value) == 2:
        return "-".join(cell(v, fmt) for v in value)
    return "-" if value is None else value if isinstance(value, str) and fmt != "{}" else fmt.format(value)


def row_cells(entry: dict, html_: bool = False) -> list[str]:
    """A strategy's row as text: each figure, with repeats followed by its range over the runs
    (`html_`: the range on a line of its own, escaped)."""
    out = []
    for key, _, fmt, _ in TABLE:
        text = cell(value_of(entry, key), fmt)
        if key == "strategy" and entry.get("contended"):  # the runs' own flag, where they carry one
            text += " (contended)"
        elif text != "-":
            text += mark(entry, key)  # a contended strategy's CPU share and simulator error
        ranged = (entry.get("interval") or {}).get(key) if key in RANGED else None
        if ranged and (entry.get("repeats") or 1) > 1 and ranged != [NEVER, NEVER]:
            bracket = f"[{cell(ranged, fmt)}]"
            text = (f"{html.escape(text)}<br><small>{html.escape(bracket)}</small>" if html_
                    else f"{text} {bracket}")
        elif html_:
            text = html.escape(text)
        out.append(text)
    return out


def failed_record(run_dir: Path, strategy: str, learners: int, reason: str) -> dict:
    """A run that did not finish: its row says why; every figure is None."""
    keys = [k for k, _, _, _ in TABLE if "." not in k] + [
        "metric", "cores", "threads_per_learner", "compute_seconds_per_frame", "step_seconds_per_frame", "nodes",
        "network", "speedup_vs_single", "interval"]
    return {**dict.fromkeys(keys), "run": Path(run_dir).name, "path": str(run_dir), "strategy": strategy,
            "learners": learners, "curve": [], "points": [], "failed": reason}


def _seed(run_dir: Path) -> int | None:
    try:
        return run_config(run_dir).seed
    except (AsrdistError, OSError):
        return None


def _score(record: dict, run_dir: Path, scores) -> dict | str:
    """Set a finished run's `test_error_rate` and `error_rate_utterances` from its scores."""
    scored = scores(record["run"], Path(run_dir))
    valid, test = (scored.get(s) if isinstance(scored, dict) else None for s in ("valid", "test"))
    record["test_error_rate"] = test["error_rate"] if test else None
    record["error_rate_utterances"] = bootstrap_interval(valid["refs"], valid["hyps"]) if valid else None
    record["scores"] = "scored" if isinstance(scored, dict) else scored
    return scored


def build_summary(run_dirs: dict[str, Path], setup: dict, failed: dict[str, str] | None = None,
                  learners: dict[str, int] | None = None, calibrations: dict | None = None,
                  target: TargetSpec | float | str | None = None, rounds: dict[str, Round] | None = None,
                  scores=None) -> dict:
    """summary.json's content: `setup` (what was asked), one entry per strategy in `runs` (with
    repeats the medians of its runs, their ranges in `interval` and each run in `rounds`), the
    simulator's prediction beside the measured frames/s, the summary table, and where the runs of
    several learners trained (`nodes`, `network`: from their summaries; `mixed` if they differ).
    `run_dirs`: run -> its directory; `rounds`: run -> its `Round` (None: each run is the
    strategy of its name, once). Runs in `failed` (run -> reason; `learners`: strategy -> its
    learner count) get a row saying why. `calibrations`: strategy -> its first run's
    `RunCalibration` (`calibrate.microbench`: microbenchmarks of one learner of its config, timed
    just before it trained), or why there is none; each strategy is predicted from its own alone.
    `target`: what --target asked (`compare.target.parse_target`; None: the baseline's final
    error). `scores(run, run_dir)`: the run's utterance scores (`compare.scores.score_run`)."""
    failed, learners, calibrations = failed or {}, learners or {}, calibrations or {}
    rounds = rounds or {name: Round(name) for name in run_dirs}
    scores = scores or (lambda run, run_dir: score_run(Path(run_dir).parent, run, Path(run_dir)))
    spec = target if isinstance(target, TargetSpec) else parse_target(target)
    records, scored = [], {}
    for name, run_dir in run_dirs.items():
        strategy = rounds[name].strategy
        record = (failed_record(run_dir, strategy, learners.get(strategy), failed[name]) if name in failed
                  else {**run_record(run_dir), "failed": None})
        record.update(run=name, round=rounds[name].round, seed=None if name in failed else _seed(run_dir))
        if not record["failed"]:
            scored[name] = _score(record, run_dir, scores)
        records.append(record)
    metric = next((r["metric"] for r in records if r["metric"]), "per")
    finals = {}
    for r in records:
        finals.setdefault(rounds[r["run"]].strategy, []).append(None if r["failed"] else r["error_rate"])
    goal = choose_target(spec, finals, metric)
    time_to_targets(records, goal)
    strategies = list(dict.fromkeys(rounds[name].strategy for name in run_dirs))
    runs = []
    for strategy in strategies:
        mine = [r for r in records if rounds[r["run"]].strategy == strategy]
        refs = {split: pooled([scored.get(r["run"]) for r in mine], split) for split in ("valid", "test")}
        intervals = {split: bootstrap_interval(*pair) if pair[0] else None for split, pair in refs.items()}
        runs.append(aggregate(strategy, mine, intervals))
    calibrated = {}
    for entry in runs:
        if entry["failed"]:
            entry["prediction"] = NOT_RUN if entry["failed"] == NOT_RUN else "training failed"
            continue
        calibration = calibrations.get(entry["strategy"], "not calibrated (no microbenchmarks of its learner were timed)")
        predicted, entry["prediction"], calibrated[entry["strategy"]] = _predict(entry, Path(entry["path"]), calibration)
        entry["predicted_frames_per_second"] = predicted
        measured = entry["frames_per_second"]
        entry["prediction_error"] = (predicted - measured) / measured if predicted is not None and measured else None
        entry["prediction_nearest_validated"] = nearest_validated(entry)
        mark_contended(entry)
    speedups(runs)
    columns = [heading.format(metric=metric.upper()) for _, heading, _, _ in TABLE]
    rows = [[value_of(r, key) for key, _, _, _ in TABLE] for r in runs]
    hosts = {(r["nodes"], r["network"]) for r in runs if not r["failed"] and r["learners"] != 1}
    nodes, network = next(iter(hosts)) if len(hosts) == 1 else ((None, "mixed") if hosts else (1, "loopback"))
    cores = next((r["cores"] for r in runs if r["cores"]), None)
    return {**setup, "metric": metric, "nodes": nodes, "network": network, "target": goal and asdict(goal),
            "recommendation": recommendation(goal, runs, sharing_line(runs, cores)), "cores": cores,
            "repeats": max((r["repeats"] for r in runs), default=1),
            "calibration": calibrated, "runs": runs,
            "time_to_target_prediction": time_to_target_check(runs, goal.value if goal else None),
            "behind_sync": behind_sync(runs, metric), "busy_host": busy_host(runs),
            "table": {"columns": columns, "rows": rows, "kinds": [kind for *_, kind in TABLE]}}


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


def time_to_targets(runs: list[dict], goal: Target | None) -> None:
    """Set every run's `time_to_target_seconds` (NEVER when it finished without reaching `goal`,
    None when it failed or there is no target) and `reached_target`."""
    for r in runs:
        seconds = time_to_target(r["points"], goal.value) if goal is not None and not r["failed"] else None
        r["reached_target"] = None if r["failed"] or goal is None else seconds is not None
        r["time_to_target_seconds"] = NEVER if r["reached_target"] is False else seconds


def format_table(summary: dict) -> str:
    """The summary table as text (what `asrdist compare` prints)."""
    kinds = summary["table"].get("kinds") or [""] * len(summary["table"]["columns"])
    cells = [summary["table"]["columns"], kinds, *(row_cells(r) for r in summary["runs"])]
    widths = [max(len(r[i]) for r in cells) for i in range(len(cells[0]))]
    lines = ["  ".join(c.ljust(w) if i == 0 else c.rjust(w) for i, (c, w) in enumerate(zip(r, widths)))
             for r in cells]
    return "\n".join([lines[0], lines[1], "-" * len(lines[0]), *lines[2:]])


def kinds_line(summary: dict) -> str:
    """Which figures are measured, which counted, which simulated (a summary from before the
    table said so has none)."""
    kinds = summary["table"].get("kinds")
    if not kinds:
        return ""
    parts = []
    for kind, what in KINDS.items():
        named = [c for c, k in zip(summary["table"]["columns"], kinds) if k == kind]
        if named:
            parts.append(f"{kind} ({what}): {', '.join(named)}")
    return "Figures " + "; ".join(parts) + "."


def repeats_line(summary: dict) -> str:
    """How many runs each strategy's figures are the median of, and what the brackets are."""
    k = summary.get("repeats") or 1
    if k < 2:
        return ("One run per strategy: no figure has an interval but the error rate's over its utterances; "
                "--repeats K trains each strategy K times in interleaved rounds.")
    return (f"Each strategy trained {k} times in interleaved rounds (round r with seed + r - 1); a figure is the "
            f"median of its runs, [lowest-highest] over them; the error rate's 95% interval over the eval split's "
            f"utterances is its own column (bootstrap, pooled over the runs).")


def note_lines(summary: dict) -> list[str]:
    """The notes after the table and in the report: strategies behind sync's accuracy, runs whose
    host was busy, strategy recipes not used for the compared model (a summary written before any
    kind simply has none)."""
    failed_rounds = [f"{r['run']}: {_why_failed(r['failed'])}" for e in summary["runs"] if not e["failed"]
                     for r in e.get("rounds") or [] if r.get("failed")]
    return [*summary.get("behind_sync", []), *summary.get("busy_host", []), *failed_rounds,
            *contended_lines(summary["runs"]), *(summary.get("recipes_not_applied") or {}).values()]


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
    first = " (each strategy's first run)" if (summary.get("repeats") or 1) > 1 else ""
    return [(f"Validation {label} of the consensus model against epoch and against wall time{first} (the last "
             f"point: the final evaluation; dashed: the target)", curves),
            ("Throughput (measured, and the simulator's prediction from each run's microbenchmarks), "
             "bytes sent and time spent communicating / waiting", costs)]


def _why_failed(reason: str) -> str:
    """A failed run's note: a run the disk stopped was not run, which says nothing of its strategy."""
    return reason if reason == NOT_RUN else f"training failed: {reason}"


def render_html(summary: dict) -> str:
    esc = html.escape
    title = f"asrdist compare: {', '.join(r['run'] for r in summary['runs'])}"
    head = "".join(f"<th>{esc(c)}</th>" for c in summary["table"]["columns"])
    kinds = summary["table"].get("kinds")
    head += ("</tr><tr>" + "".join(f"<th>{esc(k)}</th>" for k in kinds)) if kinds else ""
    body = "".join("<tr>" + "".join(f"<td>{c}</td>" for c in row_cells(r, html_=True)) + "</tr>\n"
                   for r in summary["runs"])
    notes = "".join(f"<li>{esc(r['run'])}: {esc(_why_failed(r['failed']))}</li>" if r["failed"] else
                    f"<li>{esc(r['run'])}: simulated frames/s: {esc(r['prediction'])}</li>"
                    for r in summary["runs"] if r["failed"] or r["prediction"] != "simulated")
    notes += "".join(f"<li>{esc(r['run'])}: error rate over utterances, test split: {esc(r['scores'])}</li>"
                     for r in summary["runs"] if not r["failed"] and r.get("scores") not in (None, "scored"))
    notes += "".join(f"<li>{esc(line)}</li>" for line in note_lines(summary))
    figures = "".join(f'<figure><img alt="{esc(cap)}" src="data:image/png;base64,{png}">'
                      f"<figcaption>{esc(cap)}</figcaption></figure>\n" for cap, png in _figures(summary))
    return f"""<!DOCTYPE html>
<html lang="en"><head><meta charset="utf-8"><title>{esc(title)}</title>
<style>body{{font-family:sans-serif;margin:2em;color:#222}} table{{border-collapse:collapse}}
table{{font-size:90%}} td,th{{border:1px solid #bbb;padding:3px 6px;text-align:right}}
small{{color:#555}} td:first-child,th:first-child{{text-align:left}}
th{{background:#eee}} img{{max-width:100%}} figcaption{{color:#555;font-size:90%}}</style></head>
<body><h1>{esc(title)}</h1>
<p id="recommendation"><strong>{esc(summary['recommendation'])}</strong></p>
<p>{esc(target_line(summary))} {esc(repeats_line(summary))}</p>
<p>{esc(setup_line(summary))}. Error rate: validation {esc(summary['metric'].upper())} of the final
(consensus) model; frames/s: the whole job's training frames per second; MB sent: all learners;
comm / wait s: per learner, mean; test {esc(summary['metric'].upper())}: the test split's, where the corpus
has one; speed-ups: over single's; CPU share: the CPU the learners received over the CPU they were
entitled to, marked (contended) under {CONTENDED_SHARE:.0%}. {esc(kinds_line(summary))}{esc(simulator_line(summary))}{esc(uncertainty_line(summary))}{esc(ranking_line(summary))}</p>
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
