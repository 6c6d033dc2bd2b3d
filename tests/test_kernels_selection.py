"""Top-k selection and gather (kernels/selection.py): every path against the reference."""
import numpy as np
import pytest
import torch

from kernel_asserts import (assert_outputs_equal, assert_selection_equivalent, kernel_device,
                            random_sparse_mapping, random_states)
import zerogr_kernels.selection as selection
from zerogr_kernels import (SMALL_MAX, TopkOut, extend_prefixes, filter_slots_reference, log_softmax_slots_reference,
                            small_tile, split_first_stage, split_plan, topk_gather_reference, topk_gather_triton)

DEV = kernel_device()
NAMES = TopkOut._fields


def _candidates(seed, batch, mb, vocab, max_len, dead_frac=0.2):
    """Slot rows of batch * mb beams, raw logits on their valid slots, beam scores."""
    rng = np.random.default_rng(seed)
    tokens, offsets, K = random_sparse_mapping(rng, 5, vocab, max_len, device=DEV)
    states = random_states(rng, batch * mb, 5, dead_frac=dead_frac if batch * mb > 1 else 0.0,
                           device=DEV)
    slots = filter_slots_reference(states, K, tokens=tokens, offsets=offsets)
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(batch * mb, K, generator=g).to(DEV) * 3
    logits = torch.where(slots.slot_tokens >= 0, logits, float("-inf"))
    beam_scores = (-torch.rand(batch * mb, generator=g) * 5).to(DEV)
    return slots, logits, beam_scores


def _paths(batch, mb, K, M):
    bm, bk, _ = small_tile(mb, K, M)
    paths = ["wide", "split", "prune", "small"] if bm * bk <= SMALL_MAX else ["wide", "split", "prune"]
    # the interpreter is slow; larger split/prune shapes are covered by the GPU test below
    return paths if DEV == "cuda" or mb * K <= 4096 else [p for p in paths if p not in ("split", "prune")]


def _exact(scores, slots, batch, M):
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M)
    for path in _paths(batch, scores.shape[0] // batch, scores.shape[1], M):
        got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, batch, M, path=path)
        assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
    return exp


# (batch, beams per request, vocab, max segment = K, beam width M)
CASES = [
    (1, 1, 1, 1, 1),          # single item, batch 1, beam 1
    (3, 4, 2, 2, 7),          # codebook 2: fewer valid candidates than M
    (2, 3, 60, 24, 16),
    (3, 2, 60, 40, 1),        # beam width 1
    (2, 8, 300, 199, 32),     # K = 199 (search-like step 2 width)
    (1, 1, 16384, 16384, 128),  # codebook 16,384: the small tile is at its limit
    (2, 32, 40, 24, 128),
]


@pytest.mark.parametrize("batch,mb,vocab,max_len,M", CASES)
def test_matches_reference(batch, mb, vocab, max_len, M):
    slots, logits, beam_scores = _candidates(batch * 100 + vocab, batch, mb, vocab, max_len)
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = _exact(scores, slots, batch, M)
    n_valid = (scores.view(batch, -1) > float("-inf")).sum(1)
    for r in range(batch):
        k = min(int(n_valid[r]), M)
        assert (exp.parents[r, :k] >= 0).all() and (exp.parents[r, k:] == -1).all()
        assert (exp.tokens[r, k:] == -1).all() and (exp.succ[r, k:] == -1).all()
        assert torch.isneginf(exp.scores[r, k:]).all()


def test_ties_break_by_lower_position():
    batch, mb, M = 3, 5, 40
    slots, logits, _ = _candidates(5, batch, mb, 30, 12)
    g = torch.Generator().manual_seed(1)
    q = (torch.randint(-3, 2, logits.shape, generator=g).float() / 2).to(DEV)
    q[q == 0] = torch.where(torch.rand(int((q == 0).sum()), generator=g) < 0.5, 0.0, -0.0).to(DEV)
    scores = torch.where(logits > float("-inf"), q, float("-inf"))
    exp = _exact(scores, slots, batch, M)
    for r in range(batch):  # equal scores come in ascending flat position
        s, p = exp.scores[r], exp.parents[r]
        same = (s[1:] == s[:-1]) & (p[1:] >= 0)
        assert (p[1:][same] >= p[:-1][same]).all()


def test_all_dead_request():
    slots, logits, beam_scores = _candidates(9, 2, 3, 20, 10, dead_frac=0.0)
    logits[3:] = float("-inf")
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = _exact(scores, slots, 2, 4)
    assert (exp.parents[1] == -1).all() and torch.isneginf(exp.scores[1]).all()


