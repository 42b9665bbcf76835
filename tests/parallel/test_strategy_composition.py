"""Strategies compose through their constructors: hierarchical and hybrid hold an adpsgd built from
their own typed config (every `AdpsgdConfig` field reaches it) and share one set of comm counters
with the strategies they hold, which two threads may update at once."""
from __future__ import annotations

import copy
import pickle
import sys
import threading
from dataclasses import asdict, fields, replace

import pytest
import torch

from asrdist.parallel.adpsgd import AdpsgdConfig, AdpsgdStrategy
from asrdist.parallel.base import CommCounters
from asrdist.parallel.groups import build_groups
from asrdist.parallel.hierarchical import HierarchicalConfig, HierarchicalStrategy, HybridConfig, HybridStrategy
from tests.support.dist_utils import TIMEOUT, learner_context, run_distributed

# a value other than the default for every AdpsgdConfig field: a new field fails
# test_every_adpsgd_field_has_a_value_here until it is added, and then has to reach the inner adpsgd
NOT_DEFAULT = {"pattern": "random", "delay_by_one": True, "seed": 7}


def test_every_adpsgd_field_has_a_value_here():
    assert set(NOT_DEFAULT) == {f.name for f in fields(AdpsgdConfig)}
    defaults = asdict(AdpsgdConfig())
    assert all(NOT_DEFAULT[k] != defaults[k] for k in NOT_DEFAULT)


@pytest.mark.parametrize("config_class", [HierarchicalConfig, HybridConfig])
def test_the_between_nodes_config_carries_every_adpsgd_field(config_class):
    inner = config_class(**NOT_DEFAULT).adpsgd()
    assert type(inner) is AdpsgdConfig and asdict(inner) == NOT_DEFAULT


def test_composed_strategies_share_one_set_of_counters():
    hybrid = HybridStrategy(HybridConfig())
    assert hybrid.inner.counters is hybrid.counters and hybrid.everyone.counters is hybrid.counters
    saved = CommCounters(bytes_sent=5, exchanges=2, comm_seconds=1.5).as_dict()
    hybrid.load_state_dict({"counters": saved})  # a resume keeps them shared
    assert hybrid.inner.counters is hybrid.counters and hybrid.everyone.counters.as_dict() == saved


def test_counters_pickle_and_copy_without_their_lock():
    counters = CommCounters(bytes_sent=7, comm_seconds=0.25, exchanges=3)
    for twin in (pickle.loads(pickle.dumps(counters)), copy.deepcopy(counters)):
        assert twin == counters and twin._lock is not counters._lock
        twin.add(exchanges=1)  # a lock of its own
        assert twin.exchanges == 4 and counters.exchanges == 3


def _between_nodes_config(rank: int, world_size: int):
    """Two nodes of one learner: both are leaders and build the adpsgd between nodes."""
    ctx = replace(learner_context(), groups=build_groups(rank, world_size, 1, TIMEOUT), group_size=1)
    built = []
    for strategy in (HierarchicalStrategy(HierarchicalConfig(**NOT_DEFAULT)),
                     HybridStrategy(HybridConfig(**NOT_DEFAULT, sync_epochs=0))):
        torch.manual_seed(0)
        model = torch.nn.Linear(3, 2)
        strategy.setup(model, torch.optim.SGD(model.parameters(), lr=0.1), ctx)
        outer = strategy.outer
        built.append({"class": type(outer).__name__, "config": asdict(outer.config),
                      "shares_counters": outer.counters is strategy.counters,
                      "flat_is_the_parameters": outer.flat.data_ptr() == model.weight.data_ptr()})
        strategy.close()
        strategy.finalize()
    return built


@pytest.mark.slow
def test_every_adpsgd_field_reaches_the_adpsgd_between_nodes(tmp_path):
    for built in run_distributed(_between_nodes_config, 2, tmp_path):
        assert built == [{"class": AdpsgdStrategy.__name__, "config": NOT_DEFAULT, "shares_counters": True,
                          "flat_is_the_parameters": True}] * 2


def test_two_threads_counting_at_once_lose_nothing_and_are_read_whole():
    """A training thread and a communication thread count into one set of counters (adpsgd's
    answers beside the trainer's exchanges, onebit's exchange thread): no update is lost, and a
    reader never sees one update half applied (bytes, exchanges and seconds move together)."""
    counters = CommCounters()
    per_thread, torn = 100_000, []
    done = threading.Event()

    def count_exchanges():
        for _ in range(per_thread):
            counters.add(bytes_sent=3, exchanges=1, comm_seconds=1.0, wait_seconds=1.0, answer_seconds=1.0)

    def read():
        while not done.is_set():
            c = counters.as_dict()
            if not (c["bytes_sent"] == 3 * c["exchanges"] and c["comm_seconds"] == c["wait_seconds"]):
                torn.append(c)

    old = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)  # switch threads as often as the interpreter can
    try:
        reader = threading.Thread(target=read)
        reader.start()
        threads = [threading.Thread(target=count_exchanges) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        done.set()
        reader.join()
    finally:
        sys.setswitchinterval(old)
    total = 2 * per_thread
    assert counters.as_dict() == {"bytes_sent": 3 * total, "comm_seconds": float(total),
                                  "wait_seconds": float(total), "exchanges": total, "answer_seconds": float(total)}
    assert torn == []
