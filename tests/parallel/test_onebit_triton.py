"""The Triton 1-bit kernels (asrdist/parallel/onebit_triton.py) against the pure-torch reference
on the CPU, bit for bit (any NaN as NaN): quantize with error feedback over several steps
(segments, ragged rows, signed zeros, NaN), a bucket of matrices in one launch, dequantize (written and added), the owner's mean and
reduce. On CUDA (`pytest -m cuda`, run by scripts/gpu_check.sh) the compiled kernels; without a GPU
the same kernels under Triton's interpreter (`TRITON_INTERPRET=1`, CPU tensors) where Triton is
installed, in a process of their own because the variable is read when the kernels are defined."""
from __future__ import annotations

import importlib.util
import os
import subprocess
import sys

import pytest
import torch

from asrdist.errors import ConfigError
from asrdist.parallel.onebit_kernel import ReferenceQuantizer, Residual, get_quantizer, packed_words

CASES = [(1, 1, [0, 1]), (33, 5, [0, 2, 5]), (300, 70, [0, 33, 70]), (129, 40, [3, 37]), (64, 1, [0, 1]),
         (2048, 33, [0, 33])]
"""(rows, columns, segment bounds): one element; rows off a word; segments across blocks; columns
not starting at 0; a vector; many chunks of rows."""


def _bits(t: torch.Tensor) -> torch.Tensor:
    return t.view(torch.int32) if t.dtype == torch.float32 else t


