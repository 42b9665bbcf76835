"""Installs the quick-loop guard (tests/support/quick_loop_guard.py) in a Python process that a test not
marked slow started, directly or through other processes: tests/conftest.py puts this directory first on
PYTHONPATH and names the refusals file in ASRDIST_QUICK_LOOP_GUARD. Then runs the sitecustomize
this file hides, if the interpreter has one."""
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))


def _install() -> None:
    path = os.environ.get("ASRDIST_QUICK_LOOP_GUARD")
    if not path:
        return
    sys.path.insert(0, os.path.dirname(_HERE))
    try:
        import quick_loop_guard
    finally:
        sys.path.remove(os.path.dirname(_HERE))

    class _Patch:  # the guard lives as long as this process: nothing to undo
        setattr = staticmethod(setattr)

    def report(message: str) -> None:
        with open(path, "a") as out:
            out.write(f"{message} [in process {os.getpid()}: {' '.join(sys.argv)[:200]}]\n")

    quick_loop_guard.install(_Patch, report, torch_too=False)


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


_install()
_chain()
