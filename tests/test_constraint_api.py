"""Per-request lists through the public API: the host cost of a call does not scale with
the catalog, empty lists take the list-free path, and registered lists (sub-catalog allow
sets, shared deny sets) give what the same ids passed per call give."""
import tracemalloc

import numpy as np
import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from zerogr_core import Catalog, Decoder, ZeroGRError, build_index
from zerogr_core.catalog import catalog as catalog_mod
from zerogr_core.decode import constraints as cons
from zerogr_core.decode.constraints import RequestLists, build_lists
from zerogr_core.index import INDEX_PRESETS

from test_constraints import Model, allowed_rows_of, check, gpu_case, oracle, reference_of, scenarios


def big_catalog(n=60_000, string_ids=False, seed=0):
    g = np.random.default_rng(seed)
    sizes = (64, 64, 64)
    flat = g.choice(int(np.prod(sizes)), n, replace=False)
    sids = np.stack(np.unravel_index(flat, sizes), 1)
    ids = g.permutation(n) * 3 + 7  # integers with gaps: the dense table
    if string_ids:
        ids = [f"A{v:08d}" for v in ids]
    return Catalog.from_sids(sids, sizes, item_ids=ids)


@pytest.mark.parametrize("string_ids", [False, True])
def test_lists_cost_no_catalog_sized_host_work(monkeypatch, string_ids):
    catalog = big_catalog(string_ids=string_ids)
    built = []
    real = catalog_mod.IdLookup
    monkeypatch.setattr(catalog_mod, "IdLookup", lambda ids: built.append(1) or real(ids))
    g = np.random.default_rng(1)
    batch = 8
    pick = lambda k: [catalog.item_ids[i] for i in g.choice(catalog.n_items, k, replace=False)]  # noqa: E731
    lists = [pick(10) for _ in range(batch)]
    first = build_lists(catalog, batch, None, lists)
    assert len(built) == 1
    # every later call: no catalog-wide structure rebuilt, and nothing of the catalog's size
    # allocated (a per-call gather of the N ids would take 8·N bytes)
    tracemalloc.start()
    try:
        for _ in range(3):
            again = build_lists(catalog, batch, [pick(20) if r % 2 else None for r in range(batch)], lists)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert len(built) == 1
    assert peak < catalog.n_items * 8 // 4, peak
    # the lists are what the ids say
    for r in range(batch):
        rows = catalog.rows_of(lists[r])
        assert sorted(first.rows[first.offsets[r]:first.offsets[r + 1]].tolist()) == sorted(rows.tolist())
        assert first.mode[r] == 0 and again.mode[r] == (r % 2)


def test_batch_lookup_names_the_request_of_a_bad_id():
    catalog = Catalog.from_sids([[0, 1], [1, 0], [1, 1]], (2, 2))
    with pytest.raises(ZeroGRError, match=r"deny_items\[1\].*'x' is not an integer"):
        build_lists(catalog, 2, None, [[0], ["x"]])
    # ids of mixed kinds across requests are still looked up
    out = build_lists(catalog, 2, None, [[0, 2], ["1"]])
    assert out.rows.tolist() == [0, 2, 1] or sorted(out.rows.tolist()) == [0, 1, 2]


def test_ready_made_lists_and_id_lists_in_one_call_are_refused():
    """With lists= the call ignored allow_items/deny_items and normalise= silently: a request decoded
    over items its allow list excluded."""
    catalog = Catalog.from_sids([[0, 1], [1, 0], [1, 1]], (2, 2), item_ids=[10, 11, 12])
    decoder = Decoder(build_index(catalog), [torch.randn(2, 4), torch.randn(2, 4)], 3, catalog=catalog)
    lists = decoder.request_lists(2, deny_items=[[10], None])

    def model(step, prefixes):
        return torch.ones(prefixes.shape[0], prefixes.shape[1], 4)

    for ids in (dict(allow_items=[[11], None]), dict(deny_items=[None, [12]])):
        with pytest.raises(ZeroGRError, match=r"^lists: pass either lists= or allow_items/deny_items, not both"):
            decoder.decode(model, 2, lists=lists, **ids)
    with pytest.raises(ZeroGRError, match=r"^normalise: the lists were built with normalise='request'; pass "
                                          r"normalise= to request_lists instead$"):
        decoder.decode(model, 2, lists=lists, normalise="catalog")
    catalog_lists = decoder.request_lists(2, deny_items=[[10], None], normalise="catalog")
    assert decoder.decode(model, 2, lists=catalog_lists, normalise="catalog").item_rows[0].tolist() == \
        decoder.decode(model, 2, lists=catalog_lists).item_rows[0].tolist()


