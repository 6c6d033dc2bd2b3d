"""The T5 step model's kernels (kernels/rms_norm.py, kernels/beam_attention.py, kernels/memory_attention.py)
against their references, and both attentions against ``scaled_dot_product_attention``."""
import pytest
import torch
import torch.nn.functional as F

from kernel_asserts import assert_kernel_equal, kernel_device
from zerogr_kernels import (cached_self_attention_reference, cached_self_attention_triton, request_attention_reference,
                            request_attention_triton, rms_layer_norm_reference, rms_layer_norm_triton)

DEV = kernel_device()
DTYPES = [torch.float32, torch.float16, torch.bfloat16]
# The Triton interpreter truncates float32 to bfloat16 where the GPU rounds to nearest, and
# T5's norm rounds twice (before and after the weight), so bfloat16 may differ by two units
# in the last place: 2^-6 relative.
TOL = {torch.bfloat16: {"rtol": 2 ** -6}}


def _randn(*shape, seed, dtype=torch.float32, scale=1.0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEV)


# (rows, width): a single row, odd widths, a non-power-of-two width, T5 d_model sizes
@pytest.mark.parametrize("n,d", [(1, 1), (5, 7), (33, 100), (17, 128), (3, 1024)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_matches_reference(n, d, dtype):
    x, w = _randn(n, d, seed=n + d, dtype=dtype, scale=3.0), _randn(d, seed=d, dtype=dtype)
    assert_kernel_equal(rms_layer_norm_triton(x, w, 1e-6), rms_layer_norm_reference(x, w, 1e-6), name="rms_norm",
                        **TOL.get(dtype, {}))


@pytest.mark.parametrize("dtype", DTYPES)
def test_rms_norm_with_residual(dtype):
    x, r = _randn(9, 48, seed=1, dtype=dtype), _randn(9, 48, seed=2, dtype=dtype)
    w = _randn(48, seed=3, dtype=dtype)
    got, got_sum = rms_layer_norm_triton(x, w, 1e-6, residual=r)
    want, want_sum = rms_layer_norm_reference(x, w, 1e-6, residual=r)
    exact = {"rtol": 0.0, "atol": 0.0} if dtype != torch.bfloat16 or DEV == "cuda" else TOL[dtype]
    assert_kernel_equal(got_sum, want_sum, name="x + residual", **exact)
    assert_kernel_equal(got, want, name="rms_norm", **TOL.get(dtype, {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_rms_norm_of_many_rows_four_a_program(dtype):
    """From MANY_ROWS rows of 2,048 a program takes four rows (through a last program that holds
    one): the same bits as one row a program, which the same rows get in two shorter calls."""
    from zerogr_kernels.rms_norm import MANY_ROWS
    n = MANY_ROWS + 1
    x, r = _randn(n, 2048, seed=4, dtype=dtype, scale=3.0), _randn(n, 2048, seed=5, dtype=dtype)
    w = _randn(2048, seed=6, dtype=dtype)
    got, got_sum = rms_layer_norm_triton(x, w, 1e-6, residual=r)
    h = n // 2
    parts = [rms_layer_norm_triton(x[s], w, 1e-6, residual=r[s]) for s in (slice(0, h), slice(h, n))]
    assert_kernel_equal(got, torch.cat([p[0] for p in parts]), name="rms_norm, 4 rows against 1", rtol=0, atol=0)
    assert_kernel_equal(got_sum, torch.cat([p[1] for p in parts]), name="x + residual, 4 rows against 1", rtol=0,
                        atol=0)
    if dtype == torch.float32:
        want, want_sum = rms_layer_norm_reference(x, w, 1e-6, residual=r)
        assert_kernel_equal(got_sum, want_sum, name="x + residual", rtol=0, atol=0)
        assert_kernel_equal(got, want, name="rms_norm")


@pytest.mark.parametrize("x_dtype,w_dtype", [(torch.bfloat16, torch.float32), (torch.float32, torch.bfloat16),
                                             (torch.float16, torch.float32)])
def test_rms_norm_mixed_dtypes_follow_hugging_face(x_dtype, w_dtype):
    """The output dtype and rounding of ``T5LayerNorm`` with a weight of another dtype."""
    transformers = pytest.importorskip("transformers")
    from transformers.models.t5.modeling_t5 import T5LayerNorm

    x = _randn(6, 40, seed=4, dtype=x_dtype, scale=5.0)
    norm = T5LayerNorm(40, eps=1e-6).to(DEV)
    with torch.no_grad():
        norm.weight.copy_(_randn(40, seed=5))
    norm = norm.to(w_dtype)
    with torch.no_grad():
        want = norm(x)
    got = rms_layer_norm_triton(x, norm.weight, norm.variance_epsilon)
    assert got.dtype == want.dtype
    half = torch.bfloat16 if torch.bfloat16 in (x_dtype, w_dtype) else torch.float16
    assert_kernel_equal(got, want, name="rms_norm", dtype=half, **TOL.get(half, {}))
    assert_kernel_equal(rms_layer_norm_reference(x, norm.weight, norm.variance_epsilon), want, name="reference",
                        rtol=0.0, atol=0.0)


def test_rms_norm_argument_checks():
    x = torch.zeros(3, 4, device=DEV)
    with pytest.raises(ValueError, match="weight"):
        rms_layer_norm_reference(x, torch.ones(5, device=DEV), 1e-6)
    with pytest.raises(TypeError, match="residual"):
        rms_layer_norm_reference(x, torch.ones(4, device=DEV), 1e-6, residual=x.half())
    with pytest.raises(ValueError, match="contiguous"):
        rms_layer_norm_triton(torch.zeros(4, 3, device=DEV).T, torch.ones(4, device=DEV), 1e-6)


def _lineage_cache(L, rows, beams, batch, heads, d, dtype, seed):
    """A cache of L steps (step 0 one row per request, later steps ``beams`` per request) and the
    parents each step chose, plus the ancestors of the rows of each step (as the step model keeps them)."""
    g = torch.Generator().manual_seed(seed)
    qkv = (torch.randn(L, rows, 3 * heads * d, generator=g) * 2).to(dtype)
    parents, ancestors = [], torch.zeros(L, rows, dtype=torch.int64)
    lineages = [ancestors.clone().to(DEV)]
    prev = 1
    for step in range(1, L):
        par = (torch.arange(batch)[:, None] * prev + torch.randint(0, prev, (batch, beams), generator=g)).reshape(-1)
        n = par.numel()
        ancestors[:step - 1, :n] = ancestors[:step - 1, :batch * prev][:, par]
        ancestors[step - 1, :n] = par
        parents.append(par)
        lineages.append(ancestors.clone().to(DEV))
        prev = beams
    return qkv.to(DEV), lineages, parents


@pytest.mark.parametrize("step", [0, 1, 3])
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("heads,d", [(3, 8), (2, 5)])
def test_cached_attention_matches_reference(step, dtype, heads, d):
    batch, beams, L = 3, 4, 4
    qkv, lineages, _ = _lineage_cache(L, batch * beams + 2, beams, batch, heads, d, dtype, seed=step + d)
    anc = lineages[step]
    bias = _randn(heads, L, seed=9)
    n = batch * (beams if step else 1)
    got = cached_self_attention_triton(qkv, anc, bias, step=step, n=n, heads=heads)
    want = cached_self_attention_reference(qkv, anc, bias, step=step, n=n, heads=heads)
    assert_kernel_equal(got, want, name="attention")
    out = torch.full((n, heads * d), 7.0, dtype=dtype, device=DEV)
    assert cached_self_attention_triton(qkv, anc, bias, step=step, n=n, heads=heads, out=out) is out
    assert_kernel_equal(out, want, name="attention out=")


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_lineage_attention_equals_sdpa_over_a_reordered_cache(dtype, tol):
    """The reference reads each beam's lineage in place; SDPA over keys and values gathered step
    by step by parent (a reordered cache, as Hugging Face keeps it) gives the same output."""
    batch, beams, L, heads, d = 2, 5, 4, 3, 16
    rows = batch * beams
    qkv, lineages, parents = _lineage_cache(L, rows, beams, batch, heads, d, dtype, seed=11)
    bias = _randn(heads, L, seed=12).to(dtype).float()
    hd = heads * d
    k_cache = qkv[:1, :batch, hd:2 * hd].float()                                # (positions, n, heads · d)
    v_cache = qkv[:1, :batch, 2 * hd:].float()
    for step in range(1, L):
        n = parents[step - 1].numel()
        k_cache = torch.cat([k_cache[:, parents[step - 1]], qkv[step:step + 1, :n, hd:2 * hd].float()])
        v_cache = torch.cat([v_cache[:, parents[step - 1]], qkv[step:step + 1, :n, 2 * hd:].float()])
        split = lambda t: t.reshape(step + 1, n, heads, d).permute(1, 2, 0, 3)  # noqa: E731
        q = qkv[step, :n, :hd].float().reshape(n, heads, 1, d)
        want = F.scaled_dot_product_attention(q, split(k_cache), split(v_cache),
                                              attn_mask=bias[None, :, None, :step + 1], scale=1.0)
        got = cached_self_attention_reference(qkv, lineages[step], bias, step=step, n=n, heads=heads)
        torch.testing.assert_close(got.float(), want.reshape(n, hd), rtol=tol, atol=tol)


def test_cached_attention_argument_checks():
    qkv = torch.zeros(4, 6, 3 * 2 * 8, device=DEV)
    anc = torch.zeros(4, 6, dtype=torch.int64, device=DEV)
    bias = torch.zeros(2, 4, device=DEV)
    with pytest.raises(ValueError, match="3 · heads"):
        cached_self_attention_reference(qkv, anc, bias, step=1, n=6, heads=5)
    with pytest.raises(ValueError, match="step 4"):
        cached_self_attention_reference(qkv, anc, bias, step=4, n=6, heads=2)
    with pytest.raises(ValueError, match="n 7"):
        cached_self_attention_reference(qkv, anc, bias, step=1, n=7, heads=2)
    with pytest.raises(TypeError, match="ancestors"):
        cached_self_attention_reference(qkv, anc.int(), bias, step=1, n=6, heads=2)
    with pytest.raises(TypeError, match="out"):
        cached_self_attention_reference(qkv, anc, bias, step=1, n=6, heads=2, out=torch.zeros(6, 16).half())


def _request_inputs(b, m, t, heads, d, dtype, seed):
    g = torch.Generator().manual_seed(seed)
    q, k, v = ((torch.randn(b, n, heads * d, generator=g) * 2).to(dtype).to(DEV) for n in (m, t, t))
    lengths = torch.randint(1, t + 1, (b,), generator=g)
    lengths[0] = t
    pad = torch.arange(t)[None, :] >= lengths[:, None]
    bias = torch.zeros(b, t).masked_fill(pad, torch.finfo(dtype).min).to(dtype).to(DEV)
    return q, k, v, bias[:, None, None, :]


# (batch, beams M, keys T, heads, d): one query and one key, T and M above one block, odd d
@pytest.mark.parametrize("b,m,t,heads,d", [(1, 1, 1, 1, 8), (3, 5, 7, 2, 8), (2, 70, 80, 3, 16), (2, 4, 9, 2, 5)])
@pytest.mark.parametrize("dtype", DTYPES)
def test_request_attention_matches_reference(b, m, t, heads, d, dtype):
    q, k, v, bias = _request_inputs(b, m, t, heads, d, dtype, seed=m + t)
    got = request_attention_triton(q, k, v, bias, heads=heads)
    want = request_attention_reference(q, k, v, bias, heads=heads)
    # the kernel rounds unnormalised probabilities to half precision, the reference normalised ones
    tol = {torch.float16: {"rtol": 2e-3, "atol": 2e-3}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
    assert_kernel_equal(got, want, name="request attention", **tol.get(dtype, {}))
    out = torch.full_like(q, 7.0)
    assert request_attention_triton(q, k, v, bias, heads=heads, out=out) is out
    assert_kernel_equal(out, got, name="request attention out=", rtol=0.0, atol=0.0)


@pytest.mark.parametrize("dtype,tol", [(torch.float32, 1e-5), (torch.float16, 2e-3), (torch.bfloat16, 2e-2)])
def test_request_attention_equals_sdpa_with_beams_as_queries(dtype, tol):
    """Hugging Face's layout: every beam's query against its request's keys and values, masked."""
    b, m, t, heads, d = 3, 6, 11, 4, 8
    q, k, v, bias = _request_inputs(b, m, t, heads, d, dtype, seed=5)
    split = lambda x, n: x.view(b, n, heads, d).transpose(1, 2)              # noqa: E731
    want = F.scaled_dot_product_attention(split(q, m).float(), split(k, t).float(), split(v, t).float(),
                                          attn_mask=bias.float(), scale=1.0)
    got = request_attention_reference(q, k, v, bias, heads=heads)
    torch.testing.assert_close(got.float(), want.transpose(1, 2).reshape(b, m, -1), rtol=tol, atol=tol)


def test_request_attention_argument_checks():
    q, k, v, bias = _request_inputs(2, 3, 4, 2, 8, torch.float32, seed=1)
    with pytest.raises(ValueError, match="heads"):
        request_attention_reference(q, k, v, bias, heads=3)
    with pytest.raises(ValueError, match="v must have shape"):
        request_attention_reference(q, k, v[:, :3].contiguous(), bias, heads=2)
    with pytest.raises(TypeError, match="k must have dtype"):
        request_attention_reference(q, k.half(), v, bias, heads=2)
    with pytest.raises(ValueError, match="does not broadcast"):
        request_attention_reference(q, k, v, bias[..., :3], heads=2)
    with pytest.raises(ValueError, match="larger than"):
        request_attention_reference(q[:, :1], k, v, bias.expand(2, 2, 3, 4), heads=2)
    with pytest.raises(ValueError, match="unit stride"):
        request_attention_reference(q.transpose(1, 2).contiguous().transpose(1, 2), k, v, bias, heads=2)


@pytest.mark.parametrize("dtype", DTYPES)
def test_request_attention_as_t5_encoder_self_attention(dtype):
    """Queries, keys and values as slices of one fused projection, a per-head position bias
    with the padding folded in: the encoder's self-attention, against SDPA."""
    b, t, heads, d = 2, 19, 3, 16
    g = torch.Generator().manual_seed(8)
    qkv = torch.randn(b, t, 3 * heads * d, generator=g).to(dtype).to(DEV)
    q, k, v = qkv.split(heads * d, dim=-1)
    pad = torch.arange(t)[None, :] >= torch.tensor([[t], [5]])
    bias = (torch.randn(1, heads, t, t, generator=g) * 3).masked_fill(pad[:, None, None, :], torch.finfo(dtype).min)
    bias = bias.to(dtype).to(DEV)
    got = request_attention_triton(q, k, v, bias, heads=heads)
    want = request_attention_reference(q, k, v, bias, heads=heads)
    tol = {torch.float16: {"rtol": 2e-3, "atol": 2e-3}, torch.bfloat16: {"rtol": 2e-2, "atol": 2e-2}}
    assert_kernel_equal(got, want, name="encoder attention", **tol.get(dtype, {}))
    split = lambda x: x.float().reshape(b, t, heads, d).transpose(1, 2)      # noqa: E731
    sdpa = F.scaled_dot_product_attention(split(q), split(k), split(v), attn_mask=bias.float(), scale=1.0)
    sdpa_tol = {torch.float32: 1e-5, torch.float16: 2e-3, torch.bfloat16: 2e-2}[dtype]
    torch.testing.assert_close(want.float(), sdpa.transpose(1, 2).reshape(b, t, -1), rtol=sdpa_tol, atol=sdpa_tol)
