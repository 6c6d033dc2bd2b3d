"""The step-sliced index against a brute-force trie, and builder equivalence."""
import numpy as np
import pytest
import torch
from hypothesis import given, settings, strategies as st

from zerogr_core import Catalog, ZeroGRError, build_index
from zerogr_core.index import BUILDERS, INDEX_PRESETS, HostTrie, IndexConfig, build_static_index, static_style_bytes
from zerogr_core.bench.workload import static_step_bytes
from zerogr_core.index.layout import static_style_step_bytes


def brute_next(sids, prefix):
    p = len(prefix)
    rows = sids[np.all(sids[:, :p] == np.asarray(prefix, dtype=sids.dtype), axis=1)] if p else sids
    return np.unique(rows[:, p].astype(np.int64))


@st.composite
def catalogs(draw):
    levels = draw(st.integers(1, 5))
    sizes = [draw(st.integers(2, 9)) for _ in range(levels)]
    n = draw(st.integers(1, 80))
    seed = draw(st.integers(0, 2**31 - 1))
    rng = np.random.default_rng(seed)
    skew = draw(st.sampled_from([0.0, 1.0, 3.0]))
    cols = []
    for size in sizes:
        p = np.arange(1, size + 1, dtype=float) ** -skew
        cols.append(rng.choice(size, size=n, p=p / p.sum()))
    sids = np.unique(np.stack(cols, axis=1), axis=0)
    rng.shuffle(sids)
    return Catalog.from_sids(sids, sizes), seed


def assert_same_bytes(a, b):
    for ma, mb in zip(a.steps, b.steps):
        assert (ma.kind, ma.n_states, ma.n_entries, ma.max_segment) == (mb.kind, mb.n_states, mb.n_entries, mb.max_segment)
        for ta, tb in zip(ma.tensors(), mb.tensors()):
            assert ta.dtype == tb.dtype and ta.shape == tb.shape
            assert ta.cpu().numpy().tobytes() == tb.cpu().numpy().tobytes(), f"step {ma.step} differs"


@settings(max_examples=60, deadline=None)
@given(catalogs(), st.integers(1, 7), st.sampled_from(["default", "all-sparse", "memory-lean"]))
def test_lookups_equal_brute_force_trie(cat_seed, chunk_rows, preset):
    catalog, seed = cat_seed
    config = IndexConfig(**{**INDEX_PRESETS[preset].__dict__, "chunk_rows": chunk_rows})
    indexes = {b: build_index(catalog, builder=b, config=config) for b in BUILDERS}
    for b in BUILDERS[1:]:
        assert_same_bytes(indexes[BUILDERS[0]], indexes[b])
    index = indexes["layout"]
    sids = catalog.sids
    rng = np.random.default_rng(seed)
    for row in rng.choice(catalog.n_items, size=min(10, catalog.n_items), replace=False):
        for p in range(catalog.n_levels):
            prefix = list(sids[row, :p])
            np.testing.assert_array_equal(index.next_tokens(prefix), brute_next(sids, prefix))
        # The last step's entry position is the item's row: no item ids in the index.
        assert index.walk(list(sids[row])) == row
    # Random prefixes: off-catalog ones raise, on-catalog ones agree.
    for _ in range(10):
        p = int(rng.integers(0, catalog.n_levels))
        prefix = [int(rng.integers(0, catalog.codebook_sizes[l])) for l in range(p)]
        expected = brute_next(sids, prefix)
        prefix_exists = p == 0 or np.any(np.all(sids[:, :p] == prefix, axis=1))
        if prefix_exists:
            np.testing.assert_array_equal(index.next_tokens(prefix), expected)
        else:
            with pytest.raises(ZeroGRError):
                index.next_tokens(prefix)
    stats = catalog.step_stats()
    for s, m in zip(stats, index.steps):
        assert (s["states"], s["entries"], s["max_segment"]) == (m.n_states, m.n_entries, m.max_segment)
    assert index.steps[-1].n_entries == catalog.n_items


@settings(max_examples=25, deadline=None)
@given(catalogs())
def test_baseline_indexes_agree_with_step_index(cat_seed):
    catalog, _ = cat_seed
    index = build_index(catalog, config=INDEX_PRESETS["all-sparse"])
    trie = HostTrie.from_catalog(catalog)
    dense_levels = 2 if catalog.n_levels >= 2 else 1
    static = build_static_index(catalog, dense_levels=dense_levels)
    entries = [m.n_entries for m in index.steps]
    assert static.nbytes == static_style_bytes(entries, static.vocab, dense_levels)
    assert static_step_bytes(static) == static_style_step_bytes(entries, static.vocab, dense_levels)
    # Walk every catalog SID through the STATIC-style index and the host trie.
    states = torch.zeros(catalog.n_items, dtype=torch.int64)
    trie_states = torch.zeros(catalog.n_items, dtype=torch.int64)
    sids = torch.from_numpy(catalog.sids.astype(np.int64))
    for step in range(catalog.n_levels):
        tok, succ = static.candidates(step, states)
        glob = sids[:, step] + static.band_offsets[step]
        hit = tok == glob[:, None]
        assert bool(hit.any(1).all())
        states = succ[hit]
        ttok, tsucc = trie.children(step, trie_states)
        thit = ttok.long() == sids[:, step:step + 1]
        assert bool(thit.any(1).all())
        trie_states = tsucc[thit]
    np.testing.assert_array_equal(states.numpy(), np.arange(catalog.n_items))
    np.testing.assert_array_equal(trie_states.numpy(), np.arange(catalog.n_items))


