"""Deny lists shipped as raw ids: the kernel that resolves them equals its reference, and
the engine decodes them exactly as the host-built lists of the same ids."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_core import Decoder, build_index
from zerogr_core.errors import ZeroGRError
from zerogr_core.decode.id_lists import MIN_WIDTH, DenyIds, deny_ids
from zerogr_kernels.deny_ids import (IN_PLACE_WIDTH, MAX_IDS, MAX_WIDTH, WIDE_BLOCK, deny_rows, deny_rows_reference,
                                     deny_rows_triton)
from zerogr_kernels.list_spans import longest_run

from zerogr_kernels.row_marks import mark_rows_reference, mark_words

from kernel_asserts import kernel_device
from test_constraints import Model, gpu_case
from test_device_lists import catalog_of

DEV = kernel_device()  # a GPU compiles the kernels, which then take CUDA tensors only


def case(seed, batch, width, n_ids, table_size, base):
    """``deny_rows``'s arguments: ids with repeats and misses below, inside and above the
    table, a table with holes, and rows that start after 5 entries the op must leave alone."""
    g = np.random.default_rng(seed)
    n_known = table_size * 2 // 3
    table = np.full(table_size, -1, dtype=np.int32)
    table[g.choice(table_size, n_known, replace=False)] = g.permutation(n_known).astype(np.int32)
    counts = g.integers(0, min(n_ids, width) + 1, batch)
    ids = g.integers(base - 3, base + table_size + 3, int(counts.sum()) + 4)  # 4 more past the last
    id_offsets = np.concatenate([[0], np.cumsum(counts)])
    offsets = np.concatenate([[0, 0], np.arange(1, batch + 1) * width]) + 5
    t = lambda a: torch.from_numpy(a).to(DEV)  # noqa: E731
    return (t(ids.astype(np.int64)), t(id_offsets.astype(np.int64)), width, t(table), base,
            torch.full((batch * width + 7,), -9, dtype=torch.int64, device=DEV), t(offsets.astype(np.int64)), n_known)


def run(fn, args):
    out = list(args)
    out[5] = args[5].clone()
    return fn(*out)


def assert_matches_reference(fn, args) -> None:
    want, got = run(deny_rows_reference, args), run(fn, args)
    bad = (want != got).nonzero().flatten()
    assert not bad.numel(), f"first mismatches at {bad[:5].tolist()}: {got[bad[:5]].tolist()} != {want[bad[:5]].tolist()}"


@pytest.mark.parametrize("batch,width,n_ids,table_size,base", [
    (1, 16, 0, 10, 0), (3, 16, 16, 40, 7), (5, 64, 40, 30, -4), (2, 128, 128, 1000, 100), (1, 16, 9, 3, 0)])
def test_kernel_matches_reference(batch, width, n_ids, table_size, base):
    for seed in range(3):
        assert_matches_reference(deny_rows_triton, case(seed, batch, width, n_ids, table_size, base))


@pytest.mark.parametrize("batch,width,n_ids,table_size,base", [
    (1, 2 * MAX_WIDTH, 0, 10, 0), (3, 2 * MAX_WIDTH, 3000, 4000, 7), (2, 4 * MAX_WIDTH, 8000, 500, -4),
    (1, 4 * MAX_WIDTH, 5000, 100_000, 100)])
def test_wide_path_matches_reference(batch, width, n_ids, table_size, base):
    """Past MAX_WIDTH: the lookup kernel, torch's sort, then the compaction kernels, whose blocks
    of WIDE_BLOCK ids each continue where the blocks before stopped (repeats across them)."""
    assert width > MAX_WIDTH and width % WIDE_BLOCK == 0
    for seed in range(2):
        assert_matches_reference(deny_rows_triton, case(seed, batch, width, n_ids, table_size, base))


@pytest.mark.parametrize("width", [16, 64, 2 * MAX_WIDTH])
@pytest.mark.parametrize("shift", [0, 2])
def test_marks_set_with_the_rows_match_mark_rows(width, shift):
    """With ``marks`` the op leaves the bitmap of the rows it wrote (stale bits cleared), set by
    the launch that writes them (the sorting kernel, or the wide path's compaction)."""
    for seed, (batch, n_ids, size) in enumerate([(3, 16, 40), (2, 50, 300), (1, 0, 10), (2, 16, 5000)]):
        args = case(seed, batch, width, n_ids, size, 3)
        n_words = mark_words(args[7] << shift)
        want = mark_rows_reference(args[6], run(deny_rows_reference, args),
                                   torch.zeros(n_words, dtype=torch.int32, device=DEV), shift)
        for f in (deny_rows_triton, deny_rows_reference):
            out = list(args)
            out[5] = args[5].clone()
            marks = torch.full((n_words,), -1, dtype=torch.int32, device=DEV)
            f(*out, marks=marks, mark_shift=shift)
            assert torch.equal(marks, want), (f.__name__, (marks != want).nonzero()[:5].tolist())


@pytest.mark.parametrize("width", [64, 2 * MAX_WIDTH])
def test_rows_past_int32_keep_int64_keys(width):
    """A catalog of 2^31 rows or more: both paths sort the rows as int64, not narrowed to int32."""
    ids, id_offsets, width, table, base, rows, offsets, n_rows = case(4, 3, width, 60, 200, 9)
    big = 2**31 + 3
    table = torch.where(table >= 0, table.long() + big - n_rows, table.long())
    args = (ids, id_offsets, width, table, base, rows, offsets, big)
    assert_matches_reference(deny_rows_triton, args)
    got = run(deny_rows_triton, args)[5:5 + 3 * width]
    assert (got >= big - n_rows).all() and (got < big).sum() > 3


def run_case(seed, batch, width, n_ids, n_rows):
    """``deny_rows``'s arguments over a table that maps id ``v`` to row ``v`` (a few holes), each
    request's ids drawn as runs of consecutive ids, with repeats and misses."""
    g = np.random.default_rng(seed)
    table = np.arange(n_rows, dtype=np.int32)
    table[g.choice(n_rows, n_rows // 20, replace=False)] = -1
    parts = []
    for _ in range(batch):
        runs = [np.arange(a, a + n) for a, n in zip(g.integers(-2, n_rows, 8), g.integers(1, 40, 8))]
        part = g.permutation(np.concatenate(runs + [g.integers(-2, n_rows + 2, 10)]))[:int(g.integers(0, n_ids + 1))]
        parts.append(part)
    id_offsets = np.concatenate([[0], np.cumsum([p.size for p in parts])])
    offsets = np.concatenate([[0, 0], np.arange(1, batch + 1) * width])
    t = lambda a: torch.from_numpy(np.asarray(a).astype(np.int64)).to(DEV)  # noqa: E731
    return (t(np.concatenate(parts + [np.zeros(1)])), t(id_offsets), width, torch.from_numpy(table).to(DEV), 0,
            torch.zeros(batch * width, dtype=torch.int64, device=DEV), t(offsets), n_rows)


@pytest.mark.parametrize("width,n_ids", [(16, 16), (128, 100), (MAX_WIDTH, 700), (2 * MAX_WIDTH, 2000),
                                         (4 * MAX_WIDTH, 4096)])
def test_spans_bound_each_requests_longest_run(width, n_ids):
    """``spans``: up to MAX_WIDTH each request's longest run of consecutive rows, exactly; past
    it one more than the rows that continue a run (never below the longest run, never above
    the distinct rows); the kernel's equal its reference's, and the rows are unchanged."""
    for seed in range(3):
        args = run_case(seed, 3, width, n_ids, 3 * width)
        got, want = (torch.full((3,), -1, dtype=torch.int64, device=DEV) for _ in range(2))
        rows = run(deny_rows_triton, args)
        assert torch.equal(rows, run(deny_rows_reference, args))
        run(lambda *a: deny_rows_triton(*a, spans=got), args)
        run(lambda *a: deny_rows_reference(*a, spans=want), args)
        assert got.tolist() == want.tolist()
        for r in range(3):
            seg = rows[r * width:(r + 1) * width]
            seg = seg[seg < args[7]]
            assert longest_run(seg) <= int(got[r]) <= seg.numel()
            if width <= MAX_WIDTH:
                assert int(got[r]) == longest_run(seg)
        assert int(got.max()) > 2  # the runs reached the rows


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(0, 10**6), st.integers(1, 4), st.sampled_from([16, 32]), st.integers(1, 60))
def test_reference_rows_are_each_requests_distinct_known_rows(seed, batch, width, table_size):
    ids, id_offsets, width, table, base, rows, offsets, n_rows = case(seed, batch, width, width, table_size, 2)
    deny_rows(ids, id_offsets, width, table, base, rows, offsets, n_rows)
    assert (rows[:5] == -9).all() and (rows[5 + batch * width:] == -9).all()  # nothing else written
    for r in range(batch):
        seg = rows[int(offsets[r + 1]):int(offsets[r + 1]) + width].cpu().numpy()
        given_ids = ids[int(id_offsets[r]):int(id_offsets[r + 1])].cpu().numpy() - base
        inside = given_ids[(given_ids >= 0) & (given_ids < table_size)]
        want = np.unique(table.cpu().numpy()[inside])
        want = want[want >= 0]
        assert seg[:want.size].tolist() == want.tolist()
        assert (seg[want.size:] == n_rows).all()


def test_kernel_rejects_bad_arguments():
    ids, id_offsets, width, table, base, rows, offsets, n_rows = case(0, 2, 16, 4, 10, 0)
    with pytest.raises(ValueError, match="power of two"):
        deny_rows(ids, id_offsets, 12, table, base, rows, offsets, n_rows)
    with pytest.raises(ValueError, match="at most"):
        deny_rows_triton(ids, id_offsets, 2 * MAX_IDS, table, base, rows, offsets, n_rows)
    with pytest.raises(ValueError, match="offsets"):
        deny_rows(ids, id_offsets, width, table, base, rows, offsets[:3], n_rows)


def test_calls_that_do_not_qualify_keep_the_host_lists():
    catalog = catalog_of(100, 1)
    ids = catalog.item_ids
    assert deny_ids(catalog, 2, [ids[:3], None], "request").width == MIN_WIDTH
    assert deny_ids(catalog, 2, [ids[:40], list(ids[:3])], "request").width == 64
    assert deny_ids(catalog, 2, "reg", "request") is None  # a registered name
    assert deny_ids(catalog, 2, [ids[:3], "reg"], "request") is None
    assert deny_ids(catalog, 2, [ids[:3]], "request") is None  # the wrong length: refused elsewhere
    assert deny_ids(catalog, 1, [ids.astype(str)[:3]], "request") is None  # ids given as strings
    assert deny_ids(catalog, 1, [np.arange(MAX_WIDTH + 1)], "request").width == 2 * MAX_WIDTH
    assert deny_ids(catalog, 1, [np.arange(MAX_IDS + 1)], "request") is None
    assert deny_ids(catalog, 2, [ids[:3], 7], "request") is None  # a bare id: refused elsewhere
    assert deny_ids(catalog, 1, [np.ones((2, 2), dtype=np.int64)], "request") is None
    assert deny_ids(catalog, 1, [[0.5, 2.0]], "request") is None
    # tensors: on the engine's device they stay tensors, elsewhere on the host they are arrays
    t = torch.from_numpy(ids[:40])
    on = deny_ids(catalog, 2, [t, ids[:3]], "request", device="cpu")
    assert on.parts[0] is t and on.on_device and on.copied and on.width == 64 and on.ends.tolist() == [40, 43]
    off = deny_ids(catalog, 2, [t, None], "request")
    assert isinstance(off.parts[0], np.ndarray) and not off.on_device and not off.copied
    assert deny_ids(catalog, 1, [t.to(torch.int32)], "request", device="cpu").parts[0].dtype == torch.int64
    assert deny_ids(catalog, 1, [t.double()], "request", device="cpu") is None
    assert deny_ids(catalog, 1, [t.reshape(2, 20)], "request", device="cpu") is None
    assert deny_ids(catalog, 1, [t > 3], "request", device="cpu") is None
    # past IN_PLACE_WIDTH numpy ids are copied first; up to it (and at every width, if it is MAX_IDS) they are not
    widest = deny_ids(catalog, 1, [np.arange(min(IN_PLACE_WIDTH + 1, MAX_IDS))], "request")
    assert widest.copied == (IN_PLACE_WIDTH < MAX_IDS) and widest.wide
    assert not deny_ids(catalog, 1, [np.arange(IN_PLACE_WIDTH)], "request").copied


def test_id_lists_leave_the_device_table_to_the_engine():
    """Building a call's id lists does no device work: the engine copies the catalog's id table
    under its lock, so a first call never copies while another thread captures a graph."""
    from zerogr_core.decode.device_lists import _TABLES
    from zerogr_core.decode.id_lists import AllowIds, allow_ids

    catalog = catalog_of(100, 2)
    index = build_index(catalog)
    ids = catalog.item_ids
    assert isinstance(deny_ids(catalog, 2, [ids[:3], None], "request"), DenyIds)
    assert isinstance(allow_ids(catalog, index, 2, [ids[:3], None], "request"), AllowIds)
    assert catalog._id_lookup not in _TABLES


def engine_case(plan, n_items=300):
    """``(catalog, index, model, engine, ref)``: the GPU engine's code on a CPU (no graph) with a
    fixed ``plan``, and the reference decoder projecting as it does, over ``n_items`` items of 3
    steps of 8 tokens."""
    from zerogr_core.decode.engine import GpuEngine
    from zerogr_core.decode.heads import Heads

    catalog = catalog_of(n_items, 5)
    sizes = catalog.codebook_sizes
    index = build_index(catalog)
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s)) for s in sizes]
    model = Model(sizes, 6, 3, 9)
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 5, plan_override=plan, use_graph=False)
    ref = Decoder(index, heads, 5, projection=plan, catalog=catalog, engine="reference")
    return catalog, index, model, engine, ref


