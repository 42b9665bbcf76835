"""The link microbenchmark's CPU per byte: the machine's busy CPU over back-to-back messages, less
its busy rate in a pause as long (asrdist.calibrate.link), read from /proc/stat (asrdist.utils.machine)."""
from __future__ import annotations

import os

import pytest

from asrdist.calibrate.link import machine_cpu_seconds_per_byte, measure_link
from asrdist.utils.machine import machine_busy_seconds, machine_steal_ticks, steal_share


def test_the_machine_busy_seconds_leave_out_idle_and_iowait(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal (ticks)
    stat.write_text("cpu  100 5 40 1000 30 1 20 4 0 0\ncpu0 50 2 20 500 15 0 10 2 0 0\n")
    assert machine_busy_seconds(str(stat)) == pytest.approx((100 + 5 + 40 + 1 + 20 + 4) / os.sysconf("SC_CLK_TCK"))


def test_the_steal_share_is_the_host_s_part_of_the_ticks_between_two_readings(tmp_path):
    stat = tmp_path / "stat"
    # user nice system idle iowait irq softirq steal
    stat.write_text("cpu  100 0 40 1000 0 0 20 40 0 0\n")
    before = machine_steal_ticks(str(stat))
    assert before == (40, 1200)
    stat.write_text("cpu  250 0 90 1200 0 0 20 140 0 0\n")
    assert steal_share(before, machine_steal_ticks(str(stat))) == pytest.approx(100 / 500)
    assert steal_share(before, before) is None and steal_share(None, before) is None
    assert machine_steal_ticks(str(tmp_path / "missing")) is None
    (tmp_path / "old").write_text("cpu  1 2 3 4\n")  # a kernel without the steal column
    assert machine_steal_ticks(str(tmp_path / "old")) is None


def test_no_machine_reading_without_a_cpu_line(tmp_path):
    assert machine_busy_seconds(str(tmp_path / "missing")) is None
    (tmp_path / "other").write_text("intr 1 2 3\n")
    assert machine_busy_seconds(str(tmp_path / "other")) is None


def test_the_pause_s_busy_rate_is_taken_off_per_message_and_byte():
    reading = {"messages": 10, "busy_seconds": 1.0, "seconds": 2.0, "pause_busy_seconds": 0.1, "pause_seconds": 1.0}
    # background over the messages' 2 s: 0.2 s; 0.8 s over 10 messages of 1e6 bytes sent and received
    assert machine_cpu_seconds_per_byte(reading, 1_000_000) == pytest.approx(0.8 / 10 / 2e6)
    busier_pause = dict(reading, pause_busy_seconds=1.0)
    # a pause as busy as the messages (other work on the machine): no machine figure, not a 0
    assert machine_cpu_seconds_per_byte(busier_pause, 1_000_000) is None
    assert machine_cpu_seconds_per_byte(dict(reading, pause_busy_seconds=0.2, seconds=1.0, busy_seconds=0.2),
                                        1_000_000) is None
    assert machine_cpu_seconds_per_byte(None, 1_000_000) is None
    assert machine_cpu_seconds_per_byte(dict(reading, pause_seconds=0.0), 1_000_000) is None


def test_dedicated_hosts_take_the_processes_cpu_per_byte_which_other_jobs_do_not_inflate():
    from asrdist.calibrate.microbench import link_cpu_per_byte
    link = {"cpu_seconds_per_byte": 3.5e-9, "machine_cpu_seconds_per_byte": 3.5e-9,  # beside another job
            "process_cpu_seconds_per_byte": 7.2e-10, "cpu_source": "machine"}
    assert link_cpu_per_byte(link, dedicated=False) == 3.5e-9  # shared cores: the kernel's work counts too
    assert link_cpu_per_byte(link, dedicated=True) == 7.2e-10  # a quota is charged its processes' CPU
    assert link_cpu_per_byte({"cpu_seconds_per_byte": 5e-10}, dedicated=True) == 5e-10
    assert link_cpu_per_byte({}, dedicated=True) == 0.0


@pytest.mark.slow
@pytest.mark.skipif(not os.path.exists("/proc/stat"), reason="the machine's CPU is read from /proc/stat")
def test_the_link_on_loopback_reports_the_machine_s_cpu_beside_the_processes():
    link = measure_link("loopback", 250_000, repeats=3, timeout=120)
    # the machine's figure where the messages stood out of its background, else the processes'
    source = link["cpu_source"]
    assert source == ("machine" if link["machine_cpu_seconds_per_byte"] is not None else "processes")
    figure = {"machine": "machine_cpu_seconds_per_byte", "processes": "process_cpu_seconds_per_byte"}[source]
    assert link["cpu_seconds_per_byte"] == link[figure] > 0
    assert link["process_cpu_seconds_per_byte"] > 0
    reading = link["machine_reading"]
    assert reading["messages"] >= 1 and reading["seconds"] > 0 and reading["pause_seconds"] > 0
    assert link["bytes"] == 1_000_000 and link["bytes_per_second"] > 0
    # the latency: half a one-value round trip, in seconds (not a count of round trips); on a loaded
    # machine it takes the scheduler's wake-ups and may exceed the megabyte's one-way median
    assert 0 < link["latency_seconds"] < 1.0
