"""Samplers: sharding, frame coverage, splicing, determinism, resume, bucketing. Ranks are
simulated in one process (rank=r, world_size=n) as lhotse's tests do."""
import importlib.util

import numpy as np
import pytest
import torch

from asrdist.data.batch import IGNORE_INDEX, Batch
from asrdist.data.samplers import (ChunkSampler, FrameSampler, UtteranceBatchSampler, iterate_utterances,
                                   shard_utterances, splice)
from asrdist.errors import ConfigError, DataError


class FakeStore:
    """In-memory stand-in with FeatureStore's interface."""

    def __init__(self, feats):
        self._feats = {u: np.asarray(x, dtype=np.float32) for u, x in feats.items()}
        for x in self._feats.values():
            x.setflags(write=False)
        self.utt_ids = sorted(self._feats)
        self.dim = next(iter(self._feats.values())).shape[1]
        self.total_frames = sum(len(x) for x in self._feats.values())

    def num_frames(self, utt):
        return len(self._feats[utt])

    def __getitem__(self, utt):
        return self._feats[utt]

    def __len__(self):
        return len(self._feats)

    def __contains__(self, utt):
        return utt in self._feats


def make_corpus(num_utts=23, seed=0, min_len=3, max_len=60, extra_feature_frame=()):
    """Features [T, 3] = (utterance index, frame index, noise) so every row names its source;
    labels derived from (utterance, frame). Utterances in `extra_feature_frame` get one more
    feature frame than label frames (the tolerated edge frame)."""
    rng = np.random.default_rng(seed)
    feats, labels = {}, {}
    for i in range(num_utts):
        utt = f"spk{i % 3}-{i:03d}"
        n = int(rng.integers(min_len, max_len + 1))
        t = np.arange(n + (1 if i in extra_feature_frame else 0))
        feats[utt] = np.stack([np.full(len(t), i), t, rng.normal(size=len(t))], axis=1)
        labels[utt] = ((i * 7 + np.arange(n)) % 11).astype(np.int32)
    return FakeStore(feats), labels


def naive_splice(x, t, context):
    n = len(x)
    return np.concatenate([x[min(max(t + o, 0), n - 1)] for o in range(-context, context + 1)])


def centers(batch, context, dim=3):
    """(utterance index, frame) of every row of a FrameSampler batch."""
    mid = batch.inputs[:, context * dim:(context + 1) * dim].numpy()
    return [(int(u), int(t)) for u, t in mid[:, :2]]


def frame_batches_equal(a, b):
    return len(a) == len(b) and all(torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets)
                                    for x, y in zip(a, b))


@pytest.mark.parametrize("world_size", [1, 2, 3, 4])
def test_shards_disjoint_covering_balanced_deterministic(world_size):
    rng = np.random.default_rng(world_size)
    utts = [f"u{i:02d}" for i in range(37)]
    frames = {u: int(rng.integers(10, 500)) for u in utts}
    shards = [shard_utterances(utts, frames, r, world_size) for r in range(world_size)]
    assert sorted(sum(shards, [])) == sorted(utts)
    assert len(set(sum(shards, []))) == len(utts)
    loads = [sum(frames[u] for u in s) for s in shards]
    assert max(loads) - min(loads) <= max(frames.values())
    reversed_input = [shard_utterances(utts[::-1], frames, r, world_size) for r in range(world_size)]
    assert reversed_input == shards
    as_list = [shard_utterances(utts, [frames[u] for u in utts], r, world_size) for r in range(world_size)]
    assert as_list == shards


@pytest.mark.parametrize("world_size", [1, 2, 3])
def test_frame_sampler_every_frame_once_and_spliced_correctly(world_size):
    context, batch_size = 2, 16
    store, labels = make_corpus(extra_feature_frame={1, 4})
    by_index = {int(store[u][0, 0]): u for u in store.utt_ids}
    lens = []
    for rank in range(world_size):
        s = FrameSampler(store, labels, None, rank, world_size, batch_size, context, seed=3, window_utterances=4)
        lens.append(len(s))
        seen = []
        for batch in s:
            assert batch.inputs.shape == (batch_size, (2 * context + 1) * 3)
            assert batch.inputs.dtype == torch.float32 and batch.targets.dtype == torch.int64
            assert batch.num_frames == batch_size
            for row, (ui, t) in enumerate(centers(batch, context)):
                utt = by_index[ui]
                n = len(labels[utt])  # the shorter of features and labels
                np.testing.assert_array_equal(batch.inputs[row].numpy(), naive_splice(store[utt][:n], t, context))
                assert batch.targets[row] == labels[utt][t]
            seen += centers(batch, context)
        shard_frames = {(int(store[u][0, 0]), t) for u in s.shard for t in range(len(labels[u]))}
        assert len(seen) == len(set(seen)) == len(s) * batch_size
        assert set(seen) <= shard_frames
        # Only the tail is dropped: the partial batch plus this rank's surplus over the smallest shard.
        assert len(shard_frames) - len(seen) == s.shard_frames - len(s) * batch_size
    assert len(set(lens)) == 1


