"""CatalogStore: deletions at once, additions and replaces by atomic swap, and a small
load test (threads decode while the catalog changes every 0.3 s)."""
import numpy as np
import pytest
import torch

from zerogr_core import Catalog, CatalogError, Decoder
from zerogr_core.errors import ZeroGRError
from zerogr_core.bench.live import new_items, run_load_test
from zerogr_core.decode.store import CatalogStore

SIZES = (8, 6, 5)


def make_store(n=150, seed=0, string_ids=True):
    g = np.random.default_rng(seed)
    sids = np.unique(np.stack([g.integers(0, s, n) for s in SIZES], 1), axis=0)
    ids = [f"B{i:09d}" for i in range(len(sids))] if string_ids else np.arange(len(sids)) * 3
    catalog = Catalog.from_sids(sids, SIZES, item_ids=ids)
    heads = [torch.randn(s, 8, generator=torch.Generator().manual_seed(s)) for s in SIZES]
    table = torch.randn(64, 8, generator=torch.Generator().manual_seed(1))

    def hidden_fn(step, prefixes):
        key = (prefixes.clamp(min=0) * 7 + 3).sum(-1) + step * 13
        return table[key % 64]

    def make_decoder(cat, index):
        return Decoder(index, heads, 6, catalog=cat, engine="reference")

    return CatalogStore(catalog, make_decoder, compact_fraction=0.25), hidden_fn


def test_deletes_apply_at_once_and_adds_swap_in():
    store, fn = make_store()
    first = store.decode(fn, 2)
    assert first.version == 1
    top = [x for x in first.item_ids[0] if x is not None][:3]
    index_before = store.current.index
    v = store.apply(deletes=top + ["not-an-item"])
    assert v == 2 and store.current.index is index_before  # no rebuild
    after = store.decode(fn, 2)
    assert after.version == 2 and not set(top) & set(after.item_ids.ravel().tolist())
    # an in-flight decode keeps its version: the old snapshot still decodes on the old lists
    assert first.snapshot.deleted_rows.size == 0
    extra = new_items(store.current.catalog, 5, np.random.default_rng(0))
    v = store.apply(adds=extra, deletes=[top[0]])
    cur = store.current
    assert v == 3 and cur.index is not index_before and cur.deleted_rows.size == 0
    assert cur.catalog.n_items == first.snapshot.catalog.n_items - 3 + 5
    assert set(extra.item_ids.tolist()) <= set(cur.catalog.item_ids.tolist())
    assert not set(top) & set(cur.catalog.item_ids.tolist())
    # a request may still exclude its own history on top of the global deletions
    res = store.decode(fn, 1, deny_items=[[x for x in after.item_ids[0] if x is not None]])
    assert not set(after.item_ids[0].tolist()) & set(res.item_ids[0].tolist()) - {None}


def test_id_lists_reach_the_decoder_until_items_are_deleted(monkeypatch):
    # with nothing deleted the store hands the ids on, so the decoder's own list paths (deny ids
    # resolved in its graph, allow bitmaps, sub-catalogs) serve a store's requests too
    store, fn = make_store(string_ids=False)
    decoder = store.current.decoder
    plain, seen = decoder.decode, []
    monkeypatch.setattr(decoder, "decode", lambda *a, **k: seen.append(k) or plain(*a, **k))
    deny = [np.array([0, 3, 9, 12]), None, np.array([6])]
    res = store.decode(fn, 3, deny_items=deny, normalise="catalog")
    assert seen[-1]["deny_items"] is deny and seen[-1]["normalise"] == "catalog" and "lists" not in seen[-1]
    expect = plain(fn, 3, deny_items=deny, normalise="catalog")
    assert torch.equal(res.result.item_rows, expect.item_rows)
    gone = int(res.item_ids[1][0])
    store.apply(deletes=[gone])
    assert store.current.decoder is decoder  # deleted at once: the same decoder, a global deny segment
    after = store.decode(fn, 3, deny_items=deny, normalise="catalog")
    assert seen[-1]["lists"] is not None and "deny_items" not in seen[-1]
    assert gone not in set(after.item_ids.ravel().tolist())
    assert not {0, 3, 9, 12} & set(after.item_ids[0].tolist())


def test_bad_additions_keep_the_current_version():
    store, _ = make_store()
    cur = store.current
    dup = Catalog.from_sids(cur.catalog.sids[:1], SIZES, item_ids=["fresh"])  # SID already present
    with pytest.raises(CatalogError, match="shared by items"):
        store.apply(adds=dup)
    with pytest.raises(CatalogError, match="string ids"):
        store.apply(adds=Catalog.from_sids([[7, 5, 4]], SIZES))
    with pytest.raises(CatalogError, match="adds must be a Catalog of the new items"):
        store.apply(adds=[[7, 5, 4]])
    with pytest.raises(CatalogError, match="replace takes a Catalog, got NoneType"):
        store.replace(None)
    assert store.current is cur


def test_replace_swaps_the_whole_catalog():
    store, fn = make_store()
    other = Catalog.from_sids([[0, 0, 0], [1, 1, 1]], SIZES, item_ids=["x", "y"])
    assert store.replace(other) == 2
    assert sorted(x for x in store.decode(fn, 1).item_ids[0] if x is not None) == ["x", "y"]


@pytest.mark.parametrize("string_ids", [True, False])
def test_load_test_no_failures_no_deleted_items(string_ids, monkeypatch):
    # The Triton interpreter keeps global launch state and is not thread-safe; on CPU
    # tensors without it the ops take their PyTorch references (as in CPU serving).
    monkeypatch.delenv("TRITON_INTERPRET", raising=False)
    store, fn = make_store(n=400, string_ids=string_ids)
    report = run_load_test(store, fn, 2, threads=3, seconds=1.2, change_every_s=0.3, deletes_per_change=20,
                           adds_per_change=20, replace_every=3)
    assert report["failed"] == 0 and report["invalid"] == 0 and report["deleted"] == 0, report["errors"]
    assert report["changes"] >= 3 and report["idle"]["n"] > 0 and report["churn"]["n"] > 0
    kinds = " ".join(h["change"] for h in report["change_log"])
    assert "deleted" in kinds and "rebuilt" in kinds and "replaced" in kinds


