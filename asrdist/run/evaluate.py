"""`asrdist eval RUN_DIR --data DATA`: score a run's final model on any split, write eval.json."""
from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from asrdist.checks import compute_device
from asrdist.config import RunConfig, config_from_tree
from asrdist.corpus.lexicon import split_lexicon
from asrdist.data.labels import split_alignments
from asrdist.data.targets import Targets
from asrdist.errors import DataError
from asrdist.eval.details import (
    confusions,
    hyp_lines,
    hyp_path,
    speaker_rates,
    speaker_table,
    worst_utterances,
)
from asrdist.eval.evaluate import evaluate_split, no_hybrid_reference
from asrdist.eval.kaldi_scoring import bootstrap, bootstrap_line, errs_path, errs_text, kaldi_line
from asrdist.eval.wordlm import LM_NAME
from asrdist.features.store import FeatureStore, has_features
from asrdist.io.atomic import atomic_path, json_text
from asrdist.io.kaldi_dir import read_data_dir
from asrdist.optim.ng_layers import apply_natural_gradient
from asrdist.run.prepare import ensure_features, feature_mismatch, load_targets
from asrdist.run.task import build_model_for
from asrdist.run.rundir import MODEL_NAME, read_torch_file


def trained_architecture(cfg: RunConfig, model: torch.nn.Module) -> torch.nn.Module:
    """`model` as the learners trained it: natural gradient turns a chunk model's `nn.LSTM` into an
    `AffineLSTM` (other state_dict keys), exactly as `asrdist.run.learner` does before training."""
    if cfg.optim.natural_gradient:
        apply_natural_gradient(model, convert_lstm=model.kind == "chunk", seed=cfg.seed)
    return model


def _read_model_file(path: Path) -> dict:
    blob = read_torch_file(path, "model file")
    if not isinstance(blob, dict):
        raise DataError(f"{path}: not an asrdist model file (a {type(blob).__name__}, expected a mapping)")
    for key in ("model", "config", "input_dim"):
        if key not in blob:
            raise DataError(f"{path}: not an asrdist model file (no '{key}' entry)")
    return blob


def load_state_strictly(model: torch.nn.Module, state: dict, path: Path) -> None:
    """Load every tensor of `state` into `model`; any missing, unexpected or misshaped key is a
    one-line DataError naming `path` and the first such key."""
    expected = model.state_dict()
    missing = [k for k in expected if k not in state]
    if missing:
        raise DataError(f"{path}: missing key '{missing[0]}' ({len(missing)} missing); "
                        "the file does not fit the model its config builds")
    unexpected = [k for k in state if k not in expected]
    if unexpected:
        raise DataError(f"{path}: unexpected key '{unexpected[0]}' ({len(unexpected)} unexpected); "
                        "the file does not fit the model its config builds")
    for key, tensor in expected.items():
        saved = state[key]
        if not isinstance(saved, torch.Tensor) or saved.shape != tensor.shape:
            shape = tuple(saved.shape) if isinstance(saved, torch.Tensor) else type(saved).__name__
            raise DataError(f"{path}: key '{key}' has shape {shape}, the model expects {tuple(tensor.shape)}")
    model.load_state_dict(state, strict=True)


def load_run_model(run_dir: Path, eval_overrides: dict | None = None, device: str | torch.device | None = None):
    """(model, config, targets, input_dim) of a finished run, the model on `device` (`compute_device`:
    None is the GPU where there is one); `eval_overrides` ({key: value}, None values skipped: the
    command line's --vocabulary, --adapt-rounds, ...) replace the recipe's `eval.KEY` settings."""
    device = compute_device(device)
    path = run_dir / MODEL_NAME
    if not run_dir.is_dir():
        raise DataError(f"{run_dir}: run directory not found")
    if not path.is_file():
        raise DataError(f"{path}: missing; has the run in {run_dir} finished?")
    blob = _read_model_file(path)
    tree = blob["config"]
    overrides = {k: v for k, v in (eval_overrides or {}).items() if v is not None}
    if overrides.get("lm", (tree.get("eval") or {}).get("lm", "train")) == "train" and (run_dir / LM_NAME).is_file():
        overrides["lm"] = str(run_dir / LM_NAME)  # the training transcripts' bigram, written at training
    if overrides:
        tree = {**tree, "eval": {**(tree.get("eval") or {}), **overrides}}
    cfg = config_from_tree(tree)  # the config the model was trained with
    targets = load_targets(run_dir)
    model = trained_architecture(cfg, build_model_for(cfg, blob["input_dim"], targets))
    load_state_strictly(model, blob["model"], path)
    model.to(device).eval()
    return model, cfg, targets, blob["input_dim"]


