"""H-ADPSGD (`hierarchical`): 2 nodes x 2 learners, sync inside a node, adpsgd between nodes.
Job-wide epochs hand a node's members one minibatch each at a time; the strategy trains the tone
corpus within 3% relative PER of sync; a straggler slows its own node only."""
from __future__ import annotations

import json
import os

import pytest
import torch.distributed as dist

from asrdist.cli import main
from asrdist.cluster.netem import available, list_namespaces
from asrdist.data.job_sampler import JobEpochSampler
from tests.support.per_check import assert_per_as_good_as
from tests.support.engine_fixture import ListOrder

TINY = ["model.hidden_dim=64", "model.hidden_layers=2", "data.batch_size=128", "train.log_every=10",
        "optim.warmup_steps=0", "optim.anneal_after_epoch=null", "train.group_size=2"]


def test_a_nodes_members_claim_together_and_cover_the_epoch_once():
    store, order = dist.HashStore(), ListOrder(10)
    samplers = [JobEpochSampler(order, store, 4, group_size=2, rank=r) for r in range(4)]
    iters = [iter(s) for s in samplers]
    taken: dict[int, list[int]] = {r: [] for r in range(4)}
    for node in (0, 1, 1, 0, 0, 1, 1, 0):  # nodes at their own pace; members in step
        for r in (2 * node, 2 * node + 1):  # the leader claims first, its member reads the claim
            batch = next(iters[r], None)
            if batch is not None:
                taken[r].append(next(i for i, b in enumerate(order.batches) if b is batch))
    assert sorted(sum(taken.values(), [])) == list(range(10))
    for leader, member in ((0, 1), (2, 3)):
        assert [k + 1 for k in taken[leader]] == taken[member]  # one minibatch each, same steps
    assert len(taken[0]) + len(taken[2]) == 5


def test_a_synchronous_phase_hands_every_node_the_same_minibatches_without_the_store():
    order = ListOrder(11)
    samplers = [JobEpochSampler(order, None, 4, group_size=2, rank=r) for r in range(4)]
    taken, clocks = [], []
    for s in samplers:
        s.lockstep = True
        taken.append([])
        clocks.append([])
        for batch in s:
            taken[-1].append(next(i for i, b in enumerate(order.batches) if b is batch))
            clocks[-1].append(s.schedule_step())
    assert [len(t) for t in taken] == [2, 2, 2, 2]  # 5 units of 2 over 2 nodes: 2 each, one left over
    assert sorted(sum(taken, [])) == list(range(8))
    assert clocks == [[0, 1]] * 4  # one learning-rate clock for learners whose updates are averaged


@pytest.fixture(scope="module")
def corpus(tone_corpus):
    return tone_corpus


# two emulated hosts of two learners (namespaces, 1 Gbit/s between hosts) where this machine can
# build them, else the same layout on loopback through train.group_size
def _two_hosts() -> list[str]:
    """Asked by the tests that train (slow), not at collection: the probe builds a namespace."""
    return ["--nodes", "2", "--network", "1gbit"] if available()[0] else []


def _train(corpus, out, *extra, epochs: int = 2) -> dict:
    assert main(["train", "configs/default.yaml", *TINY, *extra, "--data", str(corpus), "--learners", "4",
                 "--epochs", str(epochs), "--out", str(out), "--no-progress"]) == 0
    return json.loads((out / "summary.json").read_text())


def _ours() -> list[str]:
    return [ns for ns in list_namespaces() if f"-{os.getpid()}-" in ns]


@pytest.fixture(scope="module")
def sync(corpus, tmp_path_factory):
    return _train(corpus, tmp_path_factory.mktemp("sync") / "run", "--strategy", "sync")


@pytest.mark.slow
def test_two_nodes_of_two_train_as_well_as_sync_and_a_straggler_slows_its_node_only(corpus, sync, tmp_path):
    hier = _train(corpus, tmp_path / "hier", "--strategy", "hierarchical", *_two_hosts())
    assert_per_as_good_as(hier, sync)
    steps = {p["rank"]: p["steps"] for p in hier["comm"]["per_learner"]}
    assert steps[0] == steps[1] and steps[2] == steps[3]  # lock step inside a node
    # compute emulated (20 ms a step) so that compute, not this machine's overheads, sets the pace;
    # one epoch (~100 claims between the nodes) shows the pace as well as two
    slow = _train(corpus, tmp_path / "slow", "--strategy", "hierarchical", "train.straggler.ranks=[3]",
                  "train.straggler.slowdown=4.0", "train.emulate_compute_ms=20", epochs=1)
    steps = {p["rank"]: p["steps"] for p in slow["comm"]["per_learner"]}
    assert steps[2] == steps[3] and steps[0] > 1.5 * steps[3], steps  # node 0 keeps its pace


@pytest.mark.slow  # test_launcher.py checks the same share in-process
@pytest.mark.usefixtures("emulated_network_available")
def test_learners_of_emulated_hosts_share_this_machines_cores(corpus, tmp_path):
    """Two emulated hosts of one learner each run on one machine: each learner takes half its
    cores, not all of them as one learner per real host would (LOCAL_WORLD_SIZE is 1 there)."""
    # a few steps: the share is set when the learners start, whatever the run's length
    assert main(["train", "configs/default.yaml", *TINY, "train.max_steps=4", "--data", str(corpus), "--learners", "2",
                 "--epochs", "1", "--strategy", "adpsgd", *_two_hosts(), "--out", str(tmp_path / "run"),
                 "--no-progress"]) == 0
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["threads_per_learner"] == max(1, len(os.sched_getaffinity(0)) // 2)


@pytest.mark.slow
def test_hybrid_starts_synchronous_then_goes_asynchronous(corpus, sync, tmp_path):
    run = _train(corpus, tmp_path / "hybrid", "--strategy", "hybrid", "strategy.sync_epochs=1", *_two_hosts())
    assert_per_as_good_as(run, sync)
    assert run["final"]["frame_accuracy"] > 0.9, run["final"]
    assert not _ours()  # the emulated hosts are gone
    records = [json.loads(line) for line in (tmp_path / "hybrid" / "metrics.jsonl").read_text().splitlines()]
    epochs = [r for r in records if r["kind"] == "epoch"]
    assert epochs[0]["consensus_distance"] < 1e-6  # synchronous epoch: every learner identical
    assert epochs[1]["consensus_distance"] > 0  # then the nodes drift apart between exchanges
