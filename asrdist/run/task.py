"""The speech side of a run: model, sampler and objective for one learner.

`SpeechTask` is what the loop takes of a task (`asrdist.train.loop.Task`): its model, samplers,
`loss(model, batch)` and `validate(model)`.
"""
from __future__ import annotations

from pathlib import Path

import torch

from asrdist.config import RunConfig
from asrdist.data import samplers
from asrdist.data.augment import SpecAugment
from asrdist.data.labels import ctc_tokens, frame_labels
from asrdist.data.targets import Targets
from asrdist.errors import ConfigError
from asrdist.eval.evaluate import evaluate_split
from asrdist.features.augment import AugmentedStore, training_store
from asrdist.models import objectives
from asrdist.models.registry import build_model
from asrdist.models.registry import model_kind as kind_of


def build_model_for(cfg: RunConfig, input_dim: int, targets: Targets) -> torch.nn.Module:
    return build_model(cfg.model, input_dim, targets.num_classes)


def model_kind(cfg: RunConfig) -> str:
    return kind_of(cfg.model)


class SpeechTask:
    def __init__(self, cfg: RunConfig, targets: Targets, rank: int, world_size: int):
        self.cfg, self.targets = cfg, targets
        corpus = Path(cfg.data.corpus)
        self.train_dir, self.valid_dir = corpus / "train", corpus / "valid"
        self.store = training_store(self.train_dir, cfg.data, cfg.seed)
        meta = getattr(self.store, "base", self.store).meta
        self.spec_augment = SpecAugment.from_config(cfg.data, cfg.data.num_mel_bins,
                                                    meta.get("sample_rate", 16000))
        self.model = build_model_for(cfg, self.store.dim, targets)
        self.kind = self.model.kind
        if cfg.data.batch_size % world_size:
            raise ConfigError(f"data.batch_size: {cfg.data.batch_size} is not divisible by {world_size} learners")
        self.rank, self.world_size = rank, world_size
        self.local_batch = cfg.data.batch_size // world_size
        self.sampler = self.sampler_for(self.local_batch)

    @property
    def samples_per_step(self) -> int:
        """Nominal frames in one of this learner's minibatches (the same on every learner)."""
        return self.local_batch * (self.cfg.model.chunk if self.kind == "chunk" else 1)

    def sampler_for(self, local_batch: int, rank: int | None = None, world_size: int | None = None):
        """This learner's training sampler at `local_batch` (frames, chunks, or max frames for CTC);
        `rank=0, world_size=1` gives the whole corpus in one order (job-wide epochs)."""
        cfg, store = self.cfg, self.store
        rank = self.rank if rank is None else rank
        world_size = self.world_size if world_size is None else world_size
        augmented = isinstance(store, AugmentedStore)
        if self.kind == "ctc":
            tokens = ctc_tokens(self.train_dir, self.targets)
            tokens = store.expand_tokens(tokens) if augmented else tokens
            sampler = samplers.UtteranceBatchSampler(store, tokens, [u for u in store.utt_ids if u in tokens],
                                                     rank=rank, world_size=world_size, max_frames=local_batch,
                                                     seed=cfg.seed)
        else:
            labels = frame_labels(self.train_dir, self.targets)
            labels = store.expand_labels(labels) if augmented else labels
            utt_ids = [u for u in store.utt_ids if u in labels]
            if self.kind == "chunk":
                sampler = samplers.ChunkSampler(store, labels, utt_ids, rank=rank, world_size=world_size,
                                                batch_size=local_batch, chunk=cfg.model.chunk, seed=cfg.seed)
            else:
                sampler = samplers.FrameSampler(store, labels, utt_ids, rank=rank, world_size=world_size,
                                                batch_size=local_batch, context=cfg.model.context, seed=cfg.seed,
                                                window_utterances=cfg.data.window_utterances)
        sampler.batch_transform = self.spec_augment
        return sampler

    def loss(self, model: torch.nn.Module, batch) -> tuple[torch.Tensor, int]:
        return minibatch_loss(model, batch, self.kind)

    def validate(self, model: torch.nn.Module) -> dict:
        result = evaluate_split(model, self.valid_dir, self.targets, self.cfg)
        # the epoch record keeps the rates; eval.json alone keeps the error counts
        return {f"valid_{k}" if k in ("loss",) else k: v for k, v in result.items()
                if k not in ("utterances", "error_counts")}


def minibatch_loss(model: torch.nn.Module, batch, kind: str) -> tuple[torch.Tensor, int]:
    """(the objective's mean over `batch`, its frames) for a model of `kind` ("frame" and "chunk":
    cross-entropy over labelled frames; "ctc": CTC per output frame), on the model's device."""
    batch = batch.to(next(model.parameters()).device)
    if kind == "ctc":
        log_probs, out_lengths = model(batch.inputs, batch.input_lengths)
        loss, _ = objectives.ctc_objective(log_probs, batch.targets, out_lengths, batch.target_lengths)
        return loss, batch.num_frames
    logits = model(batch.inputs)
    loss, _ = objectives.frame_cross_entropy(logits.reshape(-1, logits.shape[-1]), batch.targets.reshape(-1))
    return loss, batch.num_frames
