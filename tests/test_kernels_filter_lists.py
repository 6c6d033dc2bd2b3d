"""The filter kernels with per-request lists applied as they fill the slots
(``filter_slots(constraint=SlotLists(...))``) against the PyTorch reference, which filters
and then runs ``constrain_slots_reference``: one launch must decide every slot as the
separate constraint kernel does, and, for catalog-normalised requests, the filter's deferred
slots settled by the selection (``topk_gather(deferred=True)``) as the searching
``constrain_scored_slots`` settles them."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from kernel_asserts import assert_outputs_equal, kernel_device, random_dense_table, random_sparse_mapping, random_states
from zerogr_kernels import FilterOut, filter_slots_reference, filter_slots_triton
from zerogr_kernels.constraints import SlotLists, constrain_slots_triton, search_iterations
from zerogr_kernels.scored_constraints import constrain_scored_slots_triton
from zerogr_kernels.selection import (PATHS, SMALL_MAX, small_tile, topk_gather_reference,
                                     topk_gather_triton)
from zerogr_kernels.list_spans import longest_run
from zerogr_kernels.row_marks import mark_rows_reference, mark_words

DEV = kernel_device()


def random_lists(rng, n_succ: int, batch: int, list_len: int, last: bool, shift, glob: bool = True):
    """Lists over the rows below ``n_succ`` successor states (each state covers at least one
    row; at the last step the successor is the row): a global deny segment (empty unless
    ``glob``) and one segment per request, modes of every kind, and the bitmap when ``shift``
    is given."""
    if last:
        n_rows, row_start = n_succ, None
    else:
        n_rows = n_succ + int(rng.integers(0, 3 * n_succ + 1))
        cuts = np.sort(rng.choice(np.arange(1, n_rows), n_succ - 1, replace=False)) if n_succ > 1 else []
        row_start = torch.as_tensor(np.concatenate([[0], cuts, [n_rows]]), dtype=torch.int32, device=DEV)
    glob = np.unique(rng.integers(0, n_rows, rng.integers(0, list_len + 1) if glob else 0))
    own = [np.setdiff1d(np.unique(rng.integers(0, n_rows, rng.integers(0, list_len + 1))), glob)
           for _ in range(batch)]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in [glob] + own])])
    rows = np.concatenate([glob] + own + [np.zeros(1, dtype=np.int64)])
    t = lambda a, dt: torch.as_tensor(np.asarray(a), dtype=dt, device=DEV)  # noqa: E731
    offsets, rows = t(offsets, torch.int64), t(rows, torch.int64)
    marks = {}
    if shift is not None:
        words = torch.full((mark_words(n_rows << shift),), -1, dtype=torch.int32, device=DEV)
        marks = dict(marks=mark_rows_reference(offsets, rows, words, shift), mark_shift=shift)
    mode = t(rng.integers(0, 4, batch), torch.int32)
    return row_start, offsets, rows, mode, marks


def both(states, K, lists, **kw):
    got = filter_slots_triton(states, K, constraint=lists, **kw)
    exp = filter_slots_reference(states, K, constraint=lists, **kw)
    assert_outputs_equal(got, exp, names=FilterOut._fields, rtol=0.0, atol=0.0)
    return got


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), dense=st.booleans(), batch=st.integers(1, 3), beams=st.integers(1, 5),
       list_len=st.integers(0, 40), last=st.booleans(), defer=st.booleans(), logits=st.booleans(),
       shift=st.sampled_from([None, 0, 2]), spans=st.booleans())
def test_filter_with_lists_matches_reference(seed, dense, batch, beams, list_len, last, defer, logits, shift, spans):
    """Sparse and dense mappings, dead beams, the last step and earlier ones, logits copied
    or not, with and without the bitmap, every list mode, deferred catalog-normalised lists,
    with and without each request's longest run of listed rows (``spans``)."""
    rng = np.random.default_rng(seed)
    n_states, vocab = 9, 70
    n_beams = batch * beams
    if dense:
        table = random_dense_table(rng, n_states, vocab, density=0.4, device=DEV)
        mapping, K, n_succ = {"table": table}, vocab, max(int(table.max()) + 1, 1)
    else:
        tokens, offsets, K = random_sparse_mapping(rng, n_states, vocab, 40, device=DEV)
        mapping, n_succ = {"tokens": tokens, "offsets": offsets}, max(int(offsets[-1]), 1)
    states = random_states(rng, n_beams, n_states, device=DEV)
    row_start, list_offsets, rows, mode, marks = random_lists(rng, n_succ, batch, list_len, last, shift,
                                                              glob=not spans or rng.random() < 0.5)
    lists = SlotLists(row_start, list_offsets, rows, mode, beams, search_iterations(4 * n_succ + 8), defer,
                      **marks)
    if spans:  # the exact longest runs and the fewest rows below a successor: the tightest bounds
        floor = 1 if row_start is None else int(torch.diff(row_start).min())
        lists = lists._replace(spans=torch.tensor(
            [longest_run(rows[list_offsets[s]:list_offsets[s + 1]]) for s in range(batch + 1)], device=DEV),
            floor=floor)
    kw = {}
    if logits:
        kw["logits"] = torch.as_tensor(rng.normal(size=(n_beams, vocab)), dtype=torch.float32, device=DEV)
    got = both(states, K, lists, **mapping, **kw)
    # the same slots as the unfused kernels: filter, then the constraint kernel (and, for the
    # deferred lists, the pass after projection: here the logits copied in stand for it)
    plain = filter_slots_triton(states, K, **mapping, **kw)
    constrain_slots_triton(*plain[:3], *lists[:6], defer, **marks)
    if not defer:
        assert_outputs_equal(got, plain, names=FilterOut._fields, rtol=0.0, atol=0.0)
        return
    # the projection's logits on the live slots, the same in both
    x = torch.as_tensor(rng.normal(size=(n_beams, K)), dtype=torch.float32, device=DEV)
    for slots in (got, plain):
        slots.slot_logits.copy_(torch.where(slots.slot_tokens >= 0, x, float("-inf")))
    scores = torch.as_tensor(rng.normal(size=n_beams), dtype=torch.float32, device=DEV)
    shifted = constrain_scored_slots_triton(*plain[:3], *lists[:6], scores, torch.empty_like(scores), **marks)
    # the searching pass killed the deferred slots and moved the normalisers' difference into the scores
    M = int(rng.integers(1, 2 * beams * K + 1))
    want = topk_gather_reference(plain.slot_logits, plain.slot_tokens, plain.slot_succ, batch, M,
                                 beam_scores=shifted)
    ref_got = filter_slots_reference(states, K, constraint=lists, **mapping, **kw)
    ref_got.slot_logits.copy_(got.slot_logits)
    tops = [topk_gather_reference(ref_got.slot_logits, ref_got.slot_tokens, ref_got.slot_succ, batch, M,
                                  beam_scores=scores, deferred=True)]
    tops += [topk_gather_triton(got.slot_logits, got.slot_tokens, got.slot_succ, batch, M, beam_scores=scores,
                                deferred=True, path=path)
             for path in PATHS if path != "small" or np.prod(small_tile(beams, K, M)[:2]) <= SMALL_MAX]
    for top in tops:
        torch.testing.assert_close(top.scores, want.scores, rtol=0, atol=1e-5)
        for name in ("parents", "tokens", "succ"):
            assert torch.equal(getattr(top, name), getattr(want, name)), name


