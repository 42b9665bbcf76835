"""The simulator on dedicated CPU hosts (`asrdist.sim.dedicated`, `simulate --device cpu:CORES`):
every CPU figure takes 1 / share as long, nothing queues for another learner's cores, a
straggler's host computes `slowdown` times slower, and the shared-core terms are left out."""
from __future__ import annotations

import dataclasses
import json

import pytest

from asrdist.cli import main
from asrdist.config import load_config
from asrdist.errors import ConfigError
from asrdist.sim.calibration import Microbenchmarks, exchange_cpu, predict_run
from asrdist.sim.dedicated import dedicated_inputs, parse_cpu_device
from tests.support.paths import CONFIGS

# one learner's figures on one core (as measure_microbenchmarks(dedicated=True) gives them), with
# shared-core figures that the dedicated inputs must drop
MICRO = Microbenchmarks(2, {"1x1": 1e-4, "8x1": 2e-4}, {"1x1": 0.4, "8x1": 0.4}, 100_000.0, 1e-9, 1e-9, 1e-9, 1e-9,
                        "1gbit", 1.2e8, 1.0, 1e-9, 1e-4, corun_slowdown=1.5, lockstep_wait_seconds=0.01,
                        claim_seconds=0.002, answer_delay_seconds=0.003)


def _cfg(strategy: str, learners: int, *extra: str):
    return load_config(CONFIGS / "default.yaml", [f"strategy.name={strategy}", f"train.learners={learners}",
                                                  "train.epochs=2", *extra])


def test_every_cpu_figure_takes_one_over_the_share_and_shared_core_terms_are_dropped():
    inputs = dedicated_inputs(MICRO, 8, 0.25, "sync", validations_per_epoch=3)
    assert inputs.seconds_per_frame == pytest.approx(2e-4 / 0.25)  # the 1-thread step, no co-run slowdown
    assert inputs.epoch_end_seconds == pytest.approx(0.4 / 0.25 * 4)  # the end and 3 validations within
    assert inputs.quantize_cost == pytest.approx(4e-9) and inputs.network_cost == pytest.approx(4e-9)
    assert inputs.lockstep_wait_seconds == inputs.claim_seconds == inputs.answer_delay_seconds == 0.0
    assert "dedicated host" in inputs.sources["seconds_per_frame"] and inputs.validations_per_epoch == 4
    # an ADPSGD exchange's CPU beyond its bytes (measured on a pair of learners) is a quota's too
    measured = dataclasses.replace(MICRO, exchange_cpu_seconds=0.01, exchange_values=100_000)
    pair = dedicated_inputs(measured, 8, 0.25, "adpsgd")
    assert pair.exchange_cpu > 0 and pair.exchange_cpu == pytest.approx(exchange_cpu(measured) / 0.25)
    assert "2 learners" in pair.sources["exchange_cpu"] and inputs.exchange_cpu == 0.0
    with pytest.raises(ConfigError):
        dedicated_inputs(MICRO, 8, 0.0)


def test_a_lone_learners_speed_is_its_share_and_a_stragglers_host_slows_sync():
    single = _cfg("single", 1)
    half = predict_run(single, dedicated_inputs(MICRO, 1, 0.5), 1, "loopback", dedicated=True)
    quarter = predict_run(single, dedicated_inputs(MICRO, 1, 0.25), 1, "loopback", dedicated=True)
    assert half.frames_per_second == pytest.approx(2 * quarter.frames_per_second, rel=0.02)
    sync = predict_run(_cfg("sync", 8), dedicated_inputs(MICRO, 8, 0.25), 8, "1gbit", dedicated=True)
    slow = predict_run(_cfg("sync", 8, "train.straggler.ranks=[3]", "train.straggler.slowdown=3.0"),
                       dedicated_inputs(MICRO, 8, 0.25), 8, "1gbit", dedicated=True)
    # lock step waits for the 3x slower host: its compute (32 frames x 8e-4 s) 3x (the learners' mean: 10/8)
    assert slow.detail.compute_seconds_per_step == pytest.approx(10 / 8 * sync.detail.compute_seconds_per_step,
                                                                 rel=0.01)
    assert slow.frames_per_second < 0.7 * sync.frames_per_second
    # eight dedicated hosts compute side by side: far above one host's pace, not capped by 2 cores' worth
    shared = predict_run(_cfg("sync", 8), dedicated_inputs(MICRO, 8, 0.25), 8, "1gbit")
    assert sync.frames_per_second > shared.frames_per_second


def test_simulate_takes_cpu_hosts_and_refuses_a_bad_quota(tmp_path, capsys):
    out = {}
    for cores in ("0.22", "0.44"):
        path = tmp_path / f"{cores}.json"
        assert main(["simulate", "--cluster", "1x1", "--strategy", "sync", "--device", f"cpu:{cores}",
                     "--frames-per-epoch", "100000", "--global-batch", "256", "--json", str(path)]) == 0
        out[cores] = json.loads(path.read_text())["prediction"]["frames_per_second"]
    assert out["0.44"] == pytest.approx(2 * out["0.22"], rel=0.02)
    assert "dedicated CPU hosts" in capsys.readouterr().out
    assert parse_cpu_device("v100") is None and parse_cpu_device("CPU:1.5") == 1.5
    assert main(["simulate", "--cluster", "8x1", "--device", "cpu:0"]) == 2
    assert "--device: expected cpu:CORES" in capsys.readouterr().err