LIST_CATALOGS = {kind: big_catalog(n=40, string_ids=kind == "string", seed=2) for kind in ("dense", "string")}
LIST_CATALOGS["sparse"] = Catalog.from_sids(LIST_CATALOGS["dense"].sids, LIST_CATALOGS["dense"].codebook_sizes,
                                            item_ids=np.arange(40) * 10**9)  # too sparse for the id table


@st.composite
def id_batches(draw):
    """A catalog and a batch of per-request id entries: ``None``, empty, duplicated ids,
    ids the catalog lacks, as arrays of several dtypes, lists or tuples."""
    kind = draw(st.sampled_from(sorted(LIST_CATALOGS)))
    catalog = LIST_CATALOGS[kind]
    absent = ["nope", "B0"] if kind == "string" else [-3, 41 * 10**9, 10**15]
    batch = draw(st.sampled_from([1, 1, 2, 3, 8]))
    pick = st.one_of(st.sampled_from(catalog.item_ids.tolist()), st.sampled_from(absent))
    entries = []
    for _ in range(batch):
        ids = draw(st.lists(pick, max_size=12))
        shape = draw(st.sampled_from(["none", "array", "array", "int32", "list", "tuple"]))
        if shape == "none":
            entries.append(None)
        elif shape == "list" or (shape == "int32" and kind != "dense"):
            entries.append(ids)
        elif shape == "tuple":
            entries.append(tuple(ids))
        elif shape == "int32":
            entries.append(np.array([i for i in ids if abs(i) < 2**31], dtype=np.int32))
        else:
            entries.append(np.array(ids) if ids else np.zeros(0, dtype=np.int64))
    return catalog, batch, entries


def oracle_rows(catalog, ids) -> list:
    """Sorted distinct rows of ``ids`` that the catalog holds, one id at a time."""
    found = set()
    for i in ([] if ids is None else list(ids)):
        try:
            found.add(catalog.row_of_item(i))
        except KeyError:
            pass
    return sorted(found)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(id_batches(), st.data())
def test_deny_lists_alone_equal_the_general_path_and_the_oracle(case, data):
    catalog, batch, deny = case
    lists = build_lists(catalog, batch, None, deny)
    # the same segments through the set operations of allow and global lists
    rows, offsets = cons._combine(None, cons._segments(catalog, deny, "deny_items", None), np.zeros(batch, bool),
                                  np.zeros(0, dtype=np.int64), catalog.n_items)
    for got, want in ((lists.rows, rows), (lists.offsets, offsets)):
        assert got.dtype == want.dtype == np.int64 and np.array_equal(got, want)
    assert lists.mode.dtype == np.int32 and not lists.mode.any() and not lists.glob.size
    for r in range(batch):
        assert lists.rows[lists.offsets[r]:lists.offsets[r + 1]].tolist() == oracle_rows(catalog, deny[r])
    # allow lists and a global list over the same entries: allow - deny - global, deny - global
    allow = data.draw(st.lists(st.sampled_from([None] + deny), min_size=batch, max_size=batch))
    glob = np.unique(data.draw(st.lists(st.integers(0, catalog.n_items - 1), max_size=5))).astype(np.int64)
    mixed = build_lists(catalog, batch, allow, deny, glob)
    for r in range(batch):
        own = set(oracle_rows(catalog, deny[r]))
        want = set(oracle_rows(catalog, allow[r])) - own if allow[r] is not None else own
        assert mixed.rows[mixed.offsets[r]:mixed.offsets[r + 1]].tolist() == sorted(want - set(glob.tolist()))
        assert mixed.mode[r] == (allow[r] is not None)


def small_setup(seed=3, sizes=(6, 5, 4), n=70, beam=5):
    g = np.random.default_rng(seed)
    flat = g.choice(int(np.prod(sizes)), n, replace=False)
    catalog = Catalog.from_sids(np.stack(np.unravel_index(flat, sizes), 1), sizes,
                                item_ids=[f"B{v:05d}" for v in g.choice(10**5, n, replace=False)])
    heads = [torch.randn(s, 6, generator=torch.Generator().manual_seed(s)) for s in sizes]
    return catalog, heads, beam


