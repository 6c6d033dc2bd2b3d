"""Per-call lists built on the device (torch, here on CPU tensors) are exactly the host
path's lists, and decode to the same beams through the reference and the engine."""
import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_core import Catalog, Decoder, build_index
from zerogr_core.decode.constraints import RequestLists, build_lists
from zerogr_core.decode.list_buffers import ListBuffers
from zerogr_core.decode.device_lists import DEVICE_MIN_IDS, DeviceRequestLists, build_lists_on, listed_ids
from zerogr_core.decode.registry import ListRegistry, RegisteredList

from test_constraints import Model


def catalog_of(n, seed, gap=3):
    g = np.random.default_rng(seed)
    sizes = (8, 8, 8)
    flat = g.choice(512, n, replace=False)
    ids = g.permutation(n) * gap + 5  # dense integer ids with holes
    return Catalog.from_sids(np.stack(np.unravel_index(flat, sizes), 1), sizes, item_ids=ids)


def same(host: RequestLists, dev: DeviceRequestLists):
    got = dev.to_host()
    assert got.offsets.tolist() == host.offsets.tolist()
    assert got.rows.tolist() == host.rows.tolist()
    assert got.mode.tolist() == host.mode.tolist()
    assert got.glob.tolist() == host.glob.tolist() and got.normalise == host.normalise
    assert int(dev.offsets[-1]) <= dev.rows.numel()  # the buffer bounds the rows it holds


@st.composite
def requests(draw):
    n = draw(st.integers(1, 120))
    catalog = catalog_of(n, draw(st.integers(0, 10**6)))
    batch = draw(st.integers(1, 6))
    # ids drawn from the catalog's, its holes and beyond both ends: misses on every side
    pool = st.integers(-3, int(catalog.item_ids.max()) + 6)
    one = st.one_of(st.none(), st.lists(pool, max_size=40), st.just("reg-allow"), st.just("reg-deny"))
    allow = draw(st.lists(one, min_size=batch, max_size=batch))
    deny = draw(st.lists(one, min_size=batch, max_size=batch))
    allow = [a if a != "reg-deny" else None for a in allow]
    deny = [d if d != "reg-allow" else None for d in deny]
    glob = draw(st.sets(st.integers(0, n - 1), max_size=10))
    return catalog, batch, allow, deny, np.array(sorted(glob), dtype=np.int64), draw(
        st.sampled_from(["request", "catalog"])), draw(st.integers(0, 10**6))


def registry_for(catalog, seed):
    g = np.random.default_rng(seed)
    reg = ListRegistry()
    for name, kind in (("reg-allow", "allow"), ("reg-deny", "deny")):
        rows = np.unique(g.choice(catalog.n_items, g.integers(0, catalog.n_items + 1)))
        reg.add(RegisteredList(name, kind, rows.astype(np.int64)))
    return reg


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_device_path_builds_the_host_lists(case):
    catalog, batch, allow, deny, glob, normalise, seed = case
    reg = registry_for(catalog, seed)
    as_arrays = [None if d is None or isinstance(d, str) else np.asarray(d, dtype=np.int64) for d in deny]
    for a, d in ((allow, deny), (allow, [x if isinstance(x, str) else y for x, y in zip(deny, as_arrays)])):
        for g in (None, glob):
            host = build_lists(catalog, batch, a, d, g, normalise, registry=reg)
            dev = build_lists_on("cpu", catalog, batch, a, d, g, normalise, registry=reg)
            same(host, dev)
    # one registered name for the whole batch (a shared deny set becomes the global segment)
    host = build_lists(catalog, batch, allow, "reg-deny", glob, normalise, registry=reg)
    same(host, build_lists_on("cpu", catalog, batch, allow, "reg-deny", glob, normalise, registry=reg))


def test_tensors_are_ids_and_other_kinds_go_to_the_host():
    catalog = catalog_of(100, 1)
    ids = catalog.item_ids[:30]
    dev = build_lists_on("cpu", catalog, 2, None, [torch.from_numpy(ids), ids[:3].tolist()])
    same(build_lists(catalog, 2, None, [ids, ids[:3]]), dev)
    # integer strings and string catalogs: the host path converts them
    assert build_lists_on("cpu", catalog, 1, None, [["5", "8"]]) is None
    strings = Catalog.from_sids([[0, 1], [1, 0]], (2, 2), item_ids=["a", "b"])
    assert build_lists_on("cpu", strings, 1, None, [["a"]]) is None
    # the decoder falls back to the host path for them, and forced to the device otherwise
    dec = Decoder(build_index(catalog), [torch.randn(8, 4)] * 3, 4, catalog=catalog, engine="reference")
    dec.list_path = "device"
    assert isinstance(dec.request_lists(1, None, [["5"]]), RequestLists)
    assert isinstance(dec.request_lists(1, None, [[5]]), DeviceRequestLists)
    assert isinstance(dec.request_lists(1, None, [[5]], path="host"), RequestLists)


