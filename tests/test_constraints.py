"""Per-request allow/deny lists: the kernel against its reference, and both decode orders
against a brute-force oracle that enumerates the catalog."""
import itertools
import math

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_kernels.constraints import constrain_slots_reference, constrain_slots_triton, search_iterations
from zerogr_kernels.scored_constraints import constrain_scored_slots_reference, constrain_scored_slots_triton
from zerogr_kernels.row_marks import mark_rows_reference, mark_rows_triton, mark_shift, mark_words
from zerogr_core import Catalog, Decoder, ZeroGRError, build_index
from zerogr_core.decode.constraints import build_lists, row_starts
from zerogr_core.index import INDEX_PRESETS, HostTrie, build_static_index

from kernel_asserts import kernel_device
from test_decode import PrefixModel

DEV = kernel_device()


# ---------------------------------------------------------------------------- kernel
def random_case(seed, n_beams, K, batch, n_rows, last, list_len, n_states=12):
    g = np.random.default_rng(seed)
    n_states = min(n_states, n_rows)  # every state covers at least one row, as in a step index
    succ = g.integers(-1, n_rows if last else n_states, (n_beams, K))
    tokens = np.where(succ >= 0, g.integers(0, 50, (n_beams, K)), -1)
    logits = np.where(succ >= 0, g.normal(size=(n_beams, K)), -np.inf)
    starts = None if last else np.concatenate(
        [[0], np.sort(g.choice(np.arange(1, n_rows), n_states - 1, replace=False)), [n_rows]])
    # segment 0: a global deny list; each request's list disjoint from it
    glob = np.unique(g.integers(0, n_rows, g.integers(0, list_len + 1)))
    lists = [np.setdiff1d(np.unique(g.integers(0, n_rows, g.integers(0, list_len + 1))), glob)
             for _ in range(batch)]
    offsets = np.concatenate([[0], np.cumsum([len(x) for x in [glob] + lists])])
    rows = np.concatenate([glob] + lists + [np.zeros(1, dtype=np.int64)])  # padded buffer
    mode = g.integers(0, 4, batch)  # bit 1: allow list, bit 2: catalog-normalised
    t = torch.from_numpy
    return (t(tokens.astype(np.int32)), t(succ.astype(np.int64)), t(logits.astype(np.float32)),
            None if starts is None else t(starts.astype(np.int32)), t(offsets.astype(np.int64)),
            t(rows.astype(np.int64)), t(mode.astype(np.int32)))


def rule(case, n_beams, batch, b, k):
    """(alive, live) of slot (b, k) by the module docstring's rule, in plain Python."""
    tokens, succ, logits, starts, offsets, rows, mode = case
    glob = rows[offsets[0]:offsets[1]].numpy()
    r = b // (n_beams // batch)
    own = rows[offsets[r + 1]:offsets[r + 2]].numpy()
    s = int(succ[b, k])
    lo, hi = (s, s + 1) if starts is None else (int(starts[s]), int(starts[s + 1]))
    listed = int(((own >= lo) & (own < hi)).sum())
    in_glob = int(((glob >= lo) & (glob < hi)).sum())
    return (listed > 0 if mode[r] & 1 else hi - lo > listed + in_glob), hi - lo > in_glob


def on_kernel_device(tensors):
    """Copies of ``tensors`` (a list, ``None`` kept) or of a dict's tensor values on the kernels'
    device: a GPU compiles the kernels, which then take CUDA tensors only."""
    if isinstance(tensors, dict):
        return {k: v.to(DEV) if isinstance(v, torch.Tensor) else v for k, v in tensors.items()}
    return [None if t is None else t.to(DEV, copy=True) for t in tensors]


def assert_same_slots(ref, tri) -> None:
    """The reference's and the kernel's slot tensors agree exactly (-inf logits alike)."""
    for name, a, b in zip(("tokens", "succ", "logits"), (t.cpu() for t in ref[:3]), (t.cpu() for t in tri[:3])):
        bad = (a != b) & ~(torch.isinf(a.float()) & torch.isinf(b.float()))
        assert not bad.any(), f"{name}: first mismatches at {bad.nonzero()[:5].tolist()}"