def assert_result_as(got, want, host) -> None:
    """``got`` (a decode of lists resolved on the device) is ``want`` (the decode of ``host``, the
    host-built lists of the same ids): the same items, tokens and scores, every item allowed."""
    assert torch.equal(got.item_rows, want.item_rows) and torch.equal(got.tokens, want.tokens), \
        f"{got.item_rows.tolist()} != {want.item_rows.tolist()}"
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
    rows = got.item_rows.cpu().numpy()
    for r in range(host.batch):
        assert host.allows(r, rows[r][rows[r] >= 0]).all()


def assert_decodes_as(engine, ref, model, fast, host) -> None:
    """The engine decodes ``fast`` as the reference decodes ``host`` (:func:`assert_result_as`)."""
    assert_result_as(engine.decode(model, host.batch, lists=fast), ref.decode(model, host.batch, lists=host), host)


def over_plans(test):
    """``test(plan, normalise)`` for two fixed plans of :func:`engine_case` and both normalisations."""
    plans = pytest.mark.parametrize("plan", [["selective", "full", "selective"], ["full", "selective", "full"]])
    return pytest.mark.parametrize("normalise", ["request", "catalog"])(plans(test))


@over_plans
def test_engine_decodes_deny_ids_as_host_lists(plan, normalise):
    catalog, index, model, engine, ref = engine_case(plan)
    ids = catalog.item_ids
    g = np.random.default_rng(3)
    # repeats, misses, an empty list, whole prefixes denied, then a wider call
    calls = [[ids[:20], None, np.array([ids[7], ids[7], -1, 10**9])],
             [np.array([], dtype=np.int64), ids[g.permutation(300)[:15]], ids[::11]],
             [ids[:250], ids[50:60], None],
             [np.tile(ids, 5), ids[:3], None],  # 1,500 ids: the wide path (in place on a GPU)
             [np.tile(ids[::2], 20), None, ids[:5]],  # 3,000 ids: copied first on a GPU
             [ids[3:6], None, None]]  # narrower again: the narrow shape serves it, not a wide one
    for deny in calls:
        fast = deny_ids(catalog, 3, deny, normalise)
        assert isinstance(fast, DenyIds)
        assert_decodes_as(engine, ref, model, fast, ref.request_lists(3, None, deny, normalise=normalise, path="host"))
    # one shape per class (read in place or copied, sorted in registers or by torch), each as wide as
    # its widest call
    shapes = {key[-1]: shape.lists.width for key, shape in engine._shapes.items() if "lists" in key}
    want = {("ids", False, False): 256, ("ids", 3000 > IN_PLACE_WIDTH, True): 4096}
    if 3000 > IN_PLACE_WIDTH:
        want[("ids", False, True)] = 2048
    assert shapes == want, shapes


