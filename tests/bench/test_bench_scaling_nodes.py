"""`asrdist bench scaling --nodes A --per-node B`: the configurations of the hierarchical issue at
A nodes x B learners, the hierarchical allreduce speed-up and the bandwidth model beside it.
End to end on loopback with a tiny model (timing targets are the benchmark's business, not the
tests')."""
from __future__ import annotations

import json

import pytest

from asrdist.bench.scaling import NODE_CONFIGS, predict_hierarchical_allreduce
from asrdist.cli import main


def test_bandwidth_model_of_the_hierarchical_allreduce():
    gbit = 1e9
    s = 4 * 45_122_648  # the swbd gradient, float32
    p = predict_hierarchical_allreduce(s, 2, 2, gbit)
    # flat ring of 4: 2S(n-1)/n = 1.5 S on a link between nodes; hierarchical: 2 learners x
    # 2(S/2)(1/2) = S on a node's link
    assert p["flat_link_bytes"] == pytest.approx(1.5 * s)
    assert p["hierarchical_link_bytes"] == pytest.approx(1.0 * s)
    assert p["flat_seconds"] == pytest.approx(1.5 * s * 8 / gbit)
    assert p["hierarchical_seconds"] == pytest.approx(s * 8 / gbit)
    assert p["ratio"] == pytest.approx(1.5)
    # the ratio ((n-1)/n) / ((A-1)/A): one learner per node gains nothing; more per node gain more
    assert predict_hierarchical_allreduce(s, 4, 1, gbit)["ratio"] == pytest.approx(1.0)
    assert predict_hierarchical_allreduce(s, 2, 4, gbit)["ratio"] == pytest.approx((7 / 8) / (1 / 2))
    assert predict_hierarchical_allreduce(s, 4, 2, 10 * gbit)["ratio"] == pytest.approx((7 / 8) / (3 / 4))
    with pytest.raises(ValueError):
        predict_hierarchical_allreduce(s, 1, 4, gbit)  # one node: nothing crosses nodes


@pytest.mark.slow  # three jobs of four learner processes
def test_bench_scaling_nodes_writes_its_contract(tmp_path):
    out = tmp_path / "scaling_nodes.json"
    assert main(["bench", "scaling", "--json", str(out), "--nodes", "2", "--per-node", "2", "--network", "loopback",
                 "--model", "dnn", "--hidden-dim", "32", "--hidden-layers", "1", "--feature-dim", "8",
                 "--num-classes", "5", "--steps", "1", "--warmup", "1", "--compute-ms", "5", "--local-batch", "16",
                 "--exchange-repeats", "2", "--timeout", "120",
                 "--configs", "sync_hierarchical,hybrid"]) == 0  # sync_flat always runs (it times the allreduces)
    result = json.loads(out.read_text())
    assert "results" not in result and "speedup" not in result  # no learner-count sweep unless asked
    assert result["network"] == "loopback" and "network_fallback" not in result  # asked for loopback
    section = result["nodes"]
    assert section["nodes"] == 2 and section["per_node"] == 2 and section["learners"] == 4
    assert section["network"] == "loopback"
    assert result["hierarchical_allreduce_speedup"] == section["hierarchical_allreduce_speedup"] > 0
    assert section["hierarchical_allreduce_predicted"] == pytest.approx(1.5)
    expected = {"sync_flat", "sync_hierarchical", "hybrid"}
    assert set(section["results"]) == expected and expected < set(NODE_CONFIGS)
    assert all(fps > 0 for fps in section["results"].values())
    details = section["details"]
    for config, fps in section["results"].items():
        d = details[config]
        assert d["steps"] == 1 and d["bytes_sent_per_step"] > 0 and len(d["per_learner"]) == 4
        assert fps == d["frames_per_second"]  # one throughput for every strategy, async ones too
    assert {c for c in expected if not details[c]["lockstep"]} == {"hybrid"}
    assert details["hybrid"]["phase"].startswith("asynchronous")
    assert details["sync_flat"]["strategy_config"] == {"hierarchical": "false"}
    assert details["sync_hierarchical"]["strategy_config"] == {"hierarchical": "true"}
    ex = details["exchange"]
    assert len(ex["flat_seconds"]) == len(ex["hierarchical_seconds"]) == 2
    assert ex["flat_seconds_median"] > 0 and ex["hierarchical_seconds_median"] > 0
    assert result["hierarchical_allreduce_speedup"] == pytest.approx(
        ex["flat_seconds_median"] / ex["hierarchical_seconds_median"])
    assert ex["max_abs_difference"] < 1e-6  # the same mean, another summation order
    assert ex["gradient_bytes"] == 4 * section["parameters"] == 4 * (32 * 88 + 32 + 5 * 32 + 5)
    assert details["hierarchical_comm_speedup_in_training"] > 0
    assert details["prediction"]["rate"] == "1gbit"  # loopback: the model at the 1 Gbit/s


