"""Evaluate a model on a split: loss, frame accuracy, and PER (hybrid) or CER/WER (CTC).

The model computes where its parameters are (`model_device`): each utterance's features go there,
and its scores come back to the CPU, where the searches (phone loop, prefix search, the word
decoders) and the scoring run."""
from __future__ import annotations

import itertools
from pathlib import Path

import numpy as np
import torch
from tqdm import tqdm

from asrdist.corpus.lexicon import lexicon_phone_tokens
from asrdist.data.labels import (
    ctc_tokens,
    frame_labels,
    phone_sequences,
    split_alignments,
)
from asrdist.data.samplers import splice
from asrdist.data.targets import Targets
from asrdist.errors import DataError
from asrdist.eval.decode import ctc_beam_decode, ctc_greedy_decode, viterbi_decode
from asrdist.eval.details import phone_details, text_details
from asrdist.eval.scoring import counts_of, error_rate
from asrdist.eval.vocabulary import vocabulary_search
from asrdist.features.store import FeatureStore
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.models.objectives import ctc_objective


def ctc_hypothesis(log_probs: np.ndarray, cfg, constrained=None) -> list[int]:
    """Token ids of one utterance: the vocabulary-constrained search when the run has one
    (`asrdist.eval.vocabulary`), else prefix beam search (`eval.beam` > 1) or greedy."""
    if constrained is not None:
        return constrained.search(log_probs)
    return ctc_beam_decode(log_probs, beam=cfg.eval.beam) if cfg.eval.beam > 1 else ctc_greedy_decode(log_probs)


def model_device(model: torch.nn.Module) -> torch.device:
    """Where `model` computes: its parameters' device (its buffers' for a model of none, the demo's
    prior-only baseline; the CPU for one of neither)."""
    first = next(itertools.chain(model.parameters(), model.buffers()), None)
    return first.device if first is not None else torch.device("cpu")


def on_model_device(model: torch.nn.Module, x: torch.Tensor) -> torch.Tensor:
    """`x` (a CPU tensor) where `model` computes; a copy from pinned memory does not wait."""
    device = model_device(model)
    return x if device.type == "cpu" else x.to(device, non_blocking=x.is_pinned())


def _frame_logits(model: torch.nn.Module, feats: np.ndarray, context: int) -> torch.Tensor:
    """A frame or chunk model's logits [T, classes] of one utterance, on the model's device."""
    if model.kind == "chunk":
        return model(on_model_device(model, torch.from_numpy(np.array(feats))[None]))[0]
    return model(on_model_device(model, torch.from_numpy(splice(feats, context))))


def frame_log_posteriors(logits: torch.Tensor) -> np.ndarray:
    """A frame model's log posteriors per frame, float64 on the CPU, as the phone-loop search takes them."""
    return torch.log_softmax(logits, -1).cpu().double().numpy()


@torch.no_grad()
def utterance_log_posteriors(model: torch.nn.Module, feats: np.ndarray, context: int) -> np.ndarray:
    """`frame_log_posteriors` of a frame model on one utterance's features."""
    return frame_log_posteriors(_frame_logits(model, feats, context))


def decoding_log_priors(targets: Targets) -> np.ndarray:
    """The classes' log priors the phone-loop search divides by (times eval.prior_scale). Classes
    never seen in training carry only the smoothing floor; dividing by it would favour them by
    ~16 nats, so they are left out of decoding (log prior -inf)."""
    priors = np.asarray(targets.priors, dtype=np.float64)
    with np.errstate(divide="ignore"):
        return np.log(np.where(priors > 1e-6, priors, 0.0))


@torch.no_grad()
def evaluate_split(model: torch.nn.Module, split_dir: Path, targets: Targets, cfg,
                   max_utterances: int | None = None, details: bool = False, adapt: bool = False) -> dict:
    """Loss and error rates on a split; with `details` also `per_utterance` (reference, hypothesis
    and errors of every utterance, `asrdist.eval.details`); with `adapt` (CTC models) each speaker's
    features first pass through the map `asrdist.eval.adapt` fits to them (`eval.adapt_*`). The
    model computes where it is (a training learner's device, `asrdist eval --device`)."""
    was_training = model.training
    model.eval()
    try:
        store = FeatureStore(split_dir)
        utt_ids = store.utt_ids[:max_utterances] if max_utterances else store.utt_ids
        if model.kind == "ctc":
            return _evaluate_ctc(model, store, utt_ids, split_dir, targets, cfg, details, adapt)
        return _evaluate_frames(model, store, utt_ids, split_dir, targets, cfg, details)
    finally:
        model.train(was_training)


