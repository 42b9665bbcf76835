"""`python -m asrdist.calibrate.quota`: the check that a host's step takes its 1-core time / quota
times its steps in a child alone and in a cgroup per quota, the child inside that group."""
from __future__ import annotations

import pytest

from asrdist.calibrate import quota
from asrdist.cluster import cpushare


@pytest.mark.slow
def test_the_timing_child_runs_inside_each_quotas_group():
    ok, why = cpushare.available()
    if not ok:
        pytest.skip(f"dedicated CPU shares unavailable: {why}")
    result = quota.measure([0.5], steps=2, frames=8)
    row, = result["quotas"]
    assert result["one_core"]["parameters"] > 1_000_000  # the default recipe's DNN
    assert row["quota"] == 0.5 and row["step_seconds"] > 0 and row["cpu_seconds_per_step"] > 0
    assert row["group_cpu_seconds"] > 0  # the child's CPU was counted by its host's group
    assert row["predicted_step_seconds"] == pytest.approx(2 * result["one_core"]["step_seconds"])
    assert set(result["load_average"]) == {"before", "after"}
