"""1-bit quantization on a CUDA device: Triton kernels with ReferenceQuantizer's results bit for bit.

A bucket (any number of matrices, each cut into column segments) is quantized in two launches:
`_quantize_chunks` reads each element once (gradient, lazy residual), writes the new residual and
the packed bits, and leaves per-chunk column sums; `_quantize_means` adds those up and writes each
column's two reconstruction values. Dequantizing a bucket is one launch. Column sums follow the
reference's pairwise tree exactly: a tree over rows padded to a power of two with -0.0 (x + -0.0 is
x for every x, so the padded tree is the reference's tree, odd rows passing up as they are), whose
aligned chunks of CHUNK_ROWS rows are its subtrees. Matrices, residuals and wire buffers are
reached through tables of addresses (one row per block of columns), as Triton's grouped GEMM does.

Needs Triton (on CUDA machines it comes with torch); `TRITON_INTERPRET=1` runs the same kernels on
CPU tensors, which is how the tests check them where there is no GPU. The wire format is the
reference's: docs/strategies.md#the-1-bit-kernels-parallelonebit_kernelpy.
"""
from __future__ import annotations

from collections import OrderedDict
from typing import Sequence

import torch
import triton
import triton.language as tl

from asrdist.parallel.onebit_kernel import Residual, packed_words

BLOCK_COLUMNS = 32
"""Columns per program (128 contiguous bytes of a row)."""
CHUNK_ROWS = 128
"""Rows per program of the first pass: a power of two and a multiple of 32 (whole words)."""
NUM_WARPS = 4
"""Warps per program."""
META = 11
"""int64 fields of a block's row in the table (see `_block_rows`)."""
_NEG_ZERO_BITS = tl.constexpr(-2147483648)
"""-0.0's bit pattern as int32: the identity of float addition, sign of zero included."""


