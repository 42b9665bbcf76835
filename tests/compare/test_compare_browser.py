"""The comparison report in a real browser: headless Chromium (Debian's `chromium`) renders
report.html, and the screenshot and the DOM show the table and the embedded plots. Skipped when no
Chromium is installed (scripts/system_deps.sh installs it)."""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

from asrdist.compare.cli import compare
from tests.support.compare_fixture import CONFIG, TINY, fabricate_runs, make_corpus

BROWSER = next((shutil.which(n) for n in ("chromium", "chromium-browser") if shutil.which(n)), None)
WIDTH, HEIGHT = 1280, 1600
PLOT_BLUE = (31, 119, 180)  # matplotlib's first colour: the curves and bars
pytestmark = pytest.mark.slow  # starts a browser; test_compare.py checks the same page's HTML quickly


def _chromium(tmp_path: Path, *args: str) -> subprocess.CompletedProcess:
    cmd = [BROWSER, "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars", "--no-first-run",
           f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},{HEIGHT}", *args]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=180, check=True)


@pytest.mark.skipif(BROWSER is None, reason="no chromium installed (scripts/system_deps.sh installs it)")
def test_report_renders_in_headless_chromium(tmp_path):
    import numpy as np
    from PIL import Image

    corpus, out = make_corpus(tmp_path / "corpus"), tmp_path / "cmp"
    fabricate_runs(out, corpus, ["single", "sync", "onebit", "adpsgd"])
    compare(CONFIG, "single,sync,onebit,adpsgd", 2, out, corpus, TINY)
    url = (out / "report.html").resolve().as_uri()
    dom = _chromium(tmp_path, "--dump-dom", url).stdout
    assert "<title>asrdist compare: single, sync, onebit, adpsgd</title>" in dom
    # strategy, learners, seconds to the target (single's final PER), speed-up over single's 20 s, PER
    assert "<td>adpsgd</td><td>2</td><td>8.0</td><td>2.50x</td><td>0.2000</td>" in dom and dom.count("data:image/png;base64,") == 2
    shot = tmp_path / "report.png"
    _chromium(tmp_path, f"--screenshot={shot}", url)
    image = Image.open(shot).convert("RGB")
    assert image.size == (WIDTH, HEIGHT)
    pixels = np.asarray(image, dtype=np.int32).reshape(-1, 3)
    not_white = float(np.mean(pixels.sum(axis=1) < 3 * 235))
    plotted = int(np.sum(np.all(np.abs(pixels - PLOT_BLUE) <= 12, axis=1)))
    assert not_white > 0.02, not_white  # text, table and plots, not a blank page
    assert plotted > 500, plotted  # the embedded PNGs were decoded and drawn
