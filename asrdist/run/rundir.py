"""What `asrdist train` may do to a run directory, and what it undoes.

- `check_resume`: a `--resume` is checked against the saved config and latest checkpoint before
  anything in the run directory is touched; each resume records `config-resume-K.yaml`.
- A start that fails before any checkpoint removes what it added, keeping the failure reports.
- `locked`: a command preparing or training a run holds its directory; a second is refused.
- `state.json` (`prepared`, `started`, `checkpointed`, `finished`, `failed`), rewritten
  atomically at each change, says what state the run is in; `describe` reads it. A damaged one
  (`state_problem`) is named by `--resume`, which counts the starts again (`counted_starts`).
Details: docs/reliability.md#run-directories-and-resume, docs/reliability.md#the-state-record-runstatejson."""
from __future__ import annotations

import contextlib
import fcntl
import json
import os
import re
import shutil
from pathlib import Path
from typing import Any, Iterator

import yaml

from asrdist.cluster.supervisor import LOG_NAME
from asrdist.config import RunConfig
from asrdist.data.bigram import LEGACY_NAME, PhoneBigram
from asrdist.errors import AsrdistError, ConfigError, DataError, Stopped, TrainingError
from asrdist.io.atomic import write_text_atomic
from asrdist.io.torch_data import load_data
from asrdist.run.summary import SUMMARY_NAME, RunSummary
from asrdist.train import checkpoint as ckpt
from asrdist.train.state import STATE_NAME, read_state, write_state
from asrdist.train.state import damage as state_damage

# The run directory's files (beside summary.json's SUMMARY_NAME, the checkpointer's CHECKPOINTS_DIR and the
# launcher's LOG_NAME).
CONFIG_NAME = "config.yaml"
TARGETS_NAME = "targets.pt"
MODEL_NAME = "model.pt"
ENV_NAME = "env.json"

# Settings a checkpoint can only be resumed with: its parameter shapes (model, input features,
# output classes), its optimizer state, its learners, and its samplers' saved positions.
RESUME_FIXED = (
    "model.name", "model.hidden_layers", "model.hidden_dim", "model.activation", "model.context",
    "model.chunk", "model.subsample", "model.conv_channels", "data.num_mel_bins", "data.cmvn", "data.targets", "data.tied_states",
    "optim.name", "optim.natural_gradient", "train.learners", "strategy.name", "data.batch_size",
    "data.window_utterances", "seed",
)

# What a failed start leaves behind on purpose: the reasons it failed.
REPORT_PATTERNS = ("failed-rank-*", "*.log")


def describe(run_dir: Path) -> str:
    """The run's state in a few words, for messages: from its record, else from its files."""
    record = read_state(run_dir)
    if record is None:
        if (run_dir / SUMMARY_NAME).is_file():
            return "finished"
        return "prepared, never started" if prepared_not_started(run_dir) else "started"
    what = record["state"]
    if what == "checkpointed":
        what += f" at {record.get('checkpoint')}"
        if record.get("epochs"):
            what += f" ({record.get('epoch')} of {record['epochs']} epochs done)"
    elif what == "failed" and record.get("reason"):
        what += f": {record['reason']}"
    return f"{what}, {record.get('since', '?')}"


def has_no_checkpoint(run_dir: Path) -> bool:
    """Whether the run holds no complete checkpoint: no `latest`, and no checkpoint directory a
    `latest` could be pointed at (one an interrupted first checkpoint left half-written is none)."""
    if (run_dir / ckpt.CHECKPOINTS_DIR / ckpt.LATEST_NAME).is_file():
        return False
    return not ckpt.complete_checkpoints(run_dir)


def _value(tree: dict, key: str):
    for part in key.split("."):
        tree = tree.get(part, {}) if isinstance(tree, dict) else {}
    return tree


