"""What `asrdist train` says of a resolved config before it writes anything (`launch.check_job`)."""
from __future__ import annotations

from asrdist.config import RunConfig, config_from_tree
from asrdist.run.launch import check_job


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


def test_a_failed_start_takes_back_its_tensorboard_file_and_a_divergence_advises_a_lower_lr(tmp_path):
    import pytest

    from asrdist.errors import TrainingError
    from asrdist.run.rundir import undone_on_failure

    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    (run / "tensorboard" / "events.1").write_text("old")
    (run / "checkpoints").mkdir()
    (run / "checkpoints" / "latest").write_text("step-00000004\n")
    with pytest.raises(TrainingError):  # a resume that fails before its first checkpoint
        with undone_on_failure(run):
            (run / "tensorboard" / "events.2").write_text("new")
            raise TrainingError("rank 0: some failure")
    assert sorted(p.name for p in (run / "tensorboard").iterdir()) == ["events.1"]
    with pytest.raises(TrainingError, match="keeps checkpoint step-00000008: .* with a lower optim.lr"):
        with undone_on_failure(run):
            (run / "checkpoints" / "latest").write_text("step-00000008\n")
            raise TrainingError("rank 0: loss is nan at step 9")


def test_a_run_directory_is_held_by_one_command_at_a_time(tmp_path):
    import pytest

    from asrdist.errors import ConfigError
    from asrdist.run.rundir import locked

    with locked(tmp_path):
        with pytest.raises(ConfigError, match="another asrdist command is training this run now"):
            with locked(tmp_path):
                pass
    with locked(tmp_path):  # released with its command
        pass
    assert list(tmp_path.iterdir()) == []  # no lock file left in the run


def test_a_failed_start_names_where_its_failure_reports_stay(tmp_path):
    import pytest

    from asrdist.errors import TrainingError
    from asrdist.run.rundir import undone_on_failure

    run = tmp_path / "run"
    with pytest.raises(TrainingError) as told:  # e.g. a full disk before the first checkpoint
        with undone_on_failure(run):
            run.mkdir()
            (run / "config.yaml").write_text("seed: 0\n")
            (run / "failed-rank-1.txt").write_text("rank 1: No space left on device\n")
            (run / "failed-rank-0.txt").write_text("rank 0: No space left on device\n")
            raise TrainingError("rank 0: No space left on device")
    assert str(told.value) == (f"rank 0: No space left on device (the learners' failure reports stay in {run}: "
                               "failed-rank-0.txt, failed-rank-1.txt)")
    assert sorted(p.name for p in run.iterdir()) == ["failed-rank-0.txt", "failed-rank-1.txt"]
