"""`asrdist bench peers` (issue 34 item 5): asrdist's strategies beside torch's own mechanisms,
on the same model, minibatches and learners."""
from __future__ import annotations

import json

import pytest

from asrdist.cli import main

@pytest.mark.slow
def test_bench_peers_did_the_same_work_as_torch(tmp_path):
    out = tmp_path / "peers.json"
    assert main(["bench", "peers", "--json", str(out), "--networks", "loopback", "--hidden-dim", "64",
                 "--steps", "3", "--rounds", "2", "--period", "2"]) == 0
    result = json.loads(out.read_text())
    assert result["networks"] == ["loopback"]
    sync = result["sync_vs_ddp"]["loopback"]
    # the same initial weights, minibatches and SGD: asrdist sync is DDP's arithmetic (a mean of two
    # gradients is exact in float32), and averaging every 2 steps is torch's PeriodicModelAverager
    assert sync["parameters_bitwise_equal"] and sync["same_work"]
    assert sync["ratio"] > 0 and sync["target"] == 0.97 and sync["met"] in (True, False)
    averaging = result["averaging_vs_torch"]["loopback"]
    assert averaging["parameters_bitwise_equal"] and averaging["ratio"] > 0
    onebit = result["onebit_vs_powersgd"]["loopback"]
    assert onebit["onebit_vs_rank1"] > 0 and onebit["onebit_vs_rank4"] > 0
    assert onebit["after_steps"] == 6
    assert onebit["bytes_per_step"]["onebit"]["counted"] < onebit["bytes_per_step"]["sync"]["counted"] / 10
    # DDP and PowerSGD run as asrdist's ddp strategy, which counts its bytes too
    assert 0 < onebit["bytes_per_step"]["powersgd_rank1"]["counted"] < onebit["bytes_per_step"]["sync"]["counted"]
    assert result["runs"]["loopback"]["bytes_per_step"]["ddp"]["counted"] == onebit["bytes_per_step"]["sync"]["counted"]
    for name in ("onebit", "powersgd_rank1", "powersgd_rank4", "sync"):
        assert 0 < onebit["held_out_loss"][name] < 10, name


@pytest.mark.parametrize("networks, message", [(" , ", "bench peers --networks ' , ': names no network"),
                                                ("loopback,fast", "network rate 'fast'")])
def test_bench_peers_refuses_bad_networks_before_any_job(networks, message, tmp_path, capsys):
    out = tmp_path / "peers.json"
    assert main(["bench", "peers", "--json", str(out), "--networks", networks]) != 0
    err = capsys.readouterr().err.strip()
    assert err.startswith("asrdist: error: ") and message in err and "\n" not in err, err
    assert not out.exists()
