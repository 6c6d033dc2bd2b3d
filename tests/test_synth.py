"""Synthetic catalogs: shapes, determinism, order, uniqueness, fan-outs, bundled samples."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from zerogr_core.catalog.catalog import lcp_with_previous
from zerogr_core.catalog.samples import SAMPLES, TINY_ROWS, open_catalog, parse_count, sample_catalog, sample_path
from zerogr_core.catalog.synth import SYNTH_PRESETS, SynthConfig, _sorted_distinct, generate
from zerogr_core.errors import ZeroGRError


def assert_sorted_unique(sids: np.ndarray) -> None:
    h = lcp_with_previous(sids)
    rows = np.arange(1, len(sids))
    differ = h[1:].astype(np.int64)
    assert (differ < sids.shape[1]).all(), "duplicate SID"
    # At the first differing level the later row must be larger.
    assert (sids[rows, differ] > sids[rows - 1, differ]).all(), "not sorted"


@pytest.mark.parametrize("kind", sorted(SYNTH_PRESETS))
@pytest.mark.parametrize("n", [1, 2, 997, 30_000])
def test_presets_shape_order_uniqueness(kind, n):
    config = SYNTH_PRESETS[kind]
    catalog = generate(kind, n, seed=3)
    assert catalog.sids.shape == (n, len(config.codebook_sizes))
    assert catalog.sids.dtype == np.int16
    assert catalog.codebook_sizes == config.codebook_sizes
    assert (catalog.sids >= 0).all() and (catalog.sids < np.array(config.codebook_sizes)).all()
    assert np.array_equal(catalog.item_ids, np.arange(n))
    assert_sorted_unique(catalog.sids)
    assert catalog.name == f"{kind}-{n}"


def test_determinism_by_seed():
    a = generate("search-like", 20_000, seed=7)
    b = generate("search-like", 20_000, seed=7)
    c = generate("search-like", 20_000, seed=8)
    assert np.array_equal(a.sids, b.sids)
    assert not np.array_equal(a.sids, c.sids)


def test_search_like_band_offsets_and_fanouts():
    catalog = generate("search-like", 300_000, seed=0)
    assert catalog.band_offsets == (0, 8192, 12288, 14336, 16384)
    stats = catalog.step_stats()
    means = [s["mean_segment"] for s in stats[1:]]
    assert means[0] == pytest.approx(150, rel=0.05)
    assert means[1] == pytest.approx(8, rel=0.03)
    assert means[2] == pytest.approx(2, rel=0.03)
    assert means[3] == 1 and stats[4]["max_segment"] == 1
    # Poisson spread around the means (docs/design.md §8: max about 199/24/11/1 at 1.9e7 SIDs).
    assert 160 <= stats[1]["max_segment"] <= 215
    assert 17 <= stats[2]["max_segment"] <= 26
    assert 6 <= stats[3]["max_segment"] <= 12
    lengths = catalog.segment_lengths(2)
    assert lengths.min() >= 1 and lengths.std() > 1.5


def test_watch_like_dense_early_steps():
    stats = generate("watch-like", 100_000, seed=1).step_stats()
    assert stats[1]["density"] > 0.2          # step 2 is dense
    assert stats[2]["mean_segment"] == pytest.approx(2, rel=0.05)
    assert stats[2]["density"] < 0.001


def test_synthetic_7_codebook_parameter_and_fanouts():
    catalog = generate("synthetic-7", 200_000, seed=2, codebook=512)
    assert catalog.codebook_sizes == (512,) * 7
    means = [s["mean_segment"] for s in catalog.step_stats()[1:]]
    assert means[0] == pytest.approx(16, rel=0.25)
    assert means[1:] == pytest.approx([8, 4, 2, 2, 1], rel=0.06)
    assert generate("synthetic-7", 100, codebook=100).sids.dtype == np.int8


def test_scale_beyond_first_codebook_widens_step_2():
    config = SYNTH_PRESETS["search-like"]
    first, fanouts = config.plan(40_000_000)
    assert first == int(0.98 * 8192)
    assert fanouts[0] == pytest.approx(40_000_000 / (first * 16))
    assert fanouts[1:] == (8.0, 2.0, 1.0)
    small = SynthConfig("s", (4, 3), (2.0,), (None,))
    first, fanouts = small.plan(12)
    assert first == 4 and fanouts == (3.0,)           # both codebooks saturated
    full = generate(small, 12)                        # every SID of the 4×3 space
    assert full.sids.tolist() == [[a, b] for a in range(4) for b in range(3)]


def test_errors_are_one_line_zerogr_errors():
    with pytest.raises(ZeroGRError, match="unknown synthetic kind 'nope'"):
        generate("nope", 10)
    with pytest.raises(ZeroGRError, match="n_items must be ≥ 1"):
        generate("watch-like", 0)
    with pytest.raises(ZeroGRError, match="do not fit"):
        generate("synthetic-7", 200, codebook=2)
    with pytest.raises(ZeroGRError, match=r"codebook must be in \[1, 2147483648\], got 0"):
        generate("synthetic-7", 10, codebook=0)
    with pytest.raises(ZeroGRError, match=r"codebook must be in \[1, 2147483648\], got 3000000000"):
        generate("synthetic-7", 10, codebook=3 * 10**9)
    with pytest.raises(ZeroGRError, match="fan-out 9.0 of step 2"):
        SynthConfig("bad", (4, 4), (9.0,), (None,))
    with pytest.raises(ZeroGRError, match="need 1 values"):
        SynthConfig("bad", (4, 4), (2.0, 2.0), (None,))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 40), min_size=1, max_size=30), st.integers(40, 300), st.integers(0, 2**32 - 1))
def test_sorted_distinct_segments(counts, size, seed):
    counts = np.array(counts)
    out = _sorted_distinct(np.random.default_rng(seed), counts, size)
    assert out.size == counts.sum() and out.min() >= 0 and out.max() < size
    for segment in np.split(out, np.cumsum(counts)[:-1]):
        assert (np.diff(segment) > 0).all()


def test_bundled_samples_match_their_generators():
    for name, spec in SAMPLES.items():
        on_disk = open_catalog(name)
        fresh = sample_catalog(name)
        assert sample_path(name).exists()
        assert np.array_equal(on_disk.sids, fresh.sids), name
        assert np.array_equal(on_disk.item_ids, fresh.item_ids), name
        assert on_disk.codebook_sizes == fresh.codebook_sizes, name
        assert on_disk.band_offsets == fresh.band_offsets, name
        assert on_disk.n_items == spec.n_items
    tiny = open_catalog("tiny")
    assert tiny.titles.tolist() == [row[4] for row in TINY_ROWS]
    total = sum(sample_path(name).stat().st_size for name in SAMPLES)
    assert total < 3 << 20


def test_open_catalog_specs():
    catalog = open_catalog("synth:synthetic-7:1e3:5:64")
    assert catalog.n_items == 1000 and catalog.codebook_sizes == (64,) * 7
    assert np.array_equal(catalog.sids, generate("synthetic-7", 1000, seed=5, codebook=64).sids)
    with pytest.raises(ZeroGRError, match="expected synth:KIND:N"):
        open_catalog("synth:watch-like")
    with pytest.raises(ZeroGRError, match="'lots' is not a whole number"):
        open_catalog("synth:watch-like:lots")
    with pytest.raises(ZeroGRError, match="codebook sizes cannot be declared"):
        open_catalog("synth:watch-like:10", codebook_sizes=(8, 8, 8))
    assert [parse_count(t, "n") for t in ("12", "1_000", "2e3", "4.0")] == [12, 1000, 2000, 4]
    for bad in ("-1", "2.5", "inf", "1e999", ""):
        with pytest.raises(ZeroGRError):
            parse_count(bad, "n")
