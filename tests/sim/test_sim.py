"""The scaling simulator in one process: its strategies behave as the real ones do where the
answer is known, the advisor ranks every strategy, and `asrdist simulate` keeps its contract."""
from __future__ import annotations

import json
import math
from types import SimpleNamespace

import pytest

from asrdist.cli import main
from asrdist.sim.cluster import LINKS, Cluster
from asrdist.sim.engine import simulate
from asrdist.sim.spec import SimSpec
from asrdist.sim.scenario import ADVISED, Job, advise, strategy_config
from tests.support.paths import CONFIGS

SHAPES = [(512, 440), (512,), (512, 512), (512,), (40, 512), (40,)]


def _spec(strategy: str, settings: dict | None = None, cluster: Cluster | None = None, **kw) -> SimSpec:
    cluster = cluster or Cluster(1, 4, LINKS["1gbit"], LINKS["1gbit"])
    return SimSpec(strategy, strategy_config(strategy, settings), SHAPES, cluster, 256, 2e-5, steps=8, **kw)


def test_one_straggler_sets_the_pace_of_sync_but_not_of_adpsgd():
    kept = {}
    fast_links = Cluster(1, 4, LINKS["loopback"], LINKS["loopback"])  # compute-bound
    for name in ("sync", "adpsgd"):
        fast = simulate(_spec(name, cluster=fast_links)).frames_per_second
        slow = simulate(_spec(name, cluster=fast_links, slowdown={3: 3.0})).frames_per_second
        kept[name] = slow / fast
    assert kept["sync"] < 0.45  # lock step: everyone waits for the learner 3x slower
    assert kept["adpsgd"] > 0.7  # only its exchanges with the slow learner wait


def test_overlap_and_double_buffering_hide_communication():
    buckets = {"bucket_cap_mb": 0.25}  # several buckets: the first ones leave during backward
    assert simulate(_spec("sync", {"overlap": True, **buckets})).seconds_per_step < \
        simulate(_spec("sync", {"overlap": False, **buckets})).seconds_per_step
    assert simulate(_spec("onebit", {"double_buffering": True})).seconds_per_step < \
        simulate(_spec("onebit", {"double_buffering": False})).seconds_per_step
    assert simulate(_spec("adpsgd", {"delay_by_one": True})).seconds_per_step < \
        simulate(_spec("adpsgd")).seconds_per_step


def test_hierarchical_allreduce_beats_flat_across_slow_nodes():
    cluster = Cluster(2, 2, LINKS["loopback"], LINKS["1gbit"])
    flat = simulate(_spec("sync", {"hierarchical": "false"}, cluster))
    hier = simulate(_spec("sync", {"hierarchical": "true"}, cluster))
    assert hier.seconds_per_step < flat.seconds_per_step


def test_advisor_ranks_every_strategy_fastest_first_and_names_the_winner():
    job = Job("sync", None, SHAPES, Cluster(2, 2, LINKS["loopback"], LINKS["1gbit"]), 1024, 2e-5, steps=6)
    ranked, why, left_out = advise(job)
    assert sorted(p.name for p in ranked) == sorted(ADVISED) and left_out == {}
    assert [p.epoch_seconds for p in ranked] == sorted(p.epoch_seconds for p in ranked)
    assert why.startswith(f"{ranked[0].name} wins")


def test_advisor_says_when_no_strategy_beats_one_learner():
    """Over a 1 Mbit/s network every strategy is slower than one learner: the advice is to stay on
    one, not that the least slow one 'wins'."""
    from asrdist.sim.cluster import link_named

    job = Job("sync", None, SHAPES, Cluster(2, 2, LINKS["loopback"], link_named("1mbit")), 1024, 2e-5, steps=24)
    ranked, why, _ = advise(job)
    assert ranked[0].speedup < 1
    assert why.startswith(f"no strategy beats one learner here (the fastest, {ranked[0].name}, runs")
    assert "train on one learner, or on a faster network" in why and "wins" not in why