def check_resume(cfg: RunConfig, run_dir: Path, saved: RunConfig) -> Path | None:
    """The checkpoint `cfg` resumes `run_dir` from, once `cfg` fits it (None: the run has none, it
    trains from the start); else one ConfigError or TrainingError line saying what to do. `saved`
    is the config the run last started with."""
    now, then = cfg.to_dict(), saved.to_dict()
    for key in RESUME_FIXED:
        if _value(now, key) != _value(then, key):
            hint = (f"resume with --learners {then['train']['learners']}" if key == "train.learners" else
                    f"resume with --strategy {then['strategy']['name']}" if key == "strategy.name" else
                    f"drop the override to resume with {key}={_value(then, key)!r}")
            raise ConfigError(f"{key}: {run_dir} was trained with {_value(then, key)!r}, this resume asks for "
                              f"{_value(now, key)!r}; a checkpoint resumes only with the settings it was made "
                              f"with: {hint}, or start a new run with --out")
    if has_no_checkpoint(run_dir):
        return None
    d = ckpt.check_resumable(run_dir, cfg.train.learners)
    check_not_older_than_final(run_dir, d)
    return d


def check_not_older_than_final(run_dir: Path, d: Path) -> None:
    """A resume from checkpoint `d` must not train again from before the run's final model (a
    checkpoint older than the end, as survival mode left them before asrdist published checkpoints
    from the survivors): its end would replace model.pt with a model of less training."""
    try:
        summary = RunSummary.read(run_dir)
    except (DataError, OSError):
        return
    kind, _, number = d.name.partition("-")
    done = len(summary.history) if kind == "epoch" else summary.steps or 0
    if number.isdigit() and int(number) < done:
        what = f"{done} epochs" if kind == "epoch" else f"{done} steps"
        raise TrainingError(f"{run_dir}: its latest checkpoint {d.name} is older than its final model (model.pt, "
                            f"{what} in summary.json); a resume would train again from there and replace "
                            f"model.pt; start a new run with --out")


def finished(run_dir: Path, cfg: RunConfig) -> bool:
    """Whether `run_dir` finished what `cfg` asks: its summary.json holds `train.epochs` epoch
    records, or `train.max_steps` (when set) steps."""
    try:
        summary = RunSummary.read(run_dir)
    except (DataError, OSError):
        return False
    max_steps = cfg.train.max_steps
    return len(summary.history) >= cfg.train.epochs or bool(max_steps and (summary.steps or 0) >= max_steps)


_RESUME_CONFIG = re.compile(r"^config-resume-(\d+)\.yaml$")


def resume_configs(run_dir: Path) -> dict[int, Path]:
    """K -> `config-resume-K.yaml` of every `--resume` the run has had."""
    found = {}
    for path in run_dir.glob("config-resume-*.yaml"):
        m = _RESUME_CONFIG.match(path.name)
        if m:
            found[int(m.group(1))] = path
    return found


def record_resume(cfg: RunConfig, run_dir: Path, overrides: list[str]) -> Path:
    """Write the next `config-resume-K.yaml` (K above every resume recorded so far): the resolved
    config, headed by a comment with the overrides and flags this resume was given."""
    path = run_dir / f"config-resume-{max(resume_configs(run_dir), default=0) + 1}.yaml"
    header = "# asrdist train --resume: " + (" ".join(overrides) if overrides else "no overrides") + "\n"
    write_text_atomic(path, header + yaml.safe_dump(cfg.to_dict(), sort_keys=False))
    return path


def is_report(path: Path) -> bool:
    """A file a failed start leaves on purpose (its learners' failure reports, the launcher's logs)."""
    return any(path.match(pattern) for pattern in REPORT_PATTERNS)


def _latest_name(run_dir: Path) -> str | None:
    pointer = run_dir / ckpt.CHECKPOINTS_DIR / ckpt.LATEST_NAME
    return pointer.read_text(errors="replace").strip() if pointer.is_file() else None


