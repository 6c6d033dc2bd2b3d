"""The fused Qwen3 query/key norm + rotary kernel against its PyTorch reference and Hugging Face."""
import pytest
import torch
from kernel_asserts import kernel_device

from zerogr_kernels.head_norm_rope import qk_norm_rope_reference, qk_norm_rope_triton

DEV = kernel_device()


def make(n, hq, hk, d, dtype, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(n, hq, d, generator=g).to(dtype)
    k = torch.randn(n, hk, d, generator=g).to(dtype) * 3
    qw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    kw = (1 + 0.1 * torch.randn(d, generator=g)).to(dtype)
    angle = torch.rand(n, d // 2, generator=g) * 40
    emb = torch.cat([angle, angle], dim=-1)
    return q, k, qw, kw, emb.cos().to(dtype), emb.sin().to(dtype)


# The Triton interpreter truncates float32 to bfloat16 where the GPU rounds to nearest; the
# kernel rounds five times (normed row, weight product, two rotary products, their sum).
BF16_ULPS = 2 if torch.cuda.is_available() else 6


@pytest.mark.parametrize("dtype,ulps", [(torch.float32, 0), (torch.bfloat16, BF16_ULPS)])
@pytest.mark.parametrize("shape", [(5, 4, 2, 16), (3, 3, 1, 6), (1, 16, 8, 128)])
def test_kernel_equals_reference(shape, dtype, ulps):
    """float32 within 1e-5; bfloat16 within a few units in the last place of the largest output."""
    # compiled on a GPU, interpreted on the CPU: a compiled kernel cannot read host tensors
    args = tuple(a.to(DEV) for a in make(*shape, dtype))
    for got, want in zip(qk_norm_rope_triton(*args[:4], 1e-6, *args[4:]), qk_norm_rope_reference(*args[:4], 1e-6,
                                                                                                 *args[4:])):
        assert got.dtype == dtype and got.shape == want.shape
        tol = 1e-5 if not ulps else ulps * 2.0 ** -8 * float(want.float().abs().max())
        torch.testing.assert_close(got.float(), want.float(), rtol=0, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_strided_rows_of_a_fused_qkv(dtype):
    """q and k as views into one (n, (heads + 2 kv_heads) D) projection equal the contiguous call."""
    q, k, qw, kw, cos, sin = (a.to(DEV) for a in make(7, 4, 2, 16, dtype, seed=5))
    fused = torch.cat([q.reshape(7, -1), k.reshape(7, -1), torch.zeros_like(k).reshape(7, -1)], dim=1)
    qv, kv = fused[:, :64].view(7, 4, 16), fused[:, 64:96].view(7, 2, 16)
    assert not qv.is_contiguous()
    want = qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin)
    for fn in (qk_norm_rope_triton, qk_norm_rope_reference):
        for got, w in zip(fn(qv, kv, qw, kw, 1e-6, cos, sin), want):
            assert got.is_contiguous()
            torch.testing.assert_close(got, w, rtol=0, atol=0 if fn is qk_norm_rope_reference else 1e-5 if
                                       dtype == torch.float32 else BF16_ULPS * 2.0 ** -8 * float(w.float().abs().max()))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("blocks,rows,stride_rows", [(3, 5, 1), (2, 4, 3), (1, 7, 1)])
def test_keys_and_values_straight_into_a_cache(dtype, blocks, rows, stride_rows):
    """k_out/v_out as views of a (blocks, slots, kv_heads, D) cache: row i lands at block i // R,
    row i % R (rows every ``stride_rows`` slots, as a beam's lineage slot), the keys equal the
    call without a cache, the values are copied, and every other slot is left as it was."""
    n, hq, hk, d = blocks * rows, 4, 2, 16
    q, k, qw, kw, cos, sin = (a.to(DEV) for a in make(n, hq, hk, d, dtype, seed=9))
    v = torch.randn(n, hk, d, generator=torch.Generator().manual_seed(1)).to(dtype).to(DEV)
    fused = torch.cat([q.reshape(n, -1), k.reshape(n, -1), v.reshape(n, -1)], dim=1)
    qv, kv_, vv = fused[:, :hq * d].view(n, hq, d), fused[:, hq * d:(hq + hk) * d].view(n, hk, d), \
        fused[:, (hq + hk) * d:].view(n, hk, d)
    slots = 3 + rows * stride_rows + 2
    want_q, want_k = qk_norm_rope_reference(qv, kv_, qw, kw, 1e-6, cos, sin)
    for fn in (qk_norm_rope_triton, qk_norm_rope_reference):
        cache = torch.full((2, blocks, slots, hk, d), -7.0, dtype=dtype, device=DEV)
        dst_k = cache[0, :, 3:3 + rows * stride_rows:stride_rows]
        dst_v = cache[1, :, 3:3 + rows * stride_rows:stride_rows]
        got_q, got_k = fn(qv, kv_, qw, kw, 1e-6, cos, sin, k_out=dst_k, v=vv, v_out=dst_v)
        assert got_k.data_ptr() == dst_k.data_ptr()
        tol = 0 if fn is qk_norm_rope_reference else 1e-5 if dtype == torch.float32 else \
            BF16_ULPS * 2.0 ** -8 * float(want_k.float().abs().max())
        torch.testing.assert_close(got_q, want_q, rtol=0, atol=tol)
        torch.testing.assert_close(dst_k.reshape(n, hk, d), want_k, rtol=0, atol=tol)
        assert torch.equal(dst_v.reshape(n, hk, d), v)
        untouched = torch.ones(slots, dtype=torch.bool)
        untouched[3:3 + rows * stride_rows:stride_rows] = False
        assert (cache[:, :, untouched.to(DEV)] == -7.0).all()


def test_rejects_a_cache_that_does_not_hold_the_rows():
    q, k, qw, kw, cos, sin = make(6, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="k_out: shape"):
        qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin, k_out=torch.empty(4, 2, 2, 16))
    with pytest.raises(ValueError, match="v and v_out go together"):
        qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin, v=k)