def test_simulate_cli_writes_json_and_refuses_bad_input(tmp_path, capsys):
    out = tmp_path / "sim.json"
    assert main(["simulate", "--cluster", "2x2", "--strategy", "onebit", "--set", "double_buffering=true",
                 "--device", "k20x", "--inside", "pcie", "--network", "1gbit", "--json", str(out)]) == 0
    prediction = json.loads(out.read_text())["prediction"]
    assert prediction["learners"] == 4 and prediction["frames_per_second"] > 0
    assert 0 < prediction["speedup"] <= 4
    bad = tmp_path / "bad.json"
    assert main(["simulate", "--cluster", "2y2", "--json", str(bad)]) != 0
    assert "asrdist: error: --cluster" in capsys.readouterr().err
    assert not bad.exists()
    with pytest.raises(SystemExit):
        main(["simulate", "--straggler"])
    assert main(["simulate", "--cluster", "4x4", "--global-batch", "10", "--json", str(bad)]) != 0
    assert "--global-batch: must be at least 16 (one frame per learner), got 10" in capsys.readouterr().err
    assert not bad.exists()


def test_an_exchange_pays_for_a_half_duplex_link_and_cpu_learners_for_their_bytes():
    """A pairwise exchange over a link that keeps half its rate each way while both directions
    carry a message takes twice the wire time; CPU learners that spend CPU on every byte they
    move take cores from each other's work."""
    from asrdist.sim.cluster import Link

    def step(duplex: float, network_cost: float = 0.0, n: int = 2) -> float:
        link = Link(1e8, 0.0, duplex=duplex)
        cluster = Cluster(n, 1, link, link, shared_cores=2 if network_cost else 0, one_machine=True,
                          thread_speedup=1.0)
        spec = _spec("adpsgd", {"pattern": "fixed"}, cluster)
        spec.network_cost, spec.own_steps = network_cost, True
        return simulate(spec).seconds_per_step

    wire = 4 * sum(math.prod(s) for s in SHAPES) / 1e8
    # the mean step of the active learner (which waits for the exchange) and the passive (which
    # answers on its own thread)
    assert step(0.5) - step(1.0) == pytest.approx(wire / 2, rel=0.05)
    assert step(1.0, network_cost=1e-7, n=4) > step(1.0, network_cost=1e-12, n=4) * 1.05


