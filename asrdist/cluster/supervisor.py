"""asrdist's supervisor around the launcher agents (`torch.distributed.run`, one per host) or,
for a job that survives lost learners, around the learners themselves (`Survival`).

A failed job becomes one `TrainingError` line naming the learner that failed first (from torch's
failure records), a job past its deadline a `JobTimedOut`; SIGTERM, SIGINT or SIGHUP stop every
agent and learner; a stopped (SIGSTOP) learner is killed `SHUTDOWN_GRACE_S` after a peer reported
it. Details: docs/reliability.md#how-the-supervisor-does-it-clustersupervisorpy."""
from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Callable, Sequence

from asrdist.cluster.failures import LearnerExit, read_exits, report_path
from asrdist.cluster.netem import die_with_parent, stop_process
from asrdist.errors import Stopped, TrainingError
from asrdist.parallel.membership import lost_key, report_lost

LOG_NAME = "launcher.log"
SHUTDOWN_GRACE_S = 3
"""How long an agent waits for a learner it stopped (SIGTERM) before it kills it (SIGKILL)."""
STOP_GRACE_S = 10.0
"""How long stopped agents get to stop their learners before they are killed (their learners die
with them), and how long, after one agent failed, the others get to fail on their own. An agent
that runs learners stops them within SHUTDOWN_GRACE_S of a SIGTERM; one whose learners finished
waits in torch's exit barrier for its peers' agents (up to 300 s), blocked in the c10d store
where no signal reaches it, and is only ended by the kill. Was 30 s: a 2-host job whose learner
failed or hung took 30 s longer than its failure (measured: 36 s for a 6 s deadline)."""
_STOP_SIGNALS = (signal.SIGTERM, signal.SIGINT, signal.SIGHUP)


class JobTimedOut(TrainingError):
    """The learners did not finish within the job's deadline; every one was stopped."""


def die_with_agent() -> None:
    """A learner never runs unsupervised: it gets SIGKILL when its launcher agent dies (even by
    SIGKILL), and leaves at once if the agent is already gone."""
    parent = os.getppid()
    die_with_parent()
    if os.getppid() != parent or parent == 1:
        os._exit(1)


_DYING_S = 1.0
"""How long a learner its peers reported lost may take to exit by itself before it is killed as hung."""


