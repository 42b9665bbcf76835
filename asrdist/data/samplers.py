"""Per-learner samplers: which frames / chunks / utterances a learner trains on, in which order.

All take explicit `rank`, `world_size` and `seed`. Shards are disjoint, cover the data and are
balanced by frames; each epoch's order is a function of (seed, epoch, rank); `len()` is the same
on every rank (synchronous learners must take the same number of steps); `state_dict()` /
`load_state_dict()` resume mid-epoch with exactly the batches an uninterrupted run would produce.

- `FrameSampler`: spliced frames for DNNs (samplers_frame.py);
- `ChunkSampler`: fixed-length chunks for LSTMs; `UtteranceBatchSampler`: length-bucketed
  utterances for CTC (samplers_sequence.py);
- `splice`, `iterate_utterances`: whole utterances for evaluation (samplers_base.py).
"""
from asrdist.data.samplers_base import (
                                        ALIGNMENT_TOLERANCE,
                                        EvalUtterance,
                                        FrameStore,
                                        ShardedSampler,
                                        iterate_utterances,
                                        shard_utterances,
                                        splice,
                                        utterance_lengths,
)
from asrdist.data.samplers_frame import FrameSampler
from asrdist.data.samplers_sequence import (
                                        ChunkSampler,
                                        UtteranceBatchSampler,
                                        length_buckets,
)

__all__ = ["ALIGNMENT_TOLERANCE", "ChunkSampler", "EvalUtterance", "FrameSampler", "FrameStore", "ShardedSampler",
           "UtteranceBatchSampler", "iterate_utterances", "length_buckets", "shard_utterances", "splice",
           "utterance_lengths"]