@pytest.mark.parametrize("normalise", [False, True])
def test_nan_candidates_are_never_selected(normalise):
    # a beam whose logits are NaN (a model output that overflowed) loses its candidates, and its
    # request keeps its finite ones; one NaN logit makes its whole row NaN under normalisation
    batch, mb, M = 3, 4, 6
    slots, logits, beam_scores = _candidates(13, batch, mb, 30, 12, dead_frac=0.0)
    valid = logits > float("-inf")
    poisoned = int(valid[:mb].any(1).nonzero()[0])                  # request 0: a beam of NaN
    partial = mb + int((valid[mb:2 * mb].sum(1) >= 2).nonzero()[0])  # request 1: one NaN, the rest high
    logits[poisoned] = torch.where(valid[poisoned], float("nan"), float("-inf"))
    logits[partial] = torch.where(valid[partial], 20.0, float("-inf"))
    logits[partial, int(valid[partial].nonzero()[0])] = float("nan")
    kwargs = dict(beam_scores=beam_scores) if normalise else {}
    exp = topk_gather_reference(logits, slots.slot_tokens, slots.slot_succ, batch, M, **kwargs)
    assert not (exp.parents == poisoned).any() and not exp.scores.isnan().any()
    finite = (logits[:mb] > float("-inf")).sum()
    assert (exp.parents[0] >= 0).sum() == min(M, finite) and (exp.parents == partial).any() != normalise
    for path in _paths(batch, mb, logits.shape[1], M):
        got = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, batch, M, path=path, **kwargs)
        if normalise:  # fused: the same selection, scores within float32 rounding (test_fused_normalisation)
            assert_selection_equivalent(got, exp, log_softmax_slots_reference(logits, beam_scores),
                                        slots.slot_tokens, slots.slot_succ, batch)
        else:
            assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("batch,mb,vocab,max_len,M", [CASES[1], CASES[3], CASES[5]])
def test_fused_normalisation(batch, mb, vocab, max_len, M):
    slots, logits, beam_scores = _candidates(batch + vocab, batch, mb, vocab, max_len)
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(logits, slots.slot_tokens, slots.slot_succ, batch, M,
                                beam_scores=beam_scores)
    assert_outputs_equal(exp, topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M),
                         names=NAMES, rtol=0.0, atol=0.0)
    for path in _paths(batch, mb, logits.shape[1], M):
        got = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, batch, M,
                                 beam_scores=beam_scores, path=path)
        assert_selection_equivalent(got, exp, scores, slots.slot_tokens, slots.slot_succ, batch)


@pytest.mark.parametrize("batch,mb,vocab,max_len,M,chunk_min", [
    (3, 4, 2, 2, 7, 1024),         # fewer candidates than M: deferred slots never pad the tail
    (2, 5, 30, 12, 3, 4),          # several split stages
    (2, 8, 300, 199, 32, 1024),    # K = 199
    (1, 1, 16384, 16384, 128, 1024),  # one wide row: column blocks fold the whole row's normaliser
])
def test_deferred_slots_normalise_but_are_not_candidates(monkeypatch, batch, mb, vocab, max_len, M, chunk_min):
    """Slots with a successor below -1 (a catalog-normalised request's slots that only its own
    list removes) count in the row's log-sum-exp and are never selected, on every path."""
    monkeypatch.setattr(selection, "SPLIT_CHUNK_MIN", chunk_min)
    slots, logits, beam_scores = _candidates(batch * 13 + vocab, batch, mb, vocab, max_len)
    g = torch.Generator().manual_seed(vocab)
    live = slots.slot_tokens >= 0
    later = live & (torch.rand(live.shape, generator=g) < 0.4).to(DEV)
    later[0] = live[0]  # a beam whose every live slot is deferred: it has no candidate
    succ = torch.where(later, -2 - slots.slot_succ, slots.slot_succ)
    want = log_softmax_slots_reference(logits, beam_scores).masked_fill(later, float("-inf"))
    exp = topk_gather_reference(want, slots.slot_tokens, succ, batch, M)
    ref = topk_gather_reference(logits, slots.slot_tokens, succ, batch, M, beam_scores=beam_scores, deferred=True)
    assert_outputs_equal(ref, exp, names=NAMES, rtol=0.0, atol=0.0)
    assert not (exp.succ < -1).any() and not (exp.parents == 0).any()
    for path in _paths(batch, mb, logits.shape[1], M):
        got = topk_gather_triton(logits, slots.slot_tokens, succ, batch, M, beam_scores=beam_scores,
                                 deferred=True, path=path)
        assert_selection_equivalent(got, exp, want, slots.slot_tokens, succ, batch)
    with pytest.raises(ValueError, match="deferred"):
        topk_gather_reference(logits, slots.slot_tokens, succ, batch, M, deferred=True)


