"""Automatic minibatch-size search at an epoch start (Seide et al. 2014; CNTK's
`SGD::SearchForBestMinibatchSize`; DESIGN.md §5.2).

1. Trial sizes: from the larger of `base_size` and half the previous epoch's size, x sqrt(2)^k
   rounded to multiples of 64, up to 2 x the previous epoch's size (CNTK's AdaptiveMinibatchSizing).
2. Each trial restores the epoch-start state and trains the same budget of frames at its size
   (`train_minibatches(size) -> loss`, `EpochStartTrials`); the search only chooses.
3. Trials go on while a loss stays <= 1.01 x the first trial's; the first above it ends the search.
4. The result is the largest size that passed.
In full: docs/optimizers.md#the-minibatch-size-search-optimbatch_searchpy."""
from __future__ import annotations

import copy
import math
from typing import Any, Callable, Iterable

from asrdist.errors import ConfigError, TrainingError

GROWTH = math.sqrt(2.0)
MULTIPLE = 64
TOLERANCE = 1.01
MAX_GROWTH = 2.0


def check_search_sizes(batch_size: int, learners: int) -> None:
    """The search's trial sizes are multiples of MULTIPLE split evenly over the learners."""
    if batch_size % MULTIPLE or MULTIPLE % learners:
        raise ConfigError(f"strategy.auto_batch_size: needs data.batch_size a multiple of {MULTIPLE} (got "
                          f"{batch_size}) and train.learners dividing {MULTIPLE} (got {learners})")


def round_to_multiple(value: float, multiple: int = MULTIPLE) -> int:
    """Nearest multiple of `multiple` (halves round up), at least `multiple` (CNTK: 64 * ((v + 32) // 64))."""
    return max(multiple, multiple * int((value + multiple / 2) // multiple))


def trial_sizes(base_size: int, previous_size: int | None = None, *, growth: float = GROWTH,
                multiple: int = MULTIPLE, max_growth: float = MAX_GROWTH) -> list[int]:
    """The minibatch sizes the search tries, in order (step 1 of the module docstring). As CNTK
    (SGD.cpp, `AdaptiveMinibatchSizing`: minMinibatchSize = max(initial, previous / 2),
    maxMinibatchSize = min(tuning max, previous x 2)), an epoch's search starts from the previous
    epoch's choice, not from the configured size; the first size is always tried."""
    _check_size("base_size", base_size, multiple)
    previous = base_size if previous_size is None else previous_size
    _check_size("previous_size", previous, 1)
    if not growth > 1 or not max_growth >= 1:
        raise ConfigError(f"batch-size search: growth must be > 1 and max_growth >= 1, got {growth}, {max_growth}")
    limit = max_growth * previous
    lowest = max(base_size, previous / max_growth)
    sizes = [round_to_multiple(lowest, multiple)]
    k = 1
    while True:
        target = lowest * growth ** k
        if target > limit * (1 + 1e-9):  # 1e-9: base * sqrt(2)^2 must count as exactly 2 x base
            return sizes
        size = round_to_multiple(target, multiple)
        if size > sizes[-1] and size <= limit:
            sizes.append(size)
        k += 1


def search_batch_size(train_minibatches: Callable[[int], float], base_size: int,
                      previous_size: int | None = None, *, tolerance: float = TOLERANCE,
                      growth: float = GROWTH, multiple: int = MULTIPLE, max_growth: float = MAX_GROWTH,
                      log: list[tuple[int, float]] | None = None) -> int:
    """The largest trial size whose loss is <= tolerance x the base size's loss (module docstring).

    train_minibatches(size): restore the epoch-start state, train the fixed number of minibatches
    at `size`, return their mean loss. `log`, if given, receives (size, loss) of every trial.
    """
    if not tolerance >= 1:
        raise ConfigError(f"batch-size search: tolerance must be >= 1, got {tolerance}")
    sizes = trial_sizes(base_size, previous_size, growth=growth, multiple=multiple, max_growth=max_growth)
    base_loss = float(train_minibatches(sizes[0]))
    if log is not None:
        log.append((sizes[0], base_loss))
    if not math.isfinite(base_loss):
        raise TrainingError(f"batch-size search: loss {base_loss} at the base size {sizes[0]}; "
                            f"lower optim.lr or check the data")
    chosen = sizes[0]
    for size in sizes[1:]:
        loss = float(train_minibatches(size))
        if log is not None:
            log.append((size, loss))
        if not math.isfinite(loss) or loss > tolerance * base_loss:
            break
        chosen = size
    return chosen


def _check_size(name: str, value: object, multiple: int) -> None:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1 or value % multiple:
        raise ConfigError(f"batch-size search: {name} must be a positive multiple of {multiple}, got {value!r}")


class EpochStartTrials:
    """`train_minibatches` for a live learner: snapshot the epoch-start state once, then per
    trial size restore it and train `minibatches_at(size)` minibatches through the trainer's own
    step: `frames` (global, all learners together) at every size. The count is computed from the
    nominal sizes, so every learner of a lock-step strategy takes the same number of steps.

    train_step(batch) -> (loss, frames): `Trainer.train_step`. batches_at(size): this learner's
    minibatches of the epoch at global size `size` (a sampler built for size // learners, set to
    the epoch). save_state() / load_state(state): everything a trial changes (model, optimizer,
    strategy residuals, RNG), e.g. the trainer's checkpoint dict. agree(loss): the loss all
    learners decide on (a mean over learners; identity for one learner), so they all choose the
    same size.
    """

    def __init__(self, train_step: Callable[[Any], tuple[float, int]], batches_at: Callable[[int], Iterable[Any]],
                 save_state: Callable[[], Any], load_state: Callable[[Any], None], frames: int,
                 agree: Callable[[float], float] = lambda loss: loss):
        if isinstance(frames, bool) or not isinstance(frames, int) or frames < 1:
            raise ConfigError(f"batch-size search: the frames of a trial must be an integer >= 1, got {frames!r}")
        self.train_step, self.batches_at, self.load_state = train_step, batches_at, load_state
        self.frames, self.agree = frames, agree
        self._snapshot = copy.deepcopy(save_state())  # trials must not write into it

    def restore(self) -> None:
        """Put the learner back exactly at the epoch start (call after the search)."""
        # a copy each time: optimizers may keep the loaded tensors and update them in place
        self.load_state(copy.deepcopy(self._snapshot))

    def minibatches_at(self, size: int) -> int:
        """The minibatches of global size `size` that make up the trial's frames (at least one)."""
        return max(1, round(self.frames / size)) if size > 0 else 1

    def __call__(self, size: int) -> float:
        self.restore()
        loss_sum, frames_sum, done = 0.0, 0, 0
        wanted = self.minibatches_at(size)
        for batch in self.batches_at(size):
            if done == wanted:
                break
            loss, frames = self.train_step(batch)
            loss_sum += loss * frames
            frames_sum += frames
            done += 1
        if frames_sum == 0:
            raise TrainingError(f"batch-size search: the epoch has no minibatch of size {size}")
        return float(self.agree(loss_sum / frames_sum))
