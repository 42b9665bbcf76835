"""What `asrdist train` says of a resolved config before it writes anything (`launch.check_job`)."""
from __future__ import annotations

from asrdist.config import RunConfig, config_from_tree
from asrdist.train.launch import check_job


def _config(strategy: str, learners: int, group_size: int = 0) -> RunConfig:
    return config_from_tree({"strategy": {"name": strategy}, "train": {"learners": learners, "group_size": group_size}})


def test_hierarchical_on_one_node_says_it_trains_as_sync(capsys):
    check_job(_config("hierarchical", 4))
    assert "has no other node to exchange with: it trains as sync" in capsys.readouterr().err
    for quiet in (_config("hierarchical", 4, group_size=2), _config("sync", 4)):
        check_job(quiet)
        assert "trains as sync" not in capsys.readouterr().err
    check_job(_config("hierarchical", 4), note=False)  # compare checks first, train says it once
    assert capsys.readouterr().err == ""
