"""The shared cores' microbenchmarks (`asrdist.calibrate.lockstep`: the lock-step wait, a collective's cost
per message, ADPSGD's answer delay)
and how the simulator's calibration carries them: learners launched as a run's are, nothing read
from any run."""
from __future__ import annotations

import dataclasses
import math

import pytest

from asrdist.errors import ConfigError
from asrdist.sim.calibration import Microbenchmarks, calibrate
from asrdist.calibrate.lockstep import COLLECTIVE_VALUES, measure_waits

MICRO = Microbenchmarks(2, {"1x2": 1e-4, "2x1": 2e-4}, {"1x2": 0.1, "2x1": 0.1}, 10_000.0, 1e-9, 1e-9, 1e-9, 1e-9,
                        lockstep_wait_seconds=0.004)


@pytest.mark.slow
def test_two_learners_time_an_allreduce_after_compute_and_back_to_back():
    waits = measure_waits("loopback", 2, 1, 0.002, timeout=120, rounds=6)
    r = waits["lockstep"]
    assert waits["claim"]["seconds"] > 0 and waits["claim"]["learners"] == 2  # the store's round trips
    assert waits["answer"] == {}  # no model's values: no exchanges
    assert r["learners"] == 2 and r["threads"] == 1 and r["rounds"] == 6 and r["products"] >= 1
    assert r["after_compute_seconds"] > 0 and r["bare_seconds"] > 0
    # the wait is the difference, never negative (a back-to-back wait can exceed the other by chance)
    assert r["wait_seconds"] == pytest.approx(max(0.0, r["after_compute_seconds"] - r["bare_seconds"]))
    collective = waits["collective"]  # gloo's ring on a bucket-like tensor, its wall and its CPU
    assert collective["values"] == COLLECTIVE_VALUES and collective["learners"] == 2
    assert collective["seconds"] > 0 and 0 < collective["cpu_seconds"] < 1


def test_a_collectives_messages_take_its_time_and_the_cpu_its_bytes_leave_unexplained():
    link = dict(link_bytes_per_second=1e9, link_duplex=0.5, link_latency_seconds=1e-4,
                link_cpu_seconds_per_byte=1e-10)
    micro = dataclasses.replace(MICRO, **link, collective_seconds=0.006, collective_cpu_seconds=0.002,
                                collective_values=16384, step_seconds_per_frame={"1x2": 1e-4, "4x1": 4e-4},
                                epoch_end_seconds={"1x2": 0.1, "4x1": 0.1})
    sent = 2 * 3 * 4 * 16384 / 4  # a ring allreduce of 4 learners: 2(n-1)/n of the bytes
    cpu = 1e-10 * 2 * sent  # what the link's CPU per byte charges for them
    many = calibrate(micro, 4, "sync")
    assert many.collective_step_seconds == pytest.approx(0.006 / 6)  # the least time of a message
    assert many.collective_step_cpu == pytest.approx((0.002 - cpu) / 6)
    assert "allreduce of 16384 values back to back" in many.sources["collective_step"]
    lone = calibrate(micro, 1, "sync")
    assert lone.collective_step_seconds == lone.collective_step_cpu == 0.0
    # CPU the bytes explain whole costs nothing more (never negative)
    assert calibrate(dataclasses.replace(micro, collective_cpu_seconds=cpu / 2), 4).collective_step_cpu == 0.0
    unmeasured = dataclasses.replace(micro, collective_seconds=0.0, collective_cpu_seconds=0.0, collective_values=0)
    assert calibrate(unmeasured, 4).collective_step_seconds == 0.0  # not measured: not modelled


@pytest.mark.parametrize("field, bad", [("collective_seconds", -0.001), ("collective_cpu_seconds", 1.0),
                                        ("collective_seconds", math.nan), ("collective_values", -1)])
def test_a_collective_out_of_range_is_refused(field, bad):
    with pytest.raises(ConfigError, match="collective"):
        dataclasses.replace(MICRO, **{field: bad})


def test_a_run_of_several_learners_is_given_the_wait_and_a_lone_learner_is_not():
    many = calibrate(MICRO, 2, "sync")
    assert many.lockstep_wait_seconds == 0.004
    assert "allreduce after a stand-in for one step's compute" in many.sources["lockstep_wait_seconds"]
    assert calibrate(MICRO, 1, "sync").lockstep_wait_seconds == 0.0


@pytest.mark.parametrize("bad", [-0.001, 1.0, math.nan])
def test_a_wait_out_of_range_is_refused(bad):
    with pytest.raises(ConfigError, match="lock-step wait"):
        dataclasses.replace(MICRO, lockstep_wait_seconds=bad)


def test_a_calibration_saved_before_the_wait_was_measured_still_loads():
    tree = dataclasses.asdict(MICRO)
    for key in ("lockstep_wait_seconds", "claim_seconds", "answer_delay_seconds", "collective_seconds",
                "collective_cpu_seconds", "collective_values", "exchanging_step_slowdown", "exchange_cpu_seconds",
                "exchange_values"):
        del tree[key]
    old = Microbenchmarks(**tree)
    assert old.lockstep_wait_seconds == old.claim_seconds == old.answer_delay_seconds == 0.0
    assert old.collective_seconds == old.collective_values == 0
    assert old.exchanging_step_slowdown == old.exchange_cpu_seconds == old.exchange_values == 0


@pytest.mark.slow
def test_adpsgd_pairs_time_their_exchanges_back_to_back_and_while_the_passive_trains():
    r = measure_waits("loopback", 2, 1, 0.002, timeout=120, values=10_000, rounds=6)["answer"]
    assert r["learners"] == 2 and r["values"] == 10_000 and r["rounds"] == 6
    assert r["exchange_training_seconds"] > 0 and r["exchange_bare_seconds"] > 0
    assert r["delay_seconds"] == pytest.approx(max(0.0, r["exchange_training_seconds"] - r["exchange_bare_seconds"]))


