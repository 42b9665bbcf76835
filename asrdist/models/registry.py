"""Acoustic models by name: a typed config, per-name defaults, and one `build_model` entry point.

Every model carries `kind`, which tells the trainer which sampler and objective to use:
"frame" (spliced frames -> [B, K] logits), "chunk" (fixed-length chunks -> [B, T, K] logits) or
"ctc" (padded utterances + lengths -> [B, T, V] log-probs + output lengths).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from torch import nn

from asrdist.checks import check_field
from asrdist.errors import ConfigError
from asrdist.models.ctc import CTCModel
from asrdist.models.dnn import SplicedDNN
from asrdist.models.lstm import ChunkLSTM

MODEL_KINDS = {"dnn": "frame", "swbd": "frame", "lstm": "chunk", "blstm": "chunk", "ctc": "ctc"}
MODEL_NAMES = tuple(MODEL_KINDS)

# Filled into fields left as None. `swbd` is the 1-bit SGD paper's shape (Seide et al. 2014):
# 429 inputs (11 x 39) -> 7 x 2048 sigmoid -> 9304 tied states, about 46M parameters.
_DEFAULTS: dict[str, dict[str, object]] = {
    "dnn": {"hidden_layers": 4, "hidden_dim": 512, "activation": "relu"},
    "swbd": {"hidden_layers": 7, "hidden_dim": 2048, "activation": "sigmoid"},
    "lstm": {"hidden_layers": 2, "hidden_dim": 256},
    "blstm": {"hidden_layers": 2, "hidden_dim": 192},
    "ctc": {"hidden_layers": 2, "hidden_dim": 192},
}
ACTIVATIONS = ("relu", "sigmoid")


@dataclass
class ModelConfig:
    name: str = "dnn"
    """dnn | swbd | lstm | blstm | ctc."""
    hidden_layers: int | None = None
    """Hidden affine layers (dnn, swbd) or stacked LSTM layers (lstm, blstm, ctc); None = the model's default."""
    hidden_dim: int | None = None
    """Hidden layer width (dnn, swbd) or LSTM cells per direction; None = the model's default."""
    activation: str | None = None
    """relu | sigmoid, for dnn and swbd only; None = the model's default (relu for dnn, sigmoid for swbd)."""
    context: int = 5
    """Frames spliced on each side of the centre frame for dnn and swbd: input is (2*context+1) frames."""
    chunk: int = 21
    """Chunk length in frames for lstm and blstm (IBM used 21); read by the chunk sampler."""
    dropout: float = 0.0
    """Dropout after each hidden layer (dnn, swbd) or between LSTM layers; 0 disables it."""
    subsample: int = 1
    """ctc only: stack this many consecutive frames into one before the BLSTM (output is T/subsample)."""
    conv_channels: int = 0
    """ctc only: channels of a two-layer convolutional front end over time and filterbank bins
    (each layer pools pairs of bins); 0 = none, the BLSTM reads the features directly."""

    def __post_init__(self):
        if self.name not in MODEL_KINDS:
            raise ConfigError(f"model.name: '{self.name}' is not one of {', '.join(MODEL_NAMES)}")
        defaults = _DEFAULTS[self.name]
        if self.activation is not None and "activation" not in defaults:
            raise ConfigError(f"model.activation: only dnn and swbd have an activation, not '{self.name}'")
        for key, value in defaults.items():
            if getattr(self, key) is None:
                setattr(self, key, value)
        for key, minimum in (("hidden_layers", 1), ("hidden_dim", 1), ("context", 0), ("chunk", 1), ("subsample", 1),
                             ("conv_channels", 0)):
            check_field(f"model.{key}", getattr(self, key), at_least=minimum)
        if self.activation is not None and self.activation not in ACTIVATIONS:
            raise ConfigError(f"model.activation: '{self.activation}' is not one of {', '.join(ACTIVATIONS)}")
        check_field("model.dropout", self.dropout, float, at_least=0, below=1)
        if self.subsample != 1 and self.name != "ctc":
            raise ConfigError(f"model.subsample: only the ctc model subsamples, not '{self.name}'")
        if self.conv_channels != 0 and self.name != "ctc":
            raise ConfigError(f"model.conv_channels: only the ctc model has a convolutional front end, not '{self.name}'")

    @property
    def kind(self) -> str:
        return MODEL_KINDS[self.name]


def model_kind(cfg: ModelConfig) -> str:
    """"frame", "chunk" or "ctc": known from the config alone, before any data is read."""
    return MODEL_KINDS[cfg.name]


def _build_dnn(cfg: ModelConfig, input_dim: int, num_classes: int) -> nn.Module:
    return SplicedDNN(input_dim, num_classes, hidden_layers=cfg.hidden_layers, hidden_dim=cfg.hidden_dim,
                      activation=cfg.activation, context=cfg.context, dropout=cfg.dropout)


def _build_chunk_lstm(cfg: ModelConfig, input_dim: int, num_classes: int) -> nn.Module:
    return ChunkLSTM(input_dim, num_classes, hidden_layers=cfg.hidden_layers, hidden_dim=cfg.hidden_dim,
                     bidirectional=cfg.name == "blstm", dropout=cfg.dropout, chunk=cfg.chunk)


def _build_ctc(cfg: ModelConfig, input_dim: int, num_classes: int) -> nn.Module:
    if cfg.conv_channels and input_dim < 4:
        raise ConfigError(f"model.conv_channels: the front end pools bins twice and needs at least 4 features "
                          f"per frame, the data has {input_dim}")
    return CTCModel(input_dim, num_classes, hidden_layers=cfg.hidden_layers, hidden_dim=cfg.hidden_dim,
                    dropout=cfg.dropout, subsample=cfg.subsample,
                    conv_channels=cfg.conv_channels)


_BUILDERS: dict[str, Callable[[ModelConfig, int, int], nn.Module]] = {
    "dnn": _build_dnn, "swbd": _build_dnn, "lstm": _build_chunk_lstm, "blstm": _build_chunk_lstm, "ctc": _build_ctc,
}


def build_model(cfg: ModelConfig, input_dim: int, num_classes: int) -> nn.Module:
    """The model `cfg.name` for `input_dim` features per frame and `num_classes` outputs.

    For ctc, `num_classes` counts the blank, which is output 0 (tokens are 1..num_classes-1).
    """
    if isinstance(input_dim, bool) or not isinstance(input_dim, int) or input_dim < 1:
        raise ConfigError(f"model '{cfg.name}': input_dim must be a positive integer, got {input_dim!r}")
    minimum = 2 if cfg.name == "ctc" else 1
    if isinstance(num_classes, bool) or not isinstance(num_classes, int) or num_classes < minimum:
        raise ConfigError(f"model '{cfg.name}': num_classes must be an integer >= {minimum}, got {num_classes!r}")
    model = _BUILDERS[cfg.name](cfg, input_dim, num_classes)
    model.name = cfg.name
    return model


def count_parameters(model: nn.Module, trainable_only: bool = False) -> int:
    """Number of scalar parameters (shared tensors counted once)."""
    return sum(p.numel() for p in model.parameters() if p.requires_grad or not trainable_only)

