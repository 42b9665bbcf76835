"""The launcher's one-line failure message names the learner whose failure came first."""
from __future__ import annotations

import os

from asrdist.cluster.failures import LearnerExit
from asrdist.cluster.supervisor import failure_message


def _exited(rank: int, code: int) -> list[LearnerExit]:
    """The agent's record (torch's ProcessFailure) of learner `rank` that failed with `code`."""
    return [LearnerExit(rank, code)]


def test_a_signal_without_a_report_is_the_root_cause(tmp_path):
    (tmp_path / "failed-rank-0.txt").write_text("learner rank 0: allreduce failed: Connection closed\n")
    message = failure_message(tmp_path, _exited(1, -9), "", 1)
    assert message == "learner rank 1 died (killed by signal 9); the job was stopped"


def test_a_learner_that_reported_its_error_is_named_by_it_even_if_it_ended_by_a_signal(tmp_path):
    (tmp_path / "failed-rank-1.txt").write_text("learner rank 1: loss is nan at step 84\ntraceback...\n")
    message = failure_message(tmp_path, _exited(1, -6), "", 1)
    assert message == "learner rank 1: loss is nan at step 84"


def test_a_killed_learner_whose_peers_timed_out_had_hung(tmp_path):
    (tmp_path / "failed-rank-1.txt").write_text(
        "learner rank 1: allreduce (timeout 20 s) failed: Timed out waiting 20000ms for recv\n")
    message = failure_message(tmp_path, _exited(0, -9), "", 1)
    assert message.startswith("learner rank 0 hung (no progress") and "Timed out" in message


def test_a_timeout_that_closed_the_connection_is_a_timeout_too(tmp_path):
    """gloo words a timed-out all-to-all this way when the timeout closed the pair first (seen on a
    loaded machine): the killed learner had still hung."""
    (tmp_path / "failed-rank-0.txt").write_text(
        "learner rank 0: all_to_all (timeout 15 s) failed: Application timeout caused pair closure\n")
    message = failure_message(tmp_path, _exited(1, -9), "", 1)
    assert message.startswith("learner rank 1 hung (no progress") and "pair closure" in message


def test_empty_reports_from_a_full_disk_are_skipped(tmp_path):
    (tmp_path / "failed-rank-0.txt").write_text("")
    (tmp_path / "failed-rank-1.txt").write_text("learner rank 1: checkpoint: No space left on device\n")
    assert failure_message(tmp_path, [], "", 1) == "learner rank 1: checkpoint: No space left on device"
    (tmp_path / "failed-rank-1.txt").write_text("")
    assert "launcher exit code 1" in failure_message(tmp_path, [], "", 1)


def test_launcher_reports_and_tracebacks_stay_off_the_terminal():
    from asrdist.cluster.supervisor import _launcher_noise

    assert _launcher_noise("E1122 16:16:07.961000 5991 torch/distributed/elastic/multiprocessing/api.py:1002] failed\n")
    assert _launcher_noise("asrdist: error: learner rank 0: loss is nan\n")  # the launcher prints the one line
    assert not _launcher_noise("[asrdist] epoch=0, train_loss=0.16\n")


def test_the_launcher_stops_on_sigterm_sigint_and_sighup():
    import signal

    from asrdist.cluster.supervisor import _STOP_SIGNALS

    assert set(_STOP_SIGNALS) == {signal.SIGTERM, signal.SIGINT, signal.SIGHUP}


def test_a_killed_learner_whose_peers_lost_the_connection_died(tmp_path):
    (tmp_path / "failed-rank-2.txt").write_text(
        "learner rank 2: allreduce (timeout 180 s) failed: Connection closed by peer [127.0.0.1]:36751\n")
    message = failure_message(tmp_path, _exited(1, -9), "", 1)
    assert message == "learner rank 1 died (killed by signal 9); the job was stopped"



