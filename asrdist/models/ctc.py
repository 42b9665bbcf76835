"""BLSTM + linear CTC model over tokens; output 0 is the blank.

forward(x [B, T, D], lengths [B]) -> (log_probs [B, T', V], out_lengths [B]). Padded utterances
are packed so the backward LSTM direction never reads padding. With `subsample` = s > 1, s
consecutive frames are stacked into one input vector (T' = ceil(T / s)), a cheap way to shorten
sequences for CTC; s = 1 keeps every frame. With `conv_channels` = C > 0, two 3x3 convolutions over
time and filterbank bins, each followed by max-pooling of pairs of bins, come first: a formant
shifted by a bin or two between speakers then drives the same units (Abdel-Hamid et al. 2012).
"""
from __future__ import annotations

import torch
from torch import nn
from torch.nn.utils.rnn import pack_padded_sequence, pad_packed_sequence

BLANK = 0


class ConvFrontEnd(nn.Module):
    """Two (3 x 3 conv, ReLU, pool 2 bins) blocks: [B, T, D] -> [B, T, C * (D // 4)].

    Frames past an utterance's length are zeroed before and after each block, so a padded
    utterance gives the outputs it would give alone (a convolution would otherwise read the padding
    and carry its bias into it).
    """

    def __init__(self, feature_dim: int, channels: int):
        super().__init__()
        if feature_dim < 4:
            raise ValueError(f"ConvFrontEnd: needs at least 4 features per frame, got {feature_dim}")
        self.blocks = nn.ModuleList([nn.Conv2d(1, channels, 3, padding=1), nn.Conv2d(channels, channels, 3, padding=1)])
        self.output_dim = channels * (feature_dim // 2 // 2)

    def forward(self, x: torch.Tensor, lengths: torch.Tensor) -> torch.Tensor:
        frames = torch.arange(x.shape[1], device=x.device)  # on the inputs' device: a GPU's too
        valid = (frames.unsqueeze(0) < lengths.unsqueeze(1)).to(x.dtype)[:, None, :, None]
        h = (x.unsqueeze(1) * valid)  # padding may hold anything
        for conv in self.blocks:
            h = torch.nn.functional.max_pool2d(torch.relu(conv(h)), (1, 2)) * valid
        return h.permute(0, 2, 1, 3).reshape(x.shape[0], x.shape[1], -1)


class CTCModel(nn.Module):
    kind = "ctc"
    blank = BLANK

    def __init__(self, feature_dim: int, num_classes: int, hidden_layers: int = 2, hidden_dim: int = 192,
                 dropout: float = 0.0, subsample: int = 1, conv_channels: int = 0):
        super().__init__()
        self.feature_dim, self.num_classes, self.subsample = feature_dim, num_classes, subsample
        self.input_dim = feature_dim
        self.frontend = ConvFrontEnd(feature_dim, conv_channels) if conv_channels else None
        frame_dim = self.frontend.output_dim if self.frontend is not None else feature_dim
        self.lstm = nn.LSTM(frame_dim * subsample, hidden_dim, num_layers=hidden_layers, batch_first=True,
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
        if self.frontend is not None:
            x = self.frontend(x, lengths.to(x.device))
        s = self.subsample
        if s > 1:
            pad = (-x.shape[1]) % s
            if pad:
                x = torch.nn.functional.pad(x, (0, 0, 0, pad))
            x = x.reshape(x.shape[0], x.shape[1] // s, s * x.shape[-1])
        out_lengths = self.output_lengths(lengths)
        packed = pack_padded_sequence(x, out_lengths, batch_first=True, enforce_sorted=False)
        hidden, _ = self.lstm(packed)
        hidden, _ = pad_packed_sequence(hidden, batch_first=True, total_length=x.shape[1])
        return torch.log_softmax(self.output(hidden), dim=-1), out_lengths
