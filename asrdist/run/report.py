"""report.png: training/validation loss and accuracy curves of a run, from metrics.jsonl."""
from __future__ import annotations

from pathlib import Path

from asrdist.io.atomic import atomic_path
from asrdist.train.metrics import read_metrics


def plot_report(run_dir: Path, title: str = "") -> Path:
    # here, not at the top: matplotlib is about a second of start-up, and of a job's learners only
    # rank 0 plots, once, at the end
    import matplotlib
    import matplotlib.pyplot as plt

    matplotlib.use("Agg")

    records = read_metrics(run_dir)
    train = [r for r in records if r["kind"] == "train"]
    epochs = [r for r in records if r["kind"] == "epoch"]
    fig, (ax_loss, ax_acc) = plt.subplots(1, 2, figsize=(11, 4))
    if train:
        ax_loss.plot([r["step"] for r in train], [r["loss"] for r in train], label="train (minibatch mean)", lw=1)
    valid = [r for r in epochs if "valid_loss" in r]
    if valid:
        ax_loss.plot([r["step"] for r in valid], [r["valid_loss"] for r in valid], "o-", label="valid")
    ax_loss.set_xlabel("step")
    ax_loss.set_ylabel("loss")
    if ax_loss.get_legend_handles_labels()[0]:
        ax_loss.legend()
    else:  # e.g. a resumed run that had nothing left to train
        ax_loss.text(0.5, 0.5, "no losses recorded", ha="center", va="center", transform=ax_loss.transAxes)
    ax_loss.grid(alpha=0.3)
    for key, label in (("frame_accuracy", "frame accuracy"), ("per", "PER"), ("cer", "CER"),
                       ("wer", "WER"), ("sentence_accuracy", "sentence accuracy")):
        pts = [(r["epoch"], r[key]) for r in epochs if key in r]
        if pts:
            ax_acc.plot(*zip(*pts), "o-", label=label)
    ax_acc.set_xlabel("epoch")
    ax_acc.set_ylim(0, 1)
    if ax_acc.get_legend_handles_labels()[0]:
        ax_acc.legend()
    ax_acc.grid(alpha=0.3)
    fig.suptitle(title)
    fig.tight_layout()
    out = Path(run_dir) / "report.png"
    with atomic_path(out) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)
    return out