def test_out_buffers_and_checks():
    slots, logits, beam_scores = _candidates(2, 2, 3, 50, 20)
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, 2, 9)
    for path in ("small", "wide", "split", "prune"):
        out = TopkOut(*(torch.full_like(t, 3) for t in exp))
        got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, 2, 9, path=path, out=out)
        assert all(g is o for g, o in zip(got, out))
        assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
    with pytest.raises(ValueError):
        topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, 4, 9)
    with pytest.raises(ValueError):
        topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, 2, 9, path="radix")
    with pytest.raises(TypeError):
        topk_gather_reference(scores, slots.slot_tokens.long(), slots.slot_succ, 2, 9)


def test_split_plan_shrinks_to_one_chunk():
    for n_cand, M in [(1, 1), (7, 128), (25728, 128), (8192, 128), (25728, 256), (10**6, 1024),
                      (50000, 4096), (16384 * 3, 8192)]:
        chunk, block_out, stages = split_plan(n_cand, M)
        assert chunk >= 2 * block_out and chunk & (chunk - 1) == 0 and block_out >= max(2, M)
        assert stages[-1] == 1 and all(n > 1 for n in stages[:-1])
        length = n_cand
        for n in stages:
            assert n == -(-length // chunk)
            length = n * block_out
    assert split_plan(25728, 128) == (1024, 128, [26, 4, 1])
    assert split_plan(8192, 128) == (1024, 128, [8, 1])


# tiny chunks so the interpreter runs several reduction stages
@pytest.mark.parametrize("batch,mb,vocab,max_len,M,chunk_min", [
    (1, 1, 1, 1, 1, 4),            # one candidate, beam width 1
    (3, 4, 2, 2, 7, 8),            # fewer valid candidates than M
    (2, 5, 30, 12, 1, 4),          # beam width 1, many stages
    (2, 6, 60, 24, 4, 8),
    (1, 1, 40, 3, 16, 8),          # Mb * K smaller than M
])
def test_split_multi_stage(monkeypatch, batch, mb, vocab, max_len, M, chunk_min):
    monkeypatch.setattr(selection, "SPLIT_CHUNK_MIN", chunk_min)
    slots, logits, beam_scores = _candidates(batch * 7 + vocab, batch, mb, vocab, max_len)
    if batch > 1:  # a request with only -inf candidates
        logits[:mb] = float("-inf")
    scores = log_softmax_slots_reference(logits, beam_scores)
    assert len(split_plan(mb * logits.shape[1], M)[2]) >= (2 if mb * logits.shape[1] > 8 * M else 1)
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M)
    got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, batch, M, path="split")
    assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
    got = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, batch, M,
                             beam_scores=beam_scores, path="split")
    assert_selection_equivalent(got, exp, scores, slots.slot_tokens, slots.slot_succ, batch)
    wide = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, batch, M,
                              beam_scores=beam_scores, path="wide")
    assert_outputs_equal(got, wide, names=NAMES, rtol=0.0, atol=0.0)


@pytest.mark.parametrize("batch,mb,vocab,max_len,M,level", [
    (1, 1, 1, 1, 1, 0),            # first step: the prefix is the token alone
    (3, 4, 2, 2, 7, 2),            # fewer valid candidates than M: padded rows all -1
    (2, 5, 30, 12, 16, 3),
    (2, 8, 300, 199, 32, 4),
])
def test_fused_prefix_extension(batch, mb, vocab, max_len, M, level):
    slots, logits, beam_scores = _candidates(batch * 11 + level, batch, mb, vocab, max_len)
    g = torch.Generator().manual_seed(level)
    prev = torch.randint(0, vocab, (batch, mb, level), generator=g).to(DEV)
    # normalised scores in, so every path selects exactly what the reference selects
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M)
    exp_next = torch.full((batch, M, level + 1), 99, dtype=torch.int64, device=DEV)
    extend_prefixes(prev, exp_next, exp)
    assert (exp_next[exp.parents < 0] == -1).all()
    ref_next = torch.full_like(exp_next, 7)
    ref = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M,
                                prefixes=(prev, ref_next))
    assert_outputs_equal(ref, exp, names=NAMES, rtol=0.0, atol=0.0)
    assert_outputs_equal([ref_next], [exp_next], names=["next prefixes"], rtol=0.0, atol=0.0)
    for path in _paths(batch, mb, scores.shape[1], M):
        nxt = torch.full_like(exp_next, 7)
        got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, batch, M,
                                 path=path, prefixes=(prev, nxt))
        assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
        assert_outputs_equal([nxt], [exp_next], names=[f"next prefixes ({path})"], rtol=0.0, atol=0.0)
    with pytest.raises(ValueError):  # wrong shape of the next buffer
        topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M,
                              prefixes=(prev, exp_next[..., :level]))