@triton.jit
def _tree(x, WIDTH: tl.constexpr, LEVELS: tl.constexpr, BC: tl.constexpr):
    """[BC, 2**LEVELS] -> [BC]: adjacent pairs summed, level by level (the reference's order)."""
    for _ in tl.static_range(LEVELS):
        a, b = tl.split(tl.reshape(x, [BC, x.shape[1] // 2, 2]))
        x = a + b
    return tl.reshape(x, [BC])


@triton.jit
def _quantize_chunks(meta, partial, counts, EF: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr,
                     LEVELS: tl.constexpr, MAXCH: tl.constexpr):
    """Program (block b, chunk k): rows [k*CH, (k+1)*CH) of the block's columns."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    row = meta + b * 11
    rows = tl.load(row + 0)
    if k * CH < rows:
        cols = tl.load(row + 1)
        c0 = tl.load(row + 2)
        ncols = tl.load(row + 3)
        grad = tl.load(row + 4).to(tl.pointer_type(tl.float32))
        words = tl.load(row + 7).to(tl.pointer_type(tl.int32))
        width = tl.load(row + 8)
        wc = tl.load(row + 9)
        j = tl.arange(0, BC)
        r = k * CH + tl.arange(0, CH)
        jmask = j < ncols
        valid = jmask[:, None] & (r < rows)[None, :]
        offs = r[None, :].to(tl.int64) * cols + (c0 + j)[:, None]
        v = tl.load(grad + offs, mask=valid, other=0.0)
        if EF:
            last_p = tl.load(row + 5).to(tl.pointer_type(tl.float32))
            means_p = tl.load(row + 6).to(tl.pointer_type(tl.float32))
            last = tl.load(last_p + offs, mask=valid, other=0.0)
            neg_m = tl.load(means_p + c0 + j, mask=jmask, other=0.0)
            pos_m = tl.load(means_p + cols + c0 + j, mask=jmask, other=0.0)
            v = v + (last - tl.where(last >= 0, pos_m[:, None], neg_m[:, None]))
            tl.store(last_p + offs, v, mask=valid)
        bits = (v >= 0) & valid
        neg_zero = tl.full([BC, CH], _NEG_ZERO_BITS, tl.int32).to(tl.float32, bitcast=True)
        pos = tl.where(valid, tl.where(bits, v, 0.0), neg_zero)
        neg = tl.where(valid, tl.where(bits, 0.0, v), neg_zero)
        # bit i % 32 of word i // 32: a word's distinct bits summed are its pattern
        shifted = tl.reshape(bits.to(tl.int32), [BC, CH // 32, 32]) << tl.arange(0, 32)[None, None, :]
        packed = tl.sum(shifted, axis=2)
        wi = k * (CH // 32) + tl.arange(0, CH // 32)
        nw = (rows + 31) // 32
        tl.store(words + wi[None, :].to(tl.int64) * width + (wc + j)[:, None], packed,
                 mask=jmask[:, None] & (wi < nw)[None, :])
        at = (b * 2 * BC + j) * MAXCH + k
        tl.store(partial + at, _tree(neg, CH, LEVELS, BC))
        tl.store(partial + at + BC * MAXCH, _tree(pos, CH, LEVELS, BC))
        tl.store(counts + (b * BC + j) * MAXCH + k, tl.sum(bits.to(tl.int32), axis=1))


@triton.jit
def _quantize_means(meta, partial, counts, EF: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr,
                    MAXCH: tl.constexpr, LEVELS: tl.constexpr):
    """Program b: the block's column sums over its chunks, its means into recon (and the residual)."""
    b = tl.program_id(0)
    row = meta + b * 11
    rows = tl.load(row + 0)
    cols = tl.load(row + 1)
    c0 = tl.load(row + 2)
    ncols = tl.load(row + 3)
    width = tl.load(row + 8)
    wc = tl.load(row + 9)
    recon = tl.load(row + 10).to(tl.pointer_type(tl.float32))
    j = tl.arange(0, BC)
    kk = tl.arange(0, MAXCH)
    live = (kk < (rows + CH - 1) // CH)[None, :] & (j < BC)[:, None]
    at = (b * 2 * BC + j[:, None]) * MAXCH + kk[None, :]
    neg_zero = tl.full([BC, MAXCH], _NEG_ZERO_BITS, tl.int32).to(tl.float32, bitcast=True)
    neg_sum = _tree(tl.where(live, tl.load(partial + at, mask=live, other=0.0), neg_zero), MAXCH, LEVELS, BC)
    pos_sum = _tree(tl.where(live, tl.load(partial + at + BC * MAXCH, mask=live, other=0.0), neg_zero),
                    MAXCH, LEVELS, BC)
    pos_count = tl.sum(tl.load(counts + (b * BC + j[:, None]) * MAXCH + kk[None, :], mask=live, other=0), axis=1)
    neg_count = rows.to(tl.int32) - pos_count
    pos_mean = tl.where(pos_count > 0, tl.div_rn(pos_sum, pos_count.to(tl.float32)), 0.0)
    neg_mean = tl.where(neg_count > 0, tl.div_rn(neg_sum, neg_count.to(tl.float32)), 0.0)
    jmask = j < ncols
    tl.store(recon + wc + j, neg_mean, mask=jmask)
    tl.store(recon + width + wc + j, pos_mean, mask=jmask)
    if EF:
        means_p = tl.load(row + 6).to(tl.pointer_type(tl.float32))
        tl.store(means_p + c0 + j, neg_mean, mask=jmask)
        tl.store(means_p + cols + c0 + j, pos_mean, mask=jmask)


@triton.jit
def _segment_values(words, recon, width, wc, rows, k, j, jmask, BC: tl.constexpr, CH: tl.constexpr):
    """[BC, CH]: the reconstruction of rows [k*CH, (k+1)*CH) of a segment's columns wc + j."""
    wi = k * (CH // 32) + tl.arange(0, CH // 32)
    packed = tl.load(words + wi[None, :].to(tl.int64) * width + (wc + j)[:, None],
                     mask=jmask[:, None] & (wi < (rows + 31) // 32)[None, :], other=0)
    bits = tl.reshape((packed[:, :, None] >> tl.arange(0, 32)[None, None, :]) & 1, [BC, CH])
    neg = tl.load(recon + wc + j, mask=jmask, other=0.0)
    pos = tl.load(recon + width + wc + j, mask=jmask, other=0.0)
    return tl.where(bits != 0, pos[:, None], neg[:, None])


@triton.jit
def _dequantize(meta, ACCUMULATE: tl.constexpr, BC: tl.constexpr, CH: tl.constexpr):
    """Program (block b, chunk k): write (or add) the block's reconstruction into its rows of out."""
    b = tl.program_id(0)
    k = tl.program_id(1)
    row = meta + b * 11
    rows = tl.load(row + 0)
    if k * CH < rows:
        stride = tl.load(row + 1)
        c0 = tl.load(row + 2)
        ncols = tl.load(row + 3)
        out = tl.load(row + 4).to(tl.pointer_type(tl.float32))
        words = tl.load(row + 7).to(tl.pointer_type(tl.int32))
        width = tl.load(row + 8)
        wc = tl.load(row + 9)
        recon = tl.load(row + 10).to(tl.pointer_type(tl.float32))
        j = tl.arange(0, BC)
        r = k * CH + tl.arange(0, CH)
        jmask = j < ncols
        valid = jmask[:, None] & (r < rows)[None, :]
        offs = r[None, :].to(tl.int64) * stride + (c0 + j)[:, None]
        values = _segment_values(words, recon, width, wc, rows, k, j, jmask, BC, CH)
        if ACCUMULATE:
            values = tl.load(out + offs, mask=valid, other=0.0) + values
        tl.store(out + offs, values, mask=valid)


@triton.jit
def _dequantize_mean(word_table, recon_table, rows, width, out, BC: tl.constexpr, CH: tl.constexpr):
    """Program (column block, chunk k): out = (d_0 + d_1 + ... + d_{n-1}) / n, summed in source order;
    word_table holds n, then the n sources' addresses (recon_table their recon's)."""
    n = tl.load(word_table)
    word_table += 1
    c0 = tl.program_id(0) * BC
    k = tl.program_id(1)
    j = tl.arange(0, BC)
    r = k * CH + tl.arange(0, CH)
    jmask = c0 + j < width
    acc = _segment_values(tl.load(word_table).to(tl.pointer_type(tl.int32)),
                          tl.load(recon_table).to(tl.pointer_type(tl.float32)), width, c0, rows, k, j, jmask, BC, CH)
    s = 1
    while s < n:
        acc = acc + _segment_values(tl.load(word_table + s).to(tl.pointer_type(tl.int32)),
                                    tl.load(recon_table + s).to(tl.pointer_type(tl.float32)),
                                    width, c0, rows, k, j, jmask, BC, CH)
        s += 1
    acc = tl.div_rn(acc, n.to(tl.float32))
    tl.store(out + r[None, :].to(tl.int64) * width + (c0 + j)[:, None], acc,
             mask=jmask[:, None] & (r < rows)[None, :])


def _next_power_of_two(n: int) -> int:
    return 1 << max(0, (n - 1).bit_length())


def _check(t: torch.Tensor, dtype: torch.dtype, numel: int | None, what: str) -> None:
    if t.dtype != dtype or not t.is_contiguous() or (numel is not None and t.numel() != numel):
        size = f"{numel} " if numel is not None else ""
        raise ValueError(f"triton quantizer: {what} must be {size}contiguous {dtype}, got {t.dtype} {tuple(t.shape)}")


def _block_rows(matrix: torch.Tensor, rows: int, stride: int, bounds: Sequence[int], words, recon,
                last: int = 0, means: int = 0) -> list[list[int]]:
    """The table's rows for one matrix: [rows, row stride, first column, columns, matrix address,
    residual values address, residual means address, words address, segment width, first column
    within the segment, recon address], one per block of at most BLOCK_COLUMNS columns of a segment."""
    if len(words) != len(bounds) - 1 or len(recon) != len(bounds) - 1:
        raise ValueError("triton quantizer: one words and one recon buffer per segment")
    table = []
    for s in range(len(bounds) - 1):
        a, b = bounds[s], bounds[s + 1]
        if b <= a:
            raise ValueError("triton quantizer: segment bounds must increase")
        _check(words[s], torch.int32, packed_words(rows) * (b - a), f"segment {s}'s words")
        _check(recon[s], torch.float32, 2 * (b - a), f"segment {s}'s recon")
        for c in range(a, b, BLOCK_COLUMNS):
            table.append([rows, stride, c, min(BLOCK_COLUMNS, b - c), matrix.data_ptr(), last, means,
                          words[s].data_ptr(), b - a, c - a, recon[s].data_ptr()])
    return table


class TritonQuantizer:
    """ReferenceQuantizer's semantics for float32 tensors on a CUDA device (or on the CPU under
    `TRITON_INTERPRET=1`), with bucket entry points: `quantize_bucket` and `dequantize_bucket`
    take many matrices in one launch (two for quantizing)."""

    name = "triton"
    CACHE = 256
    """Launch plans kept (by the addresses and shapes they were built for): a strategy's buffers
    are the same every step, so its plans are built once."""

    def __init__(self):
        self._plans: OrderedDict = OrderedDict()
        self._means: dict = {}
        """reduce_quantize's [rows, width] scratch, one per shape and device (a fixed address keeps its plan)."""

    def _plan(self, key, build):
        plan = self._plans.get(key)
        if plan is None:
            plan = build()
            self._plans[key] = plan
            if len(self._plans) > self.CACHE:
                self._plans.popitem(last=False)
        else:
            self._plans.move_to_end(key)
        return plan

    # -- quantize
    def quantize(self, grad, residual, bounds, words, recon) -> None:
        self.quantize_bucket([(grad, residual, bounds, words, recon)])

    def quantize_bucket(self, items: Sequence[tuple]) -> None:
        """Each item (grad [R, C], residual or None, bounds, words, recon) as `quantize` takes them;
        all with error feedback or all without."""
        if not items:
            return
        ef = items[0][1] is not None
        key = ("q", ef, tuple((g.data_ptr(), tuple(g.shape), None if r is None else (r.last.data_ptr(),
               r.means.data_ptr()), tuple(b), tuple(w.data_ptr() for w in ws), tuple(x.data_ptr() for x in rs))
               for g, r, b, ws, rs in items))
        meta, scratch, counts, maxch = self._plan(key, lambda: self._quantize_plan(items, ef))
        blocks = meta.shape[0] // META
        _quantize_chunks[(blocks, maxch)](meta, scratch, counts, ef, BLOCK_COLUMNS, CHUNK_ROWS,
                                         CHUNK_ROWS.bit_length() - 1, _next_power_of_two(maxch), num_warps=NUM_WARPS)
        _quantize_means[(blocks,)](meta, scratch, counts, ef, BLOCK_COLUMNS, CHUNK_ROWS, _next_power_of_two(maxch),
                                   _next_power_of_two(maxch).bit_length() - 1, num_warps=NUM_WARPS)

    def _quantize_plan(self, items, ef: bool):
        table, maxch, device = [], 1, items[0][0].device
        for grad, residual, bounds, words, recon in items:
            if (residual is not None) != ef:
                raise ValueError("triton quantizer: a bucket's matrices all have a residual or none has")
            if grad.dim() != 2:
                raise ValueError("triton quantizer: grad must be a [rows, columns] matrix")
            _check(grad, torch.float32, None, "grad")
            rows, cols = grad.shape
            if bounds[0] < 0 or bounds[-1] > cols:
                raise ValueError("triton quantizer: segment bounds outside the matrix")
            last = means = 0
            if residual is not None:
                _check(residual.last, torch.float32, rows * cols, "the residual's values")
                _check(residual.means, torch.float32, 2 * cols, "the residual's means")
                last, means = residual.last.data_ptr(), residual.means.data_ptr()
            table += _block_rows(grad, rows, cols, bounds, words, recon, last, means)
            maxch = max(maxch, (rows + CHUNK_ROWS - 1) // CHUNK_ROWS)
        blocks, width = len(table), _next_power_of_two(maxch)
        meta = torch.tensor(table, dtype=torch.int64).reshape(-1).to(device)
        return (meta, torch.empty(blocks * 2 * BLOCK_COLUMNS * width, dtype=torch.float32, device=device),
                torch.empty(blocks * BLOCK_COLUMNS * width, dtype=torch.int32, device=device), maxch)

    # -- dequantize
    def dequantize(self, words, recon, rows, bounds, out, accumulate=False) -> None:
        self.dequantize_bucket([(words, recon, rows, bounds, out)], accumulate)

    def dequantize_bucket(self, items: Sequence[tuple], accumulate: bool = False) -> None:
        """Each item (words, recon, rows, bounds, out) as `dequantize` takes them, in one launch."""
        if not items:
            return
        key = ("d", tuple((tuple(w.data_ptr() for w in ws), tuple(x.data_ptr() for x in rs), rows, tuple(b),
                           out.data_ptr(), tuple(out.stride())) for ws, rs, rows, b, out in items))
        meta, maxch = self._plan(key, lambda: self._dequantize_plan(items))
        _dequantize[(meta.shape[0] // META, maxch)](meta, accumulate, BLOCK_COLUMNS, CHUNK_ROWS, num_warps=NUM_WARPS)

    def _dequantize_plan(self, items):
        table, maxch = [], 1
        for words, recon, rows, bounds, out in items:
            if out.dim() != 2 or out.dtype != torch.float32 or out.stride(1) != 1 or out.shape[0] != rows:
                raise ValueError("triton dequantizer: out must be a float32 [rows, columns] matrix, unit column stride")
            if bounds[0] < 0 or bounds[-1] > out.shape[1]:
                raise ValueError("triton dequantizer: out does not hold the segments")
            table += _block_rows(out, rows, out.stride(0), bounds, words, recon)
            maxch = max(maxch, (rows + CHUNK_ROWS - 1) // CHUNK_ROWS)
        return torch.tensor(table, dtype=torch.int64).reshape(-1).to(items[0][4].device), maxch

    def dequantize_mean(self, words, recon, rows, out) -> None:
        """`out` [rows, w] = the mean of the n segments' reconstructions, summed in source order."""
        width = out.shape[1]
        if out.dtype != torch.float32 or not out.is_contiguous() or out.shape[0] != rows:
            raise ValueError("triton dequantize_mean: out must be a contiguous float32 [rows, w] matrix")
        for s in range(len(words)):
            _check(words[s], torch.int32, packed_words(rows) * width, f"source {s}'s words")
            _check(recon[s], torch.float32, 2 * width, f"source {s}'s recon")
        key = ("m", tuple(w.data_ptr() for w in words), tuple(r.data_ptr() for r in recon))
        tables = self._plan(key, lambda: (
            torch.tensor([len(words), *(w.data_ptr() for w in words)], dtype=torch.int64).to(out.device),
            torch.tensor([r.data_ptr() for r in recon], dtype=torch.int64).to(out.device)))
        grid = (triton.cdiv(width, BLOCK_COLUMNS), triton.cdiv(rows, CHUNK_ROWS))
        _dequantize_mean[grid](*tables, rows, width, out, BLOCK_COLUMNS, CHUNK_ROWS, num_warps=NUM_WARPS)

    def reduce_quantize(self, words, recon, rows, width, residual: Residual | None, out_words, out_recon) -> None:
        """The stripe owner's reduce: `dequantize_mean` then `quantize`, as the reference."""
        key = (rows, width, out_words.device)
        mean = self._means.get(key)
        if mean is None:
            mean = self._means[key] = torch.empty(rows, width, device=out_words.device)
        self.dequantize_mean(words, recon, rows, mean)
        self.quantize(mean, residual, [0, width], [out_words], [out_recon])