@over_plans
def test_engine_decodes_device_deny_ids_as_host_lists(plan, normalise):
    """Ids in tensors on the engine's device (here the CPU's), alone or beside numpy ids, decode as
    the host lists of the same ids; their shape copies the ids into the device block, apart from the
    shape whose ids are read where the call wrote them."""
    catalog, index, model, engine, ref = engine_case(plan)
    ids = catalog.item_ids
    t = torch.from_numpy
    calls = [[t(ids[:20]), None, t(np.array([ids[7], ids[7], -1, 10**9]))],
             [ids[::11], t(ids[50:60]).to(torch.int32), t(np.array([], dtype=np.int64))],
             [t(np.tile(ids, 5)), ids[:3], None],  # 1,500 ids
             [t(ids[3:6]), None, ids[40:45]]]  # narrower again
    for deny in calls:
        fast = deny_ids(catalog, 3, deny, normalise, device=index.device)
        assert fast.on_device
        assert_decodes_as(engine, ref, model, fast, ref.request_lists(3, None, deny, normalise=normalise, path="host"))
        numpy_ids = [None if d is None else np.asarray(d) for d in deny]
        assert_decodes_as(engine, ref, model, deny_ids(catalog, 3, numpy_ids, normalise),
                          ref.request_lists(3, None, numpy_ids, normalise=normalise, path="host"))
    shapes = {key[-1]: shape.lists for key, shape in engine._shapes.items() if "lists" in key}
    assert set(shapes) == {("ids", True, False), ("ids", True, True), ("ids", False, False), ("ids", False, True)}
    assert shapes[("ids", True, True)].width == 2048 and shapes[("ids", True, False)].width == 32
    assert not any(shapes[("ids", True, wide)].in_place for wide in (False, True))