def test_split_first_stage_tiles():
    for mb, K, M in [(1, 1, 1), (1, 3, 128), (128, 199, 128), (128, 201, 256), (1, 8192, 128), (4, 5, 2),
                     (32, 2048, 64), (1, 16384, 128), (2, 1500, 8)]:
        rows, block_c, n_col, n = split_first_stage(mb, K, M)
        chunk, block_out, _ = split_plan(mb * K, M)
        assert rows & (rows - 1) == 0 and block_c & (block_c - 1) == 0 and rows * block_c >= 2 * block_out
        assert n_col * block_c >= K and (n_col - 1) * block_c < K and n == -(-mb // rows) * n_col
        assert rows * block_c <= max(chunk, 2 * block_out) or n == 1
    assert split_first_stage(1, 8192, 128) == (1, 1024, 8, 8)
    assert split_first_stage(128, 199, 128) == (4, 256, 1, 32)


def test_split_wide_rows_in_column_blocks(monkeypatch):
    # rows wider than a chunk: each first-stage program takes one column block of a row
    # and folds the whole row for its log-sum-exp
    monkeypatch.setattr(selection, "SPLIT_CHUNK_MAX", 16)
    monkeypatch.setattr(selection, "SPLIT_CHUNK_MIN", 8)
    batch, mb, M = 2, 3, 4
    slots, logits, beam_scores = _candidates(17, batch, mb, 60, 24)
    assert split_first_stage(mb, logits.shape[1], M)[2] == 2
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M)
    prev = torch.arange(batch * mb * 2, device=DEV).view(batch, mb, 2)
    nxt, exp_next = (torch.zeros(batch, M, 3, dtype=torch.int64, device=DEV) for _ in range(2))
    extend_prefixes(prev, exp_next, exp)
    got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, batch, M,
                             path="split", prefixes=(prev, nxt))
    assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
    assert_outputs_equal([nxt], [exp_next], names=["next prefixes"], rtol=0.0, atol=0.0)
    got = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, batch, M, beam_scores=beam_scores,
                             path="split")
    assert_selection_equivalent(got, exp, scores, slots.slot_tokens, slots.slot_succ, batch)


# (batch, beams per request, vocab, K, M, chunk_min): pruning active (Mb >= M) with tiny chunks
@pytest.mark.parametrize("batch,mb,vocab,max_len,M,chunk_min", [
    (2, 8, 60, 24, 4, 8),          # several stages, row blocks of one row
    (3, 6, 30, 12, 2, 4),
    (1, 5, 40, 9, 5, 8),           # Mb == M
    (2, 3, 40, 9, 7, 8),           # Mb < M: no threshold, every live candidate survives
])
def test_prune_compacts_and_falls_back(monkeypatch, batch, mb, vocab, max_len, M, chunk_min):
    monkeypatch.setattr(selection, "SPLIT_CHUNK_MIN", chunk_min)
    slots, logits, beam_scores = _candidates(batch * 31 + M, batch, mb, vocab, max_len, dead_frac=0.0)
    # one beam per request far ahead: its whole row survives (bitonic fallback) while the
    # other rows keep only a few candidates (prefix-sum compaction)
    beam_scores = beam_scores - 40.0
    beam_scores[::mb] = 0.0
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, batch, M)
    got = topk_gather_triton(scores, slots.slot_tokens, slots.slot_succ, batch, M, path="prune")
    assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
    # fused normalisation: the row log-sum-exps may differ from the reference's in the last bit
    got = topk_gather_triton(logits, slots.slot_tokens, slots.slot_succ, batch, M, beam_scores=beam_scores,
                             path="prune")
    assert_selection_equivalent(got, exp, scores, slots.slot_tokens, slots.slot_succ, batch)