def test_rejects_interleaved_heads():
    q, k, qw, kw, cos, sin = make(3, 4, 2, 16, torch.float32)
    with pytest.raises(ValueError, match="q: each row's"):
        qk_norm_rope_reference(q.transpose(1, 2).contiguous().transpose(1, 2), k, qw, kw, 1e-6, cos, sin)


def test_reference_equals_hf_qwen3():
    transformers = pytest.importorskip("transformers")
    from transformers.models.qwen3.modeling_qwen3 import Qwen3RMSNorm, apply_rotary_pos_emb

    q, k, qw, kw, cos, sin = make(4, 4, 2, 16, torch.float32)
    qn, kn = Qwen3RMSNorm(16, eps=1e-6), Qwen3RMSNorm(16, eps=1e-6)
    with torch.no_grad():
        qn.weight.copy_(qw)
        kn.weight.copy_(kw)
        # HF's layout: (batch, heads, seq, D) with cos/sin (batch, seq, D)
        want = apply_rotary_pos_emb(qn(q).transpose(0, 1)[None], kn(k).transpose(0, 1)[None], cos[None], sin[None])
    got = qk_norm_rope_reference(q, k, qw, kw, 1e-6, cos, sin)
    for g, w in zip(got, want):
        torch.testing.assert_close(g, w[0].transpose(0, 1), rtol=1e-6, atol=1e-6)


def test_rejects_odd_head_dim():
    q, k, qw, kw, cos, sin = make(2, 2, 1, 8, torch.float32)
    with pytest.raises(ValueError, match="head_dim must be even"):
        qk_norm_rope_reference(q[..., :7].contiguous(), k[..., :7].contiguous(), qw[:7], kw[:7], 1e-6,
                               cos[:, :7].contiguous(), sin[:, :7].contiguous())


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_heads_summed_from_their_halves_give_the_same_bits(dtype):
    """Heads of 128 summed from the two halves the kernel holds (``row_sums.HALVES``, the
    launcher's choice) add what the lanes layout (``EAGER`` 1, which reloads the elements) adds,
    in the same order: the same outputs, bit for bit."""
    import zerogr_kernels.row_sums as row_sums
    from zerogr_kernels.row_sums import order_of
    assert order_of(128, 1, halves=True) == row_sums.HALVES
    args = tuple(a.to(DEV) for a in make(9, 16, 8, 128, dtype, seed=3))
    got = qk_norm_rope_triton(*args[:4], 1e-6, *args[4:])
    try:
        row_sums.IMPL = 1
        want = qk_norm_rope_triton(*args[:4], 1e-6, *args[4:])
    finally:
        row_sums.IMPL = None
    for g, w in zip(got, want):
        assert torch.equal(g, w)