def resolve_split(data: Path) -> Path:
    if (data / "wav.scp").is_file():
        return data
    if (data / "test" / "wav.scp").is_file():
        return data / "test"
    splits = sorted(p.name for p in data.iterdir() if (p / "wav.scp").is_file()) if data.is_dir() else []
    if splits:  # a corpus without a test split (an import carved only valid): name what it has
        raise DataError(f"{data}: a corpus without a test/ split; give one of its splits "
                        f"({', '.join(f'--data {data / name}' for name in splits)}) or a split directory")
    raise DataError(f"{data}: neither a split directory (wav.scp) nor a corpus with test/")


def trained_sample_rate(cfg: RunConfig, targets: Targets) -> int | None:
    """The sample rate the run's features were computed at: `targets.pt` keeps it (the front end
    `asrdist decode` rebuilds); a run from before it did reads its corpus' training store. None
    for imported features (not asrdist's front end) or a corpus that is gone."""
    if targets.features_recorded:
        record = targets.features
        return int(record["sample_rate"]) if record else None
    train = Path(cfg.data.corpus) / "train"
    if not has_features(train):
        return None
    meta = FeatureStore(train).meta
    return int(meta["sample_rate"]) if meta.get("num_mel_bins") is not None and meta.get("sample_rate") else None


def evaluate_run(run_dir: Path, data: Path, progress: bool = True, details: bool = False,
                 eval_overrides: dict | None = None, device: str | torch.device | None = None) -> dict:
    """Score the run's model on `data`, whose features are (re-)extracted with the run's recipe
    settings at the rate the model was trained at (other audio is resampled, as `asrdist decode`
    does) when they are missing, other ones, or stale (its whole corpus, for global CMVN
    statistics); `eval_overrides` replace recipe settings as in `load_run_model` (the vocabulary,
    speaker adaptation: `asrdist.eval.adapt`); the model computes on `device` (as `load_run_model`)."""
    model, cfg, targets, input_dim = load_run_model(run_dir, eval_overrides, device)
    split = resolve_split(data)
    if targets.kind in ("monophone", "tied"):  # before any features are written into the corpus
        if (split / "alignment.scp").is_file():
            split_alignments(split, len(targets.phones))
        elif split_lexicon(split) is None:
            raise no_hybrid_reference(split)
    rate = trained_sample_rate(cfg, targets)
    if feature_mismatch(split, cfg, rate):
        target = split.parent if (split.parent / "train").is_dir() and split.parent != split else split
        ensure_features(target, cfg, progress=progress, check=False, sample_rate=rate)
    dim = FeatureStore(split).dim
    if dim != input_dim:
        raise DataError(f"{split}: features have dimension {dim}, the model expects {input_dim}")
    result = evaluate_split(model, split, targets, cfg, details=details, adapt=cfg.eval.adapt_rounds > 0)
    if model.kind != "ctc":  # the phone-loop search's settings, which the PER depends on
        search = {"prior_scale": cfg.eval.prior_scale, "acoustic_scale": cfg.eval.acoustic_scale,
                  "min_duration": cfg.eval.min_duration}
    elif cfg.eval.lm_weight > 0:
        search = {"lm": cfg.eval.lm, "lm_weight": cfg.eval.lm_weight, "word_bonus": cfg.eval.word_bonus}
    else:
        search = {}
    if model.kind == "ctc" and (cfg.eval.vocabulary != "none" or cfg.eval.lexicon != "none"):
        search = {"decoder": cfg.eval.decoder, **search}
    result = {"data": str(split), "vocabulary": cfg.eval.vocabulary, **search, **result}
    return result