def test_frame_sampler_single_rank_drops_less_than_one_batch():
    store, labels = make_corpus()
    s = FrameSampler(store, labels, batch_size=32, context=1, seed=0, window_utterances=5)
    frames = sum(len(v) for v in labels.values())
    assert len(s) == frames // 32
    assert len({f for b in s for f in centers(b, 1)}) == len(s) * 32


def test_frame_sampler_determinism_and_epochs():
    store, labels = make_corpus()
    make = lambda seed: FrameSampler(store, labels, None, 1, 2, 8, 1, seed=seed, window_utterances=3)
    a, b = make(5), make(5)
    assert frame_batches_equal(list(a), list(b))
    a.set_epoch(1)
    epoch1 = list(a)
    b.set_epoch(0)
    epoch0 = list(b)
    assert not frame_batches_equal(epoch0, epoch1)
    c = make(6)
    assert not frame_batches_equal(epoch0, list(c))
    a.set_epoch(0)
    assert frame_batches_equal(list(a), epoch0)  # an epoch can be replayed


def resume_check(make, stop):
    """Run epoch 0 to `stop`, save, resume in a new sampler: the rest equals the uninterrupted run."""
    full = make()
    full.set_epoch(0)
    reference = list(full) + list(full)  # epochs 0 and 1 (the cursor moves on by itself)
    first = make()
    it = iter(first)
    for _ in range(stop):
        next(it)
    state = first.state_dict()
    assert state["position"] == stop % len(first)
    resumed = make()
    resumed.load_state_dict(state)
    resumed.set_epoch(state["epoch"])  # a no-op for the current epoch: the position is kept
    rest = list(resumed)
    resumed.set_epoch(1)
    rest += list(resumed) if state["epoch"] == 0 else []
    return reference[stop:], rest


@pytest.mark.parametrize("stop", [1, 5, 13])
def test_frame_sampler_resumes_mid_epoch(stop):
    store, labels = make_corpus()
    make = lambda: FrameSampler(store, labels, None, 0, 2, 8, 2, seed=1, window_utterances=3)
    want, got = resume_check(make, stop)
    assert len(want) == len(got) and frame_batches_equal(want, got)


def test_finished_epoch_is_saved_as_start_of_next():
    store, labels = make_corpus()
    s = FrameSampler(store, labels, batch_size=64, context=0)
    list(s)
    assert (s.state_dict()["epoch"], s.state_dict()["position"]) == (1, 0)
    t = FrameSampler(store, labels, batch_size=64, context=0)
    t.load_state_dict(s.state_dict())
    s.set_epoch(1)
    assert frame_batches_equal(list(t), list(s))


def test_shared_stream_matches_one_learner_with_the_global_batch():
    store, labels = make_corpus()
    one = list(FrameSampler(store, labels, None, 0, 1, 24, 1, seed=2, window_utterances=4))
    ranks = [list(FrameSampler(store, labels, None, r, 3, 8, 1, seed=2, window_utterances=4, shared_stream=True))
             for r in range(3)]
    assert all(len(r) == len(one) for r in ranks)
    for k, big in enumerate(one):
        assert torch.equal(torch.cat([r[k].inputs for r in ranks]), big.inputs)
        assert torch.equal(torch.cat([r[k].targets for r in ranks]), big.targets)


def test_splice_against_naive_reference():
    x = np.random.default_rng(0).normal(size=(7, 4)).astype(np.float32)
    for context in (0, 1, 3, 9):
        got = splice(x, context)
        assert got.shape == (7, (2 * context + 1) * 4)
        for t in range(7):
            np.testing.assert_array_equal(got[t], naive_splice(x, t, context))


def test_iterate_utterances_trims_to_labels_and_shards():
    store, labels = make_corpus(num_utts=6, extra_feature_frame={2})
    items = list(iterate_utterances(store, context=1, labels=labels))
    assert [u.utt_id for u in items] == store.utt_ids
    for item in items:
        n = len(labels[item.utt_id])
        np.testing.assert_array_equal(item.features, splice(store[item.utt_id][:n], 1))
        np.testing.assert_array_equal(item.labels, labels[item.utt_id])
    parts = [[u.utt_id for u in iterate_utterances(store, rank=r, world_size=2)] for r in range(2)]
    assert sorted(parts[0] + parts[1]) == store.utt_ids and not set(parts[0]) & set(parts[1])


