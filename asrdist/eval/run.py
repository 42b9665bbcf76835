"""`asrdist eval RUN_DIR --data DATA`: score a run's final model on any split, write eval.json."""
from __future__ import annotations

import json
from pathlib import Path

import torch

from asrdist.errors import DataError
from asrdist.utils.io import write_json_atomic


def load_run_model(run_dir: Path):
    from asrdist.config import config_from_tree
    from asrdist.train.prepare import load_targets
    from asrdist.train.task import build_model_for

    path = run_dir / "model.pt"
    if not path.is_file():
        raise DataError(f"{path}: missing; has the run in {run_dir} finished?")
    blob = torch.load(path, map_location="cpu", weights_only=False)
    cfg = config_from_tree(blob["config"])
    targets = load_targets(run_dir)
    model = build_model_for(cfg, blob["input_dim"], targets)
    model.load_state_dict(blob["model"], strict=False)
    model.eval()
    return model, cfg, targets, blob["input_dim"]


def resolve_split(data: Path) -> Path:
    if (data / "wav.scp").is_file():
        return data
    if (data / "test" / "wav.scp").is_file():
        return data / "test"
    raise DataError(f"{data}: neither a split directory (wav.scp) nor a corpus with test/")


def evaluate_run(run_dir: Path, data: Path, progress: bool = True) -> dict:
    from asrdist.eval.evaluate import evaluate_split
    from asrdist.features.extract import extract_features
    from asrdist.features.store import FeatureStore, has_features
    from asrdist.train.prepare import check_feature_settings

    model, cfg, targets, input_dim = load_run_model(run_dir)
    split = resolve_split(data)
    if not has_features(split):
        target = split.parent if (split.parent / "train").is_dir() and split.parent != split else split
        extract_features(target, num_mel_bins=cfg.data.num_mel_bins, cmvn=cfg.data.cmvn, progress=progress)
    check_feature_settings(split, cfg)
    dim = FeatureStore(split).dim
    if dim != input_dim:
        raise DataError(f"{split}: features have dimension {dim}, the model expects {input_dim}")
    result = evaluate_split(model, split, targets, cfg)
    result = {"data": str(split), **result}
    return result


def eval_command(args) -> int:
    result = evaluate_run(args.run_dir, args.data)
    out = args.out or args.run_dir / "eval.json"
    write_json_atomic(out, result)
    print(json.dumps(result, indent=2))
    return 0
