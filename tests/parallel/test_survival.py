"""adpsgd goes on without lost learners (issue 12 item 5): the membership agreement through the
store, the partner an active takes instead of a lost passive, a node that lives or dies whole. The
real 4-learner `asrdist train` jobs that lose learners (adpsgd: one killed, one hung; hierarchical:
a node) are tests/run/test_fault_recovery.py's, which also resume them."""
from __future__ import annotations

import json
from datetime import timedelta

import pytest
import torch
import torch.distributed as dist

from asrdist.errors import CommError, TrainingError
from asrdist.parallel import comm
from asrdist.parallel import groups as groups_module
from asrdist.parallel import membership as membership_module
from asrdist.parallel.adpsgd import AdpsgdConfig, AdpsgdStrategy
from asrdist.parallel.base import CommCounters, LearnerContext
from asrdist.parallel.membership import Membership, NodeMembership, report_lost
from tests.support.dist_utils import learner_context, run_distributed


def _store():
    return dist.HashStore()


def test_the_first_report_of_a_loss_stands_and_records_the_last_step(tmp_path):
    store = _store()
    store.set("progress/2", "137")
    first = report_lost(store, 2, "killed by signal 9", by="launcher")
    again = report_lost(store, 2, "died: its connection closed during an exchange", by="rank 0")
    assert first == again == {"rank": 2, "step": 137, "reason": "killed by signal 9", "by": "launcher"}
    assert report_lost(store, 3, "hung", by="rank 1")["step"] is None  # it never finished a step


def test_survivors_agree_on_one_member_list_and_build_one_group(monkeypatch):
    store = _store()
    made = []
    monkeypatch.setattr(groups_module.dist, "new_group",
                        lambda ranks, **kw: made.append((ranks, kw["use_local_synchronization"])) or "group")
    views = [Membership(store, r, 4, timedelta(seconds=30)) for r in range(4)]
    for r in (0, 1, 3):  # rank 2 never arrives: the launcher reports it
        store.set(f"sync/1/{r}", "1")
    report_lost(store, 2, "killed by signal 9", by="launcher")
    assert views[0].agree() == [0, 1, 3] and views[3].agree() == [0, 1, 3]
    assert views[0].group == "group" and made == [([0, 1, 3], True), ([0, 1, 3], True)]
    assert views[0].lost_learners() == [{"rank": 2, "step": None, "reason": "killed by signal 9"}]
    # a second sync point with the same survivors builds no new group
    for r in (0, 1, 3):
        store.set(f"sync/2/{r}", "1")
    assert views[0].agree() == [0, 1, 3] and len(made) == 2


def test_a_learner_that_arrives_nowhere_within_the_timeout_is_declared_hung_and_one_declared_lost_stops():
    store = _store()
    fast = Membership(store, 0, 2, timedelta(seconds=0.2))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(membership_module, "AGREE_MARGIN_S", 0.1)
        mp.setattr(groups_module.dist, "new_group", lambda ranks, **kw: "group")
        assert fast.agree() == [0]
    assert fast.lost[1]["reason"].startswith("hung: reached no sync point")
    late = Membership(store, 1, 2, timedelta(seconds=0.2))
    with pytest.MonkeyPatch.context() as mp, pytest.raises(TrainingError, match="rank 1: its peers went on without it"):
        late.agree()


def _hang_inside_the_collective(rank, world_size):
    """Rank 2 arrives at the sync point, then hangs (waits for the others to finish) instead of
    taking part in the survivors' allreduce."""
    ctx = learner_context()
    membership_module.AGREE_MARGIN_S = 0.5
    membership = Membership(ctx.store, rank, world_size, timedelta(seconds=2))
    if rank == 2:
        membership.agree()
        ctx.store.wait(["test/done"], timedelta(seconds=120))
        return {}
    attempts = []

    def total(group, members):
        attempts.append(list(members))
        t = torch.ones(1)
        comm.allreduce(t, CommCounters(), group=group, timeout=membership.timeout)
        return float(t)

    result = membership.collective(total, ctx.group)
    if rank == 0:
        ctx.store.set("test/done", "1")
    return {"total": result, "attempts": attempts, "lost": membership.lost_learners()}