class Survival:
    """Supervision of a job that goes on without lost learners; process k is learner rank k."""

    def __init__(self, store, report_dir: Path):
        self.store, self.report_dir = store, report_dir
        self.log: _ReportLog | None = None
        """The launcher's log (set by `run_agents`)."""
        self.outputs: list[list[str]] = []
        """Each learner's last stderr lines, and the threads that read them (set by `run_agents`)."""
        self.pumps: list[threading.Thread] = []
        self.lost: dict[int, str] = {}
        """rank -> the one line that says why it was lost."""
        self._declared: dict[int, float] = {}  # rank -> when its peers' report was seen, it still running
        self._stopped: set[int] = set()
        self._lost_at: dict[int, float] = {}  # rank -> when it failed (its report's time)

    def wait(self, procs: list[subprocess.Popen], stop: threading.Event, deadline: float | None) -> list[int] | None:
        """Until every learner has exited (their codes), a stop signal came, or the deadline passed."""
        while not stop.is_set():
            codes = [p.poll() for p in procs]
            for rank, code in enumerate(codes):
                if code is None and self.store.check([lost_key(rank)]):  # its peers gave up on it
                    seen = self._declared.setdefault(rank, time.monotonic())
                    if time.monotonic() - seen > _DYING_S:  # not a process on its way out: hung
                        self._stopped.add(rank)
                        procs[rank].kill()
                        codes[rank] = procs[rank].wait()
            # learners found gone in one pass are lost in the order they failed (their reports'
            # times): a divergence before the collective failures it caused in its peers
            gone = [rank for rank, code in enumerate(codes) if code not in (None, 0) and rank not in self.lost]
            for rank in sorted(gone, key=self._failed_at):
                self._lose(rank, codes[rank], len(procs))
            if all(c is not None for c in codes):
                return codes
            if deadline is not None and time.monotonic() > deadline:
                return None
            stop.wait(0.2)
        return [p.poll() or 0 for p in procs]

    def _failed_at(self, rank: int) -> float:
        """When learner `rank` wrote its failure report (none, as when it was killed: now)."""
        try:
            return report_path(self.report_dir, rank).stat().st_mtime
        except OSError:
            return time.time()

    def _lose(self, rank: int, code: int, learners: int) -> None:
        report = _first_line(report_path(self.report_dir, rank))
        if not report and rank < len(self.outputs):  # no report file (a full disk): the line it printed
            self.pumps[rank].join(2.0)  # its last lines: the pipe closes as the process exits
            said = [m for m in _LEARNER_ERROR.findall("".join(self.outputs[rank]))
                    if m.startswith(f"learner rank {rank}: ")]
            report = said[0] if said else ""
        report = report.removeprefix(f"learner rank {rank}: ")
        how = report or (f"killed by signal {-code}" if code < 0 else f"exit code {code}")
        record = report_lost(self.store, rank, how, by="launcher")
        if rank in self._stopped:  # alive, but its peers gave up on it
            how = f"{record['reason']}; stopped by the launcher"
        elif record["by"] != "launcher":
            # a peer got there first with what it inferred (a closed connection, a node that lost
            # someone); how the process ended is the fact, and the run's summary should say it
            record = {**record, "reason": how, "by": "launcher"}
            self.store.set(lost_key(rank), json.dumps(record))
        self.lost[rank] = how
        self._lost_at[rank] = self._failed_at(rank)
        left = learners - len(self.lost)
        at = f" at step {record['step']}" if record.get("step") is not None else " before its first step"
        goes_on = f"the job goes on with {left} learner{'s' * (left != 1)}" if left else "no learner is left"
        line = f"[asrdist] learner rank {rank} lost{at} ({how}); {goes_on}\n"
        sys.stderr.write(line)
        sys.stderr.flush()
        if self.log is not None:
            self.log.write(line)

    def outcome(self, codes: list[int]) -> None:
        """Nothing when a learner finished; else one line: the survivors' divergence when the last
        of them stopped on a non-finite loss (`diverged_line`), else the learner lost first."""
        if any(c == 0 for c in codes):
            return
        # in the order they failed: a learner found gone a pass later may have failed first
        line = diverged_line(dict(sorted(self.lost.items(), key=lambda lost: self._lost_at.get(lost[0], 0.0))))
        if line is None:
            rank, how = next(iter(self.lost.items()))
            line = f"learner rank {rank}: {how}"
        raise TrainingError(f"{line}; no learner finished")


_NONFINITE = re.compile(r"loss is -?(nan|inf)\b|non-finite|diverged")
_OWN_LOSS = re.compile(r"loss is -?(nan|inf)\b")
_WHERE = re.compile(r"at step (\d+) \(epoch (\d+)\)|in epoch (\d+)")


def diverged_line(lost: dict[int, str]) -> str | None:
    """When a lost learner (`lost`: rank -> why, in the order they were lost) stopped on a
    non-finite loss or gradient, or a diverged model, the line naming that: the epoch and step,
    which learners, and the learners lost before it (whose loss did not end the job); else None.
    It quotes a learner whose own loss was non-finite where one was: the others' gradients had it
    through the exchange (which of them stops first is a race), so that learner says where it began."""
    order = list(lost.items())
    first = next((k for k, (_, how) in enumerate(order) if _NONFINITE.search(how)), None)
    if first is None:
        return None
    before, after = order[:first], order[first:]
    diverged = [(r, how) for r, how in after if _NONFINITE.search(how)]
    with_it = [(r, how) for r, how in after if not _NONFINITE.search(how)]
    first_rank, first_how = next(((r, how) for r, how in diverged if _OWN_LOSS.search(how)), diverged[0])
    where = _WHERE.search(first_how)
    at = ("" if where is None else f" in epoch {where.group(3)}" if where.group(3) is not None
          else f" at step {where.group(1)} (epoch {where.group(2)})")
    what = _WHERE.sub("", first_how.split(";")[0]).strip().rstrip(",")
    ranks = ", ".join(str(r) for r, _ in diverged)

    def listed(losses: list[tuple[int, str]]) -> str:
        return ", ".join(f"rank {r} ({how})" for r, how in losses)
    return (f"the survivors' model diverged{at}: learner{'s' * (len(diverged) > 1)} {ranks} stopped on a "
            f"non-finite value (rank {first_rank}: {what})" + (f", with it {listed(with_it)}" if with_it else "")
            + (f"; lost before it: {listed(before)}" if before else "") + "; lower optim.lr or check the data")



