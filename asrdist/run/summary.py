"""summary.json, a finished run's record: `RunSummary`, its schema (`to_json` / `from_json`, written
by `write` only; rank 0 fills it at the run's end: `asrdist.run.finish`).

A record read is written back key for key (`_Record.keys`); a file from an earlier version, without
the keys added since, loads with their defaults. After `--resume` the summary accounts the whole
run (the checkpoints' loop state); `wall_seconds_last_start` and `starts` tell the last start apart.
"""
from __future__ import annotations

import json
from dataclasses import MISSING, dataclass, field, fields
from pathlib import Path
from typing import Any, ClassVar

from asrdist.cluster.cpushare import HostCpuUsage
from asrdist.cluster.launcher import WireCounters
from asrdist.errors import DataError
from asrdist.io.atomic import write_json_atomic
from asrdist.utils.contention import job_share

SUMMARY_NAME = "summary.json"
ERROR_KEYS = ("frame_accuracy", "per", "cer", "wer", "sentence_accuracy")


@dataclass(kw_only=True)
class _Record:
    """A JSON object of summary.json: typed fields, the keys this version does not type (`extra`),
    and the order its keys were read in (`keys`), so that what is read is written back as it was
    (with the fields set since, after its keys). A record made here writes every typed field but
    those in `OPTIONAL` left None."""

    extra: dict[str, Any] = field(default_factory=dict)
    keys: tuple[str, ...] = field(default=(), repr=False, compare=False)
    NESTED: ClassVar[dict[str, Any]] = {}
    """field -> how its JSON loads (a function of the value)."""
    OPTIONAL: ClassVar[tuple[str, ...]] = ()

    @classmethod
    def _typed(cls) -> list[str]:
        return [f.name for f in fields(cls) if f.name not in ("extra", "keys")]

    @classmethod
    def from_json(cls, data: dict[str, Any]):
        typed = cls._typed()
        values = {k: cls.NESTED[k](v) if k in cls.NESTED and v is not None else v
                  for k, v in data.items() if k in typed}
        return cls(**values, extra={k: v for k, v in data.items() if k not in typed}, keys=tuple(data))

    def to_json(self) -> dict[str, Any]:
        typed = {f.name: f for f in fields(self) if f.name not in ("extra", "keys")}
        out: dict[str, Any] = {}
        for key in (*self.keys, *self._typed(), *self.extra):
            if key in out:
                continue
            if key in typed:
                value = getattr(self, key)
                if key not in self.keys and (value == _default(typed[key]) if self.keys else
                                             value is None and key in self.OPTIONAL):
                    continue  # a key the file did not have and still has no news for, or not given
                out[key] = _json(value)
            elif key in self.extra:
                out[key] = self.extra[key]
        return out


def _default(f) -> Any:
    return f.default_factory() if f.default is MISSING and f.default_factory is not MISSING else f.default


def _json(value: Any) -> Any:
    if isinstance(value, list):
        return [_json(v) for v in value]
    return value.to_json() if hasattr(value, "to_json") else value


def _records(cls):
    return lambda items: [cls.from_json(x) for x in items]


@dataclass(kw_only=True)
class Figures(_Record):
    """A model's validation figures (`final.unaveraged`: the last epoch's model alone)."""

    valid_loss: float | None = None
    frame_accuracy: float | None = None
    per: float | None = None
    cer: float | None = None
    wer: float | None = None
    sentence_accuracy: float | None = None
    OPTIONAL = ERROR_KEYS

    def error_rate(self, metrics: tuple[str, ...]) -> tuple[str | None, float | None]:
        """The first of `metrics` these figures hold, and its value."""
        name = next((m for m in metrics if getattr(self, m) is not None), None)
        return name, getattr(self, name) if name else None

    def floats(self) -> dict[str, float]:
        """The figures that are numbers, in summary.json's order (what `asrdist train` prints)."""
        return {k: v for k, v in self.to_json().items() if isinstance(v, float)}


@dataclass(kw_only=True)
class FinalFigures(Figures):
    """`final`: the figures of model.pt, the average of the last epochs' models where
    `train.average_last` made one (`averaged_epochs`, numbered from 1; `unaveraged`: the model alone)."""

    train_loss: float | None = None
    averaged_epochs: list[int] | None = None
    unaveraged: Figures | None = None
    NESTED = {"unaveraged": Figures.from_json}
    OPTIONAL = (*ERROR_KEYS, "averaged_epochs", "unaveraged")

    @classmethod
    def _typed(cls) -> list[str]:  # train_loss leads, as the learner wrote it
        return ["train_loss", *(k for k in super()._typed() if k != "train_loss")]


@dataclass(kw_only=True)
class EpochRecord(Figures):
    """One entry of `history`: an epoch's end (`wall_seconds`: the job's time to it), its
    validation's figures where it validated, and the trainer's and strategy's own keys (`extra`)."""

    epoch: int = 0
    train_loss: float | None = None
    wall_seconds: float | None = None
    consensus_distance: float | None = None
    OPTIONAL = ("valid_loss", *ERROR_KEYS, "wall_seconds", "consensus_distance")