def test_a_stopped_learner_is_killed_once_a_peer_reported_a_failure(tmp_path, monkeypatch):
    """torch's agent would wait 30 s for a SIGSTOPped learner to obey its SIGTERM; the launcher
    kills it itself, and leaves running learners to the agent."""
    import os
    import signal
    import subprocess
    import sys
    import time

    from asrdist.cluster import supervisor

    agent = subprocess.Popen([sys.executable, "-c", "import subprocess; "
                              "kids = [subprocess.Popen(['sleep', '120']) for _ in range(2)]; "
                              "print(kids[0].pid, kids[1].pid, flush=True); kids[0].wait()"],
                             stdout=subprocess.PIPE, text=True)
    stopped, running = (int(x) for x in agent.stdout.readline().split())
    try:
        os.kill(stopped, signal.SIGSTOP)
        end = time.monotonic() + 60
        while supervisor._state(stopped) != "T" and time.monotonic() < end:
            time.sleep(0.01)  # polling /proc until the kernel has stopped it
        monkeypatch.setattr(supervisor, "SHUTDOWN_GRACE_S", 0)
        watch = supervisor._StoppedLearners([agent], tmp_path)
        watch.check()  # no failure reported yet: nothing happens
        assert supervisor._state(stopped) == "T"
        (tmp_path / "failed-rank-0.txt").write_text("learner rank 0: allreduce (timeout 3 s) failed: timed out\n")
        watch.check()  # the failure is seen
        watch.check()  # the grace (0 s) is over: the stopped learner is killed, the agent's wait ends
        assert agent.wait(60) == 0
        assert supervisor._state(running) not in ("", "Z", "T")
    finally:
        for pid in (stopped, running):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        agent.kill()


def test_a_transport_error_reaches_the_user_without_gloo_source_and_advice():
    from asrdist.parallel.comm import transport_error

    closed = RuntimeError("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed "
                          "by peer [127.0.0.1]:41660. This is typically caused by a remote worker crashing. Check "
                          "the logs of the remote worker before reporting an error.\nmore")
    assert transport_error(closed) == "Connection closed by peer [127.0.0.1]:41660"
    assert transport_error(RuntimeError("Operation timed out!")) == "Operation timed out!"
    assert transport_error(RuntimeError("")) == "RuntimeError"


def test_a_learner_without_a_report_file_is_named_by_the_line_it_printed(tmp_path):
    """A full disk leaves no failed-rank file; the learner's own stderr line still names the cause."""
    output = "[asrdist] epoch=0\nasrdist: error: learner rank 1: checkpoint: No space left on device\n"
    assert failure_message(tmp_path, [], output, 1) == "learner rank 1: checkpoint: No space left on device"


def _failing_learner(line: str):
    import subprocess
    import sys

    code = f"import sys; print({line!r}, file=sys.stderr); sys.exit(1)"
    return lambda: subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True, bufsize=1)


def test_a_launcher_log_on_a_full_disk_does_not_hide_the_learners_error(tmp_path):
    """launcher.log on a full disk (/dev/full refuses every write): the job's failure is still the
    learner's one line, for the torchrun agents and for the launcher that supervises learners itself."""
    import pytest
    import torch.distributed as dist

    from asrdist.cluster.supervisor import Survival, run_agents
    from asrdist.errors import TrainingError

    (tmp_path / "launcher.log").symlink_to("/dev/full")
    line = "asrdist: error: learner rank 0: checkpoint: No space left on device"
    with pytest.raises(TrainingError, match="^learner rank 0: checkpoint: No space left on device$"):
        run_agents([_failing_learner(line)], tmp_path, timeout=120)
    with pytest.raises(TrainingError, match="^learner rank 0: checkpoint: No space left on device; no learner"):
        run_agents([_failing_learner(line)], tmp_path, timeout=120, survival=Survival(dist.HashStore(), tmp_path))


def test_a_thread_traceback_of_a_learner_stays_off_the_terminal(tmp_path, capsys):
    """A learner thread's uncaught error (a full disk under adpsgd) printed 'Exception in thread'
    before its traceback; the terminal gets the learners' own lines only, the log everything."""
    from types import SimpleNamespace

    from asrdist.cluster.supervisor import _pump, _ReportLog

    lines = ["[asrdist] epoch=0\n", "Exception in thread Thread-1 (_run):\n", "Traceback (most recent call last):\n",
             "OSError: [Errno 28] No space left on device\n", "[asrdist] learner rank 1 lost at step 3\n"]
    tail: list[str] = []
    with _ReportLog(tmp_path / "launcher.log") as log:
        _pump(SimpleNamespace(stderr=iter(lines)), tail, log)
    assert capsys.readouterr().err == "[asrdist] epoch=0\n[asrdist] learner rank 1 lost at step 3\n"
    assert (tmp_path / "launcher.log").read_text() == "".join(lines) and tail == lines


