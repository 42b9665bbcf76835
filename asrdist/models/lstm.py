"""LSTM / BLSTM acoustic models on fixed-length chunks (the IBM SWB setup used 21-frame chunks).

Input [B, T, D] -> frame logits [B, T, K]. Chunks are all the same length, so no packing; the
chunk sampler supplies `chunk` frames with one label per frame.
"""
from __future__ import annotations

import torch
from torch import nn


class ChunkLSTM(nn.Module):
    """Stacked (bi)LSTM followed by a per-frame `nn.Linear` output layer."""

    kind = "chunk"

    def __init__(self, feature_dim: int, num_classes: int, hidden_layers: int = 2, hidden_dim: int = 256,
                 bidirectional: bool = False, dropout: float = 0.0, chunk: int = 21):
        super().__init__()
        self.feature_dim, self.num_classes, self.chunk = feature_dim, num_classes, chunk
        self.input_dim = feature_dim
        self.bidirectional = bidirectional
        self.lstm = nn.LSTM(feature_dim, hidden_dim, num_layers=hidden_layers, batch_first=True,
                            bidirectional=bidirectional, dropout=dropout if hidden_layers > 1 else 0.0)
        self.output = nn.Linear(hidden_dim * (2 if bidirectional else 1), num_classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if x.dim() != 3 or x.shape[-1] != self.feature_dim:
            raise ValueError(f"ChunkLSTM: expected [batch, time, {self.feature_dim}] inputs, got {tuple(x.shape)}")
        hidden, _ = self.lstm(x)
        return self.output(hidden)