@dataclass(kw_only=True)
class ValidationRecord(Figures):
    """One entry of `validations` (`train.validate_every`): a validation within an epoch or at its
    end, where it fell (`epoch_progress`: epochs done) and when (`wall_seconds`: the job's time to
    it, `validation_seconds` of which the leader had spent validating before it)."""

    epoch: int = 0
    step: int = 0
    epoch_progress: float = 0.0
    wall_seconds: float | None = None
    validation_seconds: float | None = None
    consensus_distance: float | None = None
    OPTIONAL = ("valid_loss", *ERROR_KEYS, "validation_seconds", "consensus_distance")

    @property
    def training_seconds(self) -> float | None:
        """Wall seconds to it less the validating before it: the training's own time."""
        return None if self.wall_seconds is None else self.wall_seconds - (self.validation_seconds or 0.0)


@dataclass(kw_only=True)
class LearnerFigures(_Record):
    """One learner's figures (`comm.per_learner`); its strategy's other counters are in `extra`."""

    rank: int = 0
    device: str | None = None
    steps: int | None = None
    frames: int = 0
    train_seconds: float = 0.0
    loop_seconds: float | None = None
    compute_seconds: float | None = None
    skipped_nonfinite: int | None = None
    steal_share: float | None = None
    bytes_sent: int = 0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    cpu_seconds: float | None = None
    """CPU it received while it trained this start (`asrdist.utils.contention`)."""
    cpu_wait_seconds: float | None = None
    """Its threads' time ready to run but waiting for a core, meanwhile (None: no schedstat)."""
    cpu_wall_seconds: float | None = None
    OPTIONAL = ("device", "steps", "loop_seconds", "compute_seconds", "skipped_nonfinite", "steal_share",
                "cpu_seconds", "cpu_wait_seconds", "cpu_wall_seconds")

    def cpu_figures(self) -> tuple[float | None, float | None, float | None]:
        """(CPU s received, run-queue wait s, wall s): what `contention.job_share` takes."""
        return self.cpu_seconds, self.cpu_wait_seconds, self.cpu_wall_seconds

    @property
    def stepping_seconds(self) -> float:
        """Its training loop's seconds (`train_seconds` in a summary from before `loop_seconds`)."""
        return self.loop_seconds or self.train_seconds


@dataclass(kw_only=True)
class CommTotals(_Record):
    """`comm`: bytes all learners sent, their mean seconds communicating and waiting, and each one's."""

    bytes_sent: int = 0
    comm_seconds: float = 0.0
    wait_seconds: float = 0.0
    per_learner: list[LearnerFigures] = field(default_factory=list)
    NESTED = {"per_learner": _records(LearnerFigures)}


@dataclass(kw_only=True)
class LostLearner(_Record):
    """A learner the job went on without: its rank, its last step, why, and who said so."""

    rank: int = 0
    step: int | None = None
    reason: str = ""
    by: str | None = None
    OPTIONAL = ("by",)


@dataclass(frozen=True)
class DedicatedHosts:
    """The hosts of a run on dedicated CPU shares (`--cpus-per-host`): each host's quota and
    cgroup counters, the share asked, how stragglers were slowed, and the CPU outside the hosts."""

    hosts: list[HostCpuUsage]
    cpus_per_host: float
    straggler_emulation: str | None
    outside_hosts: dict[str, Any]

    KEYS: ClassVar[tuple[str, ...]] = ("hosts", "cpus_per_host", "straggler_emulation", "outside_hosts")

    def to_json(self) -> dict[str, Any]:
        return {"hosts": [h.as_dict() for h in self.hosts], "cpus_per_host": self.cpus_per_host,
                "straggler_emulation": self.straggler_emulation, "outside_hosts": self.outside_hosts}

    @classmethod
    def from_json(cls, data: dict[str, Any]) -> "DedicatedHosts":
        return cls([HostCpuUsage(**h) for h in data["hosts"]], data.get("cpus_per_host"),
                   data.get("straggler_emulation"), data.get("outside_hosts") or {})


_REQUIRED = ("strategy", "learners", "final", "frames_per_second", "wall_seconds", "comm")
_REQUIRED_COMM = ("bytes_sent", "comm_seconds", "wait_seconds")