def test_unknown_node_config_is_refused_before_anything_runs(tmp_path, capsys):
    assert main(["bench", "scaling", "--json", str(tmp_path / "x.json"), "--nodes", "2",
                 "--configs", "sync_flat,ring"]) != 0
    assert "unknown ring" in capsys.readouterr().err and not (tmp_path / "x.json").exists()
    assert main(["bench", "scaling", "--json", str(tmp_path / "x.json"), "--configs", "hybrid"]) != 0  # no --nodes
    assert "give --nodes too" in capsys.readouterr().err and not (tmp_path / "x.json").exists()


def test_nodes_mode_falls_back_to_loopback_and_says_so(tmp_path, monkeypatch):
    """Without network emulation the run goes on loopback, and the JSON says so (learner jobs
    replaced by a stand-in that records how they were asked for)."""
    import asrdist.cluster.netem as netem
    import asrdist.cluster.launcher as launcher

    calls = []

    def fake_run_learners(module, fn, world_size, nodes, network, args, timeout=120.0):
        calls.append((fn, world_size, nodes, network, args["strategy"], args.get("strategy_config")))
        lockstep = args["strategy"] in ("sync", "onebit")
        rs = []
        for rank in range(world_size):
            r = {"rank": rank, "network": network, "threads": 1, "parameters": 1000, "strategy": args["strategy"],
                 "lockstep": lockstep, "frames_per_second": 100.0, "sum_of_learner_rates": 90.0, "seconds": 1.0,
                 "frames": 100.0, "steps": 2, "seconds_per_step": 0.5, "compute_seconds_per_step": 0.1,
                 "comm_seconds_per_step": 0.2, "wait_seconds_per_step": 0.1, "cpu_seconds_per_step": 0.3,
                 "bytes_sent_per_step": 10.0}
            if args.get("exchange_repeats"):
                r["exchange"] = {"flat_seconds": [3.0, 3.0, 2.0], "hierarchical_seconds": [2.0, 1.0, 2.0],
                                 "flat_bytes": 1, "hierarchical_bytes": 1, "max_abs_difference": 0.0}
            rs.append(r)
        return rs

    monkeypatch.setattr(netem, "available", lambda: (False, "needs root"))
    monkeypatch.setattr(launcher, "run_learners", fake_run_learners)
    out = tmp_path / "fallback.json"
    with pytest.warns(RuntimeWarning, match="falling back to loopback"):
        assert main(["bench", "scaling", "--json", str(out), "--per-node", "2", "--exchange-repeats", "3"]) == 0
    result = json.loads(out.read_text())
    assert result["network"] == "loopback" and result["requested_network"] == "1gbit"
    assert "needs root" in result["network_fallback"]
    section = result["nodes"]
    assert section["network"] == "loopback" and (section["nodes"], section["per_node"]) == (2, 2)
    assert [c[0] for c in calls] == ["scaling_learner"] * len(NODE_CONFIGS)
    assert all(c[1:4] == (4, 2, "loopback") for c in calls)
    assert [(c[4], c[5]) for c in calls] == list(NODE_CONFIGS.values())
    # the job's frames/s for every configuration (utils.throughput), never the sum of learners' rates
    assert section["results"] == {c: 100.0 for c in NODE_CONFIGS}
    assert result["hierarchical_allreduce_speedup"] == section["hierarchical_allreduce_speedup"] == 1.5  # 3 / 2
    assert section["hierarchical_allreduce_predicted"] == pytest.approx(1.5)
    assert section["details"]["prediction"]["rate"] == "1gbit"
