"""1-bit column quantization kernels: quantize + error feedback + pack, and unpack + dequantize.

Per column segment: int32 `words[ceil(R/32), w]` (bit i % 32 of words[i // 32, j] is v[i, j] >= 0)
and float32 `recon[2, w]` (the means of the negative and non-negative entries), v = g + residual.
Column sums are pairwise, so the pure-torch reference, the fused C++ kernel
(asrdist/native/onebit_kernel.cpp, built at first use; `get_quantizer("auto")` falls back to the
reference without a compiler) and the Triton kernels on CUDA (asrdist/parallel/onebit_triton.py)
agree bit for bit. Wire format, the lazy residual and the kernel's
memory sweep: docs/strategies.md#the-1-bit-kernels-parallelonebit_kernelpy."""
from __future__ import annotations

import functools
import time
import warnings
from typing import Sequence

import torch

from asrdist.errors import ConfigError
from asrdist.native import NativeBuildError, load

KERNEL_KINDS = ("auto", "fused", "reference", "triton")
SWBD_SHAPES: tuple[tuple[int, ...], ...] = (
    (2048, 429), (2048,),
    *((2048, 2048), (2048,)) * 6,
    (9304, 2048), (9304,),
)
"""Seide et al.'s Switchboard DNN: 429 inputs (11 x 39), 7 x 2048 hidden layers, 9304 senones
(45.1M parameters, the paper's "46M")."""


def packed_words(rows: int) -> int:
    return (rows + 31) // 32


def segment_numel(rows: int, width: int) -> int:
    """int32 elements of one quantized segment: packed bits plus two floats per column."""
    return packed_words(rows) * width + 2 * width