def test_chunk_sampler():
    chunk, batch_size = 7, 4
    store, labels = make_corpus(num_utts=15, min_len=3, max_len=40)
    by_index = {int(store[u][0, 0]): u for u in store.utt_ids}
    lens = []
    for rank in range(2):
        s = ChunkSampler(store, labels, None, rank, 2, batch_size, chunk, seed=4)
        lens.append(len(s))
        starts = []
        for batch in s:
            assert batch.inputs.shape == (batch_size, chunk, 3) and batch.targets.shape == (batch_size, chunk)
            assert batch.num_frames == int(batch.input_lengths.sum())
            for row in range(batch_size):
                n = int(batch.input_lengths[row])
                x = batch.inputs[row].numpy()
                utt = by_index[int(x[0, 0])]
                t0 = int(x[0, 1])
                np.testing.assert_array_equal(x[:n], store[utt][t0:t0 + n])
                np.testing.assert_array_equal(batch.targets[row, :n].numpy(), labels[utt][t0:t0 + n])
                assert (batch.targets[row, n:] == IGNORE_INDEX).all() and (x[n:] == 0).all()
                assert n == chunk or n == len(labels[utt]) < chunk
                starts.append((utt, t0))
        assert len(starts) == len(set(starts))
        assert {u for u, _ in starts} <= set(s.shard)
    assert lens[0] == lens[1]
    make = lambda: ChunkSampler(store, labels, None, 1, 2, batch_size, chunk, seed=4)
    want, got = resume_check(make, 2)
    assert frame_batches_equal(want, got)
    a, b = make(), make()
    b.set_epoch(1)
    assert not frame_batches_equal(list(a), list(b))


def test_utterance_batches_bucket_and_bound_padding():
    rng = np.random.default_rng(0)
    feats = {f"u{i:03d}": np.full((int(rng.integers(20, 400)), 2), i, dtype=np.float32) for i in range(120)}
    store = FakeStore(feats)
    tokens = {u: list(rng.integers(1, 30, size=int(rng.integers(0, 12)))) for u in feats}
    max_frames = 1600
    lens, padding, real = [], 0, 0
    for rank in range(2):
        s = UtteranceBatchSampler(store, tokens, None, rank, 2, max_frames, seed=9)
        lens.append(len(s))
        seen = []
        for batch in s:
            b, tmax, _ = batch.inputs.shape
            n_in = batch.input_lengths.tolist()
            assert b * tmax <= max_frames or b == 1
            assert n_in == sorted(n_in, reverse=True) and tmax == n_in[0]
            assert batch.num_frames == sum(n_in)
            for row in range(b):
                utt = f"u{int(batch.inputs[row, 0, 0]):03d}"
                assert n_in[row] == len(feats[utt])
                assert (batch.inputs[row, n_in[row]:] == 0).all()
                n_out = int(batch.target_lengths[row])
                assert batch.targets[row, :n_out].tolist() == tokens[utt]
                seen.append(utt)
            # A bucket is a run of the length-sorted shard: no other utterance lies strictly inside it.
            others = [len(feats[u]) for u in s.shard if u not in seen[-b:]]
            assert not any(min(n_in) < n < max(n_in) for n in others)
            padding += b * tmax - sum(n_in)
            real += sum(n_in)
        assert len(seen) == len(set(seen)) and set(seen) <= set(s.shard)
    assert lens[0] == lens[1]
    # Reference: the same greedy batching over a random order pads several times more.
    random_padding, batch_lengths = 0, []
    for n in rng.permutation([len(x) for x in feats.values()]).tolist() + [10**9]:
        if batch_lengths and (len(batch_lengths) + 1) * max(batch_lengths + [n]) > max_frames:
            random_padding += len(batch_lengths) * max(batch_lengths) - sum(batch_lengths)
            batch_lengths = []
        batch_lengths.append(n)
    assert padding < random_padding / 4
    make = lambda: UtteranceBatchSampler(store, tokens, None, 0, 2, max_frames, seed=9)
    want, got = resume_check(make, 3)
    assert len(want) == len(got)
    assert all(torch.equal(x.inputs, y.inputs) and torch.equal(x.targets, y.targets) for x, y in zip(want, got))
    a, b = make(), make()
    b.set_epoch(1)
    assert [x.input_lengths.tolist() for x in a] != [x.input_lengths.tolist() for x in b]


def test_utterance_sampler_long_utterance_alone_and_max_utterances():
    store = FakeStore({"long": np.zeros((50, 2)), "a": np.zeros((5, 2)), "b": np.zeros((5, 2)),
                       "c": np.zeros((6, 2))})
    tokens = {u: [1] for u in store.utt_ids}
    sizes = sorted(b.size for b in UtteranceBatchSampler(store, tokens, max_frames=20))
    assert sizes == [1, 3]
    sizes = sorted(b.size for b in UtteranceBatchSampler(store, tokens, max_frames=20, max_utterances=2))
    assert sizes == [1, 1, 2]


