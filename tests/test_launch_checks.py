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


def test_asrdists_own_warnings_reach_the_terminal_as_one_line():
    import os

    import asrdist
    from asrdist.cli import _format_warning

    inside = os.path.join(os.path.dirname(asrdist.__file__), "cluster", "launcher.py")
    assert _format_warning("emulated network: no netem", RuntimeWarning, inside, 83) == \
        "[asrdist] warning: emulated network: no netem\n"
    assert "RuntimeWarning" in _format_warning("other", RuntimeWarning, "/elsewhere/x.py", 3)
