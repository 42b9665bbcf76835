"""Every process group is built in `asrdist.parallel.groups`, in one order on every rank; the
strategies' package does not import the cluster package (no package cycle)."""
from __future__ import annotations

import ast
import re
from datetime import timedelta

import pytest

from asrdist.errors import ConfigError
from asrdist.parallel import groups
from tests.support.paths import PACKAGE

TIMEOUT = timedelta(seconds=5)


def test_no_module_but_groups_builds_a_process_group():
    builders = re.compile(r"\b(init_process_group|new_group|new_subgroups)\b")
    found = sorted(str(p.relative_to(PACKAGE)) for p in PACKAGE.rglob("*.py") if builders.search(p.read_text()))
    assert found == ["parallel/groups.py"]


def test_parallel_does_not_import_cluster():
    importers = []
    for path in (PACKAGE / "parallel").glob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            names = ([a.name for a in node.names] if isinstance(node, ast.Import)
                     else [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            importers += [path.name for n in names if n.startswith("asrdist.cluster")]
    assert importers == []


def test_nodes_and_rails_partition_the_job():
    assert groups.node_ranks(6, 3) == [[0, 1, 2], [3, 4, 5]]
    assert groups.rail_ranks(6, 3) == [[0, 3], [1, 4], [2, 5]]
    for world, size in ((8, 4), (12, 3), (4, 1), (4, 4)):
        for sets in (groups.node_ranks(world, size), groups.rail_ranks(world, size)):
            assert sorted(r for ranks in sets for r in ranks) == list(range(world))
    with pytest.raises(ConfigError, match="train.group_size: 3 does not divide 8"):
        groups.check_group_size(3, 8)


def _recorded(monkeypatch, fn):
    """The `new_group` calls `fn()` makes (ranks, timeout, other arguments), and its result."""
    made = []

    def new_group(ranks=None, **kw):
        made.append((ranks, kw.pop("timeout"), kw))
        return f"g{len(made) - 1}"
    monkeypatch.setattr(groups.dist, "new_group", new_group)
    return made, fn()


@pytest.mark.parametrize("rank", range(6))
def test_every_rank_builds_the_same_groups_in_the_same_order(monkeypatch, rank):
    node_wait = timedelta(seconds=15)
    made, job = _recorded(monkeypatch, lambda: groups.build_groups(rank, 6, 3, TIMEOUT, node_timeout=node_wait))
    assert made == [([0, 1, 2], node_wait, {}), ([3, 4, 5], node_wait, {}),
                    ([0, 3], TIMEOUT, {}), ([1, 4], TIMEOUT, {}), ([2, 5], TIMEOUT, {})]
    assert job.node == ("g0" if rank < 3 else "g1")
    assert job.leaders == ({0: "g2", 3: "g2"}.get(rank))
    made, leaders = _recorded(monkeypatch, lambda: groups.exchange_group(None, TIMEOUT, across=(rank, 6, 3)))
    assert made == [([0, 3], TIMEOUT, {"backend": "gloo"}), ([1, 4], TIMEOUT, {"backend": "gloo"}),
                    ([2, 5], TIMEOUT, {"backend": "gloo"})]
    assert leaders == ("g0" if rank % 3 == 0 else None)
    made, rail = _recorded(monkeypatch, lambda: groups.build_rails(rank, 6, 3, TIMEOUT))
    assert [m[0] for m in made] == groups.rail_ranks(6, 3) and rail == f"g{rank % 3}"