def _serving_candidates(seed, batch, mb, K, dead_frac=0.3):
    """Raw logits of ``batch * mb`` beams of width ``K`` on the GPU, with ``-inf`` slots,
    a dead beam per request, and ties; slot rows with unique tokens per beam."""
    g = torch.Generator(device="cuda").manual_seed(seed)
    n = batch * mb
    logits = torch.randn(n, K, generator=g, device="cuda") * 3
    logits = torch.where(torch.rand(n, K, generator=g, device="cuda") < dead_frac, float("-inf"), logits)
    if mb > 1:
        logits[::mb] = float("-inf")           # first beam of each request dead
    elif batch > 1:
        logits[1::2] = float("-inf")           # every other request all dead
    t = min(8, K // 2)
    logits[:, :t] = logits[:, t:2 * t].round()  # exact ties
    tokens = torch.arange(K, dtype=torch.int32, device="cuda").repeat(n, 1)
    tokens = torch.where(logits > float("-inf"), tokens, -1)
    succ = torch.randint(0, 2**40, (n, K), generator=g, device="cuda")
    succ = torch.where(tokens >= 0, succ, -1)
    beam_scores = -torch.rand(n, generator=g, device="cuda") * 5
    return logits, tokens, succ, beam_scores


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
@pytest.mark.parametrize("batch,mb,K,M", [(1, 128, 201, 128), (32, 128, 201, 128), (1, 1, 8192, 128),
                                          (32, 1, 8192, 128), (4, 64, 201, 64), (4, 256, 201, 256),
                                          (2, 128, 201, 1), (3, 2, 5, 128)])
def test_split_gpu_serving_shapes_and_cuda_graph(batch, mb, K, M):
    logits, tokens, succ, beam_scores = _serving_candidates(batch * 1000 + K + M, batch, mb, K)
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(scores, tokens, succ, batch, M)
    for inputs, kw in [(scores, {}), (logits, {"beam_scores": beam_scores})]:
        wide = topk_gather_triton(inputs, tokens, succ, batch, M, path="wide", **kw)
        split = topk_gather_triton(inputs, tokens, succ, batch, M, path="split", **kw)
        assert_outputs_equal(split, wide, names=NAMES, rtol=0.0, atol=0.0)
        if not kw:  # fused: prune reads its own row log-sum-exps, so compare on selection
            prune = topk_gather_triton(inputs, tokens, succ, batch, M, path="prune")
            assert_outputs_equal(prune, wide, names=NAMES, rtol=0.0, atol=0.0)
        if not kw:
            assert_outputs_equal(split, exp, names=NAMES, rtol=0.0, atol=0.0)
        else:
            assert_selection_equivalent(split, exp, scores, tokens, succ, batch)
    # fused prefix extension on every path that serves the shape
    prev = torch.randint(0, 1000, (batch, mb, 3), device="cuda")
    want = torch.empty(batch, M, 4, dtype=torch.int64, device="cuda")
    extend_prefixes(prev, want, exp)
    for path in _paths(batch, mb, K, M):
        nxt = torch.full_like(want, 5)
        got = topk_gather_triton(scores, tokens, succ, batch, M, path=path, prefixes=(prev, nxt))
        assert_outputs_equal(got, exp, names=NAMES, rtol=0.0, atol=0.0)
        assert_outputs_equal([nxt], [want], names=[f"next prefixes ({path})"], rtol=0.0, atol=0.0)
    # capture and replay: fresh inputs copied into the captured buffers give fresh outputs
    x, bs = logits.clone(), beam_scores.clone()
    out = TopkOut(*(torch.empty_like(t) for t in exp))
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        topk_gather_triton(x, tokens, succ, batch, M, beam_scores=bs, path="split", out=out)
    torch.cuda.current_stream().wait_stream(side)
    torch.cuda.synchronize()
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        topk_gather_triton(x, tokens, succ, batch, M, beam_scores=bs, path="split", out=out)
    logits2, _, _, bs2 = _serving_candidates(batch * 1000 + K + M + 1, batch, mb, K)
    logits2 = torch.where(tokens >= 0, logits2, float("-inf"))
    x.copy_(logits2)
    bs.copy_(bs2)
    graph.replay()
    torch.cuda.synchronize()
    eager = topk_gather_triton(logits2, tokens, succ, batch, M, beam_scores=bs2, path="split")
    assert_outputs_equal(out, eager, names=NAMES, rtol=0.0, atol=0.0)
    wide = topk_gather_triton(logits2, tokens, succ, batch, M, beam_scores=bs2, path="wide")
    assert_outputs_equal(out, wide, names=NAMES, rtol=0.0, atol=0.0)
