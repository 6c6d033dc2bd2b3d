"""The shared-context beam attention kernel (Qwen3's decode step) against its PyTorch reference.

The reference is the computation the Qwen3 step model made before the kernel: SDPA over the
(M · g, D) query matrix of each (request, KV head) with one additive bias; the last tests
pin that contract. On a CPU the kernel runs in the Triton interpreter.
"""
import pytest
import torch
from kernel_asserts import assert_kernel_equal, kernel_device

from zerogr_kernels import (beam_context_attention, beam_context_attention_reference,
                            beam_context_attention_triton)
from zerogr_kernels.context_attention import beam_context_bias, pipeline_stages, split_count

DEV = kernel_device()

# Kernel and reference round at different places (the probabilities to the input dtype before
# they weight the values, the output once): a couple of units in the last place of the output.
TOL = {torch.float32: (1e-5, 1e-5), torch.float16: (2e-3, 2e-3), torch.bfloat16: (1.6e-2, 1.6e-2)}


def make(batch, beams, heads, kv_heads, d, context, p, lengths, dtype, seed=0):
    """q (B, M, heads, D) and k, v (B, S, kv_heads, D) with S = context + beams · p padded to 16."""
    g = torch.Generator().manual_seed(seed)
    slots = context + -(-beams * p // 16) * 16
    q = torch.randn(batch, beams, heads, d, generator=g).to(dtype).to(DEV)
    k = (torch.randn(batch, slots, kv_heads, d, generator=g) * 1.5).to(dtype).to(DEV)
    v = torch.randn(batch, slots, kv_heads, d, generator=g).to(dtype).to(DEV)
    return q, k, v, torch.tensor(lengths, dtype=torch.int64, device=DEV)


def check(got, want, dtype, name="out"):
    rtol, atol = TOL[dtype]
    assert_kernel_equal(got, want, name=name, rtol=rtol, atol=atol)


# (batch, beams, heads, kv_heads, D, context, P, lengths)
CASES = {
    "context-1": (1, 3, 2, 1, 16, 1, 2, [1]),
    "varied-lengths": (3, 5, 4, 2, 16, 40, 2, [37, 5, 40]),
    "g1-p1": (2, 4, 2, 2, 32, 24, 1, [24, 9]),
    "rows-over-a-block": (2, 9, 4, 2, 16, 33, 2, [33, 2]),
    "odd-head-dim": (1, 6, 3, 1, 24, 20, 2, [17]),
    # lengths on block boundaries: whole blocks only, no partial last block
    "whole-blocks": (2, 4, 2, 1, 16, 64, 2, [64, 32]),
}


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("case", list(CASES))
@pytest.mark.parametrize("splits", [1, 3])
def test_kernel_equals_reference(case, splits, dtype):
    """Every visible step, one split or several (some empty for a short request)."""
    batch, beams, heads, kvh, d, context, p, lengths = CASES[case]
    q, k, v, lens = make(batch, beams, heads, kvh, d, context, p, lengths, dtype)
    for step in range(p + 1):
        kw = dict(context_len=context, lineage_len=p, step=step)
        got = beam_context_attention_triton(q, k, v, lens, splits=splits, **kw)
        assert got.shape == q.shape and got.dtype == dtype and got.is_contiguous()
        check(got, beam_context_attention_reference(q, k, v, lens, **kw), dtype, f"{case}, step {step}")


def test_many_splits_and_small_blocks():
    """More splits than key blocks of the shortest request, several blocks per split."""
    q, k, v, lens = make(2, 4, 4, 2, 16, 96, 2, [96, 20], torch.float32, seed=3)
    want = beam_context_attention_reference(q, k, v, lens, context_len=96, lineage_len=2, step=2)
    for splits in (2, 4, 6):
        got = beam_context_attention_triton(q, k, v, lens, context_len=96, lineage_len=2, step=2, splits=splits,
                                            block_n=16)
        check(got, want, torch.float32, f"{splits} splits")


def test_strided_cache_views_and_scale():
    """k and v as one layer of a (2, layers, B, S, kv_heads, D) cache; q a view of (n, heads, D) rows."""
    beams, heads, kvh, d, context, p = 4, 4, 2, 16, 24, 2
    q, k, v, lens = make(2, beams, heads, kvh, d, context, p, [20, 11], torch.float32, seed=1)
    cache = torch.zeros(2, 3, *k.shape, dtype=k.dtype, device=DEV)
    cache[0, 1], cache[1, 1] = k, v
    rows = q.reshape(-1, heads, d)
    kw = dict(context_len=context, lineage_len=p, step=1, scale=0.3)
    want = beam_context_attention_reference(q, k, v, lens, **kw)
    got = beam_context_attention_triton(rows.view(2, beams, heads, d), cache[0, 1], cache[1, 1], lens, splits=2,
                                        **kw)
    check(got, want, torch.float32)


def test_masked_slots_are_never_read():
    """NaN in the padding past each length, in lineage positions not yet visible and in the
    slots past the beams' lineage changes nothing."""
    beams, p, context = 3, 2, 40
    q, k, v, lens = make(2, beams, 4, 2, 16, context, p, [33, 7], torch.float32, seed=2)
    want = beam_context_attention_triton(q, k, v, lens, context_len=context, lineage_len=p, step=1, splits=3)
    k2, v2 = k.clone(), v.clone()
    for b, n in enumerate([33, 7]):
        for x in (k2, v2):
            x[b, n:context] = float("nan")
            x[b, context + 1:context + beams * p:p] = float("nan")        # position t = 1 of every beam
            x[b, context + beams * p:] = float("nan")
    got = beam_context_attention_triton(q, k2, v2, lens, context_len=context, lineage_len=p, step=1, splits=3)
    assert_kernel_equal(got, want, name="out", rtol=0, atol=0)


def test_dispatch_and_checks():
    q, k, v, lens = make(1, 2, 2, 1, 16, 8, 2, [5], torch.float32)
    kw = dict(context_len=8, lineage_len=2, step=1)
    check(beam_context_attention(q, k, v, lens, **kw), beam_context_attention_reference(q, k, v, lens, **kw),
          torch.float32)
    with pytest.raises(TypeError, match="k must have dtype"):
        beam_context_attention_triton(q, k.half(), v, lens, **kw)
    with pytest.raises(ValueError, match="query heads are not a multiple"):
        beam_context_attention_triton(q[:, :, :1], k[:, :, :1].expand(-1, -1, 2, -1), v[:, :, :1].expand(-1, -1, 2, -1),
                                      lens, **kw)
    with pytest.raises(ValueError, match="step must be"):
        beam_context_attention_triton(q, k, v, lens, context_len=8, lineage_len=2, step=3)
    with pytest.raises(ValueError, match="slots hold no context"):
        beam_context_attention_reference(q, k, v, lens, context_len=24, lineage_len=2, step=1)
    with pytest.raises(ValueError, match="lengths must have shape"):
        beam_context_attention_triton(q, k, v, lens.repeat(2), **kw)
    with pytest.raises(ValueError, match="unit stride"):
        beam_context_attention_triton(q, torch.cat([k, k], -1)[..., ::2], v, lens, **kw)


def _ancestors(batch, beams, p, seed):
    """A random ancestor table (B, M, P) int32 and the cache it stands for: each beam's lineage
    slot of position t copied from its ancestor's slot (what a reordering step would write)."""
    g = torch.Generator().manual_seed(seed)
    return torch.randint(0, beams, (batch, beams, p), generator=g, dtype=torch.int32).to(DEV)


def _copied_lineage(x, anc, context, p):
    """x (B, S, kvh, D) with every beam's lineage slot (m, t) replaced by slot (anc[b, m, t], t)."""
    y = x.clone()
    b, m, _ = anc.shape
    own = y[:, context:context + m * p].unflatten(1, (m, p))                       # (B, M, P, kvh, D)
    src = x[:, context:context + m * p].unflatten(1, (m, p))
    for t in range(p):
        own[:, :, t] = src[torch.arange(b, device=DEV)[:, None], anc[:, :, t].long(), t]
    return y


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_ancestor_table_equals_a_copied_lineage(splits, dtype):
    """Keys read through the ancestor table equal the beams' own slots after a physical reorder,
    in the kernel and in the reference, at every visible step."""
    batch, beams, heads, kvh, d, context, p, lengths = CASES["varied-lengths"]
    p = 3
    q, k, v, lens = make(batch, beams, heads, kvh, d, context, p, lengths, dtype, seed=6)
    anc = _ancestors(batch, beams, p, seed=7)
    k2, v2 = _copied_lineage(k, anc, context, p), _copied_lineage(v, anc, context, p)
    for step in range(p + 1):
        kw = dict(context_len=context, lineage_len=p, step=step)
        want = beam_context_attention_reference(q, k2, v2, lens, **kw)
        ref = beam_context_attention_reference(q, k, v, lens, lineage=anc, **kw)
        check(ref, want, dtype, f"reference, step {step}")
        got = beam_context_attention_triton(q, k, v, lens, lineage=anc, splits=splits, **kw)
        check(got, want, dtype, f"kernel, step {step}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("splits", [1, 3])
def test_some_beams_read_the_lineage_of_all(splits, dtype):
    """A call over the first m' of M beams (the cache sized for M) whose ancestors are any of the M
    beams (a partial last step): the kernel and the reference equal the beams of the full call
    with the same ancestors, whose queries they share."""
    batch, beams, heads, kvh, d, context, p, lengths = CASES["varied-lengths"]
    p = 3
    q, k, v, lens = make(batch, beams, heads, kvh, d, context, p, lengths, dtype, seed=8)
    anc = _ancestors(batch, beams, p, seed=9)
    few = 2
    part = anc[:, :few].contiguous()
    assert (part >= few).any()                                  # some ancestors lie past the m' beams
    for step in range(1, p + 1):
        kw = dict(context_len=context, lineage_len=p, step=step)
        want = beam_context_attention_reference(q, k, v, lens, lineage=anc, **kw)[:, :few]
        ref = beam_context_attention_reference(q[:, :few].contiguous(), k, v, lens, lineage=part, **kw)
        check(ref, want, dtype, f"reference, step {step}")
        got = beam_context_attention_triton(q[:, :few].contiguous(), k, v, lens, lineage=part, splits=splits, **kw)
        check(got, want, dtype, f"kernel, step {step}")


def test_lineage_checks():
    q, k, v, lens = make(1, 2, 2, 1, 16, 8, 2, [5], torch.float32)
    kw = dict(context_len=8, lineage_len=2, step=1)
    with pytest.raises(ValueError, match="lineage must have shape"):
        beam_context_attention_triton(q, k, v, lens, lineage=torch.zeros(1, 2, 3, dtype=torch.int32, device=DEV),
                                      **kw)
    with pytest.raises(TypeError, match="lineage must have dtype"):
        beam_context_attention_reference(q, k, v, lens, lineage=torch.zeros(1, 2, 2, device=DEV), **kw)


def test_split_count():
    """About two programs per SM, never under MIN_SPLIT_KEYS keys a split."""
    assert split_count(1024, 32, 132) == 4           # batch 1: 4 row blocks x 8 KV heads
    assert split_count(5056, 32, 132) == 8
    assert split_count(5056, 256, 132) == 1          # batch 8 fills the GPU alone
    assert split_count(100, 4, 132) == 1             # too short to split
    assert split_count(1 << 20, 1, 132) == 32        # capped


def test_pipeline_stages():
    """Three stages for a split of 8 or more key blocks (the Qwen3 decode at batch 8, or 5,056 keys
    at batch 1), two for the 4 blocks a split of 1,024 keys at batch 1 streams."""
    assert pipeline_stages(4) == 2
    assert pipeline_stages(7) == 2
    assert pipeline_stages(8) == 3
    assert pipeline_stages(16) == 3                  # batch 8, 1,024 keys, one split
    assert pipeline_stages(79) == 3                  # batch 8, 5,056 keys, one split


def _qwen3_sdpa(q, k, v, lengths, context, p, step):
    """The Qwen3 step model's attention before the kernel, as it was written (bias built per step)."""
    b, m, heads, d = q.shape
    kvh = k.shape[2]
    g = heads // kvh
    bias = torch.zeros(b, 1, m * g, k.shape[1], dtype=q.dtype, device=q.device)
    pos = torch.arange(context, device=q.device)
    ctx = torch.where(pos[None, :] < lengths[:, None], 0.0, float("-inf"))[:, None, None]
    bias[..., :context].copy_(ctx.expand(-1, -1, m * g, -1))
    slots = torch.arange(k.shape[1] - context, device=q.device)
    rows = torch.arange(m * g, device=q.device) // g
    allowed = ((slots // p)[None, :] == rows[:, None]) & ((slots % p) < step)[None, :] & (slots < m * p)[None, :]
    bias[..., context:].copy_(torch.where(allowed, 0.0, float("-inf")).expand_as(bias[..., context:]))
    qg = q.view(b, m, kvh, g, d).permute(0, 2, 1, 3, 4).reshape(b, kvh, m * g, d)
    o = torch.nn.functional.scaled_dot_product_attention(qg, k.transpose(1, 2), v.transpose(1, 2), attn_mask=bias)
    return o.view(b, kvh, m, g, d).permute(0, 2, 1, 3, 4).reshape(b, m, heads, d)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_reference_is_the_qwen3_sdpa_contract(dtype):
    """Bit for bit the SDPA-with-bias attention the Qwen3 step model ran before the kernel."""
    q, k, v, lens = make(3, 5, 4, 2, 16, 40, 2, [37, 5, 40], dtype, seed=4)
    for step in (1, 2):
        want = _qwen3_sdpa(q, k, v, lens, 40, 2, step)
        got = beam_context_attention_reference(q, k, v, lens, context_len=40, lineage_len=2, step=step)
        assert torch.equal(got, want)


def test_bias_marks_own_lineage():
    bias = beam_context_bias(torch.tensor([2]), beams=2, group=2, slots=9, context_len=3, lineage_len=2, step=1,
                             dtype=torch.float32)
    allowed = (bias[0, 0] == 0).int().tolist()
    assert allowed == [[1, 1, 0, 1, 0, 0, 0, 0, 0]] * 2 + [[1, 1, 0, 0, 0, 1, 0, 0, 0]] * 2
    # beam 0 descends from beam 1 at position 0 and chose its own token at position 1
    anc = torch.tensor([[[1, 0], [1, 1]]])
    bias = beam_context_bias(torch.tensor([2]), beams=2, group=1, slots=9, context_len=3, lineage_len=2, step=2,
                             dtype=torch.float32, lineage=anc)
    allowed = (bias[0, 0] == 0).int().tolist()
    assert allowed == [[1, 1, 0, 0, 1, 1, 0, 0, 0], [1, 1, 0, 0, 0, 1, 1, 0, 0]]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch,context,lengths", [(1, 1024, [1000]), (2, 5056, [5000, 731]), (8, 1024, None)])
def test_cuda_qwen3_shape_and_graph(batch, context, lengths):
    """Qwen3-1.7B's decode shape (16 / 8 heads of 128, beam 256, P 2) in bfloat16, automatic
    splits, an ancestor table, then replayed from a CUDA graph with new lengths and ancestors."""
    lengths = lengths or [1024 - 7 * i for i in range(batch)]
    q, k, v, lens = make(batch, 256, 16, 8, 128, context, 2, lengths, torch.bfloat16, seed=5)
    anc = _ancestors(batch, 256, 2, seed=9)
    kw = dict(context_len=context, lineage_len=2, step=2, lineage=anc)

    def run():
        return beam_context_attention(q, k, v, lens, **kw)

    check(run(), beam_context_attention_reference(q, k, v, lens, **kw), torch.bfloat16)
    graph = torch.cuda.CUDAGraph()
    stream = torch.cuda.Stream()
    with torch.cuda.stream(stream):
        run()                                                          # compiled before capture
        with torch.cuda.graph(graph, stream=stream):
            out = run()
    lens.copy_(torch.tensor([max(1, n // 3) for n in lengths], device=DEV))
    anc.copy_(_ancestors(batch, 256, 2, seed=10))
    for _ in range(3):
        graph.replay()
    torch.cuda.synchronize()
    check(out, beam_context_attention_reference(q, k, v, lens, **kw), torch.bfloat16)