def no_hybrid_reference(split_dir) -> DataError:
    return DataError(f"{split_dir}: a hybrid model is scored against the split's alignment.scp or its words through a "
                     f"lexicon (SPLIT/lexicon.txt or CORPUS/lexicon.txt: `asrdist corpus import-kaldi ... --lexicon "
                     f"FILE`); the split has neither")


def _frame_references(split_dir, targets) -> tuple[dict | None, dict[str, list[int]]]:
    """(frame labels or None, reference phones) of a split: from its alignments where it has them,
    else from its words through the lexicon (`split_lexicon`: a held-out set imported alone), each
    word's first pronunciation with adjacent equal phones merged, as an alignment's runs are."""
    if (Path(split_dir) / "alignment.scp").is_file():
        alignments = split_alignments(split_dir, len(targets.phones))
        return frame_labels(split_dir, targets, alignments), phone_sequences(alignments, targets.silence_id)
    tokens = lexicon_phone_tokens(split_dir, None, targets.phones)
    if tokens is None:
        raise no_hybrid_reference(split_dir)
    return None, {u: [p for i, p in enumerate(t) if i == 0 or p != t[i - 1]] for u, t in tokens.items()}


def _evaluate_frames(model, store, utt_ids, split_dir, targets, cfg, details: bool = False) -> dict:
    """PER by the phone-loop search; loss and frame accuracy only where the split has alignments."""
    labels, ref_phones = _frame_references(split_dir, targets)
    # `asrdist align` leaves out utterances with unknown words, as does the lexicon
    utt_ids = [u for u in utt_ids if u in ref_phones and (labels is None or u in labels)]
    log_priors = decoding_log_priors(targets)
    loss_sum, correct, frames = 0.0, 0, 0
    refs, hyps = [], []
    for utt in utt_ids:
        feats = store[utt]
        t = min(len(feats), len(labels[utt])) if labels is not None else len(feats)
        logits = _frame_logits(model, feats[:t], cfg.model.context)
        if labels is not None:
            y = on_model_device(model, torch.from_numpy(np.asarray(labels[utt][:t], dtype=np.int64)))
            loss_sum += float(torch.nn.functional.cross_entropy(logits, y, reduction="sum"))
            correct += int((logits.argmax(-1) == y).sum())
        frames += t
        log_post = frame_log_posteriors(logits)
        try:
            hyps.append(viterbi_decode(log_post, cfg.eval.prior_scale * log_priors, targets.class_to_phone,
                                       targets.bigram, min_duration=cfg.eval.min_duration,
                                       acoustic_scale=cfg.eval.acoustic_scale,
                                       silence_id=targets.silence_id))
        except DataError:  # no finite path (e.g. a diverged model): score the utterance as all deletions
            hyps.append([])
        refs.append(ref_phones[utt])
    per = error_rate(refs, hyps)
    result = {"loss": loss_sum / max(frames, 1), "frame_accuracy": correct / max(frames, 1)} if labels is not None \
        else {"reference": "lexicon"}
    result.update({"per": per["rate"], "utterances": len(utt_ids), "frames": frames,
                   "error_counts": {"per": counts_of(per)}})
    if details:
        result["per_utterance"] = phone_details(utt_ids, refs, hyps, targets.phones)
        result["sequences"] = {"per": (refs, hyps)}
    return result


def _speaker_maps(model, store, utt_ids, split_dir, cfg, constrained) -> tuple[dict, dict]:
    """({utt: its speaker's feature map}, the adaptation's summary for eval.json)."""
    from asrdist.eval.adapt import RecipeAdaptation  # here, not at the top: adapt imports this module

    data = read_data_dir(split_dir, require_text=False)
    by_speaker: dict[str, list[str]] = {}
    for utt in utt_ids:
        by_speaker.setdefault(data.utterances[utt].speaker, []).append(utt)
    adaptation = RecipeAdaptation(model, cfg, constrained)
    maps = {}
    # disable=None: a bar on a terminal only
    for speaker, utts in tqdm(sorted(by_speaker.items()), desc="adapting", unit="speaker", disable=None):
        transform = adaptation.fit(speaker, [torch.from_numpy(np.array(store[u])) for u in utts])
        maps.update({u: transform for u in utts})
    return maps, adaptation.finish()