@contextlib.contextmanager
def undone_on_failure(run_dir: Path) -> Iterator[None]:
    """Run a start of `run_dir`; if it raises before a new checkpoint is published, remove every
    entry it added to the directory (failure reports excepted) and the directory itself if it
    made it and nothing is left. A failure after a checkpoint says how to resume."""
    existed = run_dir.is_dir()
    before = _entries(run_dir) if existed else set()
    latest = _latest_name(run_dir)
    state = _file_as_it_is(run_dir / STATE_NAME)
    try:
        yield
    except RunDirBusy:  # another command's directory: what is in it is that command's
        raise
    except BaseException as exc:
        now_latest = _latest_name(run_dir) if run_dir.is_dir() else None
        if now_latest == latest or now_latest is None:
            # nothing this start did stays, its state record included: the run is as it was
            with contextlib.suppress(OSError):
                _put_back(run_dir / STATE_NAME, state)
        elif (run_dir / STATE_NAME).is_file():
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            with contextlib.suppress(OSError):  # a full disk: the error line says why already
                write_state(run_dir, "failed", reason=reason[:300])
        kept_reports: list[str] = []
        if now_latest == latest or now_latest is None:
            for path in (_entries(run_dir) - before) if run_dir.is_dir() else ():
                if is_report(path):
                    kept_reports.append(path.name)
                    continue
                if path.is_dir() and not path.is_symlink():
                    shutil.rmtree(path, ignore_errors=True)
                else:
                    path.unlink(missing_ok=True)
            if not existed and run_dir.is_dir() and not any(run_dir.iterdir()):
                run_dir.rmdir()
        diverged = isinstance(exc, AsrdistError) and bool(_DIVERGED.search(str(exc)))
        if isinstance(exc, AsrdistError) and now_latest is not None and (now_latest != latest or diverged):
            # the last checkpoint stays (a diverged run's: the last one its losses were finite up to)
            lower = " with a lower optim.lr: its weights may already be diverging" if diverged else ""
            since = "" if now_latest != latest else ", from before this start"
            told = type(exc)(f"{exc} ({run_dir} keeps checkpoint {now_latest}{since}: continue it with "
                             f"`asrdist train --resume {run_dir}`{lower})")
            told.exit_code = exc.exit_code  # a stop by signal keeps its shell status
            raise told from None
        failures = sorted(name for name in kept_reports if name.startswith("failed-rank-"))
        if isinstance(exc, AsrdistError) and failures:  # say where the learners' reports stay
            told = type(exc)(f"{exc} (the learners' failure reports stay in {run_dir}: {', '.join(failures)})")
            told.exit_code = exc.exit_code
            raise told from None
        raise


_DIVERGED = re.compile(r"non-finite|loss is -?(nan|inf)\b|diverged")


def _file_as_it_is(path: Path) -> tuple[bytes, int, int] | None:
    """(content, atime, mtime in ns) of `path`, None when there is none."""
    try:
        st = path.stat()
        return path.read_bytes(), st.st_atime_ns, st.st_mtime_ns
    except OSError:
        return None


def _put_back(path: Path, kept: tuple[bytes, int, int] | None) -> None:
    """Make `path` what `_file_as_it_is` found (content and times); nothing when it found none
    (a file this start added goes with the start's other entries)."""
    if kept is None or _file_as_it_is(path) == kept:
        return
    content, atime, mtime = kept
    write_text_atomic(path, content.decode())
    os.utime(path, ns=(atime, mtime))


def _entries(run_dir: Path) -> set[Path]:
    """The run directory's entries, and those of its tensorboard/ (a failed resume adds an events
    file there)."""
    entries = set(run_dir.iterdir())
    board = run_dir / "tensorboard"
    return entries | set(board.iterdir()) if board.is_dir() else entries


class RunDirBusy(ConfigError):
    """The run directory is held (`locked`) by another asrdist command: nothing of it is this
    command's to undo."""


def busy_new_run(run_dir: Path) -> str:
    """The line for a new run (`--out`) in a directory another command holds."""
    return (f"{run_dir}: another asrdist command (train or prepare) is preparing or training a run in this "
            f"directory now; pick another --out")


@contextlib.contextmanager
def locked(run_dir: Path, busy: str | None = None) -> Iterator[None]:
    """Hold the run directory for this command (an advisory lock on the directory itself: no file
    is made, and the lock goes with the process however it ends), so that a second `asrdist train
    --resume` of a run still training is refused instead of training it twice over, and a second
    new run in it is told so (`busy`: its line)."""
    fd = os.open(run_dir, os.O_RDONLY | os.O_DIRECTORY)
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            raise RunDirBusy(busy or f"{run_dir}: another asrdist command is training this run now; resume it "
                             f"when that one has ended") from None
        yield
    finally:
        os.close(fd)


def held_elsewhere(run_dir: Path) -> bool:
    """Whether another process holds `run_dir` (`locked`): a command preparing or training it."""
    try:
        with locked(run_dir):
            return False
    except RunDirBusy:
        return True
    except OSError:  # not a directory, or not readable: the other checks say what it is
        return False