def run_agents(starters: Sequence[Callable[[], subprocess.Popen]], report_dir: Path, timeout: float | None,
               survival: Survival | None = None, exits: Sequence[Path] = ()) -> None:
    """Start the launcher agents, echo their learners' output, log all of it, and turn a failure
    (or a stop signal) into one line naming the rank, from the failure records the agents write
    to `exits` (`asrdist.cluster.agent --exits`). With `survival` the processes are the learners
    themselves and the job goes on without lost ones."""
    report_dir = Path(report_dir)
    for f in report_dir.glob("failed-rank-*.txt"):
        f.unlink()
    stop = threading.Event()
    stopped_by: list[str] = []
    previous = {}

    def on_signal(signum, _frame):
        stopped_by.append(signum)
        stop.set()

    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, on_signal) for s in _STOP_SIGNALS}
    procs: list[subprocess.Popen] = []
    outputs: list[list[str]] = []
    pumps: list[threading.Thread] = []
    deadline = None if timeout is None else time.monotonic() + timeout
    with _ReportLog(report_dir / LOG_NAME) as log:
        if survival is not None:
            survival.log, survival.outputs, survival.pumps = log, outputs, pumps
        try:
            for start in starters:
                proc = start()
                procs.append(proc)
                outputs.append([])
                pumps.append(threading.Thread(target=_pump, args=(proc, outputs[-1], log), daemon=True))
                pumps[-1].start()
            codes = (survival.wait(procs, stop, deadline) if survival is not None
                     else _wait(procs, stop, deadline, report_dir))
        finally:
            if any(p.poll() is None for p in procs):
                _stop(procs)
            for t in pumps:
                t.join(5)
            for s, handler in previous.items():
                signal.signal(s, handler)
    if stopped_by:
        raise stopped_error(stopped_by[0], "every learner and launcher was stopped")
    if codes is None:
        raise JobTimedOut(f"the job did not finish within {timeout:g} s; every learner was stopped "
                       f"(log: {report_dir / LOG_NAME})")
    if survival is not None:
        survival.outcome(codes)
        return
    failed = [c for c in codes if c != 0]
    if failed:
        raise TrainingError(failure_message(report_dir, read_exits(list(exits)), "".join(sum(outputs, [])), failed[0]))


def stopped_error(signum: int, what: str = "") -> Stopped:
    """A stop by signal `signum` as one line; the command exits 128 + signum, the shell's status
    for a process a signal ended (130 for Ctrl-C, 143 for `kill`), however many learners it ran."""
    exc = Stopped(f"stopped by {signal.Signals(signum).name}" + (f": {what}" if what else ""))
    exc.exit_code = 128 + signum
    return exc


def _wait(procs: list[subprocess.Popen], stop: threading.Event, deadline: float | None,
          report_dir: Path) -> list[int] | None:
    """Wait until every agent has exited (their codes), one has failed and the others have had a
    grace period to fail too, a stop signal came, or the deadline passed (None)."""
    failed_at = None
    stopped = _StoppedLearners(procs, report_dir)
    while not stop.is_set():
        stopped.check()
        codes = [p.poll() for p in procs]
        if all(c is not None for c in codes):
            return codes
        now = time.monotonic()
        if failed_at is None and any(c not in (None, 0) for c in codes):
            failed_at = now  # the other hosts' learners fail on their own within their timeout
        if failed_at is not None and (now - failed_at > STOP_GRACE_S or not _agents_with_learners(procs)):
            _stop(procs)
            return [p.wait() for p in procs]
        if deadline is not None and now > deadline:
            return None
        stop.wait(0.2)
    return [p.poll() or 0 for p in procs]


