"""Kernels at serving shapes on a CUDA GPU (skipped without one).

Search-like steps at batch 32 x beam 128 (4,096 beams): a sparse step of width 199 over a
4,096-token band of an 18,432-row shared head, a width-24 step, a width-1 step, a dense
step 1 over 8,192 tokens, and a dense 16,384-token step. Also checks that one decoding
step runs without host synchronisation and replays from a CUDA graph.
"""
import numpy as np
import pytest
import torch

from kernel_asserts import (assert_kernel_equal, assert_outputs_equal, assert_selection_equivalent,
                            random_dense_table, random_sparse_mapping, random_states)
from zerogr_kernels import (FilterOut, TopkOut, filter_slots, filter_slots_reference, filter_slots_triton,
                            full_proj, log_softmax_slots_reference, log_softmax_slots_triton,
                            naive_selective_proj, selective_proj_reference, selective_proj_triton,
                            topk_gather, topk_gather_reference, topk_gather_triton, selective_proj)

pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")]

DEV = "cuda"
BATCH, BEAMS = 32, 128
HEAD_ROWS, BAND_START = 18432, 8192


def _sparse_step(seed, n_states, vocab, max_len, n_beams=BATCH * BEAMS):
    rng = np.random.default_rng(seed)
    tokens, offsets, K = random_sparse_mapping(rng, n_states, vocab, max_len, empty_frac=0.05,
                                               device=DEV)
    states = random_states(rng, n_beams, n_states, dead_frac=0.05, device=DEV)
    return states, tokens, offsets, K


def _model(H, dtype, seed, n_beams=BATCH * BEAMS):
    g = torch.Generator(device=DEV).manual_seed(seed)
    head = (torch.randn(HEAD_ROWS, H, generator=g, device=DEV) / H ** 0.5).to(dtype)
    hidden = torch.randn(n_beams, H, generator=g, device=DEV).to(dtype)
    return head, hidden


# (max segment K, codebook of the band)
STEPS = [(199, 4096), (24, 2048), (1, 2048)]


@pytest.mark.parametrize("K,vocab", STEPS)
@pytest.mark.parametrize("dtype,H", [(torch.float16, 1024), (torch.bfloat16, 1024), (torch.float32, 4096)])
def test_sparse_step(K, vocab, dtype, H):
    states, tokens, offsets, K = _sparse_step(K + H, 3000, vocab, K)
    head, hidden = _model(H, dtype, K)
    slots = filter_slots_triton(states, K, tokens=tokens, offsets=offsets)
    assert_outputs_equal(slots, filter_slots_reference(states, K, tokens=tokens, offsets=offsets),
                         names=FilterOut._fields, rtol=0.0, atol=0.0)

    logits = selective_proj_triton(hidden, head, slots.slot_tokens, slots.tasks, slots.slot_logits.clone(),
                                   band_start=BAND_START)
    ref = selective_proj_reference(hidden, head, slots.slot_tokens, slots.tasks, slots.slot_logits.clone(),
                                   band_start=BAND_START)
    assert_kernel_equal(logits, ref, name="selective", atol=1e-4)
    for tuning in ({"tasks_per_program": 4}, {"block_h": 64}):
        again = selective_proj_triton(hidden, head, slots.slot_tokens, slots.tasks,
                                      slots.slot_logits.clone(), band_start=BAND_START, **tuning)
        assert_kernel_equal(again, ref, name=f"selective {tuning}", atol=1e-4)

    naive = naive_selective_proj(hidden, head, slots.slot_tokens, slots.slot_logits.clone(),
                                 band_start=BAND_START)
    assert_kernel_equal(naive, ref, name="naive", dtype=dtype)
    full = full_proj(hidden, head, BAND_START, vocab)
    via_full = filter_slots_triton(states, K, tokens=tokens, offsets=offsets, logits=full).slot_logits
    # one numeric contract: the GEMM accumulates and stores float32 like the selective kernel
    assert full.dtype == torch.float32
    assert_kernel_equal(via_full, ref, name="full+filter", atol=1e-4)

    beam_scores = -torch.rand(states.shape[0], device=DEV) * 5
    beam_scores[states < 0] = float("-inf")
    scores = log_softmax_slots_triton(logits, beam_scores)
    assert_kernel_equal(scores, log_softmax_slots_reference(logits, beam_scores), name="log_softmax")

    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, BATCH, BEAMS)
    for path in ("wide", "small") if K <= 64 else ("wide",):
        got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, BATCH, BEAMS, path=path)
        assert_outputs_equal(got, exp, names=TopkOut._fields, rtol=0.0, atol=0.0)
        fused = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, BATCH, BEAMS,
                                   beam_scores=beam_scores, path=path)
        assert_selection_equivalent(fused, exp, scores, slots.slot_tokens, slots.slot_succ, BATCH)


