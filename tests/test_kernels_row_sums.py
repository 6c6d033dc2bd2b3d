"""Row sums of squares in eager PyTorch's order: the kernel against its reference (the same
additions, one tensor op each), and on a GPU against torch's own reduction, bit for bit."""
import pytest
import torch
import triton
import triton.language as tl
from kernel_asserts import assert_kernel_equal, kernel_device

from zerogr_kernels.row_sums import (HALVES, eager_order, halves_sum_squares, order_of, row_sum_squares,
                                     row_sum_squares_reference, row_sum_squares_triton)

DEV = kernel_device()


def rows(n, d, dtype, seed=0, scale=3.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, d, generator=g) * scale).to(dtype).to(DEV)


def test_eager_widths():
    assert [d for d in (1, 32, 64, 96, 100, 128, 256, 384, 2048, 2050, 4096) if eager_order(d)] == [
        128, 256, 384, 2048, 4096]


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("n,d", [(1, 128), (3, 256), (17, 384), (5, 2048), (2, 1024)])
def test_kernel_equals_reference_bitwise(n, d, dtype):
    """Where the order is eager's, the kernel adds exactly what the reference adds: the same bits."""
    x = rows(n, d, dtype)
    got, want = row_sum_squares_triton(x), row_sum_squares_reference(x)
    assert got.dtype == torch.float32 and got.shape == (n,)
    assert_kernel_equal(got, want, name=f"sums {n}x{d}", rtol=0, atol=0)


@pytest.mark.parametrize("n,d", [(1, 1), (4, 7), (3, 100), (2, 2050), (5, 64)])
def test_other_widths_sum_by_tree(n, d):
    """Other widths are plain float32 sums (any order): within float32 rounding of torch's."""
    x = rows(n, d, torch.float32)
    assert not eager_order(d)
    assert_kernel_equal(row_sum_squares_triton(x), x.pow(2).sum(-1), name=f"sums {n}x{d}", rtol=1e-5, atol=1e-5)


@triton.jit
def _halves_kernel(x_ptr, out_ptr, ROWS: tl.constexpr):
    rows = tl.program_id(0) * ROWS + tl.arange(0, ROWS)
    at = rows[:, None] * 128 + tl.arange(0, 64)[None, :]
    lo = tl.load(x_ptr + at).to(tl.float32)
    hi = tl.load(x_ptr + at + 64).to(tl.float32)
    tl.store(out_ptr + rows, halves_sum_squares(lo, hi, ROWS))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("rows_per_program", [1, 4, 16])
def test_halves_sum_as_the_reference_bitwise(dtype, rows_per_program):
    """Rows of 128 held as two halves of 64 (the q/k kernel's heads) add exactly what the reference adds."""
    n = 3 * rows_per_program
    x = rows(n, 128, dtype, seed=11)
    got = torch.empty(n, dtype=torch.float32, device=x.device)
    _halves_kernel[(3,)](x, got, ROWS=rows_per_program, num_warps=4, enable_fp_fusion=False)
    assert_kernel_equal(got, row_sum_squares_reference(x), name=f"halves sums {n}x128", rtol=0, atol=0)


def test_halves_where_offered():
    """Heads of 128 in a launcher that holds their halves sum from them; a probe's override of
    the code leaves the other launchers' layouts alone."""
    import zerogr_kernels.row_sums as row_sums
    assert row_sums.IMPL is None
    assert (order_of(128, 1, halves=True), order_of(128, 2), order_of(256, 1, halves=True),
            order_of(100, 1, halves=True)) == (HALVES, 2, 1, 0)
    try:
        row_sums.IMPL = HALVES
        assert (order_of(128, 2), order_of(256, 1), order_of(128, 1, halves=True)) == (2, 1, HALVES)
        row_sums.IMPL = 1
        assert (order_of(128, 2), order_of(128, 1, halves=True)) == (1, 1)
        row_sums.IMPL = 0
        assert (order_of(128, 2), order_of(128, 1, halves=True)) == (0, 0)
    finally:
        row_sums.IMPL = None


