"""`asrdist bench simulator`: calibration apart from validation. The simulator's inputs come from
microbenchmarks of one learner; the runs it is judged on never feed them."""
from __future__ import annotations

import argparse
import json
import os
import shutil
from pathlib import Path

import pytest

from asrdist.bench import simulator
from asrdist.calibrate import microbench
from asrdist.compare import runs as compare_runs
from asrdist.run.summary import RunSummary
from asrdist.sim import calibration
from asrdist.sim.calibration import Microbenchmarks
from tests.support.paths import DEFAULT_RECIPE

CONFIG = DEFAULT_RECIPE


def _micro(cores: int = 2) -> Microbenchmarks:
    return Microbenchmarks(cores, {"1x2": 20e-6, "2x1": 45e-6}, {"1x2": 0.05, "2x1": 0.08}, 50_000.0,
                           2e-9, 1e-9, 0.5e-9, 1e-9, "loopback", 1e9, 0.8, 1e-10, 50e-6)


def _args(corpus: Path, out: Path, *extra: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    simulator.add_arguments(parser)
    return parser.parse_args(["--config", str(CONFIG), "--data", str(corpus), "--out", str(out), "--strategies",
                              "sync,adpsgd", "--learners", "1,2", "--network", "loopback", *extra])


def _bench_with_runs_measuring(scale: float, corpus: Path, out: Path, monkeypatch, spy: list) -> dict:
    """The bench with its microbenchmarks and its training replaced: each 'run' writes a
    summary.json whose timings are `scale` times a fixed figure (the measurement to poison)."""
    def fake_micro(name, learners, cfg, network, repeats, timeout):
        spy.append("microbenchmarks")
        return _micro(), {"link": {}, "corun": {"slowdown": 1.0}, "parameters": 1, "feature_dim": 40,
                          "num_classes": 9}

    real_calibrate = calibration.calibrate

    def spied_calibrate(micro, learners, strategy=None):
        spy.append("calibrate")
        return real_calibrate(micro, learners, strategy)

    def fake_train(config, configs, run_out, data, overrides, failed=None, hosts=None):
        (name, cfg), = configs.items()
        run_dir = run_out / name
        run_dir.mkdir(parents=True, exist_ok=True)
        frames, loop = 10_000 * cfg.train.learners, 2.0 / scale
        per = [{"frames": frames / cfg.train.learners, "loop_seconds": loop, "train_seconds": loop}
               for _ in range(cfg.train.learners)]
        (run_dir / "summary.json").write_text(json.dumps({
            "strategy": name, "learners": cfg.train.learners, "final": {}, "wall_seconds": loop + 1,
            "frames_per_second": frames / loop, "train_frames": frames, "threads_per_learner": 1,
            "nodes": 1, "network": "loopback",
            "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0, "per_learner": per}}))
        return {name: run_dir}

    real_load = RunSummary.read

    def spied_load(cls, run_dir):
        spy.append("run read")
        return real_load(run_dir)

    monkeypatch.setattr(simulator, "measure_microbenchmarks", fake_micro)
    monkeypatch.setattr(calibration, "calibrate", spied_calibrate)
    monkeypatch.setattr(compare_runs, "train_missing", fake_train)
    monkeypatch.setattr(RunSummary, "read", classmethod(spied_load))
    return simulator.run(_args(corpus, out))


def test_no_timing_of_the_validated_runs_feeds_the_calibration(tone_corpus, tmp_path, monkeypatch):
    """Poisoned runs (their timings 10x off) move the measured column and the errors, never a
    prediction or a calibrated figure; and every run is read after the calibration it is judged
    against is done: each repeat is calibrated, predicted, then trained."""
    corpus = tmp_path / "corpus"
    shutil.copytree(tone_corpus, corpus)
    spy: list[str] = []
    clean = _bench_with_runs_measuring(1.0, corpus, tmp_path / "a", monkeypatch, spy)
    assert spy == ["microbenchmarks", "calibrate", "run read"] * (2 * 2 * 2)  # 2 strategies, 2 counts, 2 rounds
    poisoned = _bench_with_runs_measuring(10.0, corpus, tmp_path / "b", monkeypatch, [])
    assert clean["calibration"] == poisoned["calibration"]
    for name, by_n in clean["predictions"].items():
        for n, row in by_n.items():
            other = poisoned["predictions"][name][n]
            assert other["predicted"] == row["predicted"]
            assert other["measured"] == pytest.approx(10 * row["measured"])
            assert row["relative_error"] == pytest.approx((row["predicted"] - row["measured"]) / row["measured"])
    assert clean["max_relative_error"] == max(abs(r["relative_error"]) for by_n in clean["predictions"].values()
                                              for r in by_n.values())
    # the JSON says what each input was calibrated on: microbenchmarks, or the corpus' size
    sources = clean["calibration"]["by_run"]["sync"]["2"][0]["inputs"]["sources"]
    assert all(s.startswith(("microbenchmark", "the corpus")) for s in sources.values())


def test_each_run_is_trained_again_in_a_later_round_and_its_spread_reported(tone_corpus, tmp_path, monkeypatch):
    """With --run-repeats 3 every run trains three times, every run once per round, each repeat
    just after its own calibration; a row's measured and predicted frames/s are the medians of its
    repeats, its error the median of each repeat's prediction against that repeat's run, and the
    spreads between repeats are reported."""
    import dataclasses

    corpus = tmp_path / "corpus"
    shutil.copytree(tone_corpus, corpus)
    order: list[tuple[str, str]] = []
    speeds = iter([1.0, 1.0, 1.0, 1.0, 2.0, 2.0, 2.0, 2.0, 1.5, 1.5, 1.5, 1.5])  # round 2 twice as fast
    speed = [1.0]

    def fake_micro(name, learners, cfg, network, repeats, timeout):
        speed[0] = next(speeds)  # the machine's spell, which the calibration and its run share
        micro = _micro()
        steps = {k: v / speed[0] for k, v in micro.step_seconds_per_frame.items()}
        return dataclasses.replace(micro, step_seconds_per_frame=steps), {
            "link": {}, "corun": {"slowdown": 1.0}, "parameters": 1, "feature_dim": 40, "num_classes": 9}

    def fake_train(config, configs, run_out, data, overrides, failed=None, hosts=None):
        (name, cfg), = configs.items()
        order.append((run_out.parent.name, name))
        run_dir = run_out / name
        run_dir.mkdir(parents=True)  # a repeat never reuses an earlier round's run
        loop = 2.0 / speed[0]
        per = [{"frames": 10_000, "loop_seconds": loop, "train_seconds": loop}] * cfg.train.learners
        (run_dir / "summary.json").write_text(json.dumps({
            "strategy": name, "learners": cfg.train.learners, "final": {}, "wall_seconds": loop + 1,
            "frames_per_second": 10_000 / loop * cfg.train.learners, "train_frames": 10_000 * cfg.train.learners,
            "threads_per_learner": 1, "nodes": 1, "network": "loopback",
            "steal_share": 0.3 if speed[0] == 2.0 else 0.01,  # the run's own figure (round 2: a busy host)
            "cpu_share": 0.5 if speed[0] == 1.5 else 0.95, "contended": speed[0] == 1.5,  # round 3: contended
            "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0, "per_learner": per}}))
        return {name: run_dir}

    monkeypatch.setattr(simulator, "measure_microbenchmarks", fake_micro)
    monkeypatch.setattr(compare_runs, "train_missing", fake_train)
    result = simulator.run(_args(corpus, tmp_path / "out", "--run-repeats", "3"))
    assert [r for r, _ in order] == ["round1"] * 4 + ["round2"] * 4 + ["round3"] * 4
    row = result["predictions"]["sync"]["2"]
    assert row["measured_repeats"] == pytest.approx([10_000, 20_000, 15_000])
    assert row["measured"] == pytest.approx(15_000)  # the median
    assert row["measured_spread"] == pytest.approx(1.0)
    guesses = row["predicted_repeats"]
    assert guesses[1] > guesses[2] > guesses[0]  # each repeat predicted from its own calibration
    assert row["predicted"] == pytest.approx(guesses[2]) and row["predicted_spread"] > 0
    errors = row["relative_errors_by_repeat"]
    assert errors == pytest.approx([(g - m) / m for g, m in zip(guesses, [10_000, 20_000, 15_000])])
    assert row["relative_error"] == pytest.approx(sorted(errors)[1])
    assert len(result["calibration"]["by_run"]["sync"]["2"]) == 3
    # the host's steal over each repeat's training, read from the run's summary; runs above the
    # line are counted and said
    assert row["steal_shares"] == [0.01, 0.3, 0.01]
    assert row["cpu_shares"] == [0.95, 0.95, 0.5] and row["contended"] is True  # a repeat contended: marked
    noise = result["machine_noise"]
    assert noise["run_repeats"] == 3 and noise["max_spread"] == pytest.approx(1.0)
    assert noise["runs_with_busy_host"] == 4 and noise["runs"] == 12 and noise["max_steal_share"] == 0.3
    printed = simulator.format_result(result)
    assert printed.count("% (contended)") == 4
    assert "spread up to 100.0%" in printed and "host took more than 5% of its CPU in 4 of 12 runs (up to 30%" in printed


def test_calibration_is_a_function_of_the_microbenchmarks_alone():
    import inspect

    assert list(inspect.signature(calibration.calibrate).parameters) == ["micro", "learners", "strategy"]
    two = calibration.calibrate(_micro(), 2)
    # a learner among 2 on 1 of 2 threads: its measured step, as if it had both cores
    assert two.threads == 1 and two.seconds_per_frame == pytest.approx(45e-6 / 2)
    assert calibration.calibrate(_micro(), 1).network_cost == 0.0  # a lone learner moves no bytes
    with pytest.raises(Exception, match="no microbenchmark of a learner among 4"):
        calibration.calibrate(_micro(), 4)


def test_a_strategy_is_calibrated_on_its_own_recipes_step_where_it_was_measured():
    import dataclasses

    micro = dataclasses.replace(_micro(), recipe_step_seconds_per_frame={"averaging": {"2x1": 90e-6}})
    own = calibration.calibrate(micro, 2, "averaging")
    assert own.seconds_per_frame == pytest.approx(90e-6 / 2) and "averaging's recipe" in own.sources["seconds_per_frame"]
    # a strategy whose recipe was not measured (or at another learner count) takes the first run's
    assert calibration.calibrate(micro, 2, "sync").seconds_per_frame == pytest.approx(45e-6 / 2)
    assert calibration.calibrate(micro, 1, "averaging").seconds_per_frame == pytest.approx(20e-6 * 2 / 2)
    with pytest.raises(Exception, match="positive step times"):
        dataclasses.replace(_micro(), recipe_step_seconds_per_frame={"onebit": {"2x1": 0.0}})


def test_onebits_coding_costs_carry_its_whole_exchange_on_one_learner():
    """The kernels' costs (2 quantizations + 2 dequantizations per value in a world of one) are
    scaled to what the whole exchange measured alone; unmeasured (0), they stay the kernels'."""
    import dataclasses

    plain = calibration.calibrate(_micro(), 2)
    assert (plain.quantize_cost, plain.dequantize_cost) == (2e-9, 1e-9)
    whole = calibration.calibrate(dataclasses.replace(_micro(), onebit_exchange_seconds_per_value=9e-9), 2)
    assert 2 * (whole.quantize_cost + whole.dequantize_cost) == pytest.approx(9e-9)
    assert whole.quantize_cost / whole.dequantize_cost == pytest.approx(2.0)  # the kernels' proportion kept
    assert "x 1.50" in whole.sources["quantize_cost"]


def test_peers_computing_on_the_other_cores_slow_a_learners_step_by_the_co_run_figure():
    import dataclasses

    micro = dataclasses.replace(_micro(), corun_slowdown=1.3)
    # 2 learners of 1 thread each fill the 2 cores the lone step had to itself on 1
    assert calibration.calibrate(micro, 2).seconds_per_frame == pytest.approx(45e-6 / 2 * 1.3)
    assert "x 1.30" in calibration.calibrate(micro, 2).sources["seconds_per_frame"]
    # one learner on both cores was timed with both computing: nothing to add
    assert calibration.calibrate(micro, 1).seconds_per_frame == pytest.approx(20e-6 * 2 / 2)
    with pytest.raises(Exception, match="positive step times"):
        dataclasses.replace(_micro(), corun_slowdown=0.0)


def test_the_co_run_figure_is_measured_with_siblings_computing():
    from asrdist.calibrate.corun import corun_slowdown  # the measurement itself, on this machine

    alone = corun_slowdown(1, repeats=1)
    assert alone["siblings"] == 0 and alone["slowdown"] > 0
    assert alone["ratios"] == [1.0]
    affinity = os.sched_getaffinity(0)
    two = corun_slowdown(2, repeats=3)
    assert two["siblings"] == 1 and two["alone_seconds"] > 0 and two["together_seconds"] > 0
    assert len(two["ratios"]) == 3 and two["slowdown"] == pytest.approx(sorted(two["ratios"])[1])
    assert os.sched_getaffinity(0) == affinity  # the caller's cores are given back


def test_the_co_run_pins_the_timed_thread_and_each_sibling_to_a_core_of_its_own(monkeypatch):
    """Unpinned, the scheduler sometimes kept the timed thread and its sibling on one core for a
    whole measurement (a 2x reading on a 2-core machine whose cores do not slow each other)."""
    import subprocess

    from asrdist.calibrate import corun

    pinned: dict = {}
    monkeypatch.setattr(corun.os, "sched_getaffinity", lambda pid: {4, 7})
    monkeypatch.setattr(corun.os, "sched_setaffinity", lambda pid, cpus: pinned.setdefault(pid, set(cpus)))
    siblings = []

    class Sibling(subprocess.Popen):
        def __init__(self, *args, **kwargs):
            super().__init__(*args, **kwargs)
            siblings.append(self.pid)

    monkeypatch.setattr(corun.subprocess, "Popen", Sibling)
    corun.corun_slowdown(2, repeats=1)
    assert pinned == {siblings[0]: {7}, 0: {4}}  # the sibling on one core, the timed thread on the other


def test_the_co_run_keeps_the_lower_of_two_spells_and_records_both():
    """A reading of about 2x in one spell (both cores at half speed for a second, the host's doing)
    is not what a run's tens of seconds see: the calibration reads twice, seconds apart."""
    from asrdist.calibrate.corun import lower_spell

    slow = {"slowdown": 1.91, "ratios": [1.9, 1.92], "siblings": 1}
    usual = {"slowdown": 1.02, "ratios": [1.01, 1.03], "siblings": 1}
    for first, second in ((slow, usual), (usual, slow)):
        kept = lower_spell(first, second)
        assert kept["slowdown"] == 1.02 and kept["ratios"] == [1.01, 1.03]
        assert kept["spells"] == [first["slowdown"], second["slowdown"]]


def test_onebits_whole_exchange_is_measured_on_the_models_shapes():
    figures = microbench.per_value_figures([(64, 40), (64,), (10, 64), (10,)], repeats=2)
    kernels = 2 * (figures["quantize_seconds_per_value"] + figures["dequantize_seconds_per_value"])
    assert figures["onebit_exchange_seconds_per_value"] > 0 and kernels > 0


@pytest.mark.slow
@pytest.mark.timeout(900)
def test_bench_simulator_predicts_real_train_runs_end_to_end(tone_corpus, tmp_path):
    """The whole bench on the tone corpus: real microbenchmarks, then real `asrdist train` runs at
    1 and 2 learners over loopback (short: 20 steps); every row has a measured and a predicted
    frames/s."""
    from asrdist.cli import main

    corpus = tmp_path / "corpus"
    shutil.copytree(tone_corpus, corpus)
    out = tmp_path / "sim.json"
    assert main(["bench", "simulator", "--json", str(out), "--config", str(CONFIG), "--data", str(corpus),
                 "--out", str(tmp_path / "runs"), "--strategies", "adpsgd", "--learners", "1,2",
                 "--network", "loopback", "--repeats", "2", "--run-repeats", "1", "train.max_steps=20"]) == 0
    result = json.loads(out.read_text())
    for name in ("adpsgd",):
        for n in ("1", "2"):
            row = result["predictions"][name][n]
            assert row["measured"] > 0 and row["predicted"] > 0
            assert Path(row["measured_run"]["run"], "summary.json").is_file()
    lone, = result["calibration"]["by_run"]["adpsgd"]["1"]
    assert set(lone["microbenchmarks"]["step_seconds_per_frame"]) == {"1x2"} or lone["microbenchmarks"]["cores"] != 2
    calibrated, = result["calibration"]["by_run"]["adpsgd"]["2"]  # one repeat, one calibration
    micro = calibrated["microbenchmarks"]
    assert set(micro["step_seconds_per_frame"]) == {"2x1"} or micro["cores"] != 2
    assert micro["link_bytes_per_second"] > 0 and len(result["load_average"]["before"]) == 3
    assert micro["link_latency_seconds"] == calibrated["link_measurement"]["latency_seconds"] > 0
    assert micro["onebit_exchange_seconds_per_value"] > 0 and micro["corun_slowdown"] > 0
    assert calibrated["corun_measurement"]["siblings"] == len(os.sched_getaffinity(0)) - 1
    spells = calibrated["corun_measurement"]["spells"]  # read twice, the lower kept
    assert len(spells) == 2 and micro["corun_slowdown"] == min(spells)
    lockstep = calibrated["lockstep_measurement"]  # the run's 2 learners, its threads, its step's work
    assert lockstep["learners"] == 2 and lockstep["work_seconds"] > 0
    assert micro["lockstep_wait_seconds"] == lockstep["wait_seconds"] >= 0
    answer = calibrated["answer_measurement"]  # adpsgd's pair exchanging the model's values
    assert answer["learners"] == 2 and answer["values"] > 1000 and answer["exchange_training_seconds"] > 0
    assert micro["answer_delay_seconds"] == answer["delay_seconds"] >= 0
    # the delay is over the link's own exchange (the simulator's wire), not over the pair's back to back
    link_exchange = calibrated["link_measurement"]["exchange_seconds"]
    assert answer["delay_seconds"] == pytest.approx(max(0.0, answer["exchange_training_seconds"] - link_exchange))
    assert answer["active_cpu_seconds"] > 0 and answer["passive_cpu_seconds"] > 0
    assert micro["exchange_cpu_seconds"] == pytest.approx((answer["active_cpu_seconds"] + answer["passive_cpu_seconds"]) / 2)
    assert micro["exchange_values"] == answer["values"]
    claims = calibrated["claim_measurement"]  # the claims made among the exchanges
    assert micro["claim_seconds"] == claims["seconds"] > 0 and claims["among_exchanges"] and claims["claims"] > 0
    step = calibrated["step_measurement"]  # the recipe's own step, alone and among the exchanges
    assert step["recipe"] and step["alone_cpu_per_frame"] > 0 and step["exchanging_cpu_per_frame"] > 0
    assert micro["exchanging_step_slowdown"] == step["exchanging_slowdown"] > 0
    assert "among the run's learners while ADPSGD exchanges" in calibrated["inputs"]["sources"]["seconds_per_frame"]
    collective = calibrated["collective_measurement"]  # an allreduce among the run's 2 learners
    assert micro["collective_seconds"] == collective["seconds"] > 0 and collective["learners"] == 2
    assert micro["collective_cpu_seconds"] == collective["cpu_seconds"] > 0
    assert calibrated["inputs"]["collective_step_seconds"] >= 0 and "collective_step" in calibrated["inputs"]["sources"]
    assert "adpsgd's recipe" in calibrated["inputs"]["sources"]["seconds_per_frame"]