@pytest.mark.parametrize("last", [False, True])
@pytest.mark.parametrize("dense", [False, True])
def test_filter_with_spans_kills_the_prefixes_a_run_empties(last, dense):
    """With each list's longest run (``spans``) and the fewest rows below a successor
    (``floor``), the filter still kills every prefix a run of listed rows empties: fixed cases
    where such prefixes are common (long lists over few rows)."""
    for seed in range(6):
        test_filter_with_lists_matches_reference.hypothesis.inner_test(
            seed=seed, dense=dense, batch=2, beams=3, list_len=20, last=last, defer=seed % 2 == 1, logits=False,
            shift=None if seed % 3 else 0, spans=True)


@pytest.mark.parametrize("dense", [False, True])
def test_filter_with_spans_kills_prefixes_interleaved_lists_empty(dense):
    """A request's list holds every other row of a range and the global list the rows between:
    each list's longest run is one row, but together they empty every prefix inside the range,
    which the filter still kills with the spans (1, 1) (a bound on the two lists' runs together)."""
    rng = np.random.default_rng(5)
    n_states, vocab, beams = 9, 70, 4
    if dense:
        table = random_dense_table(rng, n_states, vocab, density=0.4, device=DEV)
        mapping, K, n_succ = {"table": table}, vocab, int(table.max()) + 1
    else:
        tokens, offsets, K = random_sparse_mapping(rng, n_states, vocab, 40, device=DEV)
        mapping, n_succ = {"tokens": tokens, "offsets": offsets}, int(offsets[-1])
    sizes = rng.integers(1, 4, n_succ)
    row_start = torch.as_tensor(np.concatenate([[0], np.cumsum(sizes)]), dtype=torch.int32, device=DEV)
    half = int(sizes.sum()) // 2 * 2
    own, glob = np.arange(0, half, 2), np.arange(1, half, 2)
    t = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.int64, device=DEV)  # noqa: E731
    list_offsets = t([0, glob.size, glob.size + own.size, glob.size + own.size])  # request 1: no list of its own
    lists = SlotLists(row_start, list_offsets, t(np.concatenate([glob, own])), t([0, 0]).int(), beams,
                      search_iterations(4 * n_succ), spans=t([1, 1, 0]))
    states = random_states(rng, 2 * beams, n_states, dead_frac=0.0, device=DEV)
    got = both(states, K, lists, **mapping)
    succ = got.slot_succ[:beams]
    assert (succ < 0).sum() > (filter_slots_reference(states, K, **mapping).slot_succ[:beams] < 0).sum()


def test_filter_lists_are_checked():
    rng = np.random.default_rng(0)
    tokens, offsets, K = random_sparse_mapping(rng, 4, 10, 5, device=DEV)
    states = random_states(rng, 4, 4, device=DEV)
    _, list_offsets, rows, mode, _ = random_lists(rng, int(offsets[-1]), 2, 3, True, None)
    with pytest.raises(ValueError, match="beams_per_request"):
        filter_slots_triton(states, K, tokens=tokens, offsets=offsets,
                            constraint=SlotLists(None, list_offsets, rows, mode, 3, 4))
    with pytest.raises(ValueError, match="list_offsets"):
        filter_slots_reference(states, K, tokens=tokens, offsets=offsets,
                               constraint=SlotLists(None, list_offsets[:-1], rows, mode, 2, 4))