def test_auto_builds_small_lists_on_the_host():
    catalog = catalog_of(100, 1)
    ids = catalog.item_ids
    # registered names count nothing; ids, tensors and arrays count their length
    assert listed_ids([ids[:3], None], [torch.from_numpy(ids[:4]), "history"], 2) == 7
    assert listed_ids("region", None, 3) == 0
    dec = Decoder(build_index(catalog), [torch.randn(8, 4)] * 3, 4, catalog=catalog, engine="reference")
    assert dec.list_path == "auto"
    # on a CPU index the host path, whatever the size; on a GPU the device path from DEVICE_MIN_IDS ids
    assert isinstance(dec.request_lists(1, None, [list(ids)]), RequestLists)
    assert listed_ids(None, [np.zeros(DEVICE_MIN_IDS, dtype=np.int64)], 1) == DEVICE_MIN_IDS


def test_empty_requests_are_the_list_free_path_and_all_misses_decode_as_none():
    catalog = catalog_of(200, 2)
    assert build_lists_on("cpu", catalog, 3, None, [[], None, np.zeros(0, dtype=np.int64)]).empty
    missing = build_lists_on("cpu", catalog, 2, None, [[-1, 10**9], [1]])  # 1 is a hole (ids are 5 + 3k)
    assert not missing.empty and int(missing.offsets[-1]) == 0
    assert build_lists_on("cpu", catalog, 2, [[], None]).to_host().mode.tolist() == [1, 0]


@pytest.mark.parametrize("order", ["filter-first", "score-first"])
@pytest.mark.parametrize("normalise", ["request", "catalog"])
def test_device_lists_decode_like_host_lists(order, normalise):
    catalog = catalog_of(300, 3)
    sizes = catalog.codebook_sizes
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s + 1)) for s in sizes]
    g = np.random.default_rng(4)
    batch, ids = 4, catalog.item_ids
    allow = [None, list(g.choice(ids, 60)), None, list(g.choice(ids, 5))]
    deny = [list(g.choice(ids, 40)), list(g.choice(ids, 30)), [], None]
    model = Model(sizes, 6, batch, 5)
    dec = Decoder(build_index(catalog), heads, 6, order, catalog=catalog, engine="reference")
    want = dec.decode(model, batch, lists=dec.request_lists(batch, allow, deny, normalise=normalise, path="host"))
    got = dec.decode(model, batch, lists=dec.request_lists(batch, allow, deny, normalise=normalise,
                                                           path="device"))
    assert torch.equal(got.item_rows, want.item_rows) and torch.equal(got.tokens, want.tokens)
    torch.testing.assert_close(got.scores, want.scores, rtol=0, atol=0)


def test_list_buffers_load_device_lists_as_host_lists():
    catalog = catalog_of(300, 6)
    g = np.random.default_rng(7)
    glob = np.unique(g.choice(300, 12)).astype(np.int64)
    batch = 3
    host_buf, dev_buf = ListBuffers(batch, 2048, "cpu"), ListBuffers(batch, 2048, "cpu")
    for k in range(3):  # the same global array each call: copied once, kept after
        allow = [None, list(g.choice(catalog.item_ids, 50)), None]
        deny = [list(g.choice(catalog.item_ids, 20 + k)), None, []]
        host = build_lists(catalog, batch, allow, deny, glob)
        dev = build_lists_on("cpu", catalog, batch, allow, deny, glob)
        host_buf.load(host)
        dev_buf.load(dev)
        end = int(host_buf.offsets[-1])
        assert torch.equal(host_buf.offsets, dev_buf.offsets) and torch.equal(host_buf.mode, dev_buf.mode)
        assert torch.equal(host_buf.rows[:end], dev_buf.rows[:end])