def test_deleting_every_item_publishes_an_empty_version():
    # past compact_fraction a delete rebuilds without the rows; with none left that rebuild
    # raised 'catalog is empty: no items' and the deletes never took effect
    store, fn = make_store(string_ids=False)
    every = store.current.live_ids()
    assert store.apply(deletes=every) == 2 and store.current.n_live == 0
    out = store.decode(fn, 2)
    assert out.version == 2 and (out.item_ids == -1).all()
    assert store.apply(deletes=every[:3]) == 2  # nothing left to delete: no new version
    fresh = Catalog.from_sids([[0, 0, 0]], SIZES, item_ids=[10 ** 6])
    assert store.apply(adds=fresh) == 3 and store.current.catalog.n_items == 1
    assert store.decode(fn, 1).item_ids[0].tolist() == [10 ** 6] + [-1] * 5


@pytest.mark.parametrize("fraction", ["abc", None, float("nan"), -0.1, 1.5, True])
def test_compact_fraction_is_checked(fraction):
    # NaN or a negative share rebuilt the whole catalog on every delete; a string raised a bare ValueError
    store, _ = make_store()
    with pytest.raises(ZeroGRError, match=r"^compact_fraction must be a number in \[0, 1\]"):
        CatalogStore(store.current.catalog, store.make_decoder, compact_fraction=fraction)


def test_make_decoder_must_be_callable():
    store, _ = make_store()
    with pytest.raises(ZeroGRError, match="^make_decoder: expected a callable"):
        CatalogStore(store.current.catalog, None)


def test_snapshot_must_be_a_version():
    # a version number raised AttributeError: 'int' object has no attribute 'decoder'
    store, fn = make_store()
    with pytest.raises(ZeroGRError, match=r"^snapshot: expected a CatalogVersion .*, got int$"):
        store.decode(fn, 1, snapshot=1)
    assert store.decode(fn, 1, snapshot=store.current).version == 1


@pytest.mark.parametrize("string_ids", [True, False])
def test_bad_additions_are_named_by_item(string_ids):
    # merged first, they were refused with rows of the merged table: "row 151, column 's1':
    # token 9 ≥ codebook size 8" and "row 151, column 'item_id': duplicate item id …"
    store, _ = make_store(string_ids=string_ids)
    cat = store.current.catalog
    new_id = "fresh" if string_ids else 10 ** 6
    shown = repr(new_id) if string_ids else str(new_id)
    outside = Catalog.from_sids([[9, 0, 0]], [10, 6, 5], item_ids=[new_id])
    with pytest.raises(CatalogError, match=rf"^adds: item {shown} has token 9 at level 1, outside the "
                                           rf"catalog's codebook of 8$"):
        store.apply(adds=outside)
    free = next(s for s in np.ndindex(*SIZES) if not (cat.sids == s).all(1).any())
    taken = cat.item_ids[0]
    again = Catalog.from_sids([free], SIZES, item_ids=[taken])
    with pytest.raises(CatalogError, match=rf"^adds: item id {repr(str(taken)) if string_ids else taken} is "
                                           rf"already in the catalog"):
        store.apply(adds=again)
    assert store.version == 1
    assert store.apply(adds=again, deletes=[taken]) == 2  # delete and add in one apply: a replacement
    assert store.current.catalog.sids[store.current.catalog.row_of_item(taken)].tolist() == list(free)


def test_registered_lists_outlive_a_rebuild():
    # a list registered on the version's decoder was lost with it: after an add, requests naming
    # it were refused ("'fresh' is not a registered list"), though after a delete they worked
    store, fn = make_store(string_ids=False)
    ids = store.current.catalog.item_ids
    extra = new_items(store.current.catalog, 2, np.random.default_rng(1))
    store.register_items("fresh", list(ids[:3]) + [int(extra.item_ids[0])])   # one id the catalog lacks yet
    store.register_items("gone", ids[3:6], kind="deny")
    before = store.decode(fn, 2, allow_items="fresh").item_ids
    assert sorted(before[0][before[0] >= 0].tolist()) == sorted(ids[:3].tolist())
    store.apply(adds=extra, deletes=[ids[0]])
    after = store.decode(fn, 2, allow_items="fresh", deny_items="gone")
    assert sorted(after.item_ids[0][after.item_ids[0] >= 0].tolist()) == sorted([*ids[1:3], extra.item_ids[0]])
    assert not set(ids[3:6].tolist()) & set(store.decode(fn, 1, deny_items="gone").item_ids[0].tolist())
    store.unregister_items("gone")
    store.apply(adds=new_items(store.current.catalog, 1, np.random.default_rng(2)))
    with pytest.raises(ZeroGRError, match="'gone' is not a registered list"):
        store.decode(fn, 1, deny_items="gone")
    assert store.decode(fn, 1, allow_items="fresh").version == 3


def test_history_keeps_the_latest_changes_only(monkeypatch):
    import zerogr_core.decode.store as store_mod

    monkeypatch.setattr(store_mod, "HISTORY_KEPT", 3)  # a long-running server's catalog changes without end
    store, _ = make_store(string_ids=False)
    ids = store.current.catalog.item_ids
    for i in range(5):
        store.apply(deletes=[ids[i]])
    assert [h["version"] for h in store.history] == [4, 5, 6]