def with_marks(case, n_rows, shift=None):
    """``{"marks": ..., "mark_shift": ...}`` for the kernels: the bitmap of the case's lists,
    computed by the reference (a coarser granule than the catalog needs, when ``shift`` is given)."""
    offsets, rows = case[4], case[5]
    shift = mark_shift(n_rows) if shift is None else shift
    marks = torch.full((mark_words(n_rows << shift),), -1, dtype=torch.int32, device=rows.device)
    return dict(marks=mark_rows_reference(offsets, rows, marks, shift), mark_shift=shift)


MARK_SHIFTS = [None, 0, 3]
"""No bitmap, one bit per row, one bit per 8 rows."""

KERNEL_CASES = [(2, 1, 1, False, 0), (6, 3, 3, False, 5), (4, 130, 2, True, 40), (1, 7, 1, True, 1),
                (8, 200, 4, False, 300), (2, 700, 2, False, 30)]


@pytest.mark.parametrize("shift", MARK_SHIFTS)
@pytest.mark.parametrize("defer", [False, True])
@pytest.mark.parametrize("n_beams,K,batch,last,list_len", KERNEL_CASES)
def test_kernel_matches_reference(n_beams, K, batch, last, list_len, defer, shift):
    n_rows = 97
    case = random_case(n_beams * K + list_len, n_beams, K, batch, n_rows, last, list_len)
    n_iter = search_iterations(list_len + 3)  # more halvings than needed must not change anything
    marks = {} if shift is None else with_marks(case, n_rows, shift)
    ref = [t.clone() if t is not None else None for t in case]
    tri = on_kernel_device(case)
    constrain_slots_reference(*ref, n_beams // batch, n_iter, defer)
    constrain_slots_triton(*tri, n_beams // batch, n_iter, defer, **on_kernel_device(marks))
    assert_same_slots(ref, tri)
    # independent check of the rule on the reference output
    succ, mode = case[1], case[6]
    for b in range(n_beams):
        for k in range(K):
            s = int(succ[b, k])
            if s < 0:
                assert int(ref[1][b, k]) == -1
                continue
            alive, live = rule(case, n_beams, batch, b, k)
            if defer and mode[b // (n_beams // batch)] & 2:
                alive = live  # only the global list before projection
            assert (int(ref[1][b, k]) == s) == alive and (int(ref[0][b, k]) >= 0) == alive


@pytest.mark.parametrize("last", [False, True])
def test_kernel_with_several_blocks_per_program_matches_reference(monkeypatch, last):
    """The grid of a large decode (more than MAX_PROGRAMS blocks), forced on a small case."""
    import zerogr_kernels.constraints as kc

    monkeypatch.setattr(kc, "MAX_PROGRAMS", 1)
    n_beams, K, batch = 4, 700, 2  # 6 blocks: the second program's last two past K
    case = random_case(11 + last, n_beams, K, batch, 97, last, 30)
    for defer in (False, True):
        ref = [t.clone() if t is not None else None for t in case]
        tri = on_kernel_device(case)
        constrain_slots_reference(*ref, n_beams // batch, 8, defer)
        constrain_slots_triton(*tri, n_beams // batch, 8, defer)
        assert_same_slots(ref, tri)


@pytest.mark.parametrize("shift", MARK_SHIFTS)
@pytest.mark.parametrize("n_beams,K,batch,last,list_len", KERNEL_CASES)
def test_scored_kernel_matches_reference(n_beams, K, batch, last, list_len, shift):
    n_rows = 97
    case = random_case(n_beams * K + list_len + 1, n_beams, K, batch, n_rows, last, list_len)
    n_iter = search_iterations(list_len + 3)
    scores = torch.from_numpy(np.random.default_rng(K).normal(size=n_beams).astype(np.float32))
    scores[0] = float("-inf")  # a padded beam stays padded
    marks = {} if shift is None else with_marks(case, n_rows, shift)
    ref = [t.clone() if t is not None else None for t in case]
    tri = on_kernel_device(case)
    out_ref = constrain_scored_slots_reference(*ref, n_beams // batch, n_iter, scores, torch.empty(n_beams))
    out_tri = constrain_scored_slots_triton(*tri, n_beams // batch, n_iter, scores.to(DEV),
                                            torch.empty(n_beams, device=DEV), **on_kernel_device(marks))
    assert_same_slots(ref, tri)
    torch.testing.assert_close(out_tri.cpu(), out_ref, rtol=0, atol=1e-5)
    # independent check: a log-softmax over what is left, plus the new score, is the
    # log-softmax over the live slots (float64)
    succ, logits, mode = case[1], case[2].double(), case[6]
    for b in range(n_beams):
        r = b // (n_beams // batch)
        if not mode[r] & 2:
            assert float(out_ref[b]) == float(scores[b]) and torch.equal(ref[1][b], succ[b])
            continue
        flags = [rule(case, n_beams, batch, b, k) if int(succ[b, k]) >= 0 else (False, False) for k in range(K)]
        alive = torch.tensor([a for a, _ in flags], dtype=torch.bool)
        live = torch.tensor([v for _, v in flags], dtype=torch.bool)
        assert torch.equal(ref[1][b] >= 0, alive)
        if not alive.any() or scores[b] == float("-inf"):
            assert out_ref[b] == float("-inf")
            continue
        want = torch.log_softmax(logits[b][live], 0)[alive[live]] + float(scores[b])
        got = torch.log_softmax(ref[2][b][alive].double(), 0) + float(out_ref[b])
        torch.testing.assert_close(got, want, rtol=0, atol=1e-5)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_rows=st.integers(1, 400), list_len=st.integers(0, 60),
       batch=st.integers(1, 3), last=st.booleans(), defer=st.booleans(), shift=st.sampled_from(MARK_SHIFTS))
def test_kernels_match_reference_on_any_lists(seed, n_rows, list_len, batch, last, defer, shift):
    """Ranges wider and narrower than the lists (the search is skipped only where a list
    cannot decide), empty and one-row segments, a cap far above what the lists need, ranges
    whose granules span one, two or more bitmap words."""
    n_beams, K = 2 * batch, 37
    case = random_case(seed, n_beams, K, batch, n_rows, last, list_len)
    n_iter = search_iterations(4 * n_rows)
    marks = {} if shift is None else with_marks(case, n_rows, shift)
    ref = [t.clone() if t is not None else None for t in case]
    tri = on_kernel_device(case)
    constrain_slots_reference(*ref, 2, n_iter, defer)
    constrain_slots_triton(*tri, 2, n_iter, defer, **on_kernel_device(marks))
    scores = torch.zeros(n_beams)
    out_ref = constrain_scored_slots_reference(*ref, 2, n_iter, scores, torch.empty(n_beams))
    out_tri = constrain_scored_slots_triton(*tri, 2, n_iter, scores.to(DEV), torch.empty(n_beams, device=DEV),
                                            **on_kernel_device(marks))
    assert_same_slots(ref, tri)
    torch.testing.assert_close(out_tri.cpu(), out_ref, rtol=0, atol=1e-5)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31), n_rows=st.integers(1, 5000), list_len=st.integers(0, 300),
       batch=st.integers(1, 4), shift=st.integers(0, 4), start=st.integers(0, 3))
def test_mark_rows_kernel_matches_reference(seed, n_rows, list_len, batch, shift, start):
    """Every listed row's granule is set and nothing else (bit 31 included), with rows
    before ``list_offsets[0]`` and past ``list_offsets[-1]`` ignored and stale bits cleared."""
    case = random_case(seed, 2, 3, batch, n_rows, True, list_len)
    offsets, rows = case[4] + start, torch.cat([torch.full((start,), n_rows - 1), case[5]])
    words = mark_words(n_rows << shift)
    got = mark_rows_triton(offsets.to(DEV), rows.to(DEV), torch.full((words,), -1, dtype=torch.int32, device=DEV),
                           shift).cpu()
    want = mark_rows_reference(offsets, rows, torch.full((words,), -1, dtype=torch.int32), shift)
    assert torch.equal(got, want), (got != want).nonzero()[:5].tolist()
    used = rows[int(offsets[0]):int(offsets[-1])].numpy()
    bits = np.unpackbits(want.numpy().view(np.uint8), bitorder="little")
    assert set(np.flatnonzero(bits).tolist()) == set((used >> shift).tolist())


def test_mark_shift_bounds_the_bitmap():
    assert mark_shift(1) == 0 and mark_shift(2**25) == 0 and mark_shift(2**25 + 1) == 1
    assert mark_words(2 * 10**7) == math.ceil(2 * 10**7 / 32)
    assert mark_words(10**9) * 32 <= 2**25 < mark_words(10**9) * 64


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("list_len", [0, 1, 100, 10_000])
@pytest.mark.parametrize("last", [False, True])
def test_kernels_match_reference_on_cuda(list_len, last):
    """Compiled kernels (not the interpreter) at a decode's size: 4 requests x 128 beams x
    1,000 slots over 200,000 rows in 5,000 prefixes, lists from empty to 10,000 rows."""
    batch, n_beams, K, n_rows = 4, 512, 1000, 200_000
    case = [t.cuda() if t is not None else None
            for t in random_case(list_len + last, n_beams, K, batch, n_rows, last, list_len, n_states=5000)]
    n_iter = search_iterations(1 << 20)
    marks = torch.empty(mark_words(n_rows), dtype=torch.int32, device="cuda")
    assert torch.equal(mark_rows_triton(case[4], case[5], marks, 0),
                       mark_rows_reference(case[4], case[5], marks.clone(), 0))
    for defer, kw in itertools.product((False, True), ({}, dict(marks=marks, mark_shift=0))):
        ref = [t.clone() if t is not None else None for t in case]
        tri = [t.clone() if t is not None else None for t in case]
        constrain_slots_reference(*ref, n_beams // batch, n_iter, defer)
        constrain_slots_triton(*tri, n_beams // batch, n_iter, defer, **kw)
        scores = torch.randn(n_beams, device="cuda")
        out_ref = constrain_scored_slots_reference(*ref, n_beams // batch, n_iter, scores,
                                                   torch.empty_like(scores))
        out_tri = constrain_scored_slots_triton(*tri, n_beams // batch, n_iter, scores, torch.empty_like(scores),
                                                **kw)
        assert_same_slots(ref, tri)
        torch.testing.assert_close(out_tri, out_ref, rtol=0, atol=1e-4)


def test_kernel_rejects_bad_arguments():
    case = list(random_case(0, 4, 3, 2, 10, True, 3))
    with pytest.raises(ValueError, match="beams_per_request"):
        constrain_slots_triton(*case, 3, 4)
    with pytest.raises(ValueError, match="batch \\+ 2"):
        constrain_slots_triton(*case[:4], case[4][:3], *case[5:], 2, 4)
    with pytest.raises(TypeError, match="list_mode"):
        constrain_slots_triton(*case[:6], case[6].long(), 2, 4)
    with pytest.raises(ValueError, match="at least one"):
        constrain_slots_triton(*case[:5], case[5][:0], case[6], 2, 4)


# ---------------------------------------------------------------------------- oracle
class Model(PrefixModel):
    """hidden_fn whose output depends only on (request, step, prefix); padded beams (-1) included."""


def next_tokens(sids, prefix):
    step = len(prefix)
    below = sids[np.all(sids[:, :step] == np.array(prefix, dtype=np.int64), axis=1)] if step else sids
    return np.unique(below[:, step])


def oracle(catalog, heads, model, request, beam, order, allowed_rows, live_rows=None):
    """Beam search over Python lists restricted to the allowed rows (float64); with
    ``live_rows``, filtering first normalises over their tokens (catalog normalisation)."""
    sids = catalog.sids.astype(np.int64)[np.sort(allowed_rows)]
    beams = [((), 0.0)]
    for step in range(catalog.n_levels):
        cands = []
        for prefix, score in beams:
            alive = next_tokens(sids, prefix)
            logits = heads[step].double() @ model.hidden(request, step, list(prefix)).float().double()
            if order == "filter-first":
                norm = alive if live_rows is None else next_tokens(catalog.sids.astype(np.int64)[live_rows], prefix)
                lp = torch.log_softmax(logits[norm], 0)[np.searchsorted(norm, alive)]
            else:
                lp = torch.log_softmax(logits, 0)[alive]
            cands += [(prefix + (int(t),), score + float(v)) for t, v in zip(alive, lp)]
        cands.sort(key=lambda c: -c[1])
        beams = cands[:beam]
    return beams


def exhaustive(catalog, heads, model, request, order, allowed_rows):
    """Every allowed item scored along its full path (exact when the beam holds every prefix)."""
    out = []
    for row in np.sort(allowed_rows):
        sid = catalog.sids[row].astype(np.int64)
        total = 0.0
        for step in range(catalog.n_levels):
            logits = heads[step].double() @ model.hidden(request, step, list(sid[:step])).float().double()
            if order == "filter-first":
                below = catalog.sids[np.sort(allowed_rows)].astype(np.int64)
                below = below[np.all(below[:, :step] == sid[:step], axis=1)]
                alive = np.unique(below[:, step])
                total += float(torch.log_softmax(logits[alive], 0)[np.searchsorted(alive, sid[step])])
            else:
                total += float(torch.log_softmax(logits, 0)[sid[step]])
        out.append((tuple(sid.tolist()), total))
    return sorted(out, key=lambda c: -c[1])


def allowed_rows_of(catalog, lists, request):
    rows = np.arange(catalog.n_items)
    return rows[lists.allows(request, rows)]


def check(result, catalog, expected, beam, request, allowed):
    got = result.scores[request].double().numpy()
    for j, (sid, score) in enumerate(expected):
        assert tuple(result.tokens[request, j].tolist()) == sid, (request, j, expected)
        assert math.isclose(got[j], score, rel_tol=1e-4, abs_tol=1e-4), (request, j)
        row = int(result.item_rows[request, j])
        assert row in allowed and tuple(catalog.sids[row].tolist()) == sid
    for j in range(len(expected), beam):  # padding
        assert result.scores[request, j] == float("-inf") and int(result.item_rows[request, j]) == -1


@st.composite
def scenarios(draw):
    n_levels = draw(st.integers(1, 3))
    sizes = tuple(draw(st.integers(2, 5)) for _ in range(n_levels))
    total = int(np.prod(sizes))
    n = draw(st.integers(1, min(total, 30)))
    seed = draw(st.integers(0, 10_000))
    g = np.random.default_rng(seed)
    flat = g.choice(total, n, replace=False)
    sids = np.stack(np.unravel_index(flat, sizes), 1)
    ids = [f"B{v:09d}" for v in g.choice(10**6, n, replace=False)]
    catalog = Catalog.from_sids(sids, sizes, item_ids=ids)
    batch = draw(st.integers(1, 3))
    allow, deny = [], []
    for _ in range(batch):
        kind = draw(st.sampled_from(["none", "allow", "deny", "both", "empty-allow"]))
        pick = lambda: [ids[i] for i in g.choice(n, g.integers(0, n + 1), replace=False)]  # noqa: E731
        allow.append(pick() if kind in ("allow", "both") else [] if kind == "empty-allow" else None)
        deny.append(pick() if kind in ("deny", "both") else None)
    beam = draw(st.integers(1, 6))
    preset = draw(st.sampled_from(["default", "all-sparse"]))
    projection = draw(st.sampled_from(["full", "selective"]))
    # a live catalog's deletions: one global deny set on top of the requests' lists
    glob = np.sort(g.choice(n, draw(st.integers(0, n)), replace=False)) if draw(st.booleans()) else None
    normalise = draw(st.sampled_from(["request", "catalog"]))
    return catalog, sizes, allow, deny, beam, preset, projection, seed, glob, normalise


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["filter-first", "score-first"]))
def test_both_orders_match_the_oracle(scenario, order):
    catalog, sizes, allow, deny, beam, preset, projection, seed, glob, normalise = scenario
    index = build_index(catalog, config=INDEX_PRESETS[preset])
    g = torch.Generator().manual_seed(seed)
    heads = [torch.randn(s, 5, generator=g) for s in sizes]
    batch = len(allow)
    model = Model(sizes, 5, batch, seed)
    decoder = Decoder(index, heads, beam, order, projection=projection, catalog=catalog, engine="reference")
    if glob is None:
        result = decoder.decode(model, batch, allow_items=allow, deny_items=deny, normalise=normalise)
        lists = build_lists(catalog, batch, allow, deny, normalise=normalise)
    else:
        lists = decoder.request_lists(batch, allow, deny, global_deny_rows=glob, normalise=normalise)
        result = decoder.decode(model, batch, lists=lists)
    live = np.setdiff1d(np.arange(catalog.n_items), [] if glob is None else glob)
    for r in range(batch):
        allowed = allowed_rows_of(catalog, lists, r)
        expected = oracle(catalog, heads, model, r, beam, order, allowed,
                          live if normalise == "catalog" else None)
        assert len(expected) == min(beam, allowed.size)
        check(result, catalog, expected, beam, r, set(allowed.tolist()))
        if normalise == "catalog" and glob is None:
            # an item scores the same with or without the request's list
            free = oracle(catalog, heads, model, r, catalog.n_items, order, np.arange(catalog.n_items))
            free = dict(free)
            for sid, score in expected:
                assert math.isclose(free[sid], score, rel_tol=1e-9, abs_tol=1e-9)
        if normalise == "request" and beam >= catalog.n_items:
            # the beam never drops a prefix: the same as scoring every item
            assert [s for s, _ in exhaustive(catalog, heads, model, r, order, allowed)][:beam] == \
                [s for s, _ in expected]
    ids = result.item_ids(catalog)
    assert ids.dtype == object
    for r in range(batch):
        for j in range(beam):
            if ids[r, j] is not None:
                assert glob is None or catalog.row_of_item(ids[r, j]) not in glob
                assert allow[r] is None or ids[r, j] in allow[r]
                assert deny[r] is None or ids[r, j] not in deny[r]


def test_fewer_allowed_than_beams_are_padded_and_empty_allow_returns_nothing():
    sids = np.array([[0, 0], [0, 1], [1, 0], [2, 2], [2, 3]])
    catalog = Catalog.from_sids(sids, (3, 4), item_ids=["a", "b", "c", "d", "e"])
    index = build_index(catalog)
    heads = [torch.randn(3, 4), torch.randn(4, 4)]
    model = Model((3, 4), 4, 3, 1)
    dec = Decoder(index, heads, 4, catalog=catalog)
    res = dec.decode(model, 3, allow_items=[["e", "a", "zzz"], [], None], deny_items=[None, None, ["b", "c"]])
    ids = res.item_ids(catalog)
    assert sorted(x for x in ids[0] if x is not None) == ["a", "e"] and list(ids[0]).count(None) == 2
    assert list(ids[1]) == [None] * 4 and (res.scores[1] == float("-inf")).all()
    assert sorted(x for x in ids[2] if x is not None) == ["a", "d", "e"]
    assert (res.tokens[1] == -1).all() and (res.item_rows[1] == -1).all()


def test_no_beam_is_spent_on_a_dead_prefix():
    # Step 1 token 0 has the best logit but every item below it is denied: no beam may take it.
    sids = np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0]])
    catalog = Catalog.from_sids(sids, (3, 2))
    index = build_index(catalog)
    heads = [torch.tensor([[10.0], [0.0], [0.0]]), torch.zeros(2, 1)]
    seen = []

    def hidden_fn(step, prefixes):
        seen.append(prefixes.clone())
        return torch.ones(prefixes.shape[0], prefixes.shape[1], 1)

    Decoder(index, heads, 2, catalog=catalog).decode(hidden_fn, 1, deny_items=[[0, 1]])
    # the last call of step 1 is the constrained decode's (a planner may decode before it)
    step1 = [p for p in seen if p.shape[-1] == 1][-1]
    assert 0 not in step1[0, :, 0].tolist() and step1[0, :, 0].tolist() == [1, 2]