def test_empty_and_dispatch():
    assert row_sum_squares_triton(rows(0, 128, torch.float32)).shape == (0,)
    x = rows(3, 256, torch.float32)
    assert torch.equal(row_sum_squares(x), row_sum_squares_reference(x))


def test_reference_is_a_sum_of_squares():
    """The order changes only the last bits: the reference is the row's sum of squares."""
    x = rows(9, 2048, torch.float32)
    torch.testing.assert_close(row_sum_squares_reference(x), x.double().pow(2).sum(-1).float(), rtol=1e-5, atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n,d", [(16, 128), (4000, 128), (256, 2048), (1000, 2048), (1000, 1024)])
def test_on_a_gpu_sums_as_torch_bit_for_bit(n, d):
    """The order is torch's: ``sum · (1/d)`` is ``x.float().pow(2).mean(-1)`` exactly, at the row
    counts a prefill and a decode step give (16 rows and more share torch's kernel layout)."""
    x = rows(n, d, torch.bfloat16).cuda()
    want = x.float().pow(2).mean(-1)
    assert_kernel_equal(row_sum_squares_triton(x) * (1.0 / d), want, name=f"mean {n}x{d}", rtol=0, atol=0)
    assert_kernel_equal(row_sum_squares_reference(x) * (1.0 / d), want, name=f"reference mean {n}x{d}", rtol=0,
                        atol=0)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("n", [1025, 1000, 256, 8])
def test_on_a_gpu_the_qwen3_kernels_round_as_eager_bit_for_bit(n):
    """At the Qwen3-1.7B shapes in bf16 (hidden 2,048, heads of 128, FFN 6,144) the fused norm, q/k
    norm + rotary and SwiGLU kernels return their eager references' bits: the sums in torch's order,
    libdevice's exp, and no contraction of a rounded product into a fused multiply-add."""
    from zerogr_kernels.head_norm_rope import qk_norm_rope_reference, qk_norm_rope_triton
    from zerogr_kernels.rms_norm import rms_layer_norm_reference, rms_layer_norm_triton
    from zerogr_kernels.swiglu import silu_mul_reference, silu_mul_triton

    def bf(*shape, seed, scale=3.0, shift=0.0):
        return rows(1, int(torch.tensor(shape).prod()), torch.float32, seed=seed, scale=scale).cuda().view(
            *shape).add(shift).to(torch.bfloat16)

    x, r, w = bf(n, 2048, seed=1), bf(n, 2048, seed=2), bf(2048, seed=3, scale=0.1, shift=1.0)
    (out, total), (want, want_total) = rms_layer_norm_triton(x, w, 1e-6, r), rms_layer_norm_reference(x, w, 1e-6, r)
    assert_kernel_equal(out, want, name="rms norm", rtol=0, atol=0)
    assert_kernel_equal(total, want_total, name="residual sum", rtol=0, atol=0)
    q, k = bf(n, 16, 128, seed=4, scale=2.0), bf(n, 8, 128, seed=5, scale=2.0)
    qw, kw = bf(128, seed=6, scale=0.1, shift=1.0), bf(128, seed=7, scale=0.1, shift=1.0)
    angle = torch.arange(n, device="cuda", dtype=torch.float32)[:, None] * torch.logspace(0, -6, 64, device="cuda")
    emb = torch.cat([angle, angle], dim=-1)
    cos, sin = emb.cos().to(torch.bfloat16), emb.sin().to(torch.bfloat16)
    for got, want, name in zip(qk_norm_rope_triton(q, k, qw, kw, 1e-6, cos, sin),
                               qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin), ("q", "k")):
        assert_kernel_equal(got, want, name=f"rotated {name}", rtol=0, atol=0)
    gu = bf(n, 2 * 6144, seed=8, scale=2.0)
    assert_kernel_equal(silu_mul_triton(gu), silu_mul_reference(gu), name="SwiGLU gate", rtol=0, atol=0)
