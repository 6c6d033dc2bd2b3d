"""Allow lists given as raw ids, as bitmaps of alive successors: the rank structure finds each
row's state at every step, the kernel equals its reference, and a set bit means exactly that an
allowed row lies below the state."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_core import Catalog, build_index
from zerogr_core.decode.constraints import row_starts
from zerogr_kernels.allow_nodes import (allow_nodes, allow_nodes_reference, allow_nodes_triton, derive_tables,
                                        node_layout, rank_tables)

from kernel_asserts import kernel_device
from test_deny_ids import assert_decodes_as, assert_result_as, engine_case, over_plans

DEV = kernel_device()  # a GPU compiles the kernels, which then take CUDA tensors only


def on_dev(args):
    return [a.to(DEV) if isinstance(a, torch.Tensor) else a for a in args]


def index_of(n, seed, sizes=(8, 8, 8)):
    g = np.random.default_rng(seed)
    flat = g.choice(int(np.prod(sizes)), n, replace=False)
    catalog = Catalog.from_sids(np.stack(np.unravel_index(flat, sizes), 1), sizes,
                                item_ids=g.permutation(n) * 3 + 5)
    return catalog, build_index(catalog)


def layout_of(index):
    """``(starts, level_sizes)`` of an index: the row starts of every step but the last and the
    successor states of every step."""
    starts = row_starts(index)[:-1]
    return starts, [s.numel() - 1 for s in starts] + [index.n_items]


def case(seed, batch, n_ids, sizes=(8, 8, 8)):
    g = np.random.default_rng(seed)
    catalog, index = index_of(int(g.integers(1, min(200, int(np.prod(sizes))) + 1)), seed, sizes)
    starts, level_sizes = layout_of(index)
    bits, before = rank_tables(starts, index.n_items)
    words, stride = node_layout(level_sizes)
    lookup = catalog._id_lookup
    table = torch.from_numpy(lookup.table)
    counts = g.integers(0, n_ids + 1, batch)
    counts[g.integers(0, batch)] = 0  # an empty request
    # ids of the catalog, repeats, its holes and misses on both sides, then filler past the last
    pool = np.concatenate([catalog.item_ids, catalog.item_ids[:3], [lookup.base - 2, lookup.base + table.numel() + 4,
                                                                   catalog.item_ids.max() - 1]])
    ids = np.concatenate([g.choice(pool, int(counts.sum())), [catalog.item_ids[0]] * 5])
    t = torch.from_numpy
    return (catalog, index, t(ids.astype(np.int64)), t(np.concatenate([[0], np.cumsum(counts)]).astype(np.int64)),
            table, lookup.base, bits, before, torch.tensor(words, dtype=torch.int64),
            torch.full((batch, stride), -7, dtype=torch.int32))


def run(fn, args, derived=()):
    *head, nodes = args
    return fn(*head, nodes.clone(), derived)


def derived_of(index, steps):
    """:func:`derive_tables` of ``index`` for its first ``steps`` steps."""
    starts, level_sizes = layout_of(index)
    return derive_tables(starts, node_layout(level_sizes)[0], steps)


def assert_nodes_equal(got, want, level_words, label):
    """Bitmaps equal, else the first differing words: request, step (by ``level_words``), word, both values."""
    bad = (got != want).nonzero().cpu()
    if bad.numel():
        starts = level_words.cpu().tolist()
        where = [(r, sum(w >= s for s in starts) - 1, w) for r, w in bad[:6].tolist()]
        raise AssertionError(f"{label}: {bad.shape[0]} words differ; first (request, step, word): {where}, got "
                             f"{got[tuple(bad[:6].T)].tolist()}, want {want[tuple(bad[:6].T)].tolist()}")


@given(n=st.integers(1, 300), seed=st.integers(0, 10**6), levels=st.integers(1, 4))
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
def test_rank_tables_find_each_rows_state(n, seed, levels):
    sizes = (7, 5, 9, 4)[:levels]
    _, index = index_of(min(n, int(np.prod(sizes))), seed, sizes)
    starts, _ = layout_of(index)
    bits, before = rank_tables(starts, index.n_items)
    rows = torch.arange(index.n_items)
    for level, s in enumerate(starts):
        want = torch.searchsorted(s[:-1].long(), rows, right=True) - 1
        w = rows >> 5
        word = bits[level, w].long() & 0xFFFFFFFF
        upto = (2 << (rows & 31)) - 1
        got = before[level, w].long() + torch.tensor([bin(int(x)).count("1") for x in word & upto]) - 1
        bad = (got != want).nonzero().flatten()
        assert not bad.numel(), \
            f"level {level}: rows {bad[:5].tolist()} -> {got[bad[:5]].tolist()} != {want[bad[:5]].tolist()}"


@pytest.mark.parametrize("derive", [0, 1, 2])
@pytest.mark.parametrize("seed,batch,n_ids", [(0, 1, 0), (1, 1, 30), (2, 3, 40), (3, 5, 200), (4, 2, 1500)])
def test_kernel_matches_reference(seed, batch, n_ids, derive):
    """Every step set bit by bit, or the first one or two derived from the next (the reference sets
    them all bit by bit)."""
    full = case(seed, batch, n_ids)
    args = on_dev(full[2:])
    derived = tuple((t[0].to(DEV), *t[1:]) for t in derived_of(full[1], derive))
    assert_nodes_equal(run(allow_nodes_triton, args, derived), run(allow_nodes_reference, args),
                       full[-2], f"derive {derive}")


def test_kernel_on_a_one_level_catalog():
    args = on_dev(case(5, 3, 20, sizes=(64,))[2:])
    assert args[-2].numel() == 1  # one step: its successors are the rows
    assert torch.equal(run(allow_nodes_reference, args), run(allow_nodes_triton, args))


@pytest.mark.parametrize("seed", range(4))
def test_a_set_bit_means_an_allowed_row_below(seed):
    catalog, index, ids, id_offsets, table, base, bits, before, words, nodes = case(seed, 4, 60)
    allow_nodes(ids, id_offsets, table, base, bits, before, words, nodes)
    starts = row_starts(index)
    rows_of = catalog._id_lookup
    for r in range(nodes.shape[0]):
        given_ids = ids[int(id_offsets[r]):int(id_offsets[r + 1])].numpy()
        pos = given_ids - rows_of.base
        ok = (pos >= 0) & (pos < rows_of.table.size)
        allowed = np.unique(rows_of.table[pos[ok]])
        allowed = allowed[allowed >= 0]
        for level in range(index.n_levels):
            n_states = starts[level].numel() - 1 if starts[level] is not None else index.n_items
            q = np.arange(n_states)
            if starts[level] is None:
                want = np.isin(q, allowed)
            else:
                s = starts[level].numpy()
                want = np.searchsorted(allowed, s[1:]) > np.searchsorted(allowed, s[:-1])
            word = nodes[r, int(words[level]) + (q >> 5)].numpy().astype(np.int64)
            got = ((word >> (q & 31)) & 1) == 1
            assert (got == want).all(), f"request {r}, step {level}: states {np.flatnonzero(got != want)[:5]}"


def test_rejects_bad_arguments():
    *_, ids, id_offsets, table, base, bits, before, words, nodes = case(0, 2, 5)
    with pytest.raises(ValueError, match="id_offsets"):
        allow_nodes(ids, id_offsets[:2], table, base, bits, before, words, nodes)
    with pytest.raises(TypeError, match="nodes"):
        allow_nodes(ids, id_offsets, table, base, bits, before, words, nodes.long())
    with pytest.raises(ValueError, match="level_words"):
        allow_nodes(ids, id_offsets, table, base, bits, before, torch.zeros(9, dtype=torch.int64), nodes)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_kernel_on_a_one_level_catalog():
    """One step, whose successors are the rows: the kernel compiles for the GPU and equals the reference
    (Triton failed to compile it with its level count specialised to 1)."""
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in case(5, 3, 20, sizes=(64,))[2:]]
    assert args[-2].numel() == 1
    assert torch.equal(run(allow_nodes_reference, args), run(allow_nodes_triton, args))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("seed,batch,n_ids", [(1, 1, 30), (3, 5, 200), (4, 8, 3000)])
def test_cuda_kernel_matches_reference(seed, batch, n_ids):
    full = case(seed, batch, n_ids)
    args = [a.cuda() if isinstance(a, torch.Tensor) else a for a in full[2:]]
    want = run(allow_nodes_reference, args)
    for derive in (0, 1, 2):
        derived = tuple((t[0].cuda(), *t[1:]) for t in derived_of(full[1], derive))
        assert_nodes_equal(run(allow_nodes_triton, args, derived), want, full[-2], f"derive {derive}")


@over_plans
def test_engine_decodes_allow_ids_as_host_lists(plan, normalise):
    from zerogr_core.decode.id_lists import AllowIds, allow_ids

    catalog, index, model, engine, ref = engine_case(plan)
    ids = catalog.item_ids
    g = np.random.default_rng(3)
    # repeats and misses, a request without a list, an empty list (nothing allowed), a list under
    # the beam width, ids as tensors, a whole prefix, then a call with more ids (a larger buffer)
    calls = [[ids[:20], None, np.array([ids[7], ids[7], -1, 10**9, ids[40]])],
             [np.array([], dtype=np.int64), ids[g.permutation(300)[:15]], torch.from_numpy(ids[::11])],
             [ids[:3], list(ids[50:60]), None],
             [np.tile(ids, 5), ids[:250], torch.from_numpy(ids[100:101]).int()],
             [ids[3:6], None, None]]
    for allow in calls:
        fast = allow_ids(catalog, index, 3, allow, normalise)
        assert isinstance(fast, AllowIds)
        host_allow = [a.numpy() if isinstance(a, torch.Tensor) else a for a in allow]
        assert_decodes_as(engine, ref, model, fast, ref.request_lists(3, host_allow, None, normalise=normalise,
                                                                      path="host"))
    capacities = sorted(shape.capacity for key, shape in engine._shapes.items() if "allow-ids" in key)
    assert capacities == [2048]  # one shape, grown once to the widest call


def test_public_api_routes_allow_only_calls_to_bitmaps():
    from zerogr_core import Decoder
    from zerogr_core.decode.engine import GpuEngine
    from zerogr_core.decode.heads import Heads
    from zerogr_core.decode.id_lists import AllowIds

    from test_constraints import Model
    from test_device_lists import catalog_of

    catalog = catalog_of(200, 7)
    index = build_index(catalog)
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s)) for s in catalog.codebook_sizes]
    model = Model(catalog.codebook_sizes, 6, 2, 4)
    dec = Decoder(index, heads, 5, catalog=catalog)
    # the GPU engine's code, run on a CPU (the Triton interpreter, or the references)
    dec.gpu_engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 5, use_graph=False)
    ref = Decoder(index, heads, 5, catalog=catalog, engine="reference")
    ids = catalog.item_ids
    allow = [ids[:40], torch.from_numpy(ids[100:180])]
    # on a CPU, "auto" keeps the row lists; "device" takes the bitmaps
    assert dec._allow_ids(2, allow, None, "request", None, None) is None
    dec.list_path = "device"
    assert isinstance(dec._allow_ids(2, allow, None, "request", None, None), AllowIds)
    assert isinstance(dec._allow_ids(2, allow, [None, np.array([], dtype=np.int64)], "request", None, None), AllowIds)
    for call in ([ids[:40], None], allow):
        for normalise in ("request", "catalog"):
            got = dec.decode(model, 2, allow_items=call, normalise=normalise)
            want = ref.decode(model, 2, allow_items=[c.numpy() if isinstance(c, torch.Tensor) else c for c in call],
                              normalise=normalise)
            assert torch.equal(got.item_rows, want.item_rows)
            torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
    assert any("allow-ids" in key for key in dec.gpu_engine._shapes)
    # calls that keep the row lists: a deny list beside, a registered name, ids that are not integers
    dec.register_items("some", ids[:30], kind="allow", index=False)
    for allow_items, deny_items in (([ids[:5], None], [None, ids[:3]]), ("some", None), (["some", None], None),
                                    ([ids[:5].astype(float), None], None), ([None, None], None)):
        assert dec._allow_ids(2, allow_items, deny_items, "request", None, None) is None, (allow_items, deny_items)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("engine", ["graph", "eager"])
def test_cuda_public_api_allow_ids_equal_host_lists(engine):
    """Through ``Decoder.decode`` on a GPU (a captured graph, or the engine's eager steps): allow ids as
    numpy arrays, pinned tensors and device tensors take the bitmaps, and return the same items and
    scores as the host-built lists of the same ids, every one of them allowed; calls queued without a
    synchronisation each return their own lists' result."""
    from zerogr_core import Decoder
    from zerogr_core.decode.device_lists import DEVICE_MIN_IDS

    from test_constraints import gpu_case

    g, catalog, index, heads, hidden_fn = gpu_case()
    dec = Decoder(index, heads, 16, engine=engine, catalog=catalog)
    ids, n = catalog.item_ids, catalog.n_items
    forms = (lambda a: a, lambda a: torch.from_numpy(a).pin_memory(), lambda a: torch.from_numpy(a).cuda())
    for batch, normalise in ((1, "request"), (4, "request"), (4, "catalog"), (3, "request")):
        for sizes in ((DEVICE_MIN_IDS, 0, 100, 5), (n // 2, 17, 1, 0), (3, DEVICE_MIN_IDS, 0, 5000)):
            allow = [forms[r % 3](ids[g.choice(n, sizes[r % 4])]) if sizes[r % 4] else None for r in range(batch)]
            if not any(a is not None for a in allow):
                continue
            dec.list_path = "device"  # every size takes the bitmaps (auto: from DEVICE_MIN_IDS ids)
            got = dec.decode(hidden_fn, batch, allow_items=allow, normalise=normalise)
            assert any("allow-ids" in key for key in dec.gpu_engine._shapes)
            assert dec.gpu_engine.graph_error is None
            host_allow = [a.cpu().numpy() if isinstance(a, torch.Tensor) else a for a in allow]
            host = dec.request_lists(batch, host_allow, None, normalise=normalise, path="host")
            assert_result_as(got, dec.gpu_engine.decode(hidden_fn, batch, lists=host), host)
        queued = [[ids[g.choice(n, 50 + 900 * k + 7 * r)] for r in range(batch)] for k in range(6)]
        results = [dec.decode(hidden_fn, batch, allow_items=a, normalise=normalise) for a in queued]
        for a, res in zip(queued, results):
            host = dec.request_lists(batch, a, None, normalise=normalise, path="host")
            assert torch.equal(res.item_rows, dec.gpu_engine.decode(hidden_fn, batch, lists=host).item_rows)