def test_single_item_catalog():
    catalog = Catalog.from_sids(np.array([[3, 0, 1]]), [4, 2, 2])
    index = build_index(catalog)
    assert [m.n_entries for m in index.steps] == [1, 1, 1]
    assert index.walk([3, 0, 1]) == 0
    np.testing.assert_array_equal(index.next_tokens([3]), [0])


def test_representation_rule_and_overrides():
    rng = np.random.default_rng(1)
    sids = np.unique(rng.integers(0, 16, size=(400, 3)), axis=0)
    catalog = Catalog.from_sids(sids, [16, 16, 16])
    index = build_index(catalog)
    assert index.steps[0].kind == "dense"  # one state: a 16-wide table is cheap
    forced = build_index(catalog, config=IndexConfig().with_overrides({1: "sparse", 3: "dense"}))
    assert forced.steps[0].kind == "sparse" and forced.steps[2].kind == "dense"
    for row in range(0, catalog.n_items, 37):
        for p in range(3):
            np.testing.assert_array_equal(forced.next_tokens(list(sids[row, :p])),
                                          index.next_tokens(list(sids[row, :p])))
    report = forced.report()
    assert report["total_bytes"] == sum(r["bytes"] for r in report["steps"])
    assert report["steps"][2]["bytes"] == report["steps"][2]["dense_bytes"]
    with pytest.raises(ZeroGRError):
        IndexConfig().with_overrides({1: "csr"})


def test_smallest_dtypes():
    catalog = Catalog.from_sids(np.array([[0, 5, 200], [1, 2, 40000]]), [2, 128, 40001])
    index = build_index(catalog, config=INDEX_PRESETS["all-sparse"])
    assert [m.tokens.dtype for m in index.steps] == [torch.int8, torch.int8, torch.int32]
    assert all(m.offsets.dtype == torch.int32 for m in index.steps)


def test_bad_builder_and_device():
    catalog = Catalog.from_sids(np.array([[0, 1]]), [2, 2])
    with pytest.raises(ZeroGRError, match="builder"):
        build_index(catalog, builder="fast")
    if not torch.cuda.is_available():
        with pytest.raises(ZeroGRError, match="CUDA"):
            build_index(catalog, device="cuda")
    with pytest.raises(ZeroGRError, match="^device: 'gpu0' is not a device"):
        build_index(catalog, device="gpu0")
    with pytest.raises(ZeroGRError, match="^device: 'meta': choose cpu, cuda"):
        build_index(catalog, device="meta")


def test_build_index_names_a_catalog_or_config_of_the_wrong_kind():
    """A bare SID array raised AttributeError ('numpy.ndarray' object has no attribute 'sids'), and a
    preset's name as config AttributeError ('str' object has no attribute 'workers')."""
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    with pytest.raises(ZeroGRError, match=r"^catalog: expected a Catalog \(Catalog.from_sids\), got ndarray$"):
        build_index(catalog.sids)
    with pytest.raises(ZeroGRError, match=r"^config: expected an IndexConfig or one of default, .*, got 'fastest'$"):
        build_index(catalog, config="fastest")
    for name, config in INDEX_PRESETS.items():
        assert build_index(catalog, config=name).config == config


def test_index_config_values_a_builder_cannot_use_are_named():
    """chunk_rows=0 raised range()'s ValueError, workers=-1 the thread pool's; an override of step 0 (counted
    from 0), of a step past the last or keyed "1" did nothing, silently."""
    catalog = Catalog.from_sids(np.array([[0, 1], [1, 0]]), [2, 2])
    for fields, message in ((dict(chunk_rows=0), r"chunk_rows: expected a whole number ≥ 1, got 0"),
                            (dict(workers=-1), r"workers: expected a whole number ≥ 0, got -1"),
                            (dict(dense_ratio="4"), r"dense_ratio: expected a number ≥ 0, got '4'"),
                            # int() of these raised OverflowError / ValueError; NaN made every step sparse
                            (dict(chunk_rows=float("inf")), r"chunk_rows: expected a whole number ≥ 1, got inf"),
                            (dict(workers=float("nan")), r"workers: expected a whole number ≥ 0, got nan"),
                            (dict(dense_ratio=float("nan")), r"dense_ratio: expected a number ≥ 0, got nan"),
                            (dict(chunk_rows=2.5), r"chunk_rows: expected a whole number ≥ 1, got 2.5"),
                            (dict(staging_buffers=3), r"staging_buffers: expected 1 or 2, got 3"),
                            (dict(overrides=((0, "dense"),)), r"override step 0: steps are numbered from 1")):
        with pytest.raises(ZeroGRError, match=rf"^(IndexConfig )?{message}$"):
            IndexConfig(**fields)
    for bad in ({0: "dense"}, {"1": "sparse"}):
        with pytest.raises(ZeroGRError, match=r"^override step .*: steps are numbered from 1$"):
            IndexConfig().with_overrides(bad)
    with pytest.raises(ZeroGRError, match=r"^override step 3: the catalog has 2 steps \(numbered from 1\)$"):
        build_index(catalog, config=IndexConfig().with_overrides({3: "sparse"}))
    index = build_index(catalog, config=IndexConfig().with_overrides({np.int64(1): "sparse"}))
    assert index.steps[0].kind == "sparse"
    # a whole float is a whole number: chunk_rows=2.0 passed the check, then range() raised TypeError
    config = IndexConfig(chunk_rows=2.0, dense_budget_bytes=1e6, workers=np.int64(1))
    assert (config.chunk_rows, config.dense_budget_bytes, config.workers) == (2, 1_000_000, 1)
    assert build_index(catalog, config=config).n_items == 2
