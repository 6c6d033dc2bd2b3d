"""Row-wise float8 quantization against its PyTorch reference, and the FP8 projections built on it."""
import pytest
import torch
from kernel_asserts import assert_kernel_equal, kernel_device

import zerogr_kernels.fp8_rows as fp8_rows
from zerogr_kernels.fp8_rows import FP8_MAX, quantize_rows, quantize_rows_reference, quantize_rows_triton

DEV = kernel_device()


def rows(n, k, dtype, seed=0, spread=3.0):
    g = torch.Generator().manual_seed(seed)
    # rows of very different magnitudes, so every row gets its own scale
    x = torch.randn(n, k, generator=g) * torch.logspace(-spread, spread, max(n, 1))[:n, None]
    return x.to(dtype).to(DEV)


def assert_same_bits(got, want):
    (q, s), (qr, sr) = got, want
    assert q.dtype == torch.float8_e4m3fn and q.shape == qr.shape and q.is_contiguous()
    assert s.dtype == torch.float32 and s.shape == (q.shape[0], 1)
    assert_kernel_equal(s, sr, name="scale", rtol=0.0, atol=0.0)
    assert_kernel_equal(q.view(torch.uint8), qr.view(torch.uint8), name="q bytes")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(7, 40), (3, 2048), (2, 6144), (1, 1), (5, 17)])
def test_kernel_equals_reference(shape, dtype):
    """The scales bit for bit, and every float8 byte (the cast itself is torch's in the interpreter,
    whose own float8 cast truncates; on a GPU it is the kernel's)."""
    x = rows(*shape, dtype)
    assert_same_bits(quantize_rows_triton(x), quantize_rows_reference(x))


def test_rows_past_one_block_take_two_passes(monkeypatch):
    """Rows wider than a program's block: the row's maximum over every block, each block scaled by it."""
    monkeypatch.setattr(fp8_rows, "BLOCK", 16)
    x = rows(4, 70, torch.bfloat16)
    x[2, 65] = 1e3                    # the largest magnitude in the last, partial block
    q, s = quantize_rows_triton(x)
    assert_same_bits((q, s), quantize_rows_reference(x))
    assert q[2, 65].float() == FP8_MAX


def test_zero_rows_and_empty_shapes():
    x = rows(3, 24, torch.bfloat16)
    x[1] = 0
    q, s = quantize_rows(x)
    assert (q[1].float() == 0).all() and s[1] > 0
    for n, k in ((0, 8), (4, 0)):
        assert_same_bits(quantize_rows_triton(rows(n, k, torch.bfloat16)),
                         quantize_rows_reference(rows(n, k, torch.bfloat16)))


def test_strided_rows():
    wide = rows(6, 48, torch.float32)
    view = wide[:, :40]
    assert not view.is_contiguous()
    assert_same_bits(quantize_rows(view), quantize_rows(view.contiguous()))


def test_error_bound():
    """``q · scale`` is within e4m3's rounding of ``x``: half a unit in the last of 3 mantissa bits
    (2^-4 relative) for normal values, half the smallest subnormal step (2^-10 · scale) below them."""
    x = rows(9, 300, torch.float32, spread=6.0)
    q, s = quantize_rows(x)
    back = q.float() * s
    bound = torch.maximum(x.abs() * 2.0 ** -4, 2.0 ** -10 * s) * (1 + 1e-6)
    assert ((back - x).abs() <= bound).all()
    assert (q.float().abs().amax(dim=1) == FP8_MAX).all()


def test_launcher_checks():
    with pytest.raises(TypeError):
        quantize_rows_triton(torch.zeros(2, 3, dtype=torch.int64, device=DEV))
    with pytest.raises(ValueError):
        quantize_rows_triton(torch.zeros(2, 3, 4, device=DEV))
    with pytest.raises(ValueError, match="rows must be contiguous"):
        quantize_rows_triton(torch.zeros(4, 6, device=DEV).t())
