"""The epoch progress display: a bar on a terminal, plain lines to a log (asrdist.train.progress)."""
from __future__ import annotations

import io
import re

from asrdist.train.progress import PLAIN_STEPS, EpochProgress, format_seconds

LINE = re.compile(r"^\[asrdist\] epoch 2/5: (\d+)/40 minibatches \((\d+)%\), loss ([0-9.]+), ([0-9,]+) frames/s, "
                  r"\d+:\d\d elapsed, ETA (\d+:\d\d|-)$")


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


def test_plain_lines_at_each_tenth_of_the_epoch():
    log = io.StringIO()
    shown = EpochProgress(1, 5, total=40, terminal=None, plain=log)
    for done in range(1, 41):
        shown.update(done, frames=100, loss=2.0 - done / 40)
    shown.close()
    lines = log.getvalue().splitlines()
    assert len(lines) == PLAIN_STEPS
    parsed = [LINE.match(line) for line in lines]
    assert all(parsed), lines
    assert [int(m.group(1)) for m in parsed] == list(range(4, 41, 4))
    assert [int(m.group(2)) for m in parsed] == list(range(10, 101, 10))
    assert float(parsed[-1].group(3)) == 1.0  # the loss given with the last minibatch
    assert parsed[-1].group(5) == "0:00"  # nothing left of the epoch


def test_a_resumed_epoch_counts_from_its_position_and_reports_the_job_rate():
    log = io.StringIO()
    shown = EpochProgress(1, 5, total=40, start=30, terminal=None, plain=log)
    shown.window_rate(1234.0)
    for done in range(31, 41):
        shown.update(done, frames=10, loss=0.5)
    lines = log.getvalue().splitlines()
    assert [LINE.match(line).group(1) for line in lines] == ["32", "36", "40"]
    assert all(LINE.match(line).group(4) == "1,234" for line in lines)


def test_a_terminal_gets_a_bar_and_no_plain_lines():
    term, log = _Terminal(), io.StringIO()
    shown = EpochProgress(1, 5, total=40, terminal=term, plain=log)
    for done in range(1, 41):
        shown.update(done, frames=100, loss=0.25)
    shown.bar.refresh()  # tqdm redraws at most every 0.1 s: this loop takes less
    shown.close()
    assert log.getvalue() == ""
    drawn = term.getvalue()
    assert "epoch 2/5" in drawn and "40/40" in drawn and "loss=0.2500" in drawn and "frames/s" in drawn
    assert "\r" in drawn  # redrawn in place


def test_disabled_shows_nothing():
    term, log = _Terminal(), io.StringIO()
    shown = EpochProgress(0, 1, total=10, enabled=False, terminal=term, plain=log)
    for done in range(1, 11):
        shown.update(done, frames=1, loss=1.0)
    shown.close()
    assert term.getvalue() == "" and log.getvalue() == ""


def test_format_seconds():
    assert format_seconds(0) == "0:00"
    assert format_seconds(83.4) == "1:23"
    assert format_seconds(3 * 3600 + 61) == "3:01:01"
