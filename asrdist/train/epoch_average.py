"""Averaging the last epochs' models (`train.average_last`): the final model is the element-wise
mean of the models of the run's last N epochs, as speech toolkits end a run (ESPnet's average of
the last or best epoch snapshots, icefall's `--avg N`).

The last N-1 epochs' consensus models (CPU copies, kept only once the window starts) and the job's
final model are averaged in float64 (floating-point tensors; integer buffers are the final
model's). The kept models travel in every learner's checkpoint, so `--resume` averages the same.
Details: docs/training.md#averaging-the-last-epochs-models-trainaverage_last."""
from __future__ import annotations

from dataclasses import dataclass

import torch


def average_state_dicts(states: list[dict[str, torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The element-wise mean of `states` (same keys and shapes), on the CPU: floating-point tensors
    averaged in float64 and cast back to their dtype, the others (integer counters) from the last."""
    if not states:
        raise ValueError("average_state_dicts: no state dicts to average")
    last = states[-1]
    out: dict[str, torch.Tensor] = {}
    for key, value in last.items():
        if not value.is_floating_point():
            out[key] = value.detach().to("cpu", copy=True)
            continue
        total = torch.zeros(value.shape, dtype=torch.float64)
        for state in states:
            total += state[key].detach().to("cpu", torch.float64)
        out[key] = (total / len(states)).to(value.dtype)
    return out


def cpu_state(model: torch.nn.Module) -> dict[str, torch.Tensor]:
    """A CPU copy of `model`'s state dict, detached from the model it came from."""
    return {k: v.detach().to("cpu", copy=True) for k, v in model.state_dict().items()}


@dataclass
class Averaged:
    """The averaged final model: its state dict and the epochs (0-based) whose models it averages."""

    state: dict[str, torch.Tensor]
    epochs: list[int]


class EpochAverage:
    """One learner's window of the last epochs' models. `last`: train.average_last (1: off, nothing
    kept); `epochs`: the run's planned epochs (the window is its last min(last, epochs))."""

    def __init__(self, last: int, epochs: int):
        self.last, self.epochs = last, epochs
        self.kept: list[tuple[int, dict[str, torch.Tensor]]] = []

    def _in_window(self, epoch: int) -> bool:
        return self.last > 1 and epoch >= self.epochs - self.last

    def wants(self, epoch: int, final: bool) -> bool:
        """Whether the end of `epoch` keeps its model; the final epoch's never does (the job's
        final model stands for it, after `strategy.finalize()`)."""
        return self._in_window(epoch) and not final

    def add(self, epoch: int, model: torch.nn.Module) -> None:
        self.kept = [(e, s) for e, s in self.kept if e != epoch] + [(epoch, cpu_state(model))]

    def state_dict(self) -> dict:
        return {"last": self.last, "kept": [{"epoch": e, "model": s} for e, s in self.kept]}

    def load_state_dict(self, state: dict | None) -> None:
        """A checkpoint's window (None: one from before averaging existed: nothing kept). Models out
        of this run's window (a resume that changed train.epochs or average_last) are dropped."""
        kept = [] if state is None else [(int(k["epoch"]), k["model"]) for k in state["kept"]]
        self.kept = [(e, s) for e, s in kept if self._in_window(e)]

    def result(self, final_model: torch.nn.Module, final_epoch: int) -> Averaged | None:
        """The average of the kept models and `final_model` (the model after epoch `final_epoch`),
        or None when averaging is off or there is nothing to average it with (the final model is
        then the run's model, untouched)."""
        kept = [(e, s) for e, s in self.kept if e < final_epoch]
        if self.last <= 1 or not kept:
            return None
        states = [s for _, s in kept] + [cpu_state(final_model)]
        return Averaged(average_state_dicts(states), [e for e, _ in kept] + [final_epoch])