@pytest.mark.parametrize("normalise", ["request", "catalog"])
def test_engine_buffers_take_device_lists(normalise):
    from zerogr_core.decode import list_buffers as cons
    from zerogr_core.decode.engine import GpuEngine
    from zerogr_core.decode.heads import Heads

    catalog = catalog_of(200, 8)
    sizes = catalog.codebook_sizes
    index = build_index(catalog)
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s)) for s in sizes]
    model = Model(sizes, 6, 3, 9)
    plan = ["selective", "full", "selective"]
    engine = GpuEngine(index, Heads.build(heads, index.codebook_sizes), 5, plan_override=plan, use_graph=False)
    ref = Decoder(index, heads, 5, projection=plan, catalog=catalog, engine="reference")
    ids, glob = catalog.item_ids, np.arange(2, 200, 9)
    old_min = cons.MIN_CAPACITY
    cons.MIN_CAPACITY = 64  # the last call needs a regrow
    try:
        # a global list, then none (request rows overwrite it), then it again, then a regrow
        for allow, deny, dropped in [([None, ids[:9], None], [ids[20:40], None, ids[:3]], glob),
                                     ([None, None, ids[5:8]], [ids[::7], [], None], None),
                                     ([ids[::3], None, None], [ids[::5], ids[1:30], None], glob),
                                     ([ids[:150], None, []], [None, ids[::2], None], glob)]:
            host = ref.request_lists(3, allow, deny, global_deny_rows=dropped, normalise=normalise, path="host")
            dev = ref.request_lists(3, allow, deny, global_deny_rows=dropped, normalise=normalise, path="device")
            assert isinstance(dev, DeviceRequestLists)
            got = engine.decode(model, 3, lists=dev)
            want = ref.decode(model, 3, lists=host)
            assert torch.equal(got.item_rows, want.item_rows) and torch.equal(got.tokens, want.tokens)
            torch.testing.assert_close(got.scores, want.scores, rtol=1e-4, atol=1e-4)
    finally:
        cons.MIN_CAPACITY = old_min


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_lists_equal_host_lists():
    g = np.random.default_rng(11)
    catalog = catalog_of(500, 12)
    ids = catalog.item_ids
    for batch in (1, 5, 32):
        allow = [None if g.random() < 0.6 else g.choice(ids, g.integers(0, 300)) for _ in range(batch)]
        deny = [g.integers(-5, int(ids.max()) + 5, g.integers(0, 400)) for _ in range(batch)]
        deny[0] = torch.from_numpy(deny[0]).cuda()  # a tensor already on the device
        glob = np.unique(g.choice(500, 20))
        for normalise in ("request", "catalog"):
            dev = build_lists_on("cuda", catalog, batch, allow, deny, glob, normalise)
            host = build_lists(catalog, batch, allow, [d.cpu().numpy() if torch.is_tensor(d) else d for d in deny],
                               glob, normalise)
            same(host, dev)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(requests())