class _StoppedLearners:
    """Kills the learners that cannot stop by themselves once the job is failing: SHUTDOWN_GRACE_S
    after the first learner's failure report, every stopped (state T) descendant of the agents."""

    def __init__(self, agents: list[subprocess.Popen], report_dir: Path):
        self.agents, self.report_dir = agents, report_dir
        self._failed_at: float | None = None

    def check(self) -> None:
        if self._failed_at is None:
            if any(_first_line(p) for p in self.report_dir.glob("failed-rank-*.txt")):
                self._failed_at = time.monotonic()
            return
        if time.monotonic() - self._failed_at < SHUTDOWN_GRACE_S:
            return
        states = _process_states()
        for pid in _descendants([a.pid for a in self.agents if a.poll() is None], states):
            if states[pid][0] == "T":
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass


def _proc_stat(pid: int) -> list[str]:
    """Fields of /proc/PID/stat after the command name (state, ppid, ...); [] when gone."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(") ", 1)[1].split()
    except (OSError, IndexError):
        return []


def _state(pid: int) -> str:
    fields = _proc_stat(pid)
    return fields[0] if fields else ""


def _process_states() -> dict[int, tuple[str, int]]:
    """Every process now, read once from /proc: pid -> (state (R, S, T, Z...), parent pid)."""
    states = {}
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            fields = _proc_stat(int(entry.name))
            if fields:
                states[int(entry.name)] = fields[0], int(fields[1])
    return states


def _descendants(roots: list[int], states: dict[int, tuple[str, int]]) -> list[int]:
    """The descendants of the `roots` processes among `states` (`_process_states()`)."""
    children: dict[int, list[int]] = {}
    for pid, (_, parent) in states.items():
        children.setdefault(parent, []).append(pid)
    found, todo = [], list(roots)
    while todo:
        kids = children.get(todo.pop(), [])
        found += kids
        todo += kids
    return found


def _stop(procs: list[subprocess.Popen]) -> None:
    """SIGTERM every agent's process group (the agent stops its learners); SIGKILL an agent once it
    has no learners left (it would wait out torch's exit barrier), and every agent after the grace."""
    for p in procs:
        if p.poll() is None:
            try:
                os.killpg(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
    end = time.monotonic() + STOP_GRACE_S
    while any(p.poll() is None for p in procs) and time.monotonic() < end:
        busy = _agents_with_learners(procs)
        for p in procs:
            if p not in busy:
                stop_process(p, grace_s=0.1)  # returns at once for one that has ended
        time.sleep(0.1)  # polling interval
    for p in procs:
        stop_process(p, grace_s=0.1)


def _agents_with_learners(agents: list[subprocess.Popen]) -> list[subprocess.Popen]:
    """The running agents with a learner (any live descendant) still running. A running agent
    not among them waits in torch's exit barrier for its peers' agents, and neither fails on its own
    nor answers a SIGTERM (see STOP_GRACE_S)."""
    states = _process_states()
    return [a for a in agents if a.poll() is None
            and any(states[pid][0] != "Z" for pid in _descendants([a.pid], states))]


class _ReportLog:
    """`launcher.log`, kept best-effort: a disk that fills up (or a log that cannot be written at
    all) must not turn the learners' own one-line error into the launcher's traceback. Lines are
    flushed as they come; after the first failed write the log stops, and the learners' output is
    still echoed and kept in memory for the failure line."""

    def __init__(self, path: Path):
        self.path = path
        self._lock = threading.Lock()
        try:
            self._file = open(path, "a", encoding="utf-8")
        except OSError:
            self._file = None

    def write(self, line: str) -> None:
        with self._lock:
            if self._file is None:
                return
            try:
                self._file.write(line)
                self._file.flush()
            except OSError:
                self._close()

    def _close(self) -> None:
        file, self._file = self._file, None
        try:
            file.close()
        except OSError:
            pass

    def __enter__(self) -> "_ReportLog":
        return self

    def __exit__(self, *exc) -> None:
        with self._lock:
            if self._file is not None:
                self._close()


def _pump(proc: subprocess.Popen, tail: list[str], log: _ReportLog) -> None:
    """Copy an agent's stderr into the log; echo the learners' own lines (not torch's launcher
    reports and tracebacks, not the learners' error lines: the launcher prints the one line)."""
    hidden = False
    for line in proc.stderr:
        log.write(line)
        tail.append(line)
        del tail[:-400]
        if line.startswith("[asrdist]"):  # a learner's own line again (after a restart)
            hidden = False
        hidden = (hidden or line.startswith(("Traceback (most recent call last)", "Exception in thread"))
                  or "ChildFailedError" in line)
        if not hidden and not _launcher_noise(line):
            sys.stderr.write(line)


_TORCH_LOG = re.compile(r"^\[?[DIWEF]\d{4} \d\d:\d\d:\d\d")


_CPP_TRACE = ("Exception raised from ", "frame #", "<omitting python frames>")
"""A c10 exception's stack as torch's launcher logs it (e.g. an agent whose exit barrier lost agent
0's store as that agent left first: common on slow dedicated hosts, and harmless): in the log only."""


def _launcher_noise(line: str) -> bool:
    return (bool(_TORCH_LOG.match(line)) or line.startswith(("*****", "asrdist: error: learner rank", *_CPP_TRACE))
            or "torch.distributed.run" in line and "OMP_NUM_THREADS" in line)


_TIMED_OUT = re.compile(r"timed out|timeout caused", re.IGNORECASE)
"""gloo's words for a peer that stopped answering ("Operation timed out!", "Timed out waiting",
"Application timeout caused pair closure" when the timeout closed the connection first), not
asrdist's "(timeout 20 s)" label, which every failed collective carries."""


_LEARNER_ERROR = re.compile(r"^asrdist: error: (learner rank \d+: .*)$", re.MULTILINE)
"""The one line a failing learner prints (asrdist.run.worker), also when its report file could
not be written."""


def failure_message(report_dir: Path, exits: list[LearnerExit], launcher_output: str, rc: int) -> str:
    """One line naming the learner that failed first, from the agents' records of the learners that
    failed (`exits`) and the learners' reports.

    A learner killed by a signal (not the launcher's own SIGTERM) without a report of its own is
    the root cause even when its peers wrote errors of their own (their collectives broke because
    it vanished); when those peers timed out waiting for it, it had hung (stopped making progress)
    and the launcher killed it. Otherwise the first learner that reported its own error is named;
    where that error is a non-finite value, a learner whose own loss was non-finite is named before
    the peers whose gradients it reached through the exchange (which of them reports first is a race).
    """
    reports = sorted((p for p in report_dir.glob("failed-rank-*.txt") if _first_line(p)),
                     key=lambda p: p.stat().st_mtime)
    for e in exits:
        if e.exitcode < 0 and e.exitcode != -15 and not e.message and not _first_line(report_path(report_dir, e.rank)):
            if reports and all(_TIMED_OUT.search(_first_line(p)) for p in reports):
                return (f"learner rank {e.rank} hung (no progress until its peers' timeout ran out: "
                        f"{_first_line(reports[0])}); the job was stopped")
            return f"learner rank {e.rank} died (killed by signal {-e.exitcode}); the job was stopped"
    if reports:
        first = _first_line(reports[0])
        if _NONFINITE.search(first):  # a peer's gradient had that learner's NaN through the exchange
            first = next((line for line in map(_first_line, reports) if _OWN_LOSS.search(line)), first)
        return first
    said = [e.message for e in exits if e.message] or _LEARNER_ERROR.findall(launcher_output)
    if said:  # no report file (a full disk): the line the learner recorded in its error file, or printed
        return said[0]
    if exits:
        return f"learner rank {exits[0].rank} failed (exit code {exits[0].exitcode}); the job was stopped"
    return f"learners failed (launcher exit code {rc}; see {report_dir / LOG_NAME})"


def _first_line(path: Path) -> str:
    """The first line of a learner's failure report; '' when it is missing or empty (a full disk)."""
    try:
        lines = path.read_text(errors="replace").strip().splitlines()
    except OSError:
        return ""
    return lines[0] if lines else ""
