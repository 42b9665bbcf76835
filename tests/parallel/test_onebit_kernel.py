"""1-bit quantizer: against a straightforward reference, fused kernel == torch reference bit for
bit, the error-feedback invariant, the wire format."""
from __future__ import annotations

import pytest
import torch
from tests.support.native_fixture import run_without_compiler

from asrdist.errors import ConfigError
from asrdist.parallel import onebit_kernel as K
from asrdist.parallel.onebit_kernel import quantize_dequantize


def naive_quantize_dequantize(v: torch.Tensor) -> torch.Tensor:
    """The definition, column by column with plain means."""
    m = v.reshape(-1, 1) if v.dim() == 1 else v
    out = torch.empty_like(m)
    for j in range(m.shape[1]):
        col = m[:, j]
        neg, pos = col[col < 0], col[col >= 0]
        neg_mean = neg.double().mean().float() if len(neg) else torch.tensor(0.0)
        pos_mean = pos.double().mean().float() if len(pos) else torch.tensor(0.0)
        out[:, j] = torch.where(col >= 0, pos_mean, neg_mean)
    return out.reshape(v.shape)


def adversarial_inputs() -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(3)
    mixed = torch.randn(37, 5, generator=gen)
    mixed[:, 0] = torch.rand(37, generator=gen) + 0.1  # all positive column
    mixed[:, 1] = -torch.rand(37, generator=gen) - 0.1  # all negative column
    mixed[:, 2] = 0.0  # all zero column
    mixed[::2, 3] = -0.0  # signed zeros count as non-negative
    return {
        "random": torch.randn(70, 13, generator=gen),
        "all_positive": torch.rand(33, 4, generator=gen) + 1e-3,
        "all_negative": -torch.rand(33, 4, generator=gen) - 1e-3,
        "all_zero": torch.zeros(32, 3),
        "single_element": torch.tensor([[-2.5]]),
        "single_row": torch.randn(1, 9, generator=gen),
        "bias_vector": torch.randn(65, generator=gen),
        "bias_one": torch.tensor([4.0]),
        "mixed_columns": mixed,
        "wide_range": torch.randn(64, 6, generator=gen) * torch.logspace(-20, 20, 6),
    }


@pytest.mark.parametrize("name", list(adversarial_inputs()))
def test_quantize_dequantize_matches_the_definition(name):
    v = adversarial_inputs()[name]
    got = quantize_dequantize(v)
    assert got.shape == v.shape and got.dtype == v.dtype
    torch.testing.assert_close(got, naive_quantize_dequantize(v), rtol=1e-6, atol=0)
    cols = v.reshape(-1, 1) if v.dim() == 1 else v
    for j in range(cols.shape[1]):  # at most two distinct values per column
        assert len(torch.unique(got.reshape(cols.shape)[:, j])) <= 2


def test_quantize_dequantize_exact_cases():
    assert torch.equal(quantize_dequantize(torch.zeros(5, 2)), torch.zeros(5, 2))
    assert torch.equal(quantize_dequantize(torch.full((7,), 3.0)), torch.full((7,), 3.0))
    assert quantize_dequantize(torch.tensor([1.0, -2.0, 3.0])).tolist() == [2.0, -2.0, 2.0]
    with pytest.raises(ValueError):
        quantize_dequantize(torch.zeros(2, 2, 2))


def test_wire_format_bits_and_reconstruction_values():
    g = torch.tensor([[1.0, -1.0], [-2.0, -3.0], [3.0, -5.0]])
    words = [torch.empty(2, dtype=torch.int32)]
    recon = [torch.empty(4)]
    K.ReferenceQuantizer().quantize(g, None, [0, 2], words, recon)
    assert words[0].tolist() == [0b101, 0]  # bit i = row i of the column is >= 0
    assert recon[0].tolist() == [-2.0, -3.0, 2.0, 0.0]  # negative means, then non-negative means


def _quantizers():
    try:
        return K.ReferenceQuantizer(), K.get_quantizer("fused")
    except ConfigError as e:  # no gcc on this machine
        pytest.skip(str(e))


def _run_steps(quantizer, grads, bounds, error_feedback, initial=None):
    rows, cols = grads[0].shape
    residual = K.Residual(rows, cols) if error_feedback else None
    if initial is not None:
        residual.load(initial)
    outputs = []
    for g in grads:
        words = [torch.empty(K.packed_words(rows) * (b - a), dtype=torch.int32) for a, b in zip(bounds, bounds[1:])]
        recon = [torch.empty(2 * (b - a)) for a, b in zip(bounds, bounds[1:])]
        quantizer.quantize(g, residual, bounds, words, recon)
        out = torch.full((rows, cols), 7.0)
        quantizer.dequantize(words, recon, rows, bounds, out, accumulate=False)
        added = torch.ones(rows, cols)
        quantizer.dequantize(words, recon, rows, bounds, added, accumulate=True)
        outputs += [*words, *recon, out, added]
        if residual is not None:
            outputs.append(residual.materialize())
    return outputs