def run_config_path(run_dir: Path) -> Path:
    """The resolved config the run's latest start was made with, which its learners read:
    `config-resume-K.yaml` of the K-th (latest) `--resume`, else `config.yaml`. config.yaml is
    written once, by the first start, and never rewritten: it records what made the first steps."""
    resumes = resume_configs(run_dir)
    return resumes[max(resumes)] if resumes else run_dir / CONFIG_NAME


def prepared_not_started(run_dir: Path) -> bool:
    """Whether `run_dir` is as `asrdist prepare` left it: its state record says so, and no file of
    a start contradicts it (a run of an older asrdist: its config and targets, and no checkpoint,
    summary or log of any start)."""
    record = read_state(run_dir)
    if record is not None:
        return record["state"] == "prepared" and _trained_sign(run_dir) is None
    return ((run_dir / TARGETS_NAME).is_file() and (run_dir / CONFIG_NAME).is_file()
            and not any((run_dir / name).exists() for name in (ckpt.CHECKPOINTS_DIR, SUMMARY_NAME, LOG_NAME)))


def _trained_sign(run_dir: Path) -> str | None:
    """The first file showing that the run has trained (a checkpoint, its summary, its metrics, a
    resume's config record); None when there is none."""
    latest = run_dir / ckpt.CHECKPOINTS_DIR / ckpt.LATEST_NAME
    if latest.is_file():
        return str(latest)
    complete = ckpt.complete_checkpoints(run_dir) if (run_dir / ckpt.CHECKPOINTS_DIR).is_dir() else []
    if complete:
        return str(complete[0])
    for name in (SUMMARY_NAME, "metrics.jsonl"):
        if (run_dir / name).is_file():
            return str(run_dir / name)
    resumes = resume_configs(run_dir)
    return str(resumes[min(resumes)]) if resumes else None


def state_problem(run_dir: Path) -> str | None:
    """What is wrong with the run's state.json, in a few words (unreadable, or contradicted by the
    run's files); None when it is sound or there is none."""
    damage = state_damage(run_dir)
    if damage is not None:
        return damage
    record = read_state(run_dir)
    if record is not None and record["state"] == "prepared":
        sign = _trained_sign(run_dir)
        if sign is not None:
            return f"says 'prepared', but the run has trained ({sign})"
    return None


def counted_starts(run_dir: Path) -> int:
    """How many starts the run has had, counted from its config records: the first start's
    config.yaml (unless `asrdist prepare` wrote it: env.json's command) and one
    config-resume-K.yaml per `--resume` (a start counts itself once it has written its record)."""
    try:
        argv = json.loads((run_dir / ENV_NAME).read_text()).get("argv")
    except (OSError, ValueError, AttributeError):
        argv = None
    prepared = isinstance(argv, list) and len(argv) > 1 and argv[1] == "prepare"
    first = (run_dir / CONFIG_NAME).is_file() and not prepared
    return int(first) + len(resume_configs(run_dir))


def start_prepared_advice(run_dir: Path) -> str:
    return (f"{run_dir}: prepared by `asrdist prepare` and not started yet; start it on this machine with "
            f"`asrdist train --resume {run_dir}`, or under torchrun on every host: torchrun --nnodes A "
            f"--nproc-per-node B ... -m asrdist.run.worker {run_dir} (docs/clusters.md)")


def read_torch_file(path: Path, what: str) -> Any:
    """torch.load of a run's file as data (`load_data`), its damage (truncated, garbage, missing) or
    anything beyond tensors and plain data one DataError naming it."""
    try:
        return load_data(path, DataError, allowed=[(PhoneBigram, LEGACY_NAME)])  # an older targets.pt's bigram
    except FileNotFoundError:
        raise DataError(f"{path}: missing; is {path.parent} an asrdist run directory?") from None
    except (Stopped, DataError):  # a stop signal came meanwhile (not a damaged input); a refusal said
        raise
    except Exception as exc:  # a truncated or foreign file: torch raises many kinds
        detail = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
        raise DataError(f"{path}: not a readable {what} ({type(exc).__name__}: {detail})") from None