@pytest.mark.parametrize("vocab,density,n_beams,M", [(8192, 1.0, BATCH, BEAMS), (8192, 0.3, BATCH, BEAMS),
                                                     (16384, 0.5, 2, BEAMS)])
def test_dense_step(vocab, density, n_beams, M):
    rng = np.random.default_rng(vocab)
    table = random_dense_table(rng, 1 if density == 1.0 else 7, vocab, density=density,
                               dtype=torch.int32, device=DEV)
    states = random_states(rng, n_beams, table.shape[0], dead_frac=0.0, device=DEV)
    head, hidden = _model(1024, torch.float16, 1, n_beams)
    full = full_proj(hidden, head, 0, vocab)
    slots = filter_slots_triton(states, vocab, table=table, logits=full)
    assert_outputs_equal(slots, filter_slots_reference(states, vocab, table=table, logits=full),
                         names=FilterOut._fields, rtol=0.0, atol=0.0)
    sel = selective_proj_triton(hidden, head, slots.slot_tokens, slots.tasks,
                                torch.full_like(slots.slot_logits, float("-inf")))
    assert_kernel_equal(sel, slots.slot_logits, name="selective vs full", atol=1e-4)
    scores = log_softmax_slots_triton(slots.slot_logits, torch.zeros(n_beams, device=DEV))
    batch = n_beams
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M)
    for path in ("small", "wide"):
        got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, batch, M, path=path)
        assert_outputs_equal(got, exp, names=TopkOut._fields, rtol=0.0, atol=0.0)


def _decode_step(states, tokens, offsets, K, hidden, head, beam_scores, out_slots, out_top, path):
    slots = filter_slots(states, K, tokens=tokens, offsets=offsets, out=out_slots)
    selective_proj(hidden, head, slots.slot_tokens, slots.tasks, slots.slot_logits, band_start=BAND_START)
    return topk_gather(slots.slot_logits, slots.slot_tokens, slots.slot_succ, BATCH, BEAMS,
                       beam_scores=beam_scores, path=path, out=out_top)


@pytest.mark.parametrize("K,vocab,path", [(199, 4096, "wide"), (24, 2048, "small")])
def test_step_has_no_sync_and_replays_from_a_cuda_graph(K, vocab, path):
    states, tokens, offsets, K = _sparse_step(5, 3000, vocab, K)
    head, hidden = _model(1024, torch.float16, 3)
    beam_scores = -torch.rand(states.shape[0], device=DEV)
    eager_slots = filter_slots_reference(states, K, tokens=tokens, offsets=offsets)
    out_slots = FilterOut(*(torch.empty_like(t) for t in eager_slots))
    out_top = TopkOut(*(torch.empty_like(t) for t in
                        topk_gather_reference(eager_slots.slot_logits, eager_slots.slot_tokens,
                                              eager_slots.slot_succ, BATCH, BEAMS)))
    step = lambda: _decode_step(states, tokens, offsets, K, hidden, head, beam_scores, out_slots, out_top, path)
    step()                                             # compiles every kernel before capture
    torch.cuda.synchronize()
    torch.cuda.set_sync_debug_mode("error")
    try:
        step()
    finally:
        torch.cuda.set_sync_debug_mode("default")
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        step()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        step()
    # new inputs in the same static tensors, then replay
    rng = np.random.default_rng(99)
    states.copy_(random_states(rng, states.shape[0], offsets.shape[0] - 1, dead_frac=0.05, device=DEV))
    hidden.copy_(torch.randn_like(hidden))
    beam_scores.copy_(-torch.rand_like(beam_scores))
    graph.replay()
    torch.cuda.synchronize()
    replayed = TopkOut(*(t.clone() for t in out_top))
    fresh = FilterOut(*(torch.empty_like(t) for t in out_slots))
    fresh_top = TopkOut(*(torch.empty_like(t) for t in out_top))
    expected = _decode_step(states, tokens, offsets, K, hidden, head, beam_scores, fresh, fresh_top, path)
    assert_outputs_equal(replayed, expected, names=TopkOut._fields, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16])