def test_fused_kernel_is_bit_exact_with_the_reference():
    reference, fused = _quantizers()
    gen = torch.Generator().manual_seed(0)
    cases = list(adversarial_inputs().items())
    for trial in range(40):  # random shapes, row counts around multiples of 4 and 32, segments
        rows = int(torch.randint(1, 140, (), generator=gen))
        cols = int(torch.randint(1, 40, (), generator=gen))
        cases.append((f"random{trial}", torch.randn(rows, cols, generator=gen) * 10 ** float(torch.randn((), generator=gen))))
    for name, v in cases:
        m = K.as_columns(v).contiguous()
        rows, cols = m.shape
        steps = [m, m.flip(0).contiguous(), -m]
        cuts = sorted({0, cols, *torch.randint(0, cols + 1, (2,), generator=gen).tolist()})
        c0, c1 = (0, cols) if cols < 3 else (1, cols)
        for bounds in (cuts, [c0, c1]):
            for ef in (True, False):
                initial = torch.randn(rows, cols, generator=gen) if ef else None
                expected = _run_steps(reference, steps, bounds, ef, initial)
                got = _run_steps(fused, steps, bounds, ef, initial)
                for a, b in zip(expected, got):
                    assert torch.equal(a, b), (name, bounds, ef)
                    assert torch.equal(torch.signbit(a.float()), torch.signbit(b.float())), (name, bounds, ef)


def test_owner_mean_fused_matches_reference_and_the_definition():
    reference, fused = _quantizers()
    gen = torch.Generator().manual_seed(4)
    for rows, width, n in ((1, 1, 1), (33, 5, 3), (70, 9, 4), (5, 64, 2)):
        words, recon, dequantized = [], [], []
        for _ in range(n):
            g = torch.randn(rows, width, generator=gen)
            w, r = torch.empty(K.packed_words(rows) * width, dtype=torch.int32), torch.empty(2 * width)
            reference.quantize(g, None, [0, width], [w], [r])
            words.append(w)
            recon.append(r)
            dequantized.append(quantize_dequantize(g))
        expected, got = torch.empty(rows, width), torch.empty(rows, width)
        reference.dequantize_mean(words, recon, rows, expected)
        fused.dequantize_mean(words, recon, rows, got)
        assert torch.equal(expected, got)
        total = dequantized[0].clone()
        for d in dequantized[1:]:
            total += d
        assert torch.equal(expected, total / n)


@pytest.mark.parametrize("kind", ["reference", "fused"])
def test_error_feedback_invariant(kind):
    """What was applied plus what is still carried equals everything that came in."""
    quantizer = _quantizers()[0 if kind == "reference" else 1]
    gen = torch.Generator().manual_seed(5)
    rows, cols = 45, 7
    residual = K.Residual(rows, cols)
    total_in = torch.zeros(rows, cols, dtype=torch.float64)
    total_applied = torch.zeros(rows, cols, dtype=torch.float64)
    for _ in range(6):
        g = torch.randn(rows, cols, generator=gen)
        before = residual.materialize().double()
        words, recon = [torch.empty(2 * cols, dtype=torch.int32)], [torch.empty(2 * cols)]
        quantizer.quantize(g, residual, [0, cols], words, recon)
        out = torch.empty(rows, cols)
        quantizer.dequantize(words, recon, rows, [0, cols], out)
        # one step: dequantized + new residual == g + old residual (elementwise and in sum)
        torch.testing.assert_close(out.double() + residual.materialize().double(), g.double() + before)
        torch.testing.assert_close((out.double() + residual.materialize().double()).sum(), (g.double() + before).sum())
        # column sums: the reconstruction preserves each column's sum, so the residual sums to ~0
        torch.testing.assert_close(residual.materialize().double().sum(0), torch.zeros(cols, dtype=torch.float64),
                                   atol=1e-4, rtol=0)
        total_in += g.double()
        total_applied += out.double()
    torch.testing.assert_close(total_applied + residual.materialize().double(), total_in, atol=1e-5, rtol=1e-5)


def test_pairwise_sum_matches_a_recursive_tree():
    def tree(xs):
        while len(xs) > 1:
            xs = [xs[i] + xs[i + 1] for i in range(0, len(xs) - 1, 2)] + ([xs[-1]] if len(xs) % 2 else [])
        return xs[0]

    for n in (1, 2, 3, 5, 11, 13, 32, 33):
        x = torch.randn(n, 3)
        assert torch.equal(K.pairwise_column_sum(x), tree(list(x)))


def test_measure_quantize_vs_copy_reports_a_ratio():
    result = K.measure_quantize_vs_copy(shapes=[(64, 32), (64,)], repeats=1)
    assert result["quantize_vs_copy"] > 0 and result["elements"] == 64 * 32 + 64
    assert result["threads"] == 1 and result["kernel"] in ("fused", "reference")


def test_unknown_kernel_kind_is_a_config_error():
    with pytest.raises(ConfigError):
        K.get_quantizer("gpu")


def test_without_a_compiler_auto_falls_back_to_torch_with_a_one_line_warning(tmp_path):
    """A machine without a C++ compiler: `auto` warns once, in one line, and uses the reference;
    `fused` is a one-line ConfigError. A fresh extensions directory, so no cached build can hide it."""
    script = (
        "import warnings\n"
        "from asrdist.errors import ConfigError\n"
        "from asrdist.parallel import onebit_kernel as K\n"
        "with warnings.catch_warnings(record=True) as caught:\n"
        "    warnings.simplefilter('always')\n"
        "    q = K.get_quantizer('auto')\n"
        "print(q.name)\n"
        "print(len(caught), str(caught[0].message))\n"
        "try:\n"
        "    K.get_quantizer('fused')\n"
        "except ConfigError as e:\n"
        "    print('ConfigError', e)\n")
    missing, (name, warning, error) = run_without_compiler(tmp_path, script)
    assert name == "reference"
    assert warning.startswith("1 ") and str(missing) in warning and "reference quantizer" in warning
    assert error.startswith("ConfigError onebit.kernel:") and str(missing) in error