def _same(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Bit for bit, a NaN matching any NaN (a GPU's arithmetic gives its own NaN's bits, not the
    operand's as the CPU does)."""
    a, b = a.cpu(), b.cpu()
    if a.dtype == torch.float32:
        both_nan = a.isnan() & b.isnan()
        a, b = torch.where(both_nan, 0.0, a), torch.where(both_nan, 0.0, b)
    return torch.equal(_bits(a), _bits(b))


def _buffers(rows: int, bounds: list[int], device) -> tuple[list, list]:
    spans = list(zip(bounds, bounds[1:]))
    return ([torch.full((packed_words(rows) * (b - a),), 7, dtype=torch.int32, device=device) for a, b in spans],
            [torch.full((2 * (b - a),), 3.0, device=device) for a, b in spans])


def check_against_reference(quantizer, device) -> list[str]:
    """Every way the kernels on `device` differ from the reference computed on the CPU (the
    specification: on CUDA, torch divides by a Python number through its reciprocal, so the
    reference itself is not the specification there); empty when none does."""
    ref, gen, problems = ReferenceQuantizer(), torch.Generator().manual_seed(0), []

    def there(tensors):
        return [t.to(device) for t in tensors]

    for rows, cols, bounds in CASES:
        kept, theirs = Residual(rows, cols), Residual(rows, cols, device)
        for step in range(3):
            grad = torch.randn(rows, cols, generator=gen)
            if step == 1:
                grad[:, 0] = -0.0  # a column of negative zeros: its non-negative mean is -0.0
            if step == 2 and rows > 2:
                grad[1, -1] = float("nan")
            (wr, cr), (wt, ct) = _buffers(rows, bounds, "cpu"), _buffers(rows, bounds, device)
            ref.quantize(grad, kept, bounds, wr, cr)
            quantizer.quantize(grad.to(device), theirs, bounds, wt, ct)
            where = f"{rows}x{cols} segments {bounds} step {step}"
            if not all(_same(a, b) for a, b in zip(wr + cr, wt + ct)):
                problems.append(f"quantize {where}: wire buffers differ")
            if not (_same(kept.last, theirs.last) and _same(kept.means, theirs.means)):
                problems.append(f"quantize {where}: residuals differ")
            for accumulate in (False, True):
                out = torch.randn(rows, cols, generator=gen)
                twin = out.to(device)
                ref.dequantize(wr, cr, rows, bounds, out, accumulate)
                quantizer.dequantize(there(wr), there(cr), rows, bounds, twin, accumulate)
                if not _same(out, twin):
                    problems.append(f"dequantize {where} accumulate={accumulate}: differs")
    rows, width, n = 300, 9, 3
    sources = [_buffers(rows, [0, width], "cpu") for _ in range(n)]
    for words, recon in sources:
        ref.quantize(torch.randn(rows, width, generator=gen), None, [0, width], words, recon)
    words, recon = [w[0] for w, _ in sources], [r[0] for _, r in sources]
    out, twin = torch.empty(rows, width), torch.empty(rows, width, device=device)
    ref.dequantize_mean(words, recon, rows, out)
    quantizer.dequantize_mean(there(words), there(recon), rows, twin)
    if not _same(out, twin):
        problems.append("dequantize_mean differs")
    kept, theirs = Residual(rows, width), Residual(rows, width, device)
    for step in range(2):
        (wr, cr), (wt, ct) = _buffers(rows, [0, width], "cpu"), _buffers(rows, [0, width], device)
        ref.reduce_quantize(words, recon, rows, width, kept, wr[0], cr[0])
        quantizer.reduce_quantize(there(words), there(recon), rows, width, theirs, wt[0], ct[0])
        if not (_same(wr[0], wt[0]) and _same(cr[0], ct[0]) and _same(kept.last, theirs.last)):
            problems.append(f"reduce_quantize step {step} differs")
    mine, theirs = [], []
    for rows, cols, bounds in CASES[:4]:
        grad = torch.randn(rows, cols, generator=gen)
        mine.append((grad, Residual(rows, cols), bounds, *_buffers(rows, bounds, "cpu")))
        theirs.append((grad.to(device), Residual(rows, cols, device), bounds, *_buffers(rows, bounds, device)))
    ref.quantize_bucket(mine)
    quantizer.quantize_bucket(theirs)
    if not all(_same(a, b) for m, t in zip(mine, theirs) for a, b in zip(m[3] + m[4], t[3] + t[4])):
        problems.append("a bucket of matrices in one launch differs from them one by one")
    outs = [torch.zeros(m[0].shape) for m in mine]
    twins = [o.to(device) for o in outs]
    ref.dequantize_bucket([(m[3], m[4], m[0].shape[0], m[2], o) for m, o in zip(mine, outs)], accumulate=True)
    quantizer.dequantize_bucket([(t[3], t[4], t[0].shape[0], t[2], o) for t, o in zip(theirs, twins)],
                                accumulate=True)
    if not all(_same(a, b) for a, b in zip(outs, twins)):
        problems.append("a bucket dequantized in one launch differs")
    return problems


INTERPRETED = """
import sys
from asrdist.parallel.onebit_triton import TritonQuantizer
from tests.parallel.test_onebit_triton import check_against_reference
problems = check_against_reference(TritonQuantizer(), "cpu")
print("\\n".join(problems) or "ok")
sys.exit(1 if problems else 0)
"""


@pytest.mark.skipif(importlib.util.find_spec("triton") is None, reason="Triton is not installed")
def test_the_triton_kernels_interpreted_on_the_cpu_match_the_reference_bit_for_bit():
    env = {**os.environ, "TRITON_INTERPRET": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", INTERPRETED], env=env, capture_output=True, text=True,
                          timeout=600, stdin=subprocess.DEVNULL)
    assert done.returncode == 0, done.stdout + done.stderr[-3000:]


@pytest.mark.cuda
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (scripts/gpu_check.sh runs it)")
def test_the_triton_kernels_on_cuda_match_the_reference_bit_for_bit():
    quantizer = get_quantizer("auto", "cuda")
    assert quantizer.name == "triton"
    assert check_against_reference(quantizer, torch.device("cuda")) == []


def test_the_triton_kernel_is_refused_off_cuda_in_one_line():
    with pytest.raises(ConfigError, match="'triton' runs on CUDA only"):
        get_quantizer("triton", "cpu")