def test_learners_of_emulated_hosts_get_this_machines_cores_shared_among_all_of_them(tmp_path, monkeypatch):
    """In-process, with the emulated network and the agents faked (test_hierarchical.py trains on
    the real thing, marked slow): `launch_learners` on 2 hosts of 1 learner each gives every agent
    a share of this machine's cores for all 2 learners, and a learner takes that share, not all
    the cores its host's LOCAL_WORLD_SIZE of 1 would give it on a real cluster."""
    import os

    import torch

    from asrdist.cluster import launcher, netem
    from asrdist.cluster.process_group import NETWORK_ENV, THREADS_ENV, JobEnv
    from asrdist.run.learner import set_threads

    started = []

    class FakeHosts:
        interface = "eth0"

        def __init__(self, nodes, rate, delay):
            self.nodes, self.rate, self.delay = nodes, rate, delay

        def __enter__(self):
            return self

        def __exit__(self, *exc):
            pass

        def node_address(self, i):
            return f"10.213.0.{i + 1}"

        def popen(self, node, cmd, env, **kwargs):
            started.append((node, cmd, env))

    monkeypatch.setattr(netem, "EmulatedNetwork", FakeHosts)
    monkeypatch.setattr(launcher.WireCounters, "of", classmethod(lambda cls, net: None))
    monkeypatch.setattr(launcher, "run_agents", lambda starters, report_dir, timeout, exits: [s() for s in starters])
    launcher.launch_learners("asrdist.run.worker", ["RUN"], 2, tmp_path, nodes=2, network="1gbit")
    cores = len(os.sched_getaffinity(0))
    share = str(max(1, cores // 2))
    assert [node for node, _, _ in started] == [0, 1]
    for node, cmd, env in started:
        assert cmd[cmd.index("--nproc-per-node") + 1] == "1" and cmd[cmd.index("--node-rank") + 1] == str(node)
        assert cmd[cmd.index("--master-addr") + 1] == "10.213.0.1"
        assert env[THREADS_ENV] == env["OMP_NUM_THREADS"] == share and env[NETWORK_ENV] == "1gbit"
        assert env["GLOO_SOCKET_IFNAME"] == "eth0"
    before = torch.get_num_threads()
    try:
        one_per_host = {"RANK": "0", "WORLD_SIZE": "2", "LOCAL_WORLD_SIZE": "1"}
        given = JobEnv.from_environ({**one_per_host, THREADS_ENV: share}).num_threads
        assert set_threads(0, given, local_world_size=1) == int(share) == torch.get_num_threads()
        assert set_threads(1, given, local_world_size=1) == 1  # train.threads, when set, wins
        alone = JobEnv.from_environ(one_per_host).num_threads
        assert set_threads(0, alone, local_world_size=1) == cores  # a real host's learner: all its cores
        assert set_threads(0, 0, local_world_size=1) == cores  # a learner built in this process alone
    finally:
        torch.set_num_threads(before)


def test_a_learner_functions_failure_report_is_the_line_the_supervisor_names(tmp_path):
    """The learner side of the report protocol (`netem_launch` under run_learners): an asrdist
    error is its own message, any other error names its type; the supervisor's line is its first."""
    from asrdist.cluster.failures import record_failure
    from asrdist.errors import ConfigError

    for rank, exc, line in [(1, ValueError("injected failure on rank 1\nsecond line"),
                             "learner rank 1: ValueError: injected failure on rank 1"),
                            (0, KeyError("floats"), "learner rank 0: KeyError: 'floats'"),
                            (2, ConfigError("rank 2: bench: --floats must be > 0"),
                             "learner rank 2: bench: --floats must be > 0"),
                            (3, RuntimeError(), "learner rank 3: RuntimeError")]:
        try:
            raise exc
        except Exception as caught:
            assert record_failure(tmp_path, rank, caught) == line
        report = (tmp_path / f"failed-rank-{rank}.txt").read_text()
        assert report.startswith(line + "\nTraceback (most recent call last):")
    (tmp_path / "failed-rank-0.txt").unlink()
    (tmp_path / "failed-rank-2.txt").unlink()
    (tmp_path / "failed-rank-3.txt").unlink()
    assert failure_message(tmp_path, [], "", 1) == "learner rank 1: ValueError: injected failure on rank 1"


def test_run_learners_runs_the_learner_side_through_launch_learners(tmp_path, monkeypatch):
    """In-process, the agents faked (tests/cluster/test_netem.py runs the real thing, marked slow): hosts on
    loopback are one torch.distributed.run agent each (asrdist.cluster.agent), static rendezvous on 127.0.0.1; run_learners
    hands launch_learners the learner side, the label, the deadline and the link's delay."""
    import json
    from pathlib import Path

    import pytest

    from asrdist.cluster import launcher, netem
    from asrdist.errors import ConfigError

    started = []
    monkeypatch.setattr(launcher, "_popen", lambda cmd, env, preexec=None: started.append((cmd, env)))
    monkeypatch.setattr(launcher, "run_agents", lambda starters, report_dir, timeout, exits: [s() for s in starters])
    launcher.launch_learners("asrdist.run.worker", ["RUN"], 4, tmp_path, nodes=2, network="loopback")
    assert len(started) == 2
    for node, (cmd, env) in enumerate(started):
        assert cmd[cmd.index("-m") + 1] == "asrdist.cluster.agent" and cmd[cmd.index("--node-rank") + 1] == str(node)
        assert cmd[cmd.index("--rdzv-backend") + 1] == "static" and cmd[cmd.index("--master-addr") + 1] == "127.0.0.1"
        assert cmd[cmd.index("--nproc-per-node") + 1] == "2" and env["GLOO_SOCKET_IFNAME"] == "lo"
    ports = {cmd[cmd.index("--master-port") + 1] for cmd, _ in started}
    assert len(ports) == 1  # both agents meet at host 0's

    calls = []

    def fake_launch(module, args, learners, report_dir, timeout, nodes, network, delay, cpu=None):
        calls.append((module, args, learners, timeout, nodes, network, delay))
        result_dir = Path(args[args.index("--result-dir") + 1])
        for rank in range(learners):
            (result_dir / f"result{rank}.json").write_text(json.dumps({"rank": rank}))
        return launcher.JobCounters(None, [], {})

    monkeypatch.setattr(launcher, "launch_learners", fake_launch)
    monkeypatch.setattr(netem, "available", lambda: (True, ""))
    monkeypatch.setattr(netem, "netem_supported", lambda: True)
    assert launcher.run_learners("m", "f", 4, 2, "1gbit", {"x": 1}, 30, delay="2ms") == [{"rank": r} for r in range(4)]
    module, args, learners, timeout, nodes, network, delay = calls[-1]
    assert module == "asrdist.cluster.netem_launch"
    assert (learners, timeout, nodes, network, delay) == (4, 30, 2, "1gbit", "2ms")
    assert args[args.index("--function") + 1] == "m:f" and json.loads(args[args.index("--args") + 1]) == {"x": 1}
    assert args[args.index("--label") + 1] == "emulated-1gbit-2ms" and float(args[args.index("--timeout") + 1]) == 30
    launcher.run_learners("m", "f", 2, 1, "1gbit")  # one host: this machine, no network
    assert calls[-1][5] == "loopback" and calls[-1][1][calls[-1][1].index("--label") + 1] == "loopback"
    with pytest.raises(ConfigError, match="split evenly"):
        launcher.run_learners("m", "f", 3, 2, "loopback")


def test_the_agent_hands_the_supervisor_torchs_record_of_a_learners_failure(tmp_path, monkeypatch):
    """A learner's failure reaches the supervisor through torch's own records: its error file (the
    format of torch's ErrorHandler), read by torch into a ProcessFailure, handed over by the agent."""
    from torch.distributed.elastic.multiprocessing.errors import ProcessFailure

    from asrdist.cluster.failures import read_exits, record_failure, write_exits
    from asrdist.utils.environ import ELASTIC_ERROR_FILE

    error_file = tmp_path / "error.json"
    monkeypatch.setenv(ELASTIC_ERROR_FILE, str(error_file))
    try:
        raise ValueError("injected failure on rank 1")
    except ValueError as caught:
        line = record_failure(None, 1, caught)  # no report directory: torch's record only
    failure = ProcessFailure(local_rank=1, pid=4321, exitcode=1, error_file=str(error_file))
    assert failure.message["message"] == line and "Traceback" in failure.message["extraInfo"]["py_callstack"]
    killed = ProcessFailure(local_rank=0, pid=4322, exitcode=-9, error_file=str(tmp_path / "none.json"))
    write_exits(tmp_path / "agent-0.json", {1: failure, 0: killed})
    exits = read_exits([tmp_path / "agent-0.json", tmp_path / "agent-1.json"])  # agent 1 wrote nothing
    assert exits == [LearnerExit(1, 1, line), LearnerExit(0, -9)]
    assert failure_message(tmp_path, exits, "", 1) == "learner rank 0 died (killed by signal 9); the job was stopped"
    assert failure_message(tmp_path, exits[:1], "", 1) == "learner rank 1: ValueError: injected failure on rank 1"


def test_a_learner_whose_loss_went_non_finite_is_named_before_the_peers_it_reached(tmp_path):
    """Lock-step peers read the NaN in their exchanged gradients and may report first."""
    (tmp_path / "failed-rank-0.txt").write_text("learner rank 0: non-finite gradient at step 9 (epoch 1) (loss 0.03)\n")
    (tmp_path / "failed-rank-2.txt").write_text("learner rank 2: loss is nan at step 9 (epoch 1)\n")
    os.utime(tmp_path / "failed-rank-0.txt", (1, 1))  # rank 0's report came first
    message = failure_message(tmp_path, _exited(0, 1) + _exited(2, 1), "", 1)
    assert message == "learner rank 2: loss is nan at step 9 (epoch 1)"