def test_row_starts_cover_each_state():
    g = np.random.default_rng(4)
    catalog = Catalog.from_sids(np.unique(g.integers(0, 4, (60, 4)), axis=0), (4, 4, 4, 4))
    for preset in ("default", "all-sparse"):
        index = build_index(catalog, config=INDEX_PRESETS[preset])
        starts = row_starts(index)
        assert starts[-1] is None
        for level in range(catalog.n_levels - 1):
            # state q of step level+1 = the q-th distinct prefix of length level+1
            prefixes = catalog.sids[:, :level + 1]
            first = np.flatnonzero(np.concatenate([[True], np.any(prefixes[1:] != prefixes[:-1], axis=1)]))
            assert starts[level].tolist() == first.tolist() + [catalog.n_items]


def test_constraint_errors_are_one_line():
    catalog = Catalog.from_sids([[0, 1], [1, 0]], (2, 2))
    index = build_index(catalog)
    heads = [torch.randn(2, 3), torch.randn(2, 3)]
    fn = lambda step, p: torch.zeros(p.shape[0], p.shape[1], 3)  # noqa: E731
    with pytest.raises(ZeroGRError, match="pass catalog="):
        Decoder(index, heads, 2).decode(fn, 1, deny_items=[[0]])
    dec = Decoder(index, heads, 2, catalog=catalog)
    with pytest.raises(ZeroGRError, match="lists 2 requests, batch_size is 1"):
        dec.decode(fn, 1, allow_items=[[0], [1]])
    with pytest.raises(ZeroGRError, match="'x' is not an integer"):
        dec.decode(fn, 1, allow_items=[["x"]])
    with pytest.raises(ZeroGRError, match=r"allow_items\[0\] must be a list of item ids \(or None\), got int"):
        dec.decode(fn, 1, allow_items=[1])
    with pytest.raises(ZeroGRError, match="normalise must be one of .*got 'catlog'"):
        dec.decode(fn, 1, normalise="catlog")
    with pytest.raises(ZeroGRError, match="normalise must be one of"):
        dec.request_lists(1, deny_items=[[0]], normalise="vocab")
    with pytest.raises(ZeroGRError, match="constrained order"):
        Decoder(index, heads, 2, "unconstrained", catalog=catalog).decode(fn, 1, deny_items=[[0]])
    static = build_static_index(catalog)
    with pytest.raises(ZeroGRError, match="StaticIndex"):
        Decoder(index, heads, 2, "score-first", source=static, catalog=catalog).decode(fn, 1, deny_items=[[0]])
    # the host trie shares the index's states, so score-first over it takes lists
    res = Decoder(index, heads, 2, "score-first", source=HostTrie.from_catalog(catalog),
                  catalog=catalog).decode(fn, 1, deny_items=[[0]])
    assert res.item_ids(catalog)[0].tolist() == [1, -1]


