"""Where the tests find the checkout and the data beside it, whichever folder a test lives in."""
from __future__ import annotations

from pathlib import Path

SUPPORT = Path(__file__).resolve().parent
"""tests/support: the helpers (and toy_strategy.py, which a test copies into a copy of the package)."""
TESTS = SUPPORT.parent
ROOT = TESTS.parent
"""The checkout: asrdist/, configs/, docs/, scripts/."""
PACKAGE = ROOT / "asrdist"
CONFIGS = ROOT / "configs"
DEFAULT_RECIPE = CONFIGS / "default.yaml"
SHARED_DATA = ROOT.parent / "shared" / "data"
"""The data shared beside the checkout (absent on a machine without it: the tests that read it skip)."""
FSDD = SHARED_DATA / "fsdd" / "recordings"
"""The Free Spoken Digit Dataset's recordings (`<digit>_<speaker>_<take>.wav`)."""
AN4 = SHARED_DATA / "an4"