def not_scored(split: Path, utt_ids: list[str], scored: set[str]) -> dict:
    """The split's utterances its score leaves out, by why: `no_features` (the feature store lacks
    them: `asrdist features --skip-bad` skipped them) and `no_reference` (no targets for them: words
    outside the lexicon, left out by `asrdist align`). A note says how many when there are any, so
    an error rate is never read as the whole split's when it is not."""
    stored = set(FeatureStore(split).utt_ids)
    missing = [u for u in utt_ids if u not in scored]
    out = {"no_features": [u for u in missing if u not in stored],
           "no_reference": [u for u in missing if u in stored]}
    if missing:
        why = ", ".join(f"{len(v)} {k.replace('_', ' ')}" for k, v in out.items() if v)
        print(f"asrdist: note: {split}: {len(missing)} of {len(utt_ids)} utterances not scored ({why}); "
              f"eval.json's not_scored lists them", file=sys.stderr)
    return out


def command_line_overrides(args) -> dict:
    """The `eval` settings `asrdist eval` and `asrdist decode` take as options (None: the recipe's)."""
    return {"vocabulary": args.vocabulary, "adapt_rounds": args.adapt_rounds,
            "adapt_word_balance": args.adapt_word_balance, "lm_weight": args.lm_weight,
            "word_bonus": args.word_bonus, "lm": getattr(args, "lm", None),
            "lexicon": getattr(args, "lexicon", None), "decoder": getattr(args, "decoder", None), "prior_scale": args.prior_scale,
            "acoustic_scale": args.acoustic_scale, "min_duration": args.min_duration}


def eval_command(args) -> int:
    """eval.json (scores and the worst utterances), hyp.txt (`utt text`) and errs.txt (each
    utterance's alignment, icefall's form) beside it; `%WER`-style lines (Kaldi's) on stdout."""
    result = evaluate_run(args.run_dir, args.data, details=True, eval_overrides=command_line_overrides(args),
                          device=args.device)
    records = result.pop("per_utterance")
    sequences = result.pop("sequences")
    if getattr(args, "bootstrap", False):
        result["bootstrap"] = bootstrap(sequences)
    result["worst_utterances"] = worst_utterances(records)
    data = read_data_dir(Path(result["data"]), require_text=False)
    result["not_scored"] = not_scored(Path(result["data"]), data.utt_ids, {r["utt"] for r in records})
    result["speakers"] = speaker_rates(records, {u: d.speaker for u, d in data.utterances.items()})
    result["confusions"] = confusions(records)
    out = args.out or args.run_dir / "eval.json"
    errs_metric = "per" if records and records[0]["unit"] == "phones" else "wer"
    # all three files or none: each is written beside itself first, and renamed only when all are
    with atomic_path(hyp_path(out)) as hyp_tmp, atomic_path(errs_path(out)) as errs_tmp, atomic_path(out) as out_tmp:
        hyp_tmp.write_text(hyp_lines(records), encoding="utf-8")
        errs_tmp.write_text(errs_text(records, errs_metric), encoding="utf-8")
        out_tmp.write_text(json_text(result), encoding="utf-8")
    listed = ("worst_utterances", "speakers", "confusions", "error_counts", "bootstrap")
    print(json.dumps({k: v for k, v in result.items() if k not in listed}, indent=2))
    for metric, counts in result["error_counts"].items():
        print(kaldi_line(metric, counts))
    for metric, interval in result.get("bootstrap", {}).items():
        print(bootstrap_line(metric, interval))
    print(f"[asrdist] {hyp_path(out)}: {len(records)} hypotheses; {errs_path(out)}: each one aligned with its "
          f"reference; worst utterances, each speaker's error rate and the most frequent errors in {out}")
    if records:
        unit = {"words": "word", "phones": "phone"}.get(records[0]["unit"], records[0]["unit"])
        speakers = result["speakers"]
        print(speaker_table(speakers, records[0]["unit"]), end="")
        worst = max(speakers.items(), key=lambda item: (item[1]["error_rate"], item[0]))
        line = (f"[asrdist] {len(speakers)} speaker{'s' if len(speakers) > 1 else ''}; the worst, {worst[0]}: "
                f"{unit} error rate {worst[1]['error_rate']}")
        if result["confusions"]:
            top = result["confusions"][0]
            line += (f"; the most frequent error: {top['ref'] or '(nothing)'} -> {top['hyp'] or '(nothing)'} "
                     f"({top['count']} times)")
        print(line)
    return 0
