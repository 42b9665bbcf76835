"""The launcher's one-line failure message names the learner whose failure came first."""
from __future__ import annotations

from asrdist.cluster.launcher import failure_message

OUTPUT = """[1]:
  time      : 2026-11-22_14:52:30
  host      : localhost
  rank      : {rank} (local_rank: {rank})
  exitcode  : {code} (pid: 12616)
"""


def test_a_signal_without_a_report_is_the_root_cause(tmp_path):
    (tmp_path / "failed-rank-0.txt").write_text("learner rank 0: allreduce failed: Connection closed\n")
    message = failure_message(tmp_path, OUTPUT.format(rank=1, code=-9), 1)
    assert message == "learner rank 1 died (killed by signal 9); the job was stopped"


def test_a_learner_that_reported_its_error_is_named_by_it_even_if_it_ended_by_a_signal(tmp_path):
    (tmp_path / "failed-rank-1.txt").write_text("learner rank 1: loss is nan at step 84\ntraceback...\n")
    message = failure_message(tmp_path, OUTPUT.format(rank=1, code=-6), 1)
    assert message == "learner rank 1: loss is nan at step 84"
