"""Full projection (kernels/full_projection.py): float32 logits from any input dtype."""
import pytest
import torch

from kernel_asserts import assert_kernel_equal, kernel_device
from zerogr_kernels import full_proj
from zerogr_kernels.full_projection import _fp32_out_gemm, full_proj_reference

DEV = kernel_device()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]


def _inputs(dtype, n=7, rows=50, H=40, seed=0):
    g = torch.Generator().manual_seed(seed)
    hidden = torch.randn(n, H, generator=g).to(dtype).to(DEV)
    weight = (torch.randn(rows, H, generator=g) / H ** 0.5).to(dtype).to(DEV)
    return hidden, weight


@pytest.mark.gpu
@pytest.mark.parametrize("dtype", DTYPES)
def test_logits_are_float32_accumulated_in_float32(dtype):
    hidden, weight = _inputs(dtype)
    if DEV == "cuda" and dtype != torch.float32:  # the GEMM writes float32 itself, no upcast copy
        assert _fp32_out_gemm(hidden.device, dtype)
    got = full_proj(hidden, weight, 9, 30)
    assert got.dtype == torch.float32 and got.shape == (7, 30)
    # products of two half-precision values are exact in float32: only the sum order differs
    exact = (hidden.double() @ weight[9:39].double().t()).float()
    assert_kernel_equal(got, exact, name="full_proj", atol=1e-5, rtol=1e-5)
    assert_kernel_equal(full_proj_reference(hidden, weight, 9, 30), exact, name="reference", atol=1e-5, rtol=1e-5)
    out = torch.full((7, 30), float("nan"), device=DEV)
    assert full_proj(hidden, weight, 9, 30, out=out) is out
    assert_kernel_equal(out, got, name="out=", atol=1e-6)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_head_dtype_output_is_the_rounded_gemm(dtype):
    hidden, weight = _inputs(dtype)
    low = full_proj(hidden, weight, 0, 50, out_dtype=dtype)
    assert low.dtype == dtype
    assert_kernel_equal(low.float(), full_proj(hidden, weight, 0, 50), name="rounded", dtype=dtype)


def test_argument_checks():
    hidden, weight = _inputs(torch.float16)
    with pytest.raises(TypeError, match="out must have dtype"):
        full_proj(hidden, weight, 0, 5, out=torch.empty(7, 5, dtype=torch.float16, device=DEV))
    with pytest.raises(ValueError, match="out must have shape"):
        full_proj(hidden, weight, 0, 5, out=torch.empty(7, 6, device=DEV))
    with pytest.raises(ValueError, match="outside"):
        full_proj(hidden, weight, 45, 10)
    with pytest.raises(TypeError, match="weight must have dtype"):
        full_proj(hidden, weight.float(), 0, 5)
    with pytest.raises(ValueError, match="out_dtype"):
        full_proj(hidden, weight, 0, 5, out_dtype=torch.bfloat16)
