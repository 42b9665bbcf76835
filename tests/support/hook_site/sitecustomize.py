"""Faults and shortcuts a slow test installs in the processes of the command it starts (the test puts
this directory first on PYTHONPATH; then the sitecustomize this file hides runs, if there is one):
- ASRDIST_TEST_NAN_FILE and ASRDIST_TEST_NAN_RANKS: learners of those ranks (RANK) see their loss
  become NaN from the first step after the file exists (tests/parallel/test_survivors_diverge.py);
- ASRDIST_TEST_NO_CALIBRATION: `asrdist compare` times no learner (its runs are not calibrated), so
  that a test of what compare does with its runs does not wait for the microbenchmarks
  (tests/compare/test_compare_faults.py)."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _no_calibration() -> None:
    if not os.environ.get("ASRDIST_TEST_NO_CALIBRATION"):
        return
    from asrdist.calibrate import microbench
    from asrdist.errors import AsrdistError

    def calibrate_run(name, cfg, nodes, network, when):
        raise AsrdistError("not timed in this test (ASRDIST_TEST_NO_CALIBRATION)")
    microbench.calibrate_run = calibrate_run


def _nan() -> None:
    flag, ranks = os.environ.get("ASRDIST_TEST_NAN_FILE"), os.environ.get("ASRDIST_TEST_NAN_RANKS", "")
    if not flag or os.environ.get("RANK") not in ranks.split(","):
        return
    import math

    from asrdist.train import step

    run = step.Stepper.run

    class _Poisoned:
        def __init__(self, hooks):
            self._hooks = hooks

        def __getattr__(self, name):
            return getattr(self._hooks, name)

        def loss_fn(self, model, batch):
            loss, frames = self._hooks.loss_fn(model, batch)
            return loss * math.nan, frames

    def poisoned_run(self, batch, loop, metrics=None):
        if os.path.exists(flag) and not isinstance(self.hooks, _Poisoned):
            self.hooks = _Poisoned(self.hooks)
        return run(self, batch, loop, metrics)

    step.Stepper.run = poisoned_run


def _chain() -> None:
    """Import the sitecustomize module that this one shadows (a distribution's own), if any."""
    import importlib.machinery
    import importlib.util

    others = [p for p in sys.path if os.path.abspath(p or os.curdir) != _HERE]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is None or spec.loader is None:
        return
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)


_nan()
_no_calibration()
_chain()