@dataclass(kw_only=True)
class RunSummary(_Record):
    """summary.json. Defaults are what a summary from before a key was added meant: one host on
    loopback, one start, no lost learner, no skipped step, no steal measured."""

    strategy: str
    learners: int
    """Learners the job started with (those that finished, and `lost_learners`)."""
    lost_learners: list[LostLearner] = field(default_factory=list)
    cores: int | None = None
    threads_per_learner: int | None = None
    nodes: int = 1
    network: str | None = "loopback"
    """The link between the hosts (`loopback` on one machine; None where another launcher ran it)."""
    model: str | None = None
    parameters: int | None = None
    epochs: int | None = None
    steps: int | None = None
    train_frames: int | None = None
    frames_per_second: float
    skipped_nonfinite: int = 0
    wall_seconds: float
    wall_seconds_last_start: float | None = None
    steal_share: float | None = None
    starts: int = 1
    final: FinalFigures
    comm: CommTotals
    history: list[EpochRecord] = field(default_factory=list)
    validations: list[ValidationRecord] | None = None
    """Every validation, within epochs and at their ends, in order (`train.validate_every`; None: off)."""
    wire: WireCounters | None = None
    """What the emulated hosts' NICs sent (`asrdist train --nodes` on an emulated network)."""
    dedicated: DedicatedHosts | None = None
    load: dict[str, Any] | None = None
    """The machine's 1-minute load average when the training started and ended (`start`, `end`),
    and its `cores`."""
    cpu_share: float | None = None
    """The CPU the learners received / their entitlement (`asrdist.utils.contention`), this start."""
    contended: bool | None = None
    """`cpu_share` under `contention.CONTENDED_SHARE`: another job took cores the run would have had."""
    cpu_received: dict[str, Any] | None = None
    """The figures behind `cpu_share` (`contention.CpuShare.as_dict`)."""
    gossip: dict[str, Any] | None = None
    """A gossiping job's exchanges this start and the spectral gap of their mixing (`asrdist.run.gossip`)."""
    NESTED = {"lost_learners": _records(LostLearner), "final": FinalFigures.from_json, "comm": CommTotals.from_json,
              "history": _records(EpochRecord), "validations": _records(ValidationRecord),
              "wire": WireCounters.from_json}
    OPTIONAL = ("validations", "wire", "dedicated", "load", "cpu_share", "contended", "cpu_received", "gossip")

    @classmethod
    def from_json(cls, data: Any, where: str = SUMMARY_NAME) -> "RunSummary":
        """Raises DataError naming `where` when `data` lacks a key every summary has had."""
        data = data if isinstance(data, dict) else {}
        comm = data.get("comm") if isinstance(data.get("comm"), dict) else {}
        missing = [k for k in _REQUIRED if k not in data] + [f"comm.{k}" for k in _REQUIRED_COMM if k not in comm]
        missing += [] if isinstance(data.get("final"), dict) else ["final"]
        if missing:
            raise DataError(f"{where}: not an asrdist summary (no '{missing[0]}')")
        hosts = {k: data[k] for k in DedicatedHosts.KEYS if k in data}
        rest = {k: v for k, v in data.items() if k not in hosts}
        summary = super().from_json(rest)
        if hosts.get("hosts") is not None:
            summary.dedicated = DedicatedHosts.from_json(hosts)
        else:
            summary.extra.update(hosts)
        return summary

    def to_json(self) -> dict[str, Any]:
        out = super().to_json()
        dedicated = out.pop("dedicated", None)
        return {**out, **(dedicated or {})}

    @classmethod
    def read(cls, run_dir: Path) -> "RunSummary":
        """RUN_DIR/summary.json; one DataError line when it is missing or not a summary."""
        path = Path(run_dir) / SUMMARY_NAME
        if Path(run_dir).exists() and not Path(run_dir).is_dir():
            raise DataError(f"{run_dir}: not a run directory (give the directory that holds summary.json)")
        try:
            data = json.loads(path.read_text())
        except FileNotFoundError:
            raise DataError(f"{path}: missing; is {run_dir} a finished asrdist run?") from None
        except json.JSONDecodeError as exc:
            raise DataError(f"{path}: not JSON ({exc})") from None
        return cls.from_json(data, str(path))

    def epoch_numbers(self) -> list[int]:
        """`history`'s epochs numbered from 1, as runs number them since 2026-12; an older summary,
        read and written back as it was, numbered them from 0 (its first says 0)."""
        shift = 1 if self.history and self.history[0].epoch == 0 else 0
        return [r.epoch + shift for r in self.history]

    def write(self, run_dir: Path) -> None:
        """The one writer of summary.json (whole or not at all): it marks the run finished."""
        write_json_atomic(Path(run_dir) / SUMMARY_NAME, self.to_json())

    def stepping_seconds(self) -> list[float]:
        return [p.stepping_seconds for p in self.comm.per_learner]

    def set_cpu_share(self, cores_per_learner: list[float]) -> None:
        """`cpu_share`, `contended` and `cpu_received` from the learners' own figures, each entitled
        to its `cores_per_learner` (by rank); left None where a learner has no reading."""
        learners = sorted(self.comm.per_learner, key=lambda p: p.rank)
        share = job_share([p.cpu_figures() for p in learners], [cores_per_learner[p.rank] for p in learners])
        if share is not None and share.share is not None:
            self.cpu_share, self.contended = round(share.share, 4), share.contended
            self.cpu_received = share.as_dict()

