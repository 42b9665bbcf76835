"""The epoch coordinator alone, in one process: learners' own epochs against the job's, and the
job's store protocols (the start line, progress keys, every learner's share of an epoch's sum)
with two fake learners on one store."""
from __future__ import annotations

from datetime import timedelta
from types import SimpleNamespace

import pytest
import torch.distributed as dist

from asrdist.data.job_sampler import JobEpochSampler
from asrdist.parallel.base import LearnerContext, Strategy
from asrdist.parallel.membership import last_step
from asrdist.train.epochs import START_GO, START_READY, JobEpochs, LearnerEpochs, epochs_for


class NoWaitStore:
    """The job's store, where waiting for a key nobody set yet raises at once: a learner that must
    wait is seen waiting, in one process, without a clock."""

    class Waited(Exception):
        pass

    def __init__(self):
        self.store = dist.HashStore()

    def __getattr__(self, name):
        return getattr(self.store, name)

    def wait(self, keys, timeout=None):
        if not self.store.check(keys):
            raise self.Waited(keys)


class OneOrder:
    world_size = 1

    def __len__(self):
        return 10


def _ctx(rank: int, world: int, store) -> LearnerContext:
    return LearnerContext(store=store, job_rank=rank, job_world_size=world, timeout=timedelta(seconds=10))


def _loop(**kw):
    values = dict(step=0, epoch=0, schedule_step=0.0, batch_size=0, epoch_loss_sum=0.0, epoch_loss_frames=0)
    return SimpleNamespace(**{**values, **kw})


def test_the_sampler_picks_whose_epochs_and_their_checkpoint_names():
    job_sampler = JobEpochSampler(OneOrder(), dist.HashStore(), 1)
    job, own = epochs_for(job_sampler, Strategy(), LearnerContext()), epochs_for(None, Strategy(), LearnerContext())
    assert type(job) is JobEpochs and type(own) is LearnerEpochs
    assert job.tag(_loop(step=12, epoch=3)) == "epoch-0003" and own.tag(_loop(step=12, epoch=3)) == "step-00000012"
    assert own.mid_epoch_checkpoints and not job.mid_epoch_checkpoints
    assert own.finished(stopped=True, done_steps=10, total=10) and not own.finished(False, 9, 10)
    assert job.finished(stopped=False, done_steps=3, total=10) and not job.finished(True, 10, 10)


def test_job_learners_start_together_on_the_store():
    store = NoWaitStore()
    first, last = JobEpochs(Strategy(), _ctx(1, 2, store)), JobEpochs(Strategy(), _ctx(0, 2, store))
    with pytest.raises(NoWaitStore.Waited):
        first.start()  # the other learner is not there yet: it must wait for it
    assert not store.check([START_GO])
    last.start()  # the last to arrive lets everyone go, and goes itself
    assert store.get(START_GO) == b"1" and store.add(START_READY, 0) == 2
    JobEpochs(Strategy(), _ctx(0, 1, None)).start()  # a lone learner has nobody to wait for


def test_job_learners_report_their_steps_where_survival_mode_reads_them():
    store = dist.HashStore()
    a, b = JobEpochs(Strategy(), _ctx(0, 2, store)), JobEpochs(Strategy(), _ctx(1, 2, store))
    a.after_step(_loop(step=3))
    b.after_step(_loop(step=7))
    assert last_step(store, 0) == 3 and last_step(store, 1) == 7  # membership's reader of the key
    loop = _loop(step=5, schedule_step=2.0)
    a.after_step(loop)
    assert loop.schedule_step == 2.0  # the job's clock comes from the sampler, before each step


def test_a_learners_own_epochs_count_the_schedule_by_minibatch_size_and_touch_no_store():
    store = dist.HashStore()
    own = LearnerEpochs(Strategy(), _ctx(0, 2, store), base_batch_size=256)
    loop = _loop(step=1)
    own.after_step(loop)
    loop.batch_size = 512  # a batch search doubled the minibatch
    own.after_step(loop)
    assert loop.schedule_step == 3.0 and store.num_keys() == 0


class Sampled(SimpleNamespace):
    def lost_shares(self, epoch):
        return {}, 0


def test_every_learners_share_of_a_job_epoch_lands_in_its_own_slot():
    # the epoch record's sum over the learners: each adds its count in its own slot, so the sum
    # is the table of who took how many (and the minibatches of lost learners trained again)
    members = [0, 1, 2]
    samplers = {0: Sampled(last_taken=5, last_retrained=0), 1: Sampled(last_taken=2, last_retrained=1),
                2: Sampled(last_taken=4, last_retrained=0)}
    learners = {r: JobEpochs(Strategy(), _ctx(r, 3, None)) for r in members}
    summed = [sum(v) for v in zip(*(learners[r]._counts(samplers[r], members) for r in members))]
    assert summed == [1.0, 5.0, 2.0, 4.0]
    record = {"epoch": 0}
    learners[0]._record_counts(record, summed, members, samplers[0])
    assert record == {"epoch": 0, "minibatches_by_learner": {"0": 5, "1": 2, "2": 4}}


def test_an_epoch_record_holds_the_jobs_loss_and_this_learners_share():
    loop = _loop(epoch_loss_sum=6.0, epoch_loss_frames=4)
    job, own = JobEpochs(Strategy(), _ctx(0, 1, None)), LearnerEpochs(Strategy(), _ctx(0, 1, None))
    job_record, own_record = {"epoch": 0, "train_loss": None}, {"epoch": 0, "train_loss": None}
    job.end_epoch(job_record, loop, Sampled(last_taken=9, last_retrained=0))
    own.end_epoch(own_record, loop, None)
    assert job_record == {"epoch": 0, "train_loss": 1.5, "minibatches": 9, "minibatches_by_learner": {"0": 9}}
    assert own_record == {"epoch": 0, "train_loss": 1.5}