def split_segment(buffer: torch.Tensor, rows: int, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """(words, recon) views of one segment's slice of an int32 wire buffer."""
    nw = packed_words(rows) * width
    return buffer[:nw], buffer[nw:nw + 2 * width].view(torch.float32)


def as_columns(t: torch.Tensor) -> torch.Tensor:
    """The [rows, columns] view the quantizer works on: W[out, in] as is, a vector as one column,
    higher ranks flattened after the first dimension."""
    if t.dim() == 0:
        return t.reshape(1, 1)
    if t.dim() == 1:
        return t.reshape(-1, 1)
    return t.reshape(t.shape[0], -1)


# --------------------------------------------------------------------------------- reference

def pairwise_column_sum(x: torch.Tensor) -> torch.Tensor:
    """Sum over rows by a binary tree: (x0+x1), (x2+x3), ...; an odd last row passes up as is."""
    while x.shape[0] > 1:
        n = x.shape[0]
        pairs = x[0:n - 1:2] + x[1:n:2]
        x = torch.cat([pairs, x[n - 1:n]]) if n % 2 else pairs
    return x[0]


def _pack_bits(bits: torch.Tensor) -> torch.Tensor:
    rows, width = bits.shape
    nw = packed_words(rows)
    if rows % 32:
        padded = torch.zeros(nw * 32, width, dtype=torch.int32, device=bits.device)
        padded[:rows] = bits
    else:
        padded = bits.to(torch.int32)
    # 1 << 31 is int32's -2**31: adding the word's other (distinct, smaller) bits to it never
    # overflows, so an int32 sum gives the word's bit pattern (4 bytes a value, not int64's 8)
    shifts = torch.arange(32, device=bits.device, dtype=torch.int32).view(1, 32, 1)
    return (padded.view(nw, 32, width) << shifts).sum(dim=1, dtype=torch.int32)


def _unpack_bits(words: torch.Tensor, rows: int) -> torch.Tensor:
    nw, width = words.shape
    shifts = torch.arange(32, device=words.device, dtype=torch.int32).view(1, 32, 1)
    bits = (words.view(nw, 1, width) >> shifts) & 1
    return bits.reshape(nw * 32, width)[:rows].bool()


class Residual:
    """Error-feedback state of one [R, C] matrix, kept lazily: `last` holds the previous step's
    values v and `means` [2, C] their reconstruction (negative row, non-negative row), so the
    residual is last - recon(last). Zeros mean a zero residual."""

    __slots__ = ("last", "means")

    def __init__(self, rows: int, cols: int, device: torch.device | str = "cpu"):
        self.last = torch.zeros(rows, cols, device=device)
        self.means = torch.zeros(2, cols, device=device)

    def folded(self, c0: int, c1: int) -> torch.Tensor:
        """The residual of columns [c0, c1), computed exactly as the quantizers fold it in."""
        last = self.last[:, c0:c1]
        neg_mean, pos_mean = self.means[:, c0:c1]
        return last - torch.where(last >= 0, pos_mean, neg_mean)

    def materialize(self) -> torch.Tensor:
        return self.folded(0, self.last.shape[1])

    def load(self, residual: torch.Tensor) -> None:
        """Set the residual to `residual` exactly (r - 0 == r)."""
        self.last.copy_(residual.reshape(self.last.shape))
        self.means.zero_()


class Buckets:
    """`quantize_bucket` / `dequantize_bucket` as one call per matrix (the Triton kernels take a
    whole bucket in one launch)."""

    def quantize_bucket(self, items: Sequence[tuple]) -> None:
        """Each item is `quantize`'s (grad, residual, bounds, words, recon)."""
        for item in items:
            self.quantize(*item)

    def dequantize_bucket(self, items: Sequence[tuple], accumulate: bool = False) -> None:
        """Each item is `dequantize`'s (words, recon, rows, bounds, out)."""
        for item in items:
            self.dequantize(*item, accumulate=accumulate)


class ReferenceQuantizer(Buckets):
    """Pure torch, any device: the specification the fused kernels match bit for bit."""

    name = "reference"

    def quantize(self, grad: torch.Tensor, residual: Residual | None, bounds: Sequence[int],
                 words: Sequence[torch.Tensor], recon: Sequence[torch.Tensor]) -> None:
        """Quantize columns [bounds[0], bounds[-1]) of `grad` [R, C] plus the residual (updated;
        None = no error feedback). Segment s, columns [bounds[s], bounds[s+1]), goes to the flat
        buffers words[s] (int32, ceil(R/32)*w) and recon[s] (float32, 2*w)."""
        c0, c1 = bounds[0], bounds[-1]
        v = grad[:, c0:c1]
        if residual is not None:
            v = v + residual.folded(c0, c1)
        bits = v >= 0
        zero = torch.zeros((), dtype=v.dtype, device=v.device)
        pos_sum = pairwise_column_sum(torch.where(bits, v, zero))
        neg_sum = pairwise_column_sum(torch.where(bits, zero, v))
        pos_count = bits.sum(dim=0)
        neg_count = v.shape[0] - pos_count
        pos_mean = torch.where(pos_count > 0, pos_sum / pos_count.to(v.dtype), zero)
        neg_mean = torch.where(neg_count > 0, neg_sum / neg_count.to(v.dtype), zero)
        for s in range(len(bounds) - 1):
            a, b = bounds[s] - c0, bounds[s + 1] - c0
            words[s].view(-1, b - a).copy_(_pack_bits(bits[:, a:b]))
            recon[s].view(2, b - a).copy_(torch.stack([neg_mean[a:b], pos_mean[a:b]]))
        if residual is not None:
            residual.last[:, c0:c1] = v
            residual.means[:, c0:c1] = torch.stack([neg_mean, pos_mean])

    def dequantize(self, words: Sequence[torch.Tensor], recon: Sequence[torch.Tensor], rows: int,
                   bounds: Sequence[int], out: torch.Tensor, accumulate: bool = False) -> None:
        """Write (or add) the reconstruction of each segment into its columns of `out` [rows, C]."""
        for s in range(len(bounds) - 1):
            a, b = bounds[s], bounds[s + 1]
            bits = _unpack_bits(words[s].view(-1, b - a), rows)
            neg_mean, pos_mean = recon[s].view(2, b - a)
            values = torch.where(bits, pos_mean, neg_mean)
            if accumulate:
                out[:, a:b] += values
            else:
                out[:, a:b] = values


    def dequantize_mean(self, words: Sequence[torch.Tensor], recon: Sequence[torch.Tensor], rows: int,
                        out: torch.Tensor) -> None:
        """`out` [rows, w] = the mean of n reconstructions of the same block (the owner's reduce):
        summed in source order, then divided by n."""
        width = out.shape[1]
        for s in range(len(words)):
            self.dequantize([words[s]], [recon[s]], rows, [0, width], out, accumulate=s > 0)
        out.div_(len(words))

    def reduce_quantize(self, words: Sequence[torch.Tensor], recon: Sequence[torch.Tensor], rows: int,
                        width: int, residual: Residual | None, out_words: torch.Tensor,
                        out_recon: torch.Tensor) -> None:
        """The stripe owner's reduce: quantize (with `residual`) the mean of n reconstructions
        of a [rows, width] block into one segment; `dequantize_mean` then `quantize`."""
        mean = torch.empty(rows, width, device=out_words.device)
        self.dequantize_mean(words, recon, rows, mean)
        self.quantize(mean, residual, [0, width], [out_words], [out_recon])


# ------------------------------------------------------------------------------------- fused

def _load_kernel():
    """The compiled kernels (asrdist/native/onebit_kernel.cpp, built by torch.utils.cpp_extension)."""
    try:
        return load("onebit_kernel")
    except NativeBuildError as e:
        raise RuntimeError(f"1-bit fused kernel unavailable ({e})") from None


def _pointers(tensors: Sequence[torch.Tensor]) -> tuple[int, ...]:
    return tuple(t.data_ptr() for t in tensors)


def _check_segments(bounds, words, recon, rows: int, what: str) -> None:
    if len(words) != len(bounds) - 1 or len(recon) != len(bounds) - 1:
        raise ValueError(f"{what}: one words and one recon buffer per segment")
    for s in range(len(bounds) - 1):
        width = bounds[s + 1] - bounds[s]
        if width <= 0:
            raise ValueError(f"{what}: segment bounds must increase")
        for t, n, dtype in ((words[s], packed_words(rows) * width, torch.int32), (recon[s], 2 * width, torch.float32)):
            if t.numel() != n or t.dtype != dtype or not t.is_contiguous() or t.device.type != "cpu":
                raise ValueError(f"{what}: segment {s} buffer must be {n} contiguous CPU {dtype}")


def _check_matrix(t: torch.Tensor, what: str) -> None:
    if t.dim() != 2 or t.dtype != torch.float32 or t.device.type != "cpu" or t.stride(1) != 1:
        raise ValueError(f"{what}: expected a float32 CPU matrix with unit column stride")


class FusedQuantizer(Buckets):
    """The compiled kernel: ReferenceQuantizer's semantics for float32 CPU tensors."""

    name = "fused"

    def __init__(self):
        self._lib = _load_kernel()

    def quantize(self, grad, residual, bounds, words, recon) -> None:
        _check_matrix(grad, "fused quantizer grad")
        rows, cols = grad.shape
        if not grad.is_contiguous():
            raise ValueError("fused quantizer: grad must be contiguous")
        if residual is not None:
            for t, shape in ((residual.last, (rows, cols)), (residual.means, (2, cols))):
                if tuple(t.shape) != shape or not t.is_contiguous() or t.device.type != "cpu":
                    raise ValueError(f"fused quantizer: residual buffers must be contiguous CPU {shape}")
        if bounds[0] < 0 or bounds[-1] > cols:
            raise ValueError("fused quantizer: segment bounds outside the matrix")
        _check_segments(bounds, words, recon, rows, "fused quantizer")
        last, means = (0, 0) if residual is None else (residual.last.data_ptr(), residual.means.data_ptr())
        status = self._lib.quantize(grad.data_ptr(), last, means, rows, cols, tuple(bounds), _pointers(words),
                                    _pointers(recon))
        if status != 0:
            raise MemoryError("fused quantizer: scratch allocation failed")

    def dequantize(self, words, recon, rows, bounds, out, accumulate=False) -> None:
        _check_matrix(out, "fused dequantizer out")
        if out.shape[0] != rows or bounds[0] < 0 or bounds[-1] > out.shape[1]:
            raise ValueError("fused dequantizer: out does not hold the segments")
        _check_segments(bounds, words, recon, rows, "fused dequantizer")
        self._lib.dequantize(_pointers(words), _pointers(recon), rows, tuple(bounds), out.data_ptr(), out.stride(0),
                             bool(accumulate))


    def dequantize_mean(self, words, recon, rows, out) -> None:
        _check_matrix(out, "fused dequantize_mean out")
        if not out.is_contiguous() or out.shape[0] != rows:
            raise ValueError("fused dequantize_mean: out must be a contiguous [rows, w] matrix")
        width = out.shape[1]
        _check_segments(list(range(0, width * (len(words) + 1), width)), words, recon, rows, "fused dequantize_mean")
        self._lib.dequantize_mean(_pointers(words), _pointers(recon), rows, width, out.data_ptr())

    def reduce_quantize(self, words, recon, rows, width, residual, out_words, out_recon) -> None:
        _check_segments(list(range(0, width * (len(words) + 2), width)), [*words, out_words],
                        [*recon, out_recon], rows, "fused reduce_quantize")
        if residual is not None:
            for t, shape in ((residual.last, (rows, width)), (residual.means, (2, width))):
                if tuple(t.shape) != shape or not t.is_contiguous() or t.device.type != "cpu":
                    raise ValueError(f"fused reduce_quantize: residual buffers must be contiguous CPU {shape}")
        last, means = (0, 0) if residual is None else (residual.last.data_ptr(), residual.means.data_ptr())
        status = self._lib.reduce_quantize(_pointers(words), _pointers(recon), last, means, rows, width,
                                           out_words.data_ptr(), out_recon.data_ptr())
        if status != 0:
            raise MemoryError("fused reduce_quantize: scratch allocation failed")


def _triton_quantizer():
    """The Triton kernels, or RuntimeError naming why not (no Triton in this environment)."""
    try:
        # imported here: Triton comes with CUDA builds of torch only, and loads a compiler
        from asrdist.parallel.onebit_triton import TritonQuantizer
    except ImportError as e:
        raise RuntimeError(f"1-bit Triton kernels unavailable ({e})") from None
    return TritonQuantizer()


def get_quantizer(kind: str = "auto", device: torch.device | str = "cpu"):
    """`fused` (CPU; error if it cannot be built), `triton` (CUDA; error without Triton), `reference`,
    or `auto`: fused on CPU when it builds, triton on CUDA when Triton is there, else the reference."""
    if kind not in KERNEL_KINDS:
        raise ConfigError(f"onebit.kernel: unknown kernel '{kind}' (known: {', '.join(KERNEL_KINDS)})")
    device_type = torch.device(device).type
    on_cpu = device_type == "cpu"
    if kind == "reference" or (kind == "auto" and device_type not in ("cpu", "cuda")):
        return ReferenceQuantizer()
    if kind == "triton" or (kind == "auto" and device_type == "cuda"):
        if device_type != "cuda":
            raise ConfigError(f"onebit.kernel: 'triton' runs on CUDA only, the device is {device}")
        return _or_reference(kind, "triton", _triton_quantizer)
    if not on_cpu:
        raise ConfigError(f"onebit.kernel: 'fused' runs on CPU only, the device is {device}")
    return _or_reference(kind, "fused", FusedQuantizer)


def _or_reference(kind: str, compiled: str, make):
    """`make()`; where it cannot be had, a ConfigError if `kind` asked for it by name (`compiled`),
    else the reference with a one-line warning."""
    try:
        return make()
    except RuntimeError as e:
        if kind == compiled:
            raise ConfigError(f"onebit.kernel: {e}") from e
        warnings.warn(f"{e}; using the pure-torch reference quantizer", RuntimeWarning, stacklevel=3)
        return ReferenceQuantizer()


@functools.lru_cache(maxsize=1)
def _cpu_quantizer():
    return get_quantizer("auto")


def quantize_dequantize(v: torch.Tensor) -> torch.Tensor:
    """The per-column 1-bit reconstruction of a 1-D (one column) or 2-D tensor W[out, in]
    (columns W[:, j]): each entry becomes the mean of its column's entries of the same sign
    (negative, or non-negative)."""
    if v.dim() not in (1, 2):
        raise ValueError(f"quantize_dequantize: expected a 1-D or 2-D tensor, got shape {tuple(v.shape)}")
    if v.numel() == 0:
        return v.clone()
    quantizer = _cpu_quantizer() if v.device.type == "cpu" else get_quantizer("reference", v.device)
    m = as_columns(v).to(torch.float32).contiguous()
    rows, cols = m.shape
    words = torch.empty(packed_words(rows) * cols, dtype=torch.int32, device=v.device)
    recon = torch.empty(2 * cols, device=v.device)
    quantizer.quantize(m, None, [0, cols], [words], [recon])
    out = torch.empty_like(m)
    quantizer.dequantize([words], [recon], rows, [0, cols], out)
    return out.reshape(v.shape).to(v.dtype)


def quantization_buffers(shape: Sequence[int], gen: torch.Generator) -> tuple[torch.Tensor, Residual, list, list]:
    """A random gradient of `shape` as columns, a zero residual and one segment's wire buffers
    (packed words, reconstruction means) covering all its columns: what a benchmark quantizes."""
    grad = as_columns(torch.randn(tuple(shape), generator=gen))
    rows, cols = grad.shape
    return (grad, Residual(rows, cols), [torch.empty(packed_words(rows) * cols, dtype=torch.int32)],
            [torch.empty(2 * cols)])


def measure_quantize_vs_copy(shapes: Sequence[Sequence[int]] = SWBD_SHAPES, repeats: int = 5,
                             kind: str = "auto") -> dict:
    """Throughput of quantize + error feedback + pack relative to copying the same fp32 tensors
    into preallocated buffers, on one thread (best of `repeats` per shape, summed over shapes)."""
    quantizer = get_quantizer(kind)
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        gen = torch.Generator().manual_seed(0)
        copy_s = quant_s = 0.0
        elements = 0
        for shape in shapes:
            grad, residual, words, recon = quantization_buffers(shape, gen)
            cols = grad.shape[1]
            dst = torch.empty_like(grad)
            copy_s += _best_time(lambda: dst.copy_(grad), repeats)
            quant_s += _best_time(lambda: quantizer.quantize(grad, residual, [0, cols], words, recon), repeats)
            elements += grad.numel()
    finally:
        torch.set_num_threads(threads)
    return {
        "quantize_vs_copy": copy_s / quant_s,
        "quantize_seconds": quant_s,
        "copy_seconds": copy_s,
        "elements": elements,
        "kernel": quantizer.name,
        "threads": 1,
        "repeats": repeats,
    }


def _best_time(fn, repeats: int) -> float:
    fn()  # warm up: page faults, first touch
    best = float("inf")
    for _ in range(max(1, repeats)):
        t0 = time.perf_counter()
        fn()
        best = min(best, time.perf_counter() - t0)
    return best