@pytest.mark.slow
def test_a_learner_that_hangs_inside_the_survivors_collective_is_left_out_and_the_collective_run_again(tmp_path):
    results = run_distributed(_hang_inside_the_collective, 3, tmp_path)
    for r in results[:2]:
        assert r["attempts"] == [[0, 1, 2], [0, 1]]  # the first one timed out waiting for rank 2
        assert r["total"] == 2.0
        assert [(x["rank"], x["reason"].split(":")[0]) for x in r["lost"]] == [(2, "hung")]


def test_a_collective_failing_with_nobody_else_to_blame_is_not_retried(monkeypatch):
    monkeypatch.setattr(groups_module.dist, "new_group", lambda ranks, **kw: "group")
    membership = Membership(_store(), 0, 1, timedelta(seconds=1))
    calls = []

    def failing(group, members):
        calls.append(members)
        raise CommError("rank 0: allreduce failed: Connection closed by peer")

    with pytest.raises(CommError):
        membership.collective(failing)
    assert calls == [[0]]
    store = _store()
    store.set("sync/1/1", "1")  # rank 1 is there too: rank 0 is not alone, but the error is not a transport failure
    pair = Membership(store, 0, 2, timedelta(seconds=1))
    with pytest.raises(ValueError, match="a bug"):
        pair.collective(lambda group, members: calls.append(members) or int("a bug"))
    assert calls == [[0], [0, 1]]


def test_an_active_takes_the_next_live_passive_on_the_ring():
    strategy = AdpsgdStrategy(AdpsgdConfig(pattern="fixed"))
    strategy.ctx = LearnerContext(rank=0, world_size=6)
    strategy.membership = Membership(_store(), 0, 6, timedelta(seconds=1))
    assert strategy._partner() == 1  # round 0: the right neighbour
    strategy.membership.report(1, "killed")
    assert strategy._partner() == 3
    strategy.membership.report(3, "killed")
    strategy.membership.report(5, "killed")
    assert strategy._partner() is None  # every passive lost: train alone


def test_a_node_lives_or_dies_whole_and_its_leaders_see_nodes():
    """hierarchical: rank 3 of nodes {0,1} {2,3} {4,5} is lost, so its node-mate 2 is no survivor
    (recorded in the store, so the launcher stops it if it still runs); the leaders' view maps
    node k to leader rank 2k."""
    store = _store()
    views = {r: Membership(store, r, 6, timedelta(seconds=30), group_size=2) for r in (0, 1, 4, 5)}
    for r in (0, 1, 4, 5):
        store.set(f"sync/1/{r}", "1")
    report_lost(store, 3, "killed by signal 9", by="launcher")
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(groups_module.dist, "new_group", lambda ranks, **kw: ("group", tuple(ranks)))
        assert all(view.agree() == [0, 1, 4, 5] for view in views.values())  # rank 2 was never waited for
    assert views[0].group == ("group", (0, 1, 4, 5))
    assert json.loads(store.get("lost/2"))["reason"] == "its node lost rank 3"
    assert [x["rank"] for x in views[5].lost_learners()] == [2, 3]
    nodes = NodeMembership(views[0])
    assert nodes.is_lost(1) and not nodes.is_lost(0) and not nodes.is_lost(2)
    assert nodes.lost_ranks() == frozenset({1})
    nodes.report(2, "hung: no answer to an exchange within 30 s")  # node 2 = its leader, rank 4
    assert json.loads(store.get("lost/4"))["reason"].startswith("hung") and nodes.is_lost(2)


def test_a_passive_goes_on_listening_after_a_broken_receive_only_once_a_loss_is_named():
    strategy = AdpsgdStrategy(AdpsgdConfig())
    strategy.ctx = LearnerContext(rank=1, world_size=4, timeout=timedelta(seconds=0.3))
    strategy.membership = Membership(_store(), 1, 4, strategy.ctx.timeout)
    reset = RuntimeError("Read error [127.0.0.1]:51876: Connection reset by peer")
    with pytest.raises(RuntimeError, match="reset by peer"):  # nobody named as lost: not explained
        strategy._after_broken_header(reset)
    report_lost(strategy.membership.store, 2, "killed by signal 9", by="launcher")
    strategy._after_broken_header(reset)  # the launcher named rank 2: listen on
    assert strategy.membership.is_lost(2)
    strategy.membership = None  # a job that fails fast
    with pytest.raises(RuntimeError, match="reset by peer"):
        strategy._after_broken_header(reset)