def _hosts_spec(strategy: str, cpu_hosts: bool, per_host: int = 1, **kw):
    from asrdist.sim.cluster import LINKS, Cluster
    from asrdist.sim.scenario import strategy_config
    from asrdist.sim.spec import SimSpec
    shapes = [(512, 440), (512,), (512, 512), (512,), (40, 512), (40,)]
    cluster = Cluster(4 // per_host, per_host, LINKS["1gbit"], LINKS["1gbit"], cpu_hosts=cpu_hosts)
    return SimSpec(strategy, strategy_config(strategy, None), shapes, cluster, 64, 1e-4, steps=8,
                   network_cost=4e-9, **kw)


def test_on_cpu_hosts_a_messages_cpu_follows_its_wire_and_the_group_waits_for_its_slowest_host():
    """A host of one learner throttled by its quota neither computes nor moves its bytes: a
    collective takes its wire time plus its CPU (a device's network engine, or learners sharing a
    host: the longer of the two), and a straggler's host takes `slowdown` times as long over its
    messages' CPU too, holding up the whole ring."""
    from asrdist.sim.engine import simulate
    for strategy in ("sync", "adpsgd"):
        beside = simulate(_hosts_spec(strategy, False))
        after = simulate(_hosts_spec(strategy, True))
        # each message's CPU (4e-9 s a byte, both ways) now adds to its wire (sync) or, for an
        # ADPSGD exchange, runs beside it on both hosts' quotas
        assert after.frames_per_second < 0.9 * beside.frames_per_second, strategy
        if strategy == "sync":  # the same compute and bytes a step (adpsgd's pool moves to whoever is free)
            assert after.compute_seconds_per_step == pytest.approx(beside.compute_seconds_per_step)
            assert after.bytes_sent == beside.bytes_sent
        else:  # a passive answers from a thread on its own host's quota: its compute shares it
            assert after.compute_seconds_per_step > 1.1 * beside.compute_seconds_per_step
    # learners sharing a host's quota lend each other what they leave waiting: CPU and wire overlap there
    shared = simulate(_hosts_spec("sync", True, per_host=2))
    assert shared.seconds_per_step == pytest.approx(simulate(_hosts_spec("sync", False, per_host=2)).seconds_per_step)
    # a host's quota is cut only when all its learners are stragglers (cpushare.HostCpuPlan); a
    # straggler beside a learner at full speed sleeps instead, its messages' CPU at the host's pace
    beside = {r: simulate(_hosts_spec("sync", cpu_hosts, per_host=2, slowdown={3: 3.0})).seconds_per_step
              for r, cpu_hosts in (("quota", True), ("device", False))}
    assert beside["quota"] == pytest.approx(beside["device"])
    whole = simulate(_hosts_spec("sync", True, per_host=2, slowdown={2: 3.0, 3: 3.0})).seconds_per_step
    assert whole > 1.2 * simulate(_hosts_spec("sync", False, per_host=2, slowdown={2: 3.0, 3: 3.0})).seconds_per_step
    sync = simulate(_hosts_spec("sync", True))
    slow = simulate(_hosts_spec("sync", True, slowdown={3: 3.0}))
    device = simulate(_hosts_spec("sync", False, slowdown={3: 3.0}))
    per_step = 1e-4 * 64  # one learner's compute a step
    # the slow host's compute (+2 x per_step) and its messages' CPU (x 3) hold up every learner
    extra = slow.seconds_per_step - sync.seconds_per_step
    assert extra > 2 * per_step * 1.05
    assert slow.seconds_per_step > device.seconds_per_step + 0.5 * (extra - 2 * per_step)


def test_a_validation_on_cpu_hosts_adds_its_collectives_and_the_asynchronous_learners_pause():
    """What asrdist's trainer does at a validation beyond the leader's work: the consensus model's
    allreduce (float32) over every learner, and for learners out of lock step first their spread
    (consensus distance, float64) after each stopped at its step's end (about one step)."""
    from types import SimpleNamespace

    from asrdist.sim.cluster import LINKS, Cluster
    from asrdist.sim.scenario import Job, strategy_config, validation_seconds

    def job(strategy: str, learners: int = 8, cpu_hosts: bool = True) -> Job:
        cluster = Cluster(learners, 1, LINKS["1gbit"], LINKS["1gbit"], cpu_hosts=cpu_hosts)
        return Job(strategy, strategy_config(strategy, None), [(1000, 1000)], cluster, 256, 1e-4, network_cost=4e-9)

    step = SimpleNamespace(seconds_per_step=0.05)
    sync = validation_seconds(job("sync"), step)
    one_way = 2 * 4e6 * 7 / 8  # a learner's bytes in a ring allreduce of the float32 model
    assert sync > one_way / LINKS["1gbit"].bandwidth + 4e-9 * 2 * one_way * 0.99  # its wire, then its CPU
    # adpsgd: the pause, the float32 allreduce and one of twice the bytes (latency aside: about 3x)
    assert validation_seconds(job("adpsgd"), step) - 0.05 == pytest.approx(3 * sync, rel=0.05)
    assert validation_seconds(job("sync", cpu_hosts=False), step) == 0.0  # not modelled off CPU hosts
    assert validation_seconds(job("adpsgd", learners=1), step) == 0.0