@pytest.mark.slow
def test_an_odd_learner_count_leaves_the_last_passive_unasked_and_still_ends():
    r = measure_waits("loopback", 3, 1, 0.001, timeout=120, values=1000, rounds=3)
    assert r["answer"]["learners"] == 3 and r["answer"]["exchange_bare_seconds"] > 0


def test_several_learners_are_given_the_claim_and_the_answer_delay_and_a_lone_learner_neither():
    micro = dataclasses.replace(MICRO, answer_delay_seconds=0.003, claim_seconds=0.001)
    many, lone = calibrate(micro, 2, "adpsgd"), calibrate(micro, 1, "adpsgd")
    assert many.answer_delay_seconds == 0.003 and many.claim_seconds == 0.001
    assert "the passive training a stand-in" in many.sources["answer_delay_seconds"]
    assert "a claim and a progress record on the job's store" in many.sources["claim_seconds"]
    assert lone.answer_delay_seconds == lone.claim_seconds == 0.0


@pytest.mark.parametrize("field, words", [("answer_delay_seconds", "answer delay"), ("claim_seconds", "claim")])
@pytest.mark.parametrize("bad", [-0.001, 1.0, math.nan])
def test_a_claim_or_answer_delay_out_of_range_is_refused(field, words, bad):
    with pytest.raises(ConfigError, match=words):
        dataclasses.replace(MICRO, **{field: bad})


def test_adpsgds_step_is_its_cpu_among_the_exchanges_and_the_other_strategies_keep_the_corun():
    """An ADPSGD learner computes while its peers compute and the exchanges' traffic preempts it:
    its step is the lone step x `exchanging_step_slowdown` (measured with the recipe's own step),
    instead of the co-run of matrix products that every other strategy's learners take."""
    micro = dataclasses.replace(MICRO, corun_slowdown=1.05, exchanging_step_slowdown=1.3)
    lone_step = 2e-4 * 1 / 2  # "2x1" on 2 cores: the step on 1 thread stated as if it had both
    adpsgd, sync = calibrate(micro, 2, "adpsgd"), calibrate(micro, 2, "sync")
    assert adpsgd.seconds_per_frame == pytest.approx(lone_step * 1.3)
    assert "while ADPSGD exchanges of the model run" in adpsgd.sources["seconds_per_frame"]
    assert sync.seconds_per_frame == pytest.approx(lone_step * 1.05)
    unmeasured = dataclasses.replace(micro, exchanging_step_slowdown=0.0)
    assert calibrate(unmeasured, 2, "adpsgd").seconds_per_frame == pytest.approx(lone_step * 1.05)
    assert calibrate(micro, 1, "adpsgd").seconds_per_frame == pytest.approx(1e-4)  # a lone learner: neither


def test_an_exchanges_cpu_is_charged_beyond_its_bytes_and_copies_and_never_below_nothing():
    from asrdist.parallel.adpsgd import exchange_traffic

    values = 1000
    traffic = exchange_traffic(values)
    moved = 1e-9 * (traffic["exchange"].bytes_sent + traffic["answer"].bytes_sent)  # both messages, each side
    copies = 2 * 1e-9 * values  # the halfway step's copies the simulator charges (MICRO's average cost)
    micro = dataclasses.replace(MICRO, link_cpu_seconds_per_byte=1e-9, exchange_cpu_seconds=0.003,
                                exchange_values=values)
    many = calibrate(micro, 2, "adpsgd")
    assert many.exchange_cpu == pytest.approx(0.003 - moved - copies)
    assert "each side's CPU" in many.sources["exchange_cpu"]
    assert calibrate(micro, 1, "adpsgd").exchange_cpu == 0.0
    assert calibrate(dataclasses.replace(micro, exchange_cpu_seconds=moved / 2), 2).exchange_cpu == 0.0
    assert calibrate(dataclasses.replace(micro, exchange_values=0), 2).exchange_cpu == 0.0  # not measured


@pytest.mark.parametrize("field, bad", [("exchanging_step_slowdown", 0.2), ("exchanging_step_slowdown", math.nan),
                                        ("exchange_cpu_seconds", -0.001), ("exchange_cpu_seconds", 1.0),
                                        ("exchange_values", -1)])
def test_an_exchanges_figures_out_of_range_are_refused(field, bad):
    with pytest.raises(ConfigError, match="exchange"):
        dataclasses.replace(MICRO, **{field: bad})


def test_the_answer_delay_is_over_the_links_own_exchange_the_simulators_wire():
    from asrdist.calibrate.microbench import answer_delay

    assert answer_delay({"exchange_training_seconds": 0.040}, {"exchange_seconds": 0.034}) == pytest.approx(0.006)
    assert answer_delay({"exchange_training_seconds": 0.030}, {"exchange_seconds": 0.034}) == 0.0  # never negative
    assert answer_delay({}, {"exchange_seconds": 0.034}) == 0.0 == answer_delay({"exchange_training_seconds": 0.04}, {})


def test_a_slow_recipe_step_gets_fewer_rounds_never_too_few():
    from asrdist.calibrate.lockstep import MIN_ROUNDS, ROUNDS, rounds_for

    assert rounds_for(0.01) == ROUNDS  # the default DNN's step: every round
    assert rounds_for(0.5) == MIN_ROUNDS  # half a second a step: a few, not minutes of them
    assert MIN_ROUNDS <= rounds_for(0.1) <= ROUNDS