def test_empty_lists_take_the_list_free_path(monkeypatch):
    catalog, heads, beam = small_setup()
    index = build_index(catalog)
    model = Model(catalog.codebook_sizes, 6, 3, 2)
    dec = Decoder(index, heads, beam, catalog=catalog, engine="reference", projection="selective")
    free = dec.decode(model, 3)

    def refuse(*a, **k):
        raise AssertionError("an empty list built or applied constraint lists")

    monkeypatch.setattr(cons, "SlotConstraint", refuse)
    monkeypatch.setattr(cons, "build_lists", refuse)
    for kwargs in (dict(deny_items=[[], None, np.zeros(0, dtype=np.int64)]),
                   dict(allow_items=[None] * 3, deny_items=[None] * 3),
                   dict(deny_items=[[]] * 3, normalise="catalog"),
                   dict(lists=RequestLists.from_rows(deny=[[], [], []]))):
        got = dec.decode(model, 3, **kwargs)
        assert torch.equal(got.item_rows, free.item_rows) and torch.equal(got.scores, free.scores)
    # a wrong length is still refused, even with nothing listed
    monkeypatch.undo()
    with pytest.raises(ZeroGRError, match="lists 2 requests, batch_size is 3"):
        dec.decode(model, 3, deny_items=[[], []])


def test_registered_deny_set_is_the_global_segment_and_errors_are_one_line():
    catalog, heads, beam = small_setup()
    dec = Decoder(build_index(catalog), heads, beam, catalog=catalog, engine="reference")
    out_of_stock = list(catalog.item_ids[::3])
    entry = dec.register_items("out-of-stock", out_of_stock, kind="deny")
    assert not entry.indexed
    a = dec.request_lists(3, None, "out-of-stock")
    b = dec.request_lists(3, [None, ["B00000"], None], ["out-of-stock"] * 3)
    assert a.glob is entry.rows and b.glob is entry.rows  # the same object: copied to the device once
    model = Model(catalog.codebook_sizes, 6, 3, 2)
    got = dec.decode(model, 3, deny_items="out-of-stock")
    want = dec.decode(model, 3, deny_items=[out_of_stock] * 3)
    assert torch.equal(got.item_rows, want.item_rows)
    torch.testing.assert_close(got.scores, want.scores)
    with pytest.raises(ZeroGRError, match=r"allow_items\[0\]: 'nope' is not a registered list"):
        dec.decode(model, 3, allow_items="nope")
    with pytest.raises(ZeroGRError, match=r"allow_items\[1\]: 'out-of-stock' is registered as a deny list"):
        dec.decode(model, 3, allow_items=[None, "out-of-stock", None])
    with pytest.raises(ZeroGRError, match="only an allow set gets an index"):
        dec.register_items("x", out_of_stock, kind="deny", index=True)
    with pytest.raises(ZeroGRError, match="kind must be one of"):
        dec.register_items("x", out_of_stock, kind="block")
    with pytest.raises(ZeroGRError, match="not a registered list"):
        dec.unregister_items("x")
    dec.unregister_items("out-of-stock")
    with pytest.raises(ZeroGRError, match="not a registered list"):
        dec.decode(model, 3, deny_items="out-of-stock")


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(scenarios(), st.sampled_from(["filter-first", "score-first"]), st.booleans())
def test_registered_allow_sets_match_the_row_lists_and_the_oracle(scenario, order, indexed):
    catalog, sizes, allow, deny, beam, preset, projection, seed, _, normalise = scenario
    index = build_index(catalog, config=INDEX_PRESETS[preset])
    g = torch.Generator().manual_seed(seed)
    heads = [torch.randn(s, 5, generator=g) for s in sizes]
    batch = len(allow)
    model = Model(sizes, 5, batch, seed)
    dec = Decoder(index, heads, beam, order, projection=projection, catalog=catalog, engine="reference")
    region = next((a for a in allow if a), list(catalog.item_ids[:1]))
    entry = dec.register_items("region", region, index=indexed)
    assert entry.indexed == indexed
    # every request names the set (the sub-catalog path when indexed), each with its own deny list
    got = dec.decode(model, batch, allow_items="region", deny_items=deny, normalise=normalise)
    rows = dec.decode(model, batch, allow_items=[region] * batch, deny_items=deny, normalise=normalise)
    assert torch.equal(got.item_rows, rows.item_rows) and torch.equal(got.tokens, rows.tokens)
    torch.testing.assert_close(got.scores, rows.scores, rtol=1e-5, atol=1e-5)
    lists = build_lists(catalog, batch, [region] * batch, deny, normalise=normalise)
    live = np.arange(catalog.n_items)
    for r in range(batch):
        allowed = allowed_rows_of(catalog, lists, r)
        expected = oracle(catalog, heads, model, r, beam, order, allowed,
                          live if normalise == "catalog" else None)
        check(got, catalog, expected, beam, r, set(allowed.tolist()))
    # some requests name it, others pass ids or nothing: the row path, same answers
    mixed = ["region"] + allow[1:]
    got = dec.decode(model, batch, allow_items=mixed, deny_items=deny, normalise=normalise)
    want = dec.decode(model, batch, allow_items=[region] + allow[1:], deny_items=deny, normalise=normalise)
    assert torch.equal(got.item_rows, want.item_rows)
    torch.testing.assert_close(got.scores, want.scores, rtol=1e-5, atol=1e-5)


