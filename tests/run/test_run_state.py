"""Issue 37, the quick half: a run directory's state record and what a resume or a new start reads
from it; checkpoints published by the survivors of a lost learner and resumed by every learner;
lost learners' minibatches trained again in the survivors' epoch; an empty recipe; notes never
before an error; a stop by signal exits 128 + signal; features never rewritten under a reader.
The slow half (real jobs killed, stopped and interrupted) is tests/run/test_fault_recovery.py."""
from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from asrdist.cli import main
from asrdist.config import config_from_tree, read_config_tree
from asrdist.data.job_sampler import JobEpochSampler
from asrdist.errors import ConfigError, DataError, TrainingError
from asrdist.train import checkpoint as ckpt, state as run_state
from asrdist.run import rundir
from asrdist.run.launch import check_new_run_dir
from tests.support.engine_fixture import ListOrder


@pytest.mark.parametrize("text", ["", "# only a comment\n", "0\n", "false\n", "[]\n", "just words\n", "[1, 2]\n"])
def test_an_empty_or_non_mapping_recipe_is_one_line_naming_the_file(tmp_path, capsys, text):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(text)
    with pytest.raises(ConfigError, match=str(recipe)):
        read_config_tree(recipe)
    # the recipe is blamed, not the (missing) corpus, and nothing trains
    code = main(["train", str(recipe), "--data", str(tmp_path / "no-corpus"), "--out", str(tmp_path / "run"),
                 "--no-progress"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and err.startswith(f"asrdist: error: {recipe}: "), err
    assert not (tmp_path / "run").exists()


def test_checkpoint_minutes_is_a_typed_field_with_a_range():
    assert config_from_tree({}).train.checkpoint_minutes == 10.0
    assert config_from_tree({"train": {"checkpoint_minutes": 0}}).train.checkpoint_minutes == 0
    for bad in (-1, "ten", True, 1e9):
        with pytest.raises(ConfigError, match="train.checkpoint_minutes"):
            config_from_tree({"train": {"checkpoint_minutes": bad}})


def test_the_state_record_follows_a_run_and_a_checkpoint_publishes_its_epoch(tmp_path):
    run = tmp_path / "run"
    run.mkdir()
    assert run_state.read_state(run) is None
    run_state.write_state(run, "prepared", learners=2)
    assert rundir.prepared_not_started(run) and rundir.describe(run).startswith("prepared")
    run_state.write_state(run, "started", learners=2)
    assert run_state.read_state(run)["starts"] == 1 and not rundir.prepared_not_started(run)
    for rank in range(2):
        ckpt.save_learner(run, "epoch-0001", rank, {"rank": rank})
    ckpt.publish(run, "epoch-0001", 2, progress={"epoch": 1, "epochs": 4})
    state = run_state.read_state(run)
    assert state["state"] == "checkpointed" and state["checkpoint"] == "epoch-0001" and state["epoch"] == 1
    assert "1 of 4 epochs done" in rundir.describe(run)
    run_state.write_state(run, "failed", reason="learner rank 1: killed")
    state = run_state.read_state(run)
    assert state["checkpoint"] == "epoch-0001" and state["reason"] == "learner rank 1: killed"
    assert not list(run.glob(".*.tmp"))  # written atomically


def _killed_in_first_epoch(tmp_path: Path) -> Path:
    """A run directory as a SIGKILL during the first epoch leaves it: prepared, started, a first
    checkpoint half-written, no `latest`."""
    run = tmp_path / "run"
    run.mkdir()
    (run / "config.yaml").write_text("{}\n")
    (run / "targets.pt").write_bytes(b"x")
    run_state.write_state(run, "prepared", learners=1)
    run_state.write_state(run, "started", learners=1)
    half = run / "checkpoints" / "step-00000040"
    half.mkdir(parents=True)
    (half / ".rank-0.pt.123.tmp").write_bytes(b"partial")
    return run


def test_a_run_killed_before_its_first_checkpoint_resumes_from_the_start_and_a_new_start_says_so(tmp_path):
    run = _killed_in_first_epoch(tmp_path)
    assert rundir.has_no_checkpoint(run)
    cfg = config_from_tree({})
    assert rundir.check_resume(cfg, run, cfg) is None  # --resume: from the start, not an error
    with pytest.raises(Exception) as told:
        check_new_run_dir(run, tmp_path / "corpus")
    message = str(told.value)
    # one way forward, not advice that points elsewhere: neither torchrun nor "start it without --resume"
    assert f"asrdist train --resume {run}" in message and "from the start" in message, message
    assert "torchrun" not in message and "not started" not in message, message


def test_a_complete_checkpoint_is_never_restarted_from_the_start(tmp_path):
    run = _killed_in_first_epoch(tmp_path)
    ckpt.save_learner(run, 40, 0, {"rank": 0})  # complete, though `latest` was never written
    assert not rundir.has_no_checkpoint(run) and ckpt.complete_checkpoints(run)
    cfg = config_from_tree({})
    with pytest.raises(TrainingError, match="latest: missing; resume from the complete checkpoint"):
        rundir.check_resume(cfg, run, cfg)
    ckpt.publish(run, 40, 1)
    assert rundir.check_resume(cfg, run, cfg).name == "step-00000040"


def test_survivors_publish_a_checkpoint_every_learner_resumes_from(tmp_path):
    run = tmp_path / "run"
    for rank in (0, 3):  # ranks 1 and 2 were lost (adpsgd: groups of one)
        ckpt.save_learner(run, "epoch-0003", rank, {"rank": rank})
    ckpt.publish(run, "epoch-0003", 4, members=[0, 3])
    assert (run / "checkpoints" / "latest").read_text().strip() == "epoch-0003"
    assert json.loads((run / "checkpoints" / "epoch-0003" / "members.json").read_text())["lost"] == [1, 2]
    assert ckpt.check_resumable(run, 4).name == "epoch-0003"
    assert [ckpt.load_learner(run, r, 4)["rank"] for r in range(4)] == [0, 3, 0, 3]
    # hierarchical, nodes of two: node 1 (ranks 2, 3) lost; each takes the file of its place in node 0
    for rank in (0, 1):
        ckpt.save_learner(run, "epoch-0004", rank, {"rank": rank})
    ckpt.publish(run, "epoch-0004", 4, members=[0, 1], group_size=2)
    assert [ckpt.load_learner(run, r, 4)["rank"] for r in range(4)] == [0, 1, 0, 1]


def test_a_resume_never_goes_back_behind_the_final_model(tmp_path):
    run = tmp_path / "run"
    for rank in range(2):
        ckpt.save_learner(run, "epoch-0001", rank, {"rank": rank})
    ckpt.publish(run, "epoch-0001", 2)
    summary = {"strategy": "adpsgd", "learners": 2, "frames_per_second": 1.0, "wall_seconds": 1.0, "final": {},
               "comm": {"bytes_sent": 0, "comm_seconds": 0.0, "wait_seconds": 0.0}}
    (run / "summary.json").write_text(json.dumps({**summary, "history": [{"epoch": e} for e in range(8)], "steps": 900}))
    cfg = config_from_tree({"train": {"learners": 2, "epochs": 12}, "strategy": {"name": "adpsgd"}})
    with pytest.raises(TrainingError, match="older than its final model"):
        rundir.check_resume(cfg, run, cfg)


def _claimed(order: ListOrder, batch) -> int:
    return next(i for i, b in enumerate(order.batches) if b is batch)


def _each_in_a_thread(iters: dict, order: ListOrder, taken: dict[int, list[int]]) -> None:
    """Survivors run on at once (each in its thread, as learners in their processes): one done with
    the order waits in the store for the others."""
    import threading

    def run(rank: int) -> None:
        taken[rank] += [_claimed(order, b) for b in iters[rank]]

    threads = [threading.Thread(target=run, args=(r,), daemon=True) for r in iters]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)  # only to catch a hang
        assert not t.is_alive(), "a survivor waited for its peers forever"


def test_the_minibatch_a_lost_learner_held_is_trained_again_in_the_survivors_epoch():
    store, order = dist.HashStore(), ListOrder(12)
    samplers = [JobEpochSampler(order, store, 3, rank=r) for r in range(3)]
    lost: list[int] = []
    for s in samplers:
        s.lost_ranks = lambda: list(lost)
    iters = [iter(s) for s in samplers]
    taken: dict[int, list[int]] = {r: [] for r in range(3)}
    for r in (0, 1, 2, 1):  # rank 1 finishes one minibatch, takes another and dies with it
        taken[r].append(_claimed(order, next(iters[r])))
    held = taken[1].pop()  # never finished
    lost.append(1)
    _each_in_a_thread({r: iters[r] for r in (0, 2)}, order, taken)
    assert held in taken[0] + taken[2]
    assert sorted(taken[0] + taken[1] + taken[2]) == list(range(12))  # every minibatch once, none lost
    finished, left = samplers[0].lost_shares(0)
    assert finished == {1: 1} and left == 0
    assert samplers[0].last_retrained + samplers[2].last_retrained == 1


def _two_nodes_of_two():
    """Four learners in nodes of two over one job-wide order of 12 units; `lost` (ranks) is what
    every sampler's membership view reports, `taken` each rank's claimed units."""
    store, order = dist.HashStore(), ListOrder(12)
    samplers = [JobEpochSampler(order, store, 4, group_size=2, rank=r) for r in range(4)]
    lost: list[int] = []
    for s in samplers:
        s.lost_ranks = lambda: list(lost)
    taken: dict[int, list[int]] = {r: [] for r in range(4)}
    return order, samplers, lost, [iter(s) for s in samplers], taken


def test_a_lost_nodes_unit_is_trained_again_by_a_surviving_node():
    order, samplers, lost, iters, taken = _two_nodes_of_two()
    for r in (0, 1, 2, 3):
        taken[r].append(_claimed(order, next(iters[r])))
    held = [taken[2].pop(), taken[3].pop()]  # node 1 dies in its first step
    lost += [2, 3]
    _each_in_a_thread({r: iters[r] for r in (0, 1)}, order, taken)
    assert set(held) <= set(taken[0] + taken[1])
    assert sorted(taken[0] + taken[1]) == list(range(12))
    assert [k + 1 for k in taken[0]] == taken[1]  # the node's members still step together
    assert samplers[0].lost_shares(0) == ({2: 0, 3: 0}, 0)


def test_a_stop_by_signal_exits_with_the_shells_status():
    from asrdist.cluster.supervisor import stopped_error

    assert stopped_error(signal.SIGINT).exit_code == 130
    assert stopped_error(signal.SIGTERM).exit_code == 143
    assert str(stopped_error(signal.SIGHUP, "every learner was stopped")) == \
        "stopped by SIGHUP: every learner was stopped"


def test_no_note_comes_before_an_error(tmp_path, capsys):
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("strategy:\n  name: onebit\n  error_feedback: true\n")
    code = main(["train", str(recipe), "--strategy", "sync", "--data", str(tmp_path / "no-corpus"),
                 "--out", str(tmp_path / "run"), "--no-progress"])
    err = capsys.readouterr().err
    assert code != 0 and "note:" not in err and err.count("\n") == 1 and err.startswith("asrdist: error:"), err


def test_features_are_never_rewritten_under_another_reader(tone_corpus, tmp_path):
    import shutil

    from asrdist.features.store import FeatureStore
    from asrdist.run.prepare import ensure_features

    corpus = tmp_path / "corpus"
    shutil.copytree(tone_corpus, corpus)
    before = FeatureStore(corpus / "train").meta
    other = config_from_tree({"data": {"num_mel_bins": before["num_mel_bins"] + 3, "corpus": str(corpus)}})
    # another command reading the corpus' features (as `asrdist train` holds them while it runs)
    reader = subprocess.Popen(
        [sys.executable, "-c", "import sys; from asrdist.features.store import hold_for_reading as h; "
         "[h(p) for p in sys.argv[1:]]; print('held', flush=True); sys.stdin.read()",
         str(corpus / "train"), str(corpus / "valid")],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    try:
        assert reader.stdout.readline().strip() == "held"
        with pytest.raises(DataError, match="in use by another asrdist command") as told:
            ensure_features(corpus, other, progress=False)
        assert f"data.num_mel_bins={before['num_mel_bins']}" in str(told.value)
        assert FeatureStore(corpus / "train").meta == before  # untouched
    finally:
        reader.stdin.close()
        reader.wait(timeout=60)
    ensure_features(corpus, other, progress=False)  # nobody reads them now: re-extracted
    assert FeatureStore(corpus / "train").meta["num_mel_bins"] == before["num_mel_bins"] + 3


def test_a_full_disk_is_one_line_with_no_progress_bar_left_above_it(tone_corpus, tmp_path, monkeypatch, capsys):
    """On a terminal (stderr a tty, where the bars are drawn) a failing extraction takes its bar
    away before the error line: what the terminal shows is that one line."""
    import shutil

    from tests.support.full_disk import fill_disk

    shutil.copytree(tone_corpus / "train", tmp_path / "split", ignore=shutil.ignore_patterns("feats"))
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    fill_disk(monkeypatch, tmp_path)
    assert main(["features", str(tmp_path / "split"), "--jobs", "1"]) != 0
    err = capsys.readouterr().err
    assert "%|" in err  # the bar was drawn
    shown = [line.split("\r")[-1].strip() for line in err.split("\n")]
    shown = [line for line in shown if line]
    assert len(shown) == 1 and shown[0].startswith("asrdist: error: ") and "No space left" in shown[0], shown


def test_a_loss_found_after_the_others_used_up_the_order_is_still_trained_again():
    """The survivors done with the order wait for the learner still holding a minibatch; once it
    is reported lost, one of them trains its minibatch: the epoch loses nothing."""
    import threading
    import time

    store, order = dist.HashStore(), ListOrder(9)
    samplers = [JobEpochSampler(order, store, 3, rank=r) for r in range(3)]
    lost: list[int] = []
    for s in samplers:
        s.lost_ranks = lambda: list(lost)
    held = _claimed(order, next(iter(samplers[1])))  # rank 1 takes one and hangs with it
    taken: dict[int, list[int]] = {0: [], 2: []}
    runs = {r: threading.Thread(target=lambda r=r: taken[r].extend(_claimed(order, b) for b in samplers[r]),
                                daemon=True) for r in (0, 2)}
    for t in runs.values():
        t.start()

    def waiting(rank: int) -> bool:
        return store.check([f"holding/{rank}"]) and store.get(f"holding/{rank}").decode().startswith("0:-1:")

    end = time.monotonic() + 60
    while not (waiting(0) and waiting(2)):  # polling the store, as the learners do
        assert time.monotonic() < end, "the survivors never used up the order"
        time.sleep(0.01)
    assert all(t.is_alive() for t in runs.values())  # they wait for rank 1
    lost.append(1)  # its loss is reported only now
    for t in runs.values():
        t.join(timeout=60)
        assert not t.is_alive()
    assert sorted(taken[0] + taken[2]) == list(range(9)) and held in taken[0] + taken[2]
    assert samplers[0].lost_shares(0) == ({1: 0}, 0)


def test_a_lost_node_member_that_died_between_two_steps_is_not_counted_twice():
    """Rank 3 finished its node's unit with rank 2 and died before reading the next claim; rank 2
    claimed it and died in it: the node held one unit, which a surviving node trains again."""
    order, samplers, lost, iters, taken = _two_nodes_of_two()
    for r in (0, 1, 2, 3, 2):  # node 1 finishes a unit; its leader takes the next, its member never does
        taken[r].append(_claimed(order, next(iters[r])))
    held = taken[2].pop()
    lost += [2, 3]
    _each_in_a_thread({r: iters[r] for r in (0, 1)}, order, taken)
    assert held in taken[0] and held + 1 in taken[1]
    finished, left = samplers[0].lost_shares(0)
    assert finished == {2: 1, 3: 1} and left == 0
    assert sum(len(v) for v in taken.values()) == 12  # every minibatch once: none lost, none twice


def test_a_minibatch_claimed_an_instant_before_its_learner_died_is_still_trained():
    """Rank 1 claims a minibatch and dies before recording that it holds it: once every survivor
    is done, the minibatch in nobody's finished record is trained again."""
    store, order = dist.HashStore(), ListOrder(10)
    samplers = [JobEpochSampler(order, store, 3, rank=r) for r in range(3)]
    lost = [1]
    for s in samplers:
        s.lost_ranks = lambda: list(lost)
    first = _claimed(order, next(iter(samplers[1])))
    store.append("epoch/0/done/1", f"{first},")  # rank 1 finished it (as its next claim records first)
    stolen = int(store.add("epoch/0/claimed", 1)) - 1  # and claimed the next, dying before recording it
    taken: dict[int, list[int]] = {0: [], 2: []}
    _each_in_a_thread({r: iter(samplers[r]) for r in (0, 2)}, order, taken)
    assert stolen in taken[0] + taken[2] and first not in taken[0] + taken[2]  # trained once each
    assert sorted(taken[0] + taken[2] + [first]) == list(range(10))
    assert samplers[0].lost_shares(0) == ({1: 1}, 0)
