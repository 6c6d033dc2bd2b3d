"""The fused SwiGLU gate kernel against its PyTorch reference and Hugging Face's Qwen3 MLP."""
import pytest
import torch
from kernel_asserts import kernel_device

from zerogr_kernels.swiglu import silu_mul, silu_mul_reference, silu_mul_triton

DEV = kernel_device()
# On a GPU the kernel rounds as torch does, bit for bit (libdevice's exp, a rounded division). The
# Triton interpreter truncates float32 to half precision where the GPU rounds to nearest, and the
# kernel rounds twice (SiLU, product): a few units in the last place there.
EXACT = torch.cuda.is_available()
HALF_ULPS = 4


def gate_up(n, f, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(n, 2 * f, generator=g) * 4).to(dtype).to(DEV)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("shape", [(5, 24), (3, 1500), (1, 1)])
def test_kernel_equals_reference(shape, dtype):
    """Bit for bit on a GPU; in the interpreter float32 within 2e-6 relative and half precision
    within a few units in the last place."""
    x = gate_up(*shape, dtype)
    got, want = silu_mul_triton(x), silu_mul_reference(x)
    assert got.dtype == dtype and got.shape == (shape[0], shape[1]) and got.is_contiguous()
    rtol = 2e-6 if dtype == torch.float32 else HALF_ULPS * 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
    if EXACT:
        rtol = 0.0
    torch.testing.assert_close(got.float(), want.float(), rtol=rtol, atol=0.0 if EXACT else 1e-6)


def test_strided_rows():
    """Rows of a wider buffer (a view) give what the contiguous copy gives."""
    wide = gate_up(6, 40, torch.float32)
    view = wide[:, :48]
    assert not view.is_contiguous()
    torch.testing.assert_close(silu_mul(view), silu_mul(view.contiguous()), rtol=0, atol=0)


def test_reference_equals_hf_qwen3_mlp():
    pytest.importorskip("transformers")
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3MLP

    torch.manual_seed(0)
    mlp = Qwen3MLP(Qwen3Config(hidden_size=16, intermediate_size=24)).eval()
    x = torch.randn(5, 16)
    with torch.no_grad():
        gu = torch.cat([mlp.gate_proj(x), mlp.up_proj(x)], dim=1)
        torch.testing.assert_close(mlp.down_proj(silu_mul_reference(gu)), mlp(x), rtol=1e-6, atol=1e-6)


def test_rejects_odd_width():
    with pytest.raises(ValueError, match="gate_up: expected an even"):
        silu_mul_reference(torch.zeros(2, 5))
