"""The one minibatch type every sampler yields and every model's loss function reads."""
from __future__ import annotations

from dataclasses import dataclass

import torch

IGNORE_INDEX = -100
"""Target value of padded frames (torch's cross-entropy default `ignore_index`)."""


@dataclass
class Batch:
    """A minibatch. Shapes depend on the sampler:

    - frames (DNN): inputs [B, (2C+1)*dim] float32, targets [B] int64;
    - chunks (LSTM): inputs [B, chunk, dim], targets [B, chunk] (IGNORE_INDEX on padding),
      input_lengths [B];
    - utterances (CTC): inputs [B, Tmax, dim] zero-padded, input_lengths [B], targets [B, Lmax]
      zero-padded, target_lengths [B].
    """

    inputs: torch.Tensor
    targets: torch.Tensor
    num_frames: int
    """Real (unpadded) input frames in the batch: what throughput figures count."""
    input_lengths: torch.Tensor | None = None
    target_lengths: torch.Tensor | None = None

    def to(self, device: torch.device | str, non_blocking: bool = False) -> "Batch":
        """The batch on `device`. To a GPU from the CPU through pinned memory, without blocking:
        a copy from pageable memory would wait for the device's queue to drain first."""
        pin = torch.device(device).type == "cuda"

        def move(t: torch.Tensor | None) -> torch.Tensor | None:
            if t is None:
                return None
            if pin and t.device.type == "cpu":
                return t.pin_memory().to(device, non_blocking=True)
            return t.to(device, non_blocking=non_blocking)

        return Batch(inputs=move(self.inputs), targets=move(self.targets), num_frames=self.num_frames,
                     input_lengths=move(self.input_lengths), target_lengths=move(self.target_lengths))

    @property
    def size(self) -> int:
        """Rows in the batch (frames, chunks or utterances)."""
        return int(self.inputs.shape[0])

    def split(self, parts: int) -> list["Batch"]:
        """The batch's rows in `parts` contiguous micro-batches of sizes differing by at most one
        (fewer when it has fewer rows; `train.accumulate`), views of this batch's tensors. Each
        counts its own real frames: its rows, or the sum of its `input_lengths`."""
        if parts < 1:
            raise ValueError(f"Batch.split: parts must be >= 1, got {parts}")
        if parts == 1 or self.size <= 1:
            return [self]

        def cut(t: torch.Tensor | None) -> list[torch.Tensor | None]:
            return [None] * min(parts, self.size) if t is None else list(torch.tensor_split(t, min(parts, self.size)))

        out = []
        for x, y, lengths, target_lengths in zip(cut(self.inputs), cut(self.targets), cut(self.input_lengths),
                                                 cut(self.target_lengths)):
            frames = int(x.shape[0]) if lengths is None else int(lengths.sum())
            out.append(Batch(inputs=x, targets=y, num_frames=frames, input_lengths=lengths,
                             target_lengths=target_lengths))
        return out