def test_bad_input_and_config():
    store, labels = make_corpus(num_utts=4)
    bad = dict(labels)
    bad[store.utt_ids[0]] = labels[store.utt_ids[0]][:-2]
    with pytest.raises(DataError, match=f"utterance {store.utt_ids[0]}: .* feature frames but .* label frames"):
        FrameSampler(store, bad, batch_size=4)
    missing = {u: v for u, v in labels.items() if u != store.utt_ids[1]}
    with pytest.raises(DataError, match=f"utterance {store.utt_ids[1]}: no labels"):
        ChunkSampler(store, missing, batch_size=2)
    with pytest.raises(DataError, match="not in the feature store"):
        FrameSampler(store, labels, ["nope"], batch_size=4)
    with pytest.raises(DataError, match="no token sequence"):
        UtteranceBatchSampler(store, {}, max_frames=100)
    with pytest.raises(ConfigError, match="rank 2"):
        FrameSampler(store, labels, None, 2, 2, 4, 1, seed=0)
    with pytest.raises(ConfigError, match="cannot fill"):
        FrameSampler(store, labels, None, 0, 5, 4, 1, seed=0)
    with pytest.raises(ConfigError, match="too small for one batch"):
        FrameSampler(store, labels, batch_size=10_000)
    s = FrameSampler(store, labels, batch_size=4, context=1, seed=0)
    with pytest.raises(ConfigError, match="batch_size"):
        FrameSampler(store, labels, batch_size=8, context=1, seed=0).load_state_dict(s.state_dict())
    with pytest.raises(ConfigError, match="'frames' sampler"):
        ChunkSampler(store, labels, batch_size=2).load_state_dict(s.state_dict())


def test_batch_to_device():
    b = Batch(torch.zeros(2, 3), torch.zeros(2, dtype=torch.int64), num_frames=2, input_lengths=torch.ones(2))
    moved = b.to("cpu")
    assert moved.num_frames == 2 and moved.target_lengths is None and moved.size == 2
    assert torch.equal(moved.input_lengths, b.input_lengths)


@pytest.mark.skipif(importlib.util.find_spec("asrdist.features.store") is None,
                    reason="asrdist.features.store not built yet")
def test_samplers_on_the_real_feature_store(tmp_path):
    from asrdist.features.store import FeatureStore, FeatureStoreWriter

    fake, labels = make_corpus(num_utts=8, extra_feature_frame={3})
    writer = FeatureStoreWriter(tmp_path / "feats", fake.dim)
    for u in fake.utt_ids[::-1]:
        writer.add(u, fake[u])
    writer.close({})
    real = FeatureStore(tmp_path / "feats")
    assert real.utt_ids == fake.utt_ids and real.dim == 3
    for make in (lambda st: FrameSampler(st, labels, batch_size=8, context=2, seed=0, window_utterances=3),
                 lambda st: ChunkSampler(st, labels, batch_size=3, chunk=5, seed=0)):
        assert frame_batches_equal(list(make(real)), list(make(fake)))


def test_bench_data_on_a_tiny_corpus(tmp_path):
    import argparse

    from asrdist.bench import data as bench_data
    from asrdist.io.audio import write_wav
    from asrdist.io.kaldi_dir import Utterance, write_data_dir

    rng = np.random.default_rng(0)
    utts = []
    for i in range(3):
        write_wav(tmp_path / f"u{i}.wav", rng.normal(0, 3000, 8000 + 800 * i), 16000)
        utts.append(Utterance(f"u{i}", "spk", str(tmp_path / f"u{i}.wav"), "zero", duration=0.5))
    write_data_dir(tmp_path / "split", utts)
    parser = argparse.ArgumentParser()
    bench_data.add_arguments(parser)
    threads = torch.get_num_threads()
    try:
        result = bench_data.run(parser.parse_args(["--data", str(tmp_path / "split"), "--utterances", "30",
                                                   "--epochs", "1"]))
    finally:
        torch.set_num_threads(threads)  # run() pins one thread; leave the test process as it was
    assert result["fbank"]["files"] == 3
    assert result["fbank"]["audio_seconds"] == pytest.approx((8000 + 8800 + 9600) / 16000)
    assert result["fbank_x_realtime"] > 0 and result["sampler_frames_per_second"] > 0
    assert result["frames"] > 0 and result["frames"] % 256 == 0
    assert result["threads"] == 1 and result["seconds"] > 0
