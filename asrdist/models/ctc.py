"""BLSTM + linear CTC model over tokens; output 0 is the blank.

forward(x [B, T, D], lengths [B]) -> (log_probs [B, T', V], out_lengths [B]). Padded utterances
are packed so the backward LSTM direction never reads padding. With `subsample` = s > 1, s
consecutive frames are stacked into one input vector (T' = ceil(T / s)), a cheap way to shorten
sequences for CTC; s = 1 keeps every frame.
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

BLANK = 0


class CTCModel(nn.Module):
    kind = "ctc"
    blank = BLANK

    def __init__(self, feature_dim: int, num_classes: int, hidden_layers: int = 2, hidden_dim: int = 192,
                 dropout: float = 0.0, subsample: int = 1):
        super().__init__()
        self.feature_dim, self.num_classes, self.subsample = feature_dim, num_classes, subsample
        self.input_dim = feature_dim
        self.lstm = nn.LSTM(feature_dim * subsample, hidden_dim, num_layers=hidden_layers, batch_first=True,
                            bidirectional=True, dropout=dropout if hidden_layers > 1 else 0.0)
        self.output = nn.Linear(2 * hidden_dim, num_classes)

    def output_lengths(self, lengths: torch.Tensor) -> torch.Tensor:
        return torch.div(lengths + self.subsample - 1, self.subsample, rounding_mode="floor")

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        if x.dim() != 3 or x.shape[-1] != self.feature_dim:
            raise ValueError(f"CTCModel: expected [batch, time, {self.feature_dim}] inputs, got {tuple(x.shape)}")
        lengths = torch.as_tensor(lengths, dtype=torch.long).cpu()
        if lengths.shape != (x.shape[0],) or int(lengths.min()) < 1 or int(lengths.max()) > x.shape[1]:
            raise ValueError(f"CTCModel: lengths {lengths.tolist()} do not fit inputs of shape {tuple(x.shape)}")
        s = self.subsample
        if s > 1:
            pad = (-x.shape[1]) % s
            if pad:
                x = torch.nn.functional.pad(x, (0, 0, 0, pad))
            x = x.reshape(x.shape[0], x.shape[1] // s, s * self.feature_dim)
        out_lengths = self.output_lengths(lengths)
        packed = pack_padded_sequence(x, out_lengths, batch_first=True, enforce_sorted=False)
        hidden, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(hidden, batch_first=True, total_length=x.shape[1])
        return torch.log_softmax(self.output(hidden), dim=-1), out_lengths
