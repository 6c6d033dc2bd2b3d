"""Top-k selection and gather (kernels/selection.py): both paths against the reference."""
import numpy as np
import pytest
import torch

from kernel_asserts import (assert_outputs_equal, assert_selection_equivalent, kernel_device,
                            random_sparse_mapping, random_states)
from kernels import (SMALL_MAX, TopkOut, filter_slots_reference, log_softmax_slots_reference,
                     small_tile, topk_gather_reference, topk_gather_triton)

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
    return ["wide", "small"] if bm * bk <= SMALL_MAX else ["wide"]


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


def test_out_buffers_and_checks():
    slots, logits, beam_scores = _candidates(2, 2, 3, 50, 20)
    scores = log_softmax_slots_reference(logits, beam_scores)
    exp = topk_gather_reference(scores, slots.slot_tokens, slots.slot_succ, 2, 9)
    for path in ("small", "wide"):
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