def test_collectives_whose_members_send_and_receive_at_once_pay_for_a_half_duplex_link():
    """A ring allreduce (and reduce-scatter, all-gather, all-to-all) has every member send to one
    neighbour while it receives from another, so each direction keeps the link's `duplex` share of
    its one-way rate, between nodes and inside one; a broadcast sends one way and does not."""
    from asrdist.parallel.comm import Transfer
    from asrdist.sim.cluster import Link
    from asrdist.sim.resources import transfer_seconds

    def seconds(kind: str, group: str, duplex: float, nodes: int = 2) -> float:
        link = Link(1e8, 0.0, duplex=duplex)
        return transfer_seconds(Transfer(kind, group, 2, 10**8, 25_000_000), Cluster(nodes, 2 // nodes, link, link))

    for kind in ("allreduce", "reduce_scatter", "all_gather", "all_to_all"):
        for group, nodes in (("world", 2), ("world", 1), ("node", 1)):
            assert seconds(kind, group, 0.5, nodes) == pytest.approx(2 * seconds(kind, group, 1.0, nodes)), (kind, group)
    assert seconds("broadcast", "node", 0.5, 1) == pytest.approx(seconds("broadcast", "node", 1.0, 1))
    assert seconds("exchange", "pair", 0.5) == pytest.approx(2 * seconds("exchange", "pair", 1.0))


def test_learners_of_a_node_share_its_card_in_pairwise_exchanges():
    """The same 1 Gbit/s link inside and between nodes, fixed ring: 4 nodes of one learner and 2
    nodes of two differ only in that every other round the two exchanges of 2 x 2 cross between
    the same two nodes and share their cards: the learners' steps take longer."""
    def step(nodes: int, per_node: int) -> float:
        cluster = Cluster(nodes, per_node, LINKS["1gbit"], LINKS["1gbit"])
        return simulate(_spec("adpsgd", {"pattern": "fixed"}, cluster)).seconds_per_step

    assert step(2, 2) > 1.1 * step(4, 1)


def test_a_fixed_ring_of_nodes_keeps_its_step_time_as_nodes_are_added():
    """On N nodes of two learners each node's card carries two exchanges of a fixed ring whatever
    N is, so the step time stays put (it grew with N when an exchange held one card while it
    waited for the next: a convoy around the ring)."""
    def step(nodes: int) -> float:
        cluster = Cluster(nodes, 2, LINKS["nvlink"], LINKS["1gbit"])
        return simulate(_spec("adpsgd", {"pattern": "fixed"}, cluster)).seconds_per_step

    assert step(32) < 1.2 * step(4)


def test_a_fixed_cost_per_minibatch_adds_to_every_step():
    one = Cluster(1, 1, LINKS["nvlink"], LINKS["nvlink"])
    result = simulate(SimSpec("single", None, SHAPES, one, 1000, 1e-5, step_overhead=0.05, steps=4))
    assert result.frames_per_second == pytest.approx(1000 / (0.05 + 1000 * 1e-5))


def test_frames_per_second_is_the_jobs_frames_over_its_longest_learner():
    """The one throughput (asrdist.utils.throughput): with a straggler 3x slower in adpsgd, each
    learner training its own steps, the job's frames/s is all frames over the straggler's end,
    not the sum of the learners' own rates (which counts the fast learner as if it went on)."""
    cluster = Cluster(1, 2, LINKS["nvlink"], LINKS["nvlink"])
    spec = SimSpec("adpsgd", strategy_config("adpsgd"), SHAPES, cluster, 1000, 1e-4, slowdown={1: 3.0}, steps=8,
                   own_steps=True)
    result = simulate(spec)
    frames = sum(result.steps) * 1000
    straggler_compute = 8 * 3 * 1000 * 1e-4
    assert result.frames_per_second <= frames / straggler_compute
    # the sum of rates would be about (1 + 1/3) / 1e-4 frames/s; the job's is about 2 / 3 of 1 / 1e-4
    assert result.frames_per_second == pytest.approx(frames / straggler_compute, rel=0.1)
    # an epoch of the simulated window's own frames takes the window's time (pace + tail)
    assert result.pace_seconds_per_frame * frames + result.tail_seconds == pytest.approx(
        frames / result.frames_per_second)


def test_validation_has_a_calibration_table_and_a_held_out_table():
    from asrdist.sim.cluster import GPU_SHARE
    from asrdist.sim.validate import CASES, KNOBS, format_table, validate

    result = validate()
    # every row is predicted once with its own paper held out
    assert len(result["held_out_rows"]) == len(CASES)
    for row in result["held_out_rows"]:
        assert all(row["paper"] not in where for where in row["knobs_set_by"].values()), row
    # the calibration rows are named with the knob they set and match (they were fitted on)
    assert [r["knob"] for r in result["calibration_rows"]] == [k.name for k in KNOBS]
    for row in result["calibration_rows"]:
        assert abs(row["relative_error"]) <= 0.01, row
    assert result["max_relative_error_held_out"] == max(abs(r["relative_error"]) for r in result["held_out_rows"])
    text = format_table(result)
    assert "Rows that set the presets" in text and "held out" in text
    # a knob whose row is in the held-out paper is fitted on another paper's row, or takes its prior
    by_paper = {r["paper"]: r["knobs_set_by"] for r in result["held_out_rows"]}
    assert by_paper["IBM blog 2019"]["gpu_share"].startswith("IBM ICASSP 2019")
    assert by_paper["Seide 2014"]["onebit_cost"].startswith("prior")
    assert by_paper["IBM ICASSP 2019"] == result["presets_set_by"]
    # the record of validated cases that every prediction's uncertainty comes from holds these rows
    from asrdist.sim.uncertainty import cases_from_validate, load_cases

    recorded = [c for c in load_cases() if c.device == "gpu"]
    fresh = cases_from_validate(result)
    assert [(c.case, c.strategy, c.learners) for c in recorded] == [(c.case, c.strategy, c.learners) for c in fresh]
    assert [c.relative_error for c in recorded] == pytest.approx([c.relative_error for c in fresh], abs=0.005)
    # the device presets (what `asrdist simulate --device` and the advisor use) are the all-paper fit
    assert GPU_SHARE == pytest.approx(result["presets"]["gpu_share"], rel=0.005)


def test_every_prediction_carries_the_error_of_its_nearest_validated_case(tmp_path, capsys):
    from asrdist.sim.uncertainty import ValidatedCase, nearest

    cases = [ValidatedCase("v", "a", "adpsgd", 16, "gpu", 0.1), ValidatedCase("v", "b", "hierarchical", 64, "gpu", -0.4),
             ValidatedCase("b", "c", "adpsgd", 4, "cpu", 0.05), ValidatedCase("v", "d", "onebit", 8, "gpu", 0.9)]
    assert nearest("adpsgd", 64, "gpu", cases).case == "a"  # the same strategy before the same size
    assert nearest("hybrid", 64, "gpu", cases).case == "b"  # else its family, nearest in size
    assert nearest("adpsgd", 64, "cpu", cases).case == "c"  # the same kind of learner first
    assert nearest("sync", 2, "gpu", []) is None
    # learners sharing one host (loopback) take a loopback case before a closer one on hosts of their own
    placed = [ValidatedCase("b", "hosts", "sync", 4, "cpu", 0.05),
              ValidatedCase("b", "loopback", "sync", 2, "cpu", 1.3, "loopback"),
              ValidatedCase("b", "lone", "sync", 1, "cpu", 0.01, "loopback")]
    assert nearest("sync", 4, "cpu", placed, placement="loopback").case == "loopback"
    assert nearest("sync", 4, "cpu", placed, placement="hosts").case == "hosts"
    assert nearest("single", 1, "cpu", placed, placement="hosts").case == "lone"  # a lone learner is anywhere
    with pytest.raises(ValueError, match="placement"):
        nearest("sync", 4, "cpu", placed, placement="cloud")
    from asrdist.sim.uncertainty import cases_from_bench, placement_of
    assert placement_of(4, 1, "loopback") == "loopback" and placement_of(4, None, None) == "loopback"
    assert placement_of(4, 4, "emulated-1gbit-nodelay") == "hosts" and placement_of(4, 2, "emulated-10gbit") == "hosts"
    bench = {"network": "loopback", "cores": 2, "load_average": {"before": [0.5]},
             "predictions": {"sync": {"2": {"relative_error": 1.2}}}}
    assert [c.placement for c in cases_from_bench(bench)] == ["loopback"]
    assert [c.placement for c in cases_from_bench({**bench, "network": "emulated-1gbit"})] == ["hosts"]
    out = tmp_path / "sim.json"
    assert main(["simulate", "--cluster", "2x2", "--network", "1gbit", "--json", str(out)]) == 0
    ranking = json.loads(out.read_text())["ranking"]
    assert all(p["nearest_validated"]["device"] == "gpu" for p in ranking)
    printed = capsys.readouterr().out
    assert "[1] simulate --validate" in printed
    # the strategies the winner does not beat beyond the simulator's error are named, in print and JSON
    from asrdist.sim.cli import within_error_of_winner
    result = json.loads(out.read_text())
    assert result["within_error_of_winner"] == within_error_of_winner(
        [SimpleNamespace(name=p["name"], epoch_seconds=p["epoch_seconds"]) for p in ranking],
        [SimpleNamespace(relative_error=p["nearest_validated"]["relative_error"]) for p in ranking])
    assert result["within_error_of_winner"] and all(name in printed.split("advice: ")[1]
                                                    for name in result["within_error_of_winner"])
    ranked = [SimpleNamespace(name=n, epoch_seconds=t) for n, t in (("a", 10.0), ("b", 11.0), ("c", 20.0))]
    errors = [SimpleNamespace(relative_error=e) for e in (0.1, 0.05, 0.1)]
    assert within_error_of_winner(ranked, errors) == ["b"] and within_error_of_winner(ranked, [None] * 3) == ["b", "c"]
    # CPU learners of one node on its loopback take loopback cases; GPUs of one node take the papers' (hosts)
    assert main(["simulate", "--cluster", "4", "--network", "loopback", "--seconds-per-frame", "2e-4",
                 "--json", str(out)]) == 0
    assert {p["nearest_validated"]["placement"] for p in json.loads(out.read_text())["ranking"]} == {"loopback"}
    assert main(["simulate", "--cluster", "4x1", "--network", "1gbit", "--seconds-per-frame", "2e-4",
                 "--json", str(out)]) == 0
    assert {p["nearest_validated"]["placement"] for p in json.loads(out.read_text())["ranking"]} == {"hosts"}
    assert main(["simulate", "--cluster", "1x8", "--device", "k20x", "--json", str(out)]) == 0
    assert {p["nearest_validated"]["device"] for p in json.loads(out.read_text())["ranking"]} == {"gpu"}


def test_cpu_learners_share_the_cores_and_memory_bound_work_gains_little_from_threads():
    """A lone learner: 0.1 s of CPU work on both cores' threads, then a 0.2 s sleep (emulated
    compute). Learners use one core each for their CPU work and share the cores when there are
    more learners than cores; a sleeping learner leaves its core to the others."""
    def step(n: int, thread_speedup: float) -> float:
        cluster = Cluster(1, n, LINKS["loopback"], LINKS["loopback"], shared_cores=2, one_machine=True,
                          thread_speedup=thread_speedup)
        return simulate(SimSpec("single", None, SHAPES, cluster, 100, 1e-3, step_overhead=0.2,
                                steps=12)).seconds_per_step

    assert step(1, 1.0) == pytest.approx(0.3)
    assert step(2, 1.0) == pytest.approx(0.3)  # memory-bound: one thread each is as fast as two
    assert step(2, 0.0) == pytest.approx(0.4)  # linear in threads: one thread takes twice as long
    assert step(4, 1.0) == pytest.approx(0.4)  # four start together: each runs at half speed


def test_cores_are_shared_by_all_work_in_progress_as_the_scheduler_does():
    """Processor sharing: 1 s and 2 s of one-thread work on one core, both from t=0, end at 2 s
    and 3 s (not 1 s and 3 s, as queueing would have it); a job arriving at 0.5 s on two cores
    beside one running job runs at full speed."""
    import simpy

    from asrdist.sim.resources import SharedCores

    def ends(cores: int, jobs: list[tuple[float, float, int]]) -> list[float]:
        env, done = simpy.Environment(), {}
        shared = SharedCores(env, cores)

        def job(name, start, seconds, threads):
            yield env.timeout(start)
            yield shared.run(seconds, threads)
            done[name] = env.now

        for i, (start, seconds, threads) in enumerate(jobs):
            env.process(job(i, start, seconds, threads))
        env.run()
        return [done[i] for i in range(len(jobs))]

    assert ends(1, [(0, 1.0, 1), (0, 2.0, 1)]) == pytest.approx([2.0, 3.0])
    assert ends(2, [(0, 1.0, 1), (0.5, 1.0, 1)]) == pytest.approx([1.0, 1.5])
    # a two-thread job and a one-thread job on two cores: 3 threads wanted, each at 2/3 speed
    assert ends(2, [(0, 1.0, 2), (0, 2.0, 1)]) == pytest.approx([1.5, 2.5])


def test_a_long_averaging_period_costs_in_proportion_not_nothing():
    """Averaging every 4000 minibatches (beyond what is simulated step by step): its period is
    simulated shortened with the average's cost in proportion, so bytes and communication per
    minibatch are a quarter of averaging every 1000, not zero (before: no average fell inside the
    simulated window, and averaging looked free)."""
    from asrdist.sim.spec import MAX_AVERAGING_STEPS, averaging_period, simulated_steps

    cluster = Cluster(2, 4, LINKS["nvlink"], LINKS["1gbit"])
    results = {}
    for every in (1000, 4000):
        spec = _spec("averaging", {"average_every": every * 256, "samples_per_step": 256}, cluster)
        assert simulated_steps(spec) == MAX_AVERAGING_STEPS
        assert averaging_period(spec) == (1000, 1000 / every)
        results[every] = simulate(spec)
    short, long = results[1000], results[4000]
    assert long.bytes_per_step[0] > 0 and long.bytes_per_step[0] == pytest.approx(short.bytes_per_step[0] / 4, rel=1e-9)
    communication = [r.comm_share * r.seconds_per_step for r in (short, long)]
    assert communication[1] == pytest.approx(communication[0] / 4, rel=0.02) and communication[1] > 0
    assert long.frames_per_second > short.frames_per_second
    # a run of exactly `steps` minibatches (bench scaling's learners) keeps its real period
    spec = _spec("averaging", {"average_every": 4000 * 256, "samples_per_step": 256}, cluster, own_steps=True)
    assert averaging_period(spec) == (4000, 1.0) and simulated_steps(spec) == spec.steps


def test_a_run_config_averages_what_its_optimizer_keeps_per_parameter():
    """The simulated average carries the optimizer tensors the real one does (averaging.py's
    `average_momentum`): SGD momentum one copy of the parameters, CNTK AdaGrad with momentum two,
    none without momentum or with `average_momentum=false`, and the bytes follow."""

    from asrdist.config import load_config
    from asrdist.sim.scenario import averaged_state_copies, config_job, run_job

    configs = CONFIGS
    default = load_config(configs / "default.yaml", ["strategy.name=averaging"])  # Nesterov 0.9
    cases = {
        "momentum": (default, 1),
        "local momentum": (load_config(configs / "default.yaml",
                                       ["strategy.name=averaging", "strategy.average_momentum=false"]), 0),
        "kaldi (no momentum)": (load_config(configs / "averaging.yaml"), 0),
        "adagrad": (load_config(configs / "default.yaml", ["strategy.name=averaging", "optim.name=adagrad"]), 2),
        "sync": (load_config(configs / "default.yaml", ["strategy.name=sync"]), 0),
    }
    for name, (cfg, copies) in cases.items():
        assert averaged_state_copies(cfg) == copies, name
    sent = {}
    for name in ("momentum", "local momentum"):
        job = config_job(cases[name][0], 4, 1e-5, cores=2)
        assert job.state_copies == cases[name][1]
        sent[name] = sum(run_job(job).detail.bytes_per_step)
    assert sent["momentum"] == pytest.approx(2 * sent["local momentum"], rel=1e-6) and sent["local momentum"] > 0


@pytest.mark.parametrize("strategy", ["sync", "onebit", "averaging", "adpsgd", "hierarchical", "hybrid"])
def test_every_strategy_simulates_a_lone_learner(strategy):
    one = Cluster(1, 1, LINKS["1gbit"], LINKS["1gbit"])
    result = simulate(_spec(strategy, cluster=one))
    assert result.frames_per_second > 0 and result.bytes_sent == [0] * len(result.bytes_sent)


def test_a_straggler_at_the_end_of_the_simulated_window_does_not_set_adpsgds_rate():
    """adpsgd at a straggler's pace for its own minibatches only: its last minibatch, still running
    when the others have emptied the pool, is paid once per epoch, not taken as the job's rate."""
    from asrdist.sim.scenario import run_job

    cluster = Cluster(1, 8, LINKS["nvlink"], LINKS["nvlink"])
    healthy = run_job(Job("adpsgd", strategy_config("adpsgd", None), SHAPES, cluster, 2048, 2e-5))
    slow = run_job(Job("adpsgd", strategy_config("adpsgd", None), SHAPES, cluster, 2048, 2e-5, slowdown={7: 100.0}))
    assert 0.7 < slow.frames_per_second / healthy.frames_per_second < 0.95  # about 7 of 8 learners' work (0.3 before)
    assert slow.detail.tail_seconds > healthy.detail.tail_seconds
    assert slow.comm_share > 0  # the passives' answers count as communication too


def test_hybrid_blends_both_phases_figures():
    from asrdist.sim.scenario import run_job

    cluster = Cluster(2, 2, LINKS["nvlink"], LINKS["1gbit"])
    settings = {"sync_epochs": 1}

    def job(epochs: int):
        return run_job(Job("hybrid", strategy_config("hybrid", settings), SHAPES, cluster, 1024, 2e-5, epochs=epochs))

    sync_only, blended = job(1), job(4)
    phases = [simulate(Job("hybrid", strategy_config("hybrid", settings), SHAPES, cluster, 1024, 2e-5).spec(**kw))
              for kw in ({"synchronous": True}, {})]
    mb = [sum(p.bytes_sent) / sum(p.steps) for p in phases]
    assert sync_only.bytes_per_step == pytest.approx(mb[0])
    assert blended.bytes_per_step == pytest.approx((mb[0] + 3 * mb[1]) / 4)
    assert min(p.comm_share for p in phases) <= blended.comm_share <= max(p.comm_share for p in phases)


def test_a_comparisons_simulated_runs_carry_their_nearest_validated_case():
    from asrdist.compare.prediction import nearest_validated, uncertainty_line
    from asrdist.sim.uncertainty import load_cases, nearest

    record = {"run": "adpsgd", "strategy": "adpsgd", "learners": 4, "predicted_frames_per_second": 1000.0,
              "nodes": 1, "network": "loopback"}
    case = nearest_validated(record)
    assert case["case"] == nearest("adpsgd", 4, "cpu", placement="loopback").case
    assert case["case"] in [c.case for c in load_cases()]
    on_hosts = nearest_validated({**record, "nodes": 4, "network": "emulated-1gbit-nodelay"})
    assert on_hosts["case"] == nearest("adpsgd", 4, "cpu", placement="hosts").case
    assert nearest_validated({**record, "predicted_frames_per_second": None}) is None  # nothing predicted
    line = uncertainty_line({"runs": [{**record, "prediction_nearest_validated": case}, {"run": "failed"}]})
    assert f"adpsgd {100 * case['relative_error']:+.0f}%" in line and case["case"] in line
    assert uncertainty_line({"runs": [{"run": "failed"}]}) == ""


def test_cpu_learners_code_onebit_on_the_cores_they_share_even_while_the_wire_is_busy():
    """4 double-buffered onebit learners on one machine's 2 cores: the exchange of one minibatch
    crosses a slow link while the next is computed. On a device of its own the wire would hide the
    stripes' coding; CPU learners code on the cores their compute fills, so every second of every
    learner's CPU work (compute, quantize, the owners' reduce, dequantize) takes the shared cores
    and a step lasts at least their sum over the cores."""
    import dataclasses

    link = dataclasses.replace(LINKS["1gbit"], bandwidth=LINKS["1gbit"].bandwidth / 10)
    cluster = Cluster(4, 1, link, link, shared_cores=2, one_machine=True, thread_speedup=1.0)
    spec = SimSpec("onebit", strategy_config("onebit", {"double_buffering": True}), SHAPES, cluster, 1000, 2e-5,
                   quantize_cost=1e-8, dequantize_cost=1e-8, steps=12)
    values = sum(math.prod(s) for s in SHAPES)
    compute = spec.local_batch * 2e-5
    coding = (1e-8 + (1e-8 + 1e-8 / 4) + 1e-8) * values  # quantize, reduce its stripe, dequantize
    assert simulate(spec).seconds_per_step >= 4 * (compute + coding) / 2 * 0.999


def test_a_step_waits_for_the_learner_the_scheduler_left_last_on_shared_cores():
    """`lockstep_wait` (measured by `asrdist.calibrate.lockstep`): on shared CPU cores, the first lock-step
    collective that needs every learner's whole step waits that much longer: a sync step (its
    last bucket, with or without overlap), a onebit step, an average (once per average); never
    an asynchronous exchange, and never on a cluster of devices (no shared cores)."""
    wait = 0.01

    def step(strategy: str, settings: dict, lockstep_wait: float, shared_cores: int = 2) -> float:
        cluster = Cluster(1, 4, LINKS["loopback"], LINKS["loopback"], shared_cores=shared_cores, one_machine=True,
                          thread_speedup=1.0)
        spec = _spec(strategy, settings, cluster, lockstep_wait=lockstep_wait, own_steps=True)
        return simulate(spec).seconds_per_step

    buckets = {"bucket_cap_mb": 0.25}  # several buckets: the first ones leave during backward
    for settings in ({"overlap": True, **buckets}, {"overlap": False, **buckets}):
        assert step("sync", settings, wait) - step("sync", settings, 0.0) == pytest.approx(wait, rel=0.02), settings
    onebit = step("onebit", {"double_buffering": False}, wait) - step("onebit", {"double_buffering": False}, 0.0)
    assert 0.5 * wait < onebit <= 1.001 * wait  # its chunks' coding on the cores overlaps part of the wait
    every = 4  # an average every 4 minibatches of 256 frames: 2 averages in the 8 steps simulated
    period = {"average_every": 256 * every}
    averaged = step("averaging", period, wait) - step("averaging", period, 0.0)
    assert averaged == pytest.approx(wait / every, rel=0.02)
    assert step("adpsgd", {"pattern": "fixed"}, wait) == pytest.approx(step("adpsgd", {"pattern": "fixed"}, 0.0))
    assert step("sync", buckets, wait, shared_cores=0) == pytest.approx(step("sync", buckets, 0.0, shared_cores=0))


def test_each_message_of_a_lock_step_collective_costs_its_wake_up_on_shared_cores():
    """`collective_step_seconds` and `collective_step_cpu` (measured by `asrdist.calibrate.lockstep`): on
    shared CPU cores each sequential message of a lock-step collective (a ring allreduce of 4:
    6) takes at least that long and that much more of the learner's CPU; an asynchronous exchange
    and a cluster of devices pay neither."""
    from asrdist.parallel import sync
    from asrdist.sim.resources import transfer_seconds

    buckets = {"bucket_cap_mb": 0.25, "overlap": False}

    def step(strategy: str, settings: dict, shared_cores: int = 2, **costs) -> float:
        cluster = Cluster(1, 4, LINKS["loopback"], LINKS["loopback"], shared_cores=shared_cores, one_machine=True,
                          thread_speedup=1.0)
        return simulate(_spec(strategy, settings, cluster, own_steps=True, **costs)).seconds_per_step

    traffic = sync.exchange_traffic(SHAPES, 4, 4, sync.SyncConfig(**buckets))  # one bucket after another
    collectives = [t for bucket in traffic for t in bucket]
    assert len(collectives) >= 2 and {t.kind for t in collectives} == {"allreduce"}
    messages = 6 * len(collectives)
    cluster = Cluster(1, 4, LINKS["loopback"], LINKS["loopback"], shared_cores=2, one_machine=True)
    wire = sum(transfer_seconds(t, cluster) for t in collectives)
    # a collective takes the longer of its link's time and its messages' wake-ups (they overlap)
    assert step("sync", buckets, collective_step_seconds=0.1 * wire / messages) == pytest.approx(step("sync", buckets))
    longer = step("sync", buckets, collective_step_seconds=0.01) - step("sync", buckets)
    assert longer == pytest.approx(messages * 0.01 - wire, rel=0.02)
    # CPU far beyond the link's time: 4 learners' messages on 2 cores take twice each learner's CPU
    busier = step("sync", buckets, collective_step_cpu=0.01) - step("sync", buckets)
    assert busier == pytest.approx(messages * 0.01 * 4 / 2, rel=0.05)
    adpsgd = {"pattern": "fixed"}
    assert step("adpsgd", adpsgd, collective_step_seconds=0.001, collective_step_cpu=0.001) == \
        pytest.approx(step("adpsgd", adpsgd))
    assert step("sync", buckets, 0, collective_step_seconds=0.001) == pytest.approx(step("sync", buckets, 0))


def test_an_adpsgd_exchange_waits_for_a_passive_that_trains_and_nothing_else_does():
    """`answer_delay` (measured by `asrdist.calibrate.lockstep`): each ADPSGD exchange takes that much
    longer before the passive's reply goes out. The active stalls on it (its step grows by the
    delay; the passive's does not); delay-by-one hides it behind the next step's compute when the
    exchange is shorter; a lock-step strategy never pays it."""
    delay = 0.002
    cluster = Cluster(1, 2, LINKS["loopback"], LINKS["loopback"])  # one active, one passive: no queue

    def steps(strategy: str, settings: dict, answer_delay: float):
        result = simulate(_spec(strategy, settings, cluster, answer_delay=answer_delay, own_steps=True))
        return result.seconds_per_step, result.frames_per_second

    stalled, _ = steps("adpsgd", {"pattern": "fixed"}, delay)
    base, _ = steps("adpsgd", {"pattern": "fixed"}, 0.0)
    assert stalled - base == pytest.approx(delay / 2, rel=0.02)  # the mean of the active's +delay and the passive's 0
    # delay-by-one: a 5 ms step (256 frames x 2e-5 s) covers a 1 ms exchange and the delay; only the
    # last exchange, waited for at the end of the 8 steps, shows (the active's 1/8, halved by the mean)
    hidden = {"pattern": "fixed", "delay_by_one": True}
    shown = steps("adpsgd", hidden, delay)[0] - steps("adpsgd", hidden, 0.0)[0]
    assert shown == pytest.approx(delay / 2 / 8, rel=0.02)
    assert steps("sync", {}, delay) == pytest.approx(steps("sync", {}, 0.0))


def test_a_learner_of_a_job_wide_pool_pays_its_claim_on_the_store_every_minibatch():
    """`claim_seconds` (measured by `asrdist.calibrate.lockstep`): adpsgd's learners claim each minibatch
    from the job's pool on the store before computing it, each step that much longer; a lock-step
    strategy's learners take theirs without the store."""
    claim = 0.002
    cluster = Cluster(1, 2, LINKS["loopback"], LINKS["loopback"])

    def step(strategy: str, claim_seconds: float) -> float:
        return simulate(_spec(strategy, {}, cluster, claim_seconds=claim_seconds, own_steps=True)).seconds_per_step

    assert step("adpsgd", claim) - step("adpsgd", 0.0) == pytest.approx(claim, rel=0.02)
    assert step("sync", claim) == pytest.approx(step("sync", 0.0))


def test_each_side_of_an_adpsgd_exchange_pays_its_cpu_beyond_the_bytes_on_shared_cores():
    """`exchange_cpu` (measured by `asrdist.calibrate.lockstep`): CPU learners spend it on each side of every
    ADPSGD exchange, on the cores they share; with the cores idle it hides under the wire, with every
    core computing it slows the job; learners with their own devices and lock-step strategies never
    pay it."""
    link = LINKS["1gbit"]

    def fps(strategy: str, exchange_cpu: float, shared_cores: int) -> float:
        cluster = Cluster(1, 4, link, link, shared_cores=shared_cores, one_machine=True, thread_speedup=1.0)
        return simulate(_spec(strategy, {"pattern": "fixed"} if strategy == "adpsgd" else {}, cluster,
                              exchange_cpu=exchange_cpu, own_steps=True)).frames_per_second

    assert fps("adpsgd", 0.01, 2) < 0.97 * fps("adpsgd", 0.0, 2)  # 4 learners on 2 cores: CPU is the bottleneck
    assert fps("adpsgd", 0.01, 0) == pytest.approx(fps("adpsgd", 0.0, 0))
    assert fps("sync", 0.01, 2) == pytest.approx(fps("sync", 0.0, 2))