def test_the_graphed_build_pads_to_the_host_lists(case):
    """:class:`GraphedBuild`'s padded layout (ids that miss the table, one run over them, empty
    runs), here run eagerly on the CPU, gives the host path's lists, with ids as numpy arrays and
    as tensors; a second call leaves the first call's lists as they were."""
    from zerogr_core.decode.device_lists import GraphedBuild, device_id_table

    catalog, batch, allow, deny, _, normalise, seed = case
    ids = lambda e: None if e is None or isinstance(e, str) else np.asarray(e, dtype=np.int64)  # noqa: E731
    allow, deny = [ids(a) for a in allow], [ids(d) for d in deny]
    parts, sizes = [], []
    for kind, entries in ((1, allow), (0, deny)):
        for r, a in enumerate(entries):
            if a is not None and a.size:
                parts.append(a)
                sizes.append((r, kind, a.size))
    mode = np.array([a is not None for a in allow], dtype=np.int32)
    build = GraphedBuild(device_id_table(catalog, "cpu"), "cpu", batch, catalog.n_items, DEVICE_MIN_IDS)
    # every other part as a tensor on the build's device: it is copied into its stretch of the block
    mixed = [torch.from_numpy(p).to(torch.int32 if i % 4 == 1 else torch.int64) if i % 2 else p
             for i, p in enumerate(parts)]
    offsets, rows = build(mixed, sizes, mode)
    first = DeviceRequestLists(offsets, rows, mode, np.zeros(0, dtype=np.int64), normalise)
    same(build_lists(catalog, batch, allow, deny, None, normalise), first)
    build(parts[::-1], sizes[::-1], mode)  # the same lists in another order
    same(build_lists(catalog, batch, allow, deny, None, normalise), first)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphed_build_equals_host_lists():
    """Numpy ids, pinned host tensors and tensors on the device, no global list: the captured
    build (one graph per batch and capacity), over several calls of one shape; each call's lists
    stay as built."""
    g = np.random.default_rng(12)
    catalog = catalog_of(500, 13)
    ids = catalog.item_ids
    as_tensor = (lambda a: a, lambda a: torch.from_numpy(a).pin_memory(), lambda a: torch.from_numpy(a).cuda())
    for batch in (1, 5, 32):
        built = []
        for call in range(3):
            allow = [None if g.random() < 0.6 else g.choice(ids, g.integers(0, 300)) for _ in range(batch)]
            deny = [g.integers(-5, int(ids.max()) + 5, g.integers(0, 400)) for _ in range(batch)]
            given = [None if a is None else as_tensor[(r + call) % 3](a) for r, a in enumerate(allow)]
            for normalise in ("request", "catalog"):
                dev = build_lists_on("cuda", catalog, batch, given, deny, None, normalise)
                built.append((build_lists(catalog, batch, allow, deny, None, normalise), dev))
        for host, dev in built:
            same(host, dev)
    from zerogr_core.decode.device_lists import _TABLES

    graphs = [k for k in _TABLES[catalog._id_lookup] if isinstance(k, tuple) and k[0] == "graph"]
    assert len(graphs) == 3, graphs  # one per batch: every call fit the smallest capacity


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_graphed_build_under_concurrent_callers():
    """Threads building lists of one shape at once (one on a stream of its own) each get
    their own lists."""
    from concurrent.futures import ThreadPoolExecutor

    g = np.random.default_rng(14)
    catalog = catalog_of(500, 15)
    ids, batch = catalog.item_ids, 4
    calls = [[g.integers(-5, int(ids.max()) + 5, g.integers(0, 400)) for _ in range(batch)] for _ in range(24)]

    def build(i):
        stream = torch.cuda.Stream() if i % 2 else torch.cuda.current_stream()
        with torch.cuda.stream(stream):
            dev = build_lists_on("cuda", catalog, batch, None, calls[i])
            host = dev.to_host()
        return i, host

    with ThreadPoolExecutor(4) as pool:
        for i, got in pool.map(build, range(len(calls))):
            want = build_lists(catalog, batch, None, calls[i])
            assert got.offsets.tolist() == want.offsets.tolist() and got.rows.tolist() == want.rows.tolist(), i


@pytest.mark.parametrize("limit", ["int32", "int64"])
def test_both_key_widths_build_the_host_lists(monkeypatch, limit):
    """The device build sorts its keys as int32 when they fit, else as int64: both give the host
    path's lists (the int64 width forced here: a catalog big enough to need it is not built)."""
    from zerogr_core.decode import device_lists

    if limit == "int64":
        monkeypatch.setattr(device_lists, "KEY32_LIMIT", 0)
    g = np.random.default_rng(7)
    for seed in range(6):
        catalog = catalog_of(300, seed)
        ids = catalog.item_ids
        batch = 1 + seed
        allow = [None if g.random() < 0.5 else g.choice(ids, g.integers(0, 200)) for _ in range(batch)]
        deny = [g.integers(-5, int(ids.max()) + 5, g.integers(0, 250)) for _ in range(batch)]
        for normalise in ("request", "catalog"):
            same(build_lists(catalog, batch, allow, deny, None, normalise),
                 build_lists_on("cpu", catalog, batch, allow, deny, None, normalise))


def test_place_ids_lays_parts_back_to_back():
    from zerogr_core.decode.device_lists import PARALLEL_GATHER, copy_tensors, place_ids

    g = np.random.default_rng(0)
    parts = [g.integers(0, 10**9, 5), g.integers(0, 2**31, PARALLEL_GATHER + 3).astype(np.uint32),
             torch.arange(7, dtype=torch.int32), g.integers(-5, 5, 2), torch.arange(3) + 100]
    host = torch.full((3 + PARALLEL_GATHER + 40,), -1, dtype=torch.int64)
    gathered, tensors = place_ids(parts, host, 3)
    assert gathered == 3 + 5 + PARALLEL_GATHER + 3 + 7 + 2
    assert [(at, t.numel()) for at, t in tensors] == [(3 + 5 + PARALLEL_GATHER + 3, 7), (gathered, 3)]
    block = host.clone()
    copy_tensors(tensors, block)
    want = np.concatenate([np.asarray(p) for p in parts]).astype(np.int64)
    assert block[3:3 + want.size].tolist() == want.tolist()
    assert host[:3].tolist() == [-1] * 3 and block[3 + want.size:].eq(-1).all()