@pytest.mark.parametrize("plan,normalise", [(["full", "selective", "selective"], "request"),
                                            (["selective", "full", "full"], "request"),
                                            (["selective", "full", "selective"], "catalog")])
def test_engine_lists_match_the_reference_and_buffers_regrow(plan, normalise):
    from zerogr_core.decode import list_buffers as cons
    from zerogr_core.decode.engine import GpuEngine
    from zerogr_core.decode.heads import Heads

    g = np.random.default_rng(2)
    sizes = (9, 5, 4)
    catalog = Catalog.from_sids(np.unique(np.stack([g.integers(0, s, 120) for s in sizes], 1), axis=0), sizes)
    index = build_index(catalog)
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s)) for s in sizes]
    model = Model(sizes, 6, 3, 7)
    n = catalog.n_items
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 5, plan_override=plan, use_graph=False)
    ref = Decoder(index, heads, 5, projection=plan, catalog=catalog, engine="reference")
    old_min = cons.MIN_CAPACITY
    cons.MIN_CAPACITY = 64  # the last call needs a regrow
    try:
        glob = np.arange(1, n, 4)
        # small lists in one buffer: the global list, none (request rows overwrite it), the
        # same global list object again (must be copied again); then lists that need a regrow
        for allow, deny, dropped in [([None, [4, 9], [1, 2]], [list(range(5)), None, None], glob),
                                     ([None, [6, 7], None], [[0, 1, 2, 3, 5, 7, 9, 11], None, [3]], None),
                                     ([None, None, [3, 5, 8]], [[0, 2], None, None], glob),
                                     ([list(range(n // 2)), None, []], [None, list(range(0, n, 2)), None], glob)]:
            lists = ref.request_lists(3, allow, deny, global_deny_rows=dropped, normalise=normalise)
            got = engine.decode(model, 3, lists=lists)
            want = ref.decode(model, 3, lists=lists)
            assert torch.equal(got.item_rows, want.item_rows) and torch.equal(got.tokens, want.tokens)
            torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
            shape = engine._shapes[engine.key(3) + ("lists", normalise)]
            assert shape.capacity >= lists.rows.size
        # unconstrained calls still use the plain shape
        plain = engine.decode(model, 3)
        assert torch.equal(plain.item_rows, ref.decode(model, 3).item_rows)
    finally:
        cons.MIN_CAPACITY = old_min


def gpu_case(seed: int = 5):
    """A random 4-level catalog indexed on the GPU, its heads and a capturable hidden_fn
    (pure GPU work), for the graph-replay tests of lists: ``(rng, catalog, index, heads, hidden_fn)``."""
    g = np.random.default_rng(seed)
    sizes = (300, 40, 30, 20)
    catalog = Catalog.from_sids(np.unique(np.stack([g.integers(0, s, 20000) for s in sizes], 1), axis=0), sizes)
    index = build_index(catalog, device="cuda")
    heads = [torch.randn(s, 96, device="cuda") for s in sizes]
    table = torch.randn(64, 96, device="cuda")

    def hidden_fn(step, prefixes):
        return table[((prefixes.clamp(min=0) * 7 + 3).sum(-1) + step * 13) % 64]

    return g, catalog, index, heads, hidden_fn


def reference_of(graph: Decoder, batch: int, index, heads, catalog) -> Decoder:
    """The reference decoder projecting each step as ``graph``'s plan for ``batch`` does."""
    plan = graph.gpu_engine.plans[graph.gpu_engine.key(batch)]
    proj = ["full" if s.option.mode.endswith("full") else "selective" for s in plan.steps]
    return Decoder(index, heads, 16, engine="reference", projection=proj, catalog=catalog)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_with_lists_matches_the_reference_on_gpu():
    g, catalog, index, heads, hidden_fn = gpu_case()
    n = catalog.n_items
    graph = Decoder(index, heads, 16, engine="graph", catalog=catalog)
    for batch in (1, 4):
        cases = [(None, [g.choice(n, 5000, replace=False) for _ in range(batch)]),
                 ([g.choice(n, n // 100, replace=False) for _ in range(batch)], None),
                 ([g.choice(n, 7, replace=False)] + [None] * (batch - 1), None)]
        # each normalisation captures its own graph
        for (allow, deny), normalise in itertools.product(cases, ("request", "catalog")):
            lists = graph.request_lists(batch, allow, deny, normalise=normalise)
            a = graph.decode(hidden_fn, batch, lists=lists)
            assert graph.gpu_engine.graph_error is None
            b = reference_of(graph, batch, index, heads, catalog).decode(hidden_fn, batch, lists=lists)
            assert torch.equal(a.item_rows, b.item_rows)
            torch.testing.assert_close(a.scores, b.scores, rtol=1e-4, atol=1e-4)
            rows = a.item_rows.cpu().numpy()
            for r in range(batch):
                assert lists.allows(r, rows[r][rows[r] >= 0]).all()