@pytest.mark.parametrize("residual", [False, True])
def test_rms_norm_at_decode_size(dtype, residual):
    """T5's norm over a decode's 4,096 rows of d_model 128 (and 1,024 rows of 1,024)."""
    from zerogr_kernels import rms_layer_norm_reference, rms_layer_norm_triton

    g = torch.Generator(device=DEV).manual_seed(1)
    for n, d in [(BATCH * BEAMS, 128), (1024, 1024)]:
        x = (torch.randn(n, d, generator=g, device=DEV) * 3).to(dtype)
        r = torch.randn(n, d, generator=g, device=DEV).to(dtype) if residual else None
        w = torch.randn(d, generator=g, device=DEV).to(dtype)
        got, want = rms_layer_norm_triton(x, w, 1e-6, r), rms_layer_norm_reference(x, w, 1e-6, r)
        if residual:
            assert_kernel_equal(got[1], want[1], name="x + residual", rtol=0.0, atol=0.0)
            got, want = got[0], want[0]
        # rsqrt may differ in the last float32 bit, which T5's two roundings (before and after
        # the weight) can turn into two units in the last place of a half-precision output
        two_ulps = {torch.float16: {"rtol": 2 ** -9}, torch.bfloat16: {"rtol": 2 ** -6}}
        assert_kernel_equal(got, want, name="rms_norm", **two_ulps.get(dtype, {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cached_attention_at_decode_size(dtype):
    """The lineage self-attention of a TIGER-size decoder (6 heads of 64) at batch 32 x beam 128,
    every step of 4, against the reference."""
    from zerogr_kernels import cached_self_attention_reference, cached_self_attention_triton

    g = torch.Generator(device=DEV).manual_seed(2)
    L, heads, d, n = 4, 6, 64, BATCH * BEAMS
    qkv = torch.randn(L, n, 3 * heads * d, generator=g, device=DEV).to(dtype)
    bias = torch.randn(heads, L, generator=g, device=DEV)
    local = torch.randint(0, BEAMS, (L, n), generator=g, device=DEV)
    ancestors = torch.arange(n, device=DEV)[None] // BEAMS * BEAMS + local
    ancestors[0] = torch.arange(n, device=DEV) // BEAMS                     # step 0: one row per request
    for step in range(L):
        rows = n if step else BATCH
        got = cached_self_attention_triton(qkv, ancestors, bias, step=step, n=rows, heads=heads)
        want = cached_self_attention_reference(qkv, ancestors, bias, step=step, n=rows, heads=heads)
        assert_kernel_equal(got, want, name=f"attention step {step}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_request_attention_at_decode_size(dtype):
    """T5 cross-attention at batch 32 x beam 128 over 32-token padded histories, 6 heads of 64."""
    from zerogr_kernels import request_attention_reference, request_attention_triton

    g = torch.Generator(device=DEV).manual_seed(3)
    heads, d, t = 6, 64, 32
    q = torch.randn(BATCH, BEAMS, heads * d, generator=g, device=DEV).to(dtype)
    k, v = (torch.randn(BATCH, t, heads * d, generator=g, device=DEV).to(dtype) for _ in range(2))
    lengths = torch.randint(1, t + 1, (BATCH, 1), generator=g, device=DEV)
    bias = torch.zeros(BATCH, t, device=DEV).masked_fill(torch.arange(t, device=DEV) >= lengths,
                                                          torch.finfo(dtype).min).to(dtype)[:, None, None, :]
    got = request_attention_triton(q, k, v, bias, heads=heads)
    want = request_attention_reference(q, k, v, bias, heads=heads)
    # bfloat16: the kernel rounds unnormalised probabilities, the reference normalised ones
    assert_kernel_equal(got, want, name="request attention", **({"atol": 3e-2} if dtype == torch.bfloat16 else {}))