def _evaluate_ctc(model, store, utt_ids, split_dir, targets, cfg, details: bool = False, adapt: bool = False) -> dict:
    constrained = vocabulary_search(cfg, targets)
    chars = targets.kind == "chars"
    # the transcripts scored as text (characters, or words of a vocabulary), read once: also the targets'
    data = read_data_dir(split_dir) if chars or constrained is not None else None
    tokens = ctc_tokens(split_dir, targets, data)
    if chars:  # references from the text, also of utterances whose characters the model never saw (no loss)
        tok = targets.tokenizer
        references = {u: tok.normalize(data.utterances[u].text) for u in utt_ids if u in data.utterances}
        utt_ids = [u for u in utt_ids if u in references]
    else:
        utt_ids = [u for u in utt_ids if u in tokens]  # lexicon targets leave out utterances with unknown words
    maps, adaptation = {}, None
    if adapt and utt_ids:
        maps, adaptation = _speaker_maps(model, store, utt_ids, split_dir, cfg, constrained)
    loss_sum, loss_frames, frames, exact = 0.0, 0, 0, 0
    refs, hyps = [], []
    for utt in utt_ids:
        feats = on_model_device(model, torch.from_numpy(np.array(store[utt]))[None])
        if utt in maps:
            feats = maps[utt](feats)
        lengths = torch.tensor([feats.shape[1]])
        log_probs, out_lengths = model(feats, lengths)
        ref = tokens.get(utt)
        if ref is not None:
            reference = on_model_device(model, torch.tensor([ref], dtype=torch.long).reshape(1, -1))
            loss, _ = ctc_objective(log_probs, reference, out_lengths, torch.tensor([len(ref)]))
            loss_sum += float(loss) * int(out_lengths[0])  # ctc_objective normalizes by output frames
            loss_frames += int(out_lengths[0])
        frames += int(out_lengths[0])
        lp = log_probs[0, : int(out_lengths[0])].cpu().double().numpy()
        hyp = list(ctc_hypothesis(lp, cfg, constrained))
        refs.append(list(ref) if ref is not None else None)
        hyps.append(hyp)
        exact += int(refs[-1] == hyp)
    result: dict = {"loss": loss_sum / max(loss_frames, 1), "utterances": len(utt_ids), "frames": frames,
                    "sentence_accuracy": exact / max(len(utt_ids), 1)}
    if adaptation is not None:
        result["adaptation"] = adaptation
    scored = {}  # metric -> (references, hypotheses) as token sequences
    if targets.kind == "phones" and constrained is not None:
        # Hypotheses are words: score them as words (a word said with another of its pronunciations
        # is right), and the phones as before.
        from asrdist.corpus.lexicon import normalize_word

        ref_text = [" ".join(map(normalize_word, data.utterances[u].text.split())) for u in utt_ids]
        hyp_text = [" ".join(constrained.words(h)) for h in hyps]
        result["sentence_accuracy"] = sum(r == h for r, h in zip(ref_text, hyp_text)) / max(len(utt_ids), 1)
        scored = {"wer": ([r.split() for r in ref_text], [h.split() for h in hyp_text]), "per": (refs, hyps)}
        if details:
            result["per_utterance"] = text_details(utt_ids, ref_text, hyp_text)
    elif targets.kind == "phones":
        scored = {"per": (refs, hyps)}
        if details:
            result["per_utterance"] = phone_details(utt_ids, refs, hyps, targets.phones)
    else:
        without_loss = [u for u in utt_ids if u not in tokens]
        if without_loss:
            # scored (the model cannot say them: errors), left out of the loss
            result["unseen_characters"] = {"utterances": len(without_loss), "characters": sorted(
                set().union(*(tok.unseen(references[u]) for u in without_loss)))}
        ref_text = [references[u] for u in utt_ids]
        hyp_text = [tok.decode(h) for h in hyps]
        scored = {"cer": ([list(r) for r in ref_text], [list(h) for h in hyp_text]),
                  "wer": ([r.split() for r in ref_text], [h.split() for h in hyp_text])}
        if details:
            result["per_utterance"] = text_details(utt_ids, ref_text, hyp_text)
    rates = {name: error_rate(*pair) for name, pair in scored.items()}
    result.update({name: r["rate"] for name, r in rates.items()})
    result["error_counts"] = {name: counts_of(r) for name, r in rates.items()}
    if details:
        result["sequences"] = scored
    return result
