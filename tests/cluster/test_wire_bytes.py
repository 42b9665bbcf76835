"""Bytes on the wire (issue 34 item 4): the emulated hosts' NIC counters against the strategies'
own byte counts. Counted and wire payload must agree within 5% once the protocol overhead is
removed: every frame a veth counts is one TCP/IPv4 segment (or a segmentation-offload
super-segment) of the learners' connections, so the estimate takes Ethernet + IPv4 + TCP headers
(with the timestamp option) per counted segment off the counted bytes (`netem.payload_on_wire`),
and the payload of the barrier that closes every measured exchange, measured alone, off that."""
from __future__ import annotations

import pytest

from asrdist.bench.comm import WIRE_TOLERANCE, _wire_figures
from asrdist.cluster import netem
from asrdist.cluster.launcher import run_learners

needs_netns = pytest.mark.usefixtures("emulated_network_available")
# A DNN 440 -> 512 -> 512 -> 40: ~510k gradients, enough payload per exchange that gloo's framing
# (a preamble of tens of bytes per message, not in the header estimate) stays far below 5%
SHAPES = [[512, 440], [512], [512, 512], [512], [40, 512], [40]]


def test_payload_on_wire_takes_one_header_per_segment():
    before = {"tx_bytes": 1000, "tx_packets": 10, "rx_bytes": 0, "rx_packets": 0}
    after = {"tx_bytes": 1000 + 3 * 66 + 5000, "tx_packets": 13, "rx_bytes": 0, "rx_packets": 0}
    assert netem.payload_on_wire(before, after, header_bytes=66) == {"bytes": 5198, "packets": 3, "payload_bytes": 5000}


@needs_netns
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:emulated network. kernel has no netem")
@pytest.mark.parametrize("learners", [2, 4])
def test_counted_bytes_match_the_wire(learners):
    results = run_learners("asrdist.bench.comm", "exchange_timing", learners, None, "10gbit",
                           {"shapes": SHAPES, "repeats": 3, "kernel": "auto", "chunks": None}, timeout=300)
    figures = _wire_figures(results[0], learners, learners)
    for name in ("sync", "onebit"):
        w = figures["wire"][name]
        assert w["payload_bytes_per_exchange"] > 0, (name, w)
        assert abs(w["counted_vs_wire"] - 1) <= WIRE_TOLERANCE, (name, w)
    assert figures["counted_matches_wire"] is True
    # the wire sees 1-bit's compression: far fewer bytes than fp32's allreduce
    assert figures["bytes_ratio"] < 0.1


def test_counted_bytes_that_miss_the_wire_are_caught():
    # a count short by 10% (as a strategy forgetting a message would be) must not pass
    wire = {"bytes": 110_000, "packets": 10, "payload_bytes": 109_340}
    r0 = {"sync_bytes": 0.9 * 109_340, "onebit_bytes": 109_340 / 30,
          "wire": {"sync": wire, "onebit": {"bytes": 4300, "packets": 10, "payload_bytes": 109_340 / 30},
                   "barrier": {"bytes": 0, "packets": 0, "payload_bytes": 0}}}
    figures = _wire_figures(r0, 2, 2)
    assert figures["counted_matches_wire"] is False
    assert figures["wire"]["sync"]["counted_vs_wire"] == pytest.approx(0.9)


@needs_netns
@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:emulated network. kernel has no netem")
def test_a_run_on_emulated_hosts_records_its_wire_bytes(tone_corpus, tmp_path):
    import json

    from asrdist.cli import main

    out = tmp_path / "run"
    assert main(["train", "configs/default.yaml", "model.hidden_dim=64", "model.hidden_layers=2", "data.batch_size=126",
                 "--data", str(tone_corpus), "--learners", "2", "--nodes", "2", "--network", "10gbit",
                 "--strategy", "sync", "--epochs", "1", "--out", str(out), "--no-progress"]) == 0
    summary = json.loads((out / "summary.json").read_text())
    wire, counted = summary["wire"], summary["comm"]["bytes_sent"]
    assert [h["node"] for h in wire["hosts"]] == [0, 1]
    assert wire["payload_bytes"] == sum(h["payload_bytes"] for h in wire["hosts"]) < wire["frame_bytes"]
    # one learner per host: every counted byte crossed a link (and the job's start, validation and
    # end added their own)
    assert wire["payload_bytes"] >= (1 - WIRE_TOLERANCE) * counted > 0
