"""Feed-forward DNN on spliced frames: the hybrid acoustic model of the 1-bit SGD and Kaldi papers.

Input: one row per frame, the centre frame with `context` frames on each side concatenated,
[B, (2*context+1)*D]. Output: [B, K] logits over phone or tied-state classes. Every affine map is a
plain `nn.Linear` (the NG-SGD helper finds and wraps exactly those).
"""
from __future__ import annotations

import torch
from torch import nn

# The 1-bit SGD paper's SWB-300h DNN: 11 frames x 39 features in, 9304 tied states out.
SWBD_FEATURE_DIM = 39
SWBD_NUM_CLASSES = 9304

_ACTIVATIONS = {"relu": nn.ReLU, "sigmoid": nn.Sigmoid}


class SplicedDNN(nn.Module):
    """`hidden_layers` x (Linear -> activation [-> Dropout]) then a Linear output layer."""

    kind = "frame"

    def __init__(self, feature_dim: int, num_classes: int, hidden_layers: int = 4, hidden_dim: int = 512,
                 activation: str = "relu", context: int = 5, dropout: float = 0.0):
        super().__init__()
        if activation not in _ACTIVATIONS:
            raise ValueError(f"unknown activation '{activation}'")
        self.feature_dim, self.context, self.num_classes = feature_dim, context, num_classes
        self.input_dim = (2 * context + 1) * feature_dim
        layers: list[nn.Module] = []
        width = self.input_dim
        for _ in range(hidden_layers):
            layers += [nn.Linear(width, hidden_dim), _ACTIVATIONS[activation]()]
            if dropout > 0:
                layers.append(nn.Dropout(dropout))
            width = hidden_dim
        self.hidden = nn.Sequential(*layers)
        self.output = nn.Linear(width, num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.shape[-1] != self.input_dim:
            raise ValueError(f"SplicedDNN: expected spliced inputs of {2 * self.context + 1} x {self.feature_dim} = "
                             f"{self.input_dim} features, got shape {tuple(x.shape)}")
        return self.output(self.hidden(x))