def test_large_allow_set_gets_its_own_index_by_default():
    catalog, heads, beam = small_setup(sizes=(40, 40, 4), n=3000)
    dec = Decoder(build_index(catalog), heads, beam, catalog=catalog, engine="reference", projection="full")
    big = dec.register_items("cold-start", catalog.item_ids[::2])
    small = dec.register_items("few", catalog.item_ids[:10])
    assert big.indexed and not small.indexed
    assert big.decoder.index.n_items == big.rows.size == 1500
    assert big.decoder.catalog.item_ids.tolist() == catalog.item_ids[big.rows].tolist()


def test_quick_constraints_suite_measures_the_public_api_without_polars(tmp_path):
    import json
    import os
    import subprocess
    import sys
    from pathlib import Path

    from zerogr_core.bench.live import api_conditions

    code = ("import sys; sys.modules['polars'] = None; sys.modules['plotly'] = None; "
            "from zerogr_core.cli import main; "
            f"sys.exit(main(['bench', '--quick', '--suite', 'constraints', '--device', 'cpu', "
            f"'--out', {str(tmp_path)!r}]))")
    root = Path(__file__).resolve().parents[1]
    env = dict(os.environ, TRITON_INTERPRET="0")
    result = subprocess.run([sys.executable, "-c", code], cwd=root, env=env, capture_output=True, text=True,
                            timeout=300)
    assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-2000:]
    doc = json.loads(next(tmp_path.glob("constraints*.json")).read_text())
    api = [r for r in doc["records"] if r["kind"] == "constraints-api"]
    labels = [c[0] for c in api_conditions(1200, True)]
    assert [r["condition"] for r in api] == labels
    assert all(r["list_violations"] == 0 and r["valid"] for r in api)
    assert all(r["p50_ratio"] > 0 for r in api if r["condition"] != "none")
    # each condition's ratio is to the list-free calls that took turns with it
    for r in api[1:]:
        assert r["p50_ratio"] == pytest.approx(r["median_ms"] / r["none_paired_median_ms"])
        assert r["none_paired_median_ms"] > 0
    checks = [r for r in doc["records"] if r["kind"] == "check" and "public API" in r["check"]]
    assert len(checks) == len(labels) and all(r["passed"] for r in checks)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_graph_replay_with_ids_and_registered_sets_matches_the_reference_on_gpu():
    g, catalog, index, heads, hidden_fn = gpu_case()
    n = catalog.n_items
    graph = Decoder(index, heads, 16, engine="graph", catalog=catalog)
    region = catalog.item_ids[g.choice(n, n // 10, replace=False)]
    assert graph.register_items("region", region).indexed
    graph.register_items("recalled", catalog.item_ids[g.choice(n, 500, replace=False)], kind="deny")
    for batch in (1, 4):
        for call in range(3):  # the pinned buffers are refilled while earlier copies may be in flight
            deny = [catalog.item_ids[g.choice(n, 300, replace=False)] for _ in range(batch)]
            for kwargs in (dict(deny_items=deny), dict(allow_items="region", deny_items=deny),
                           dict(allow_items=[region] * batch, deny_items=deny), dict(deny_items="recalled"),
                           dict(deny_items=deny, normalise="catalog")):
                a = graph.decode(hidden_fn, batch, **kwargs)
                assert graph.gpu_engine.graph_error is None
                ref = reference_of(graph, batch, index, heads, catalog)
                ref.register_items("region", region, index=False)
                ref.register_items("recalled", catalog.item_ids[graph.registry.get("recalled").rows], kind="deny")
                b = ref.decode(hidden_fn, batch, **kwargs)
                torch.testing.assert_close(a.scores, b.scores, rtol=1e-4, atol=1e-4)
                if kwargs.get("allow_items") != "region":
                    assert torch.equal(a.item_rows, b.item_rows), list(kwargs)
                else:  # the sub-catalog's own plan may project differently: equal up to near-ties
                    same = (a.item_rows == b.item_rows).float().mean()
                    assert same > 0.9, same
                    allowed = set(graph.registry.get("region").rows.tolist())
                    assert all(r in allowed for r in a.item_rows.flatten().tolist() if r >= 0)