@pytest.mark.parametrize("normalise", ["request", "catalog"])
def test_steps_whose_prefixes_outgrow_the_width_run_without_lists(normalise):
    """Every item of 8 × 8 × 8: the first step's successors hold 64 rows, more than 16 ids can
    deny, so the 16-wide shape filters that step without its lists and waits for them at the
    second; there a run of 8 ids still empties the prefix of each request's best item (rows in
    SID order: 8 rows per second-step prefix), and the decodes equal those of the host lists."""
    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    by_row = catalog.item_ids  # rows are in SID order
    best = [int(r) // 8 * 8 for r in engine.decode(model, 3).item_rows[:, 0]]
    calls = [[by_row[best[0]:best[0] + 8], None, np.concatenate([by_row[best[2]:best[2] + 8], by_row[::90]])],
             [None, by_row[best[1]:best[1] + 8], by_row[[3, 200, 201]]]]
    for deny in calls:
        fast = deny_ids(catalog, 3, deny, normalise)
        assert fast.width == 16
        assert_decodes_as(engine, ref, model, fast, ref.request_lists(3, None, deny, normalise=normalise, path="host"))
    (shape,) = [shape for key, shape in engine._shapes.items() if "lists" in key]
    lists = [runner.slot_lists for runner in shape.runners]
    waits = [runner.prepare_lists is not None for runner in shape.runners]
    assert lists[0] is None and lists[1] is not None and lists[2] is not None and waits == [False, True, False]
    assert lists[1].spans is shape.lists.spans and int(shape.lists.spans[0]) == 0


@pytest.mark.parametrize("normalise", ["request", "catalog"])
def test_one_wide_request_decodes_as_its_host_lists(normalise):
    """Batch 1 past MAX_WIDTH ids: the prefix of the best item denied whole, repeated and scattered
    ids, then a second call whose rows the first one's must not leak into; every decode equals that
    of the host lists of the same ids."""
    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"], 512)
    by_row = catalog.item_ids  # rows are in SID order
    best = int(engine.decode(model, 1).item_rows[0, 0]) // 8 * 8
    calls = [[np.tile(np.concatenate([by_row[best:best + 8], by_row[::7]]), 20)],
             [np.tile(by_row[300:310], 150)]]
    for deny in calls:
        fast = deny_ids(catalog, 1, deny, normalise)
        assert fast.width > MAX_WIDTH
        assert_decodes_as(engine, ref, model, fast, ref.request_lists(1, None, deny, normalise=normalise, path="host"))


@pytest.mark.parametrize("order", ["filter-first", "unconstrained"])
def test_public_api_deny_only_calls_on_the_engine(order):
    """``Decoder.decode(deny_items=...)`` with the engine (its code on a CPU, as on a GPU): ids
    decode as the host lists of the same ids; entries that are all ``None`` or empty take the
    list-free path, also where lists are refused (an unconstrained decoder); ids that do not
    qualify (a bare id) still reach the host path, which refuses them."""
    catalog, index, model, engine, ref = engine_case(["full", "selective", "full"])
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s)) for s in catalog.codebook_sizes]
    dec = Decoder(index, heads, 5, catalog=catalog, order=order)  # engine_case's heads
    dec.gpu_engine = engine
    ids = catalog.item_ids
    plain = engine.decode(model, 3)
    for nothing in ([None, None, None], [np.array([], dtype=np.int64), [], None]):
        got = dec.decode(model, 3, deny_items=nothing)
        assert torch.equal(got.item_rows, plain.item_rows) and torch.equal(got.tokens, plain.tokens)
    if order == "unconstrained":
        with pytest.raises(ZeroGRError, match="constrained order"):
            dec.decode(model, 3, deny_items=[ids[:4], None, None])
        return
    for normalise in ("request", "catalog"):
        deny = [ids[:30], None, np.array([ids[9], ids[9], 10**9])]
        host = ref.request_lists(3, None, deny, normalise=normalise, path="host")
        assert_result_as(dec.decode(model, 3, deny_items=deny, normalise=normalise), ref.decode(model, 3, lists=host),
                         host)
        on_device = [None if d is None else torch.from_numpy(d) for d in deny]  # the index's device: the CPU
        assert_result_as(dec.decode(model, 3, deny_items=on_device, normalise=normalise),
                         ref.decode(model, 3, lists=host), host)
    with pytest.raises(ZeroGRError, match="deny_items"):
        dec.decode(model, 3, deny_items=[ids[:4], 7, None])


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("width", [16, 128, MAX_WIDTH, IN_PLACE_WIDTH, 4096, 16_384, MAX_IDS])
def test_cuda_kernel_matches_reference(width):
    for seed in range(3):
        args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in case(seed, 9, width, width, 5 * width, 11)]
        assert_matches_reference(deny_rows, args)  # the sorting kernel or the wide path
        # ids and their offsets read in place from pinned host memory
        pinned = list(args)
        pinned[0], pinned[1] = args[0].cpu().pin_memory(), args[1].cpu().pin_memory()
        want, got = run(deny_rows_reference, args), run(deny_rows, pinned)
        assert torch.equal(got, want), (got != want).nonzero()[:5].tolist()
        # the longest runs (their bound past MAX_WIDTH), over ids drawn as runs of consecutive rows
        runs = [a.cuda() if isinstance(a, torch.Tensor) else a for a in run_case(seed, 5, width, width, 3 * width)]
        spans = [torch.full((5,), -1, dtype=torch.int64, device="cuda") for _ in range(2)]
        assert torch.equal(run(lambda *a: deny_rows(*a, spans=spans[0]), runs),
                           run(lambda *a: deny_rows_reference(*a, spans=spans[1]), runs))
        assert spans[0].tolist() == spans[1].tolist() and int(spans[0].max()) > 1


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", ["graph", "eager"])
def test_cuda_public_api_deny_ids_equal_host_lists(engine):
    """Through ``Decoder.decode`` (a captured graph, or the engine's eager steps; ids resolved on
    a side stream beside the first step): the same items and scores as the host-built lists of
    the same ids, and none of them denied."""
    g, catalog, index, heads, hidden_fn = gpu_case()
    dec = Decoder(index, heads, 16, engine=engine, catalog=catalog)
    ids, n = catalog.item_ids, catalog.n_items
    for batch, normalise in ((1, "request"), (4, "request"), (4, "catalog"), (3, "request")):
        for widths in ((5, 0, 100, 2000), (2048, 17, 1, 0), (10_000, 3, 0, 5000)):
            deny = [ids[g.choice(n, widths[r % 4], replace=True)] if widths[r % 4] else None for r in range(batch)]
            assert isinstance(deny_ids(catalog, batch, deny, normalise), DenyIds)
            got = dec.decode(hidden_fn, batch, deny_items=deny, normalise=normalise)
            assert dec.gpu_engine.graph_error is None
            host = dec.request_lists(batch, None, deny, normalise=normalise, path="host")
            assert_result_as(got, dec.gpu_engine.decode(hidden_fn, batch, lists=host), host)
            # the same ids in CUDA tensors: copied device to device, never read in place
            on_gpu = [None if d is None else torch.from_numpy(d).cuda() for d in deny]
            assert deny_ids(catalog, batch, on_gpu, normalise, device=index.device).copied
            assert np.array_equal(dec.request_lists(batch, None, on_gpu, normalise=normalise, path="host").rows,
                                  host.rows)  # the host path takes them too
            assert_result_as(dec.decode(hidden_fn, batch, deny_items=on_gpu, normalise=normalise),
                             dec.gpu_engine.decode(hidden_fn, batch, lists=host), host)
        # calls queued without a synchronisation between them: each call's ids wait for the
        # previous decode to have read the pinned block before they overwrite it (read in place
        # up to IN_PLACE_WIDTH ids, copied past it)
        sizes = [50, 1500, 80, 3000, 20, 700, 2500, 5]
        lists = [[ids[g.choice(n, k + 7 * r)] for r in range(batch)] for k in sizes]
        got = [dec.decode(hidden_fn, batch, deny_items=d, normalise=normalise) for d in lists]
        for d, res in zip(lists, got):
            host = dec.request_lists(batch, None, d, normalise=normalise, path="host")
            want = dec.gpu_engine.decode(hidden_fn, batch, lists=host)
            assert torch.equal(res.item_rows, want.item_rows)
