"""Catalog files: both layouts in every format, and one clear error per malformed case."""
from __future__ import annotations

import numpy as np
import polars as pl
import pytest

from zerogr_core.catalog.catalog import Catalog
from zerogr_core.catalog.io import catalog_format, load_catalog, save_catalog
from zerogr_core.errors import CatalogError


def write(tmp_path, name: str, text: str):
    path = tmp_path / name
    path.write_text(text)
    return path


def expect_error(path, *fragments, **kwargs) -> CatalogError:
    with pytest.raises(CatalogError) as info:
        load_catalog(path, **kwargs)
    message = str(info.value)
    assert "\n" not in message
    assert message.startswith(str(path))
    for fragment in fragments:
        assert fragment in message, (fragment, message)
    return info.value


# ---------------------------------------------------------------------------- malformed files
MALFORMED = {
    # name: (file text, fragments the message must contain)
    "ragged-sid": ("item_id,sid\n1,3 5 1\n2,3 5 2\n3,3 5\n", ["row 3", "column 'sid'", "2 tokens", "row 1 has 3"]),
    "missing-level-value": ("item_id,s1,s2\n1,3,4\n2,,4\n", ["row 2", "column 's1'", "missing value"]),
    "short-row": ("item_id,s1,s2\n1,3,4\n2,3\n", ["row 2", "column 's2'", "missing value"]),
    "missing-sid": ("item_id,sid\n1,3 4\n2,\n", ["row 2", "column 'sid'", "missing value"]),
    "missing-item-id": ("item_id,s1\n1,3\n,4\n", ["row 2", "column 'item_id'", "missing value"]),
    "non-integer-token": ("item_id,s1,s2\n1,3,4\n2,x,4\n", ["row 2", "column 's1'", "'x' is not an integer"]),
    "fractional-token": ("item_id,s1\n1,3\n2,2.5\n", ["row 2", "column 's1'", "not an integer"]),
    "non-integer-sid-token": ("item_id,sid\n1,3 4\n2,3 y\n", ["row 2", "column 'sid'", "'y'", "token 2"]),
    "negative-token": ("item_id,s1,s2\n1,3,4\n2,1,-1\n", ["row 2", "column 's2'", "negative token -1"]),
    "negative-sid-token": ("item_id,sid\n1,3 4\n2,-3 4\n", ["row 2", "column 'sid'", "negative token -3", "token 1"]),
    "duplicate-item-id": ("item_id,s1\n7,1\n8,2\n7,3\n", ["row 3", "column 'item_id'", "duplicate item id 7",
                                                          "also on row 1"]),
    "duplicate-sid": ("item_id,s1,s2\n1,3,4\n2,0,1\n3,3,4\n", ["column 's1–s2'", "SID 3 4", "items 1 and 3",
                                                              "collision"]),
    "duplicate-sid-one-level": ("item_id,s1\n1,0\n2,0\n", ["row 2", "column 's1'", "items 1 and 2"]),
    "no-item-id-column": ("id,s1\n1,2\n", ["no 'item_id' column", "id, s1"]),
    "no-level-columns": ("item_id,title\n1,a\n", ["no SID columns"]),
    "level-gap": ("item_id,s1,s3\n1,2,3\n", ["column 's2'", "without gaps"]),
    "duplicate-long-string-id": ("item_id,s1\nhttps://example.com/item/1,1\nhttps://example.com/item/2,2\n"
                                 "https://example.com/item/1,3\n",
                                 ["row 3", "duplicate item id 'https://example.com/item/1' (also on row 1)"]),
    "bare-carriage-returns": ("item_id,s1\r1,2\r3,4\r", ["bare carriage return (\\r)"]),
    "level-gap-from-zero": ("item_id,s0,s2\n1,2,3\n", ["column 's1'", "s0…s2 without gaps"]),
    "levels-not-from-one": ("item_id,s2,s3\n1,2,3\n", ["column 's1'", "s1…s3 without gaps"]),
    "zero-based-bad-token": ("item_id,s0,s1\n1,2,3\n2,2,-1\n", ["row 2", "column 's1'", "negative token"]),
    "own-case-bad-token": ("item_id,S1,S2\n1,2,3\n2,2,-1\n", ["row 2", "column 'S2'", "negative token"]),
    "both-layouts": ("item_id,s1,sid\n1,2,3\n", ["column 'sid'", "both"]),
    "header-only": ("item_id,s1,s2\n", ["no data rows"]),
    "blank-lines-only": ("\n\n\n", ["file is empty"]),
    "extra-field": ("item_id,s1\n1,2\n3,4,5\n", ["row 2", "3 fields but the header has 2"]),
}


@pytest.mark.parametrize("case", sorted(MALFORMED))
def test_malformed_csv_names_file_row_column(tmp_path, case):
    text, fragments = MALFORMED[case]
    expect_error(write(tmp_path, f"{case}.csv", text), *fragments)


def test_long_values_are_cut_in_messages(tmp_path):
    long_id = "x" * 5000
    path = write(tmp_path, "long.csv", f"item_id,s1\n{long_id},1\n{long_id},2\n")
    with pytest.raises(CatalogError) as caught:
        load_catalog(path)
    message = str(caught.value)
    assert "row 2" in message and "(also on row 1)" in message and "x…" in message and len(message) < 300, message


def test_from_sids_names_ragged_rows_and_quotes_numpy_values_plainly():
    with pytest.raises(CatalogError, match="rows have different lengths"):
        Catalog.from_sids([[0, 1], [1]], [2, 2])
    with pytest.raises(CatalogError, match=r"row 1, column 's1': token 0\.5 is not an integer$"):
        Catalog.from_sids(np.array([[0.5, 1.0]]), [2, 2])


def test_from_sids_refuses_more_levels_than_int8_prefix_lengths_hold():
    """With 128 levels the int8 common prefix length of two equal SIDs wrapped to -128, so the duplicate
    passed and the catalog held two items no decode could tell apart."""
    with pytest.raises(CatalogError, match=r"^128 SID levels, over the 127 a catalog holds"):
        Catalog.from_sids(np.zeros((2, 128), dtype=np.int64))
    with pytest.raises(CatalogError, match="is shared by items 0 and 1"):
        Catalog.from_sids(np.zeros((2, 127), dtype=np.int64))


def test_from_sids_names_codebook_sizes_that_are_not_whole_numbers():
    """A scalar or a string raised TypeError/ValueError from int() and 4.7 was truncated to 4."""
    sids = np.array([[0, 1], [1, 0]])
    for bad in (4, "44", [4.7, 4], [None, 4], [True, 4]):
        with pytest.raises(CatalogError, match=r"^column 'codebook_sizes': codebook sizes must be one whole number "
                                               r"per level, got "):
            Catalog.from_sids(sids, bad)
    for fine in ([2, 3], (2.0, 3.0), np.array([2, 3]), [np.int32(2), 3]):
        assert Catalog.from_sids(sids, fine).codebook_sizes == (2, 3)


def test_from_sids_names_band_offsets_that_are_not_whole_numbers():
    """Band offsets went through int(): 3.7 was read as 3 (a model's SID tokens then looked up one
    vocabulary id off), a scalar raised TypeError, and a negative offset passed."""
    sids = np.array([[0, 1], [1, 0]])
    for bad in (5, "08", [0, 3.7], [0, None], [0, -1], [False, 2]):
        with pytest.raises(CatalogError, match=r"^column 'band_offsets': band offsets must be one non-negative "
                                               r"whole number per level, got "):
            Catalog.from_sids(sids, (2, 2), band_offsets=bad)
    for fine in ([0, 2], (0.0, 2.0), np.array([0, 2]), [np.int64(0), 2]):
        offsets = Catalog.from_sids(sids, (2, 2), band_offsets=fine).band_offsets
        assert offsets == (0, 2) and all(type(o) is int for o in offsets)


def test_a_declared_size_past_int32_names_the_codebook_sizes_not_a_level_column(tmp_path):
    """3,000,000,000 declared for level 2 of a file was reported as "column 's2': codebook size must be in …",
    a fault of the file's column; it is the declared sizes' (on the app's Catalog page, its *Options* field)."""
    path = write(tmp_path, "sizes.csv", "item_id,s1,s2\n1,3,4\n2,1,0\n")
    with pytest.raises(CatalogError) as err:
        load_catalog(path, codebook_sizes=(4, 3_000_000_000))
    assert str(err.value) == (f"{path}, column 'codebook_sizes': codebook size 2 must be in [1, 2147483648] (tokens "
                              "are stored as int32), got 3000000000")


def test_rows_refer_to_file_order_not_sorted_order(tmp_path):
    # The bad row is the 4th data row of the file even though sorting would move it.
    path = write(tmp_path, "unsorted.csv", "item_id,s1,s2\n1,9,1\n2,5,0\n3,7,7\n4,0,-2\n")
    expect_error(path, "row 4", "column 's2'")


def test_missing_file_empty_file_and_extension(tmp_path):
    expect_error(tmp_path / "absent.csv", "no such file")
    expect_error(write(tmp_path, "empty.csv", ""), "file is empty")
    expect_error(write(tmp_path, "catalog.json", "{}"), "unsupported extension '.json'")
    (tmp_path / "folder.csv").mkdir()
    expect_error(tmp_path / "folder.csv", "not a regular file")


def test_max_bytes(tmp_path):
    path = write(tmp_path, "big.csv", "item_id,s1\n" + "".join(f"{i},{i}\n" for i in range(100)))
    expect_error(path, "over the limit of 100", max_bytes=100)
    assert load_catalog(path, max_bytes=10_000).n_items == 100


def test_token_beyond_declared_codebook(tmp_path):
    path = write(tmp_path, "sizes.csv", "item_id,s1,s2\n1,3,4\n2,1,9\n")
    expect_error(path, "row 2", "column 's2'", "token 9 ≥ codebook size 8", codebook_sizes=(4, 8))
    expect_error(path, "column 'codebook_sizes'", "the SIDs have 2 levels, the codebook sizes 4/8/8 have 3",
                 codebook_sizes=(4, 8, 8))
    sid_path = write(tmp_path, "sizes_sid.csv", "item_id,sid\n1,3 4\n2,1 9\n")
    expect_error(sid_path, "row 2", "column 'sid'", "token 9 ≥ codebook size 8", "token 2", codebook_sizes=(4, 8))


def test_duplicate_sids_with_collision_level(tmp_path):
    path = write(tmp_path, "dups.csv", "item_id,s1,s2\n1,3,4\n2,0,1\n3,3,4\n4,3,4\n")
    catalog = load_catalog(path, on_duplicate="collision")
    assert catalog.collision_level_added and catalog.duplicate_groups == 1
    assert catalog.sids.tolist() == [[0, 1, 0], [3, 4, 0], [3, 4, 1], [3, 4, 2]]
    assert catalog.item_ids.tolist() == [2, 1, 3, 4]
    assert catalog.codebook_sizes == (4, 5, 3)
    expect_error(path, "on_duplicate", on_duplicate="ignore")


def test_parquet_errors(tmp_path):
    path = tmp_path / "bad.parquet"
    pl.DataFrame({"item_id": [1, 2, 3], "s1": [1.0, None, 2.0]}).write_parquet(path)
    expect_error(path, "row 2", "column 's1'", "missing value")
    pl.DataFrame({"item_id": [1, 2], "sid": [[1, 2], [3]]}).write_parquet(path)
    expect_error(path, "row 2", "column 'sid'", "1 tokens, but row 1 has 2")
    pl.DataFrame({"item_id": [1, 2], "sid": [[1, 2], [3, None]]}).write_parquet(path)
    expect_error(path, "row 2", "column 'sid'", "missing value", "token 2")
    pl.DataFrame({"item_id": [1, 2], "s1": [True, False]}).write_parquet(path)
    expect_error(path, "column 's1'", "expected integers")
    u64 = pl.Series([0, 2**63 + 5], dtype=pl.UInt64)
    pl.DataFrame({"item_id": [1, 2], "s1": u64}).write_parquet(path)
    expect_error(path, "row 2", "column 's1'", "9223372036854775813 is past the 64-bit signed range")
    pl.DataFrame({"item_id": [1, 2], "s1": [0, 2**31]}).write_parquet(path)
    expect_error(path, "row 2", "column 's1'", "token 2147483648 exceeds the largest supported token")
    pl.DataFrame({"item_id": pl.Series([1, 2], dtype=pl.UInt64), "s1": [0, 1]}).write_parquet(path)
    assert load_catalog(path).item_ids.tolist() == [1, 2]  # unsigned values within int64 load
    garbage = write(tmp_path, "garbage.parquet", "not a parquet file at all")
    expect_error(garbage, "cannot read as PARQUET")


def test_parquet_float_columns_past_int64(tmp_path):
    """Infinite or huge floats in a float column raised Polars' InvalidOperationError ('conversion
    from `f64` to `i64` failed in column ...'), with a traceback and no row."""
    path = tmp_path / "floats.parquet"
    for column, other in (("item_id", {"s1": [0, 1]}), ("s1", {"item_id": [1, 2]})):
        for value, reason in ((float("inf"), "inf is not an integer"), (float("-inf"), "-inf is not an integer"),
                              (1e30, "1e+30 is past the 64-bit signed range")):
            pl.DataFrame({column: [1.0, value], **other}).write_parquet(path)
            expect_error(path, "row 2", f"column '{column}'", reason)
    pl.DataFrame({"item_id": [1.0, -2.0**63], "s1": [0, 1]}).write_parquet(path)
    assert load_catalog(path).item_ids.tolist() == [1, -2**63]


# ---------------------------------------------------------------------------- reading and round trips
def test_carriage_returns_inside_lines_and_crlf_files_load(tmp_path):
    crlf = load_catalog(write(tmp_path, "crlf.csv", "item_id,s1,title\r\n1,0,x\r\n2,1,y\r\n"))
    quoted = load_catalog(write(tmp_path, "quoted.csv", 'item_id,s1,title\n1,0,"a\rb"\n2,1,y\n'))
    assert crlf.titles.tolist() == ["x", "y"] and quoted.titles.tolist() == ["a\rb", "y"]


def test_layouts_agree_and_sort(tmp_path):
    per_level = write(tmp_path, "a.csv", "Item_ID, s1 ,s2,s3,Title,genre\n10,3,5,1,x,g\n11,0,2,2,\"y, z\",g\n")
    sid_tsv = write(tmp_path, "b.tsv", "item_id\tsid\ttitle\n10\t3 5 1\tx\n11\t 0, 2 ,2 \ty, z\n")
    sid_txt = write(tmp_path, "c.txt", "item_id\tsid\ttitle\n10\t3,5,1\tx\n11\t0 2 2\ty, z\n")
    sid_list = tmp_path / "d.parquet"
    pl.DataFrame({"item_id": [10, 11], "sid": [[3, 5, 1], [0, 2, 2]], "title": ["x", "y, z"]}).write_parquet(sid_list)
    for path in (per_level, sid_tsv, sid_txt, sid_list):
        catalog = load_catalog(path)
        assert catalog.sids.tolist() == [[0, 2, 2], [3, 5, 1]], path
        assert catalog.item_ids.tolist() == [11, 10]
        assert catalog.titles.tolist() == ["y, z", "x"]
        assert catalog.codebook_sizes == (4, 6, 3)
        assert catalog.name == path.stem


def test_levels_numbered_from_zero_keep_every_level(tmp_path):
    # s0 is the first level, not an extra column to ignore: dropping it would merge items
    zero = load_catalog(write(tmp_path, "zero.csv", "item_id,s0,s1,s2\n1,4,2,3\n2,5,2,3\n"))
    one = load_catalog(write(tmp_path, "one.csv", "item_id,s1,s2,s3\n1,4,2,3\n2,5,2,3\n"))
    assert zero.n_levels == 3
    np.testing.assert_array_equal(zero.sids, one.sids)
    np.testing.assert_array_equal(zero.item_ids, one.item_ids)


def test_array_column_and_float_columns(tmp_path):
    path = tmp_path / "arr.parquet"
    pl.DataFrame({"item_id": [5.0, 6.0], "sid": pl.Series([[1, 2], [0, 3]], dtype=pl.Array(pl.Int16, 2))}
                 ).write_parquet(path)
    catalog = load_catalog(path, codebook_sizes=(2, 4))
    assert catalog.sids.tolist() == [[0, 3], [1, 2]] and catalog.item_ids.tolist() == [6, 5]


def random_catalog(rng, n=300, sizes=(50, 7, 300), titles=True, band_offsets=None) -> Catalog:
    sids = np.stack([rng.integers(0, s, n) for s in sizes], axis=1)
    sids = np.unique(sids, axis=0)
    ids = rng.permutation(10 * len(sids))[:len(sids)]
    names = [f"item {i}, \"quoted\"\t" if i % 7 == 0 else f"item {i}" for i in range(len(sids))] if titles else None
    return Catalog.from_sids(sids, tuple(s + 3 for s in sizes), item_ids=ids, titles=names,
                             band_offsets=band_offsets)


@pytest.mark.parametrize("suffix", [".csv", ".tsv", ".txt", ".parquet"])
@pytest.mark.parametrize("titles", [True, False])
def test_round_trip_is_exact(tmp_path, suffix, titles):
    rng = np.random.default_rng(len(suffix) + titles)
    catalog = random_catalog(rng, titles=titles, band_offsets=(0, 53, 63))
    path = save_catalog(catalog, tmp_path / f"cat{suffix}")
    sizes = None if suffix == ".parquet" else catalog.codebook_sizes
    back = load_catalog(path, codebook_sizes=sizes)
    assert np.array_equal(back.sids, catalog.sids) and back.sids.dtype == catalog.sids.dtype
    assert np.array_equal(back.item_ids, catalog.item_ids)
    assert back.codebook_sizes == catalog.codebook_sizes
    if titles:
        assert back.titles.tolist() == catalog.titles.tolist()
    else:
        assert back.titles is None
    if suffix == ".parquet":
        assert back.band_offsets == catalog.band_offsets   # kept in the Parquet metadata
    header = pl.read_parquet(path) if suffix == ".parquet" else pl.read_csv(path, separator="," if suffix == ".csv" else "\t")
    assert header.columns[:4] == ["item_id", "s1", "s2", "s3"]


def test_round_trip_of_collision_catalog(tmp_path):
    catalog = Catalog.from_sids([[1, 1], [1, 1], [0, 2]], (2, 3), on_duplicate="collision")
    back = load_catalog(save_catalog(catalog, tmp_path / "c.parquet"))
    assert np.array_equal(back.sids, catalog.sids) and back.codebook_sizes == catalog.codebook_sizes == (2, 3, 2)


def test_declared_sizes_override_metadata(tmp_path):
    catalog = Catalog.from_sids([[1, 1], [0, 2]], (8, 8), band_offsets=(0, 8))
    path = save_catalog(catalog, tmp_path / "c.parquet")
    back = load_catalog(path, codebook_sizes=(4, 4))
    assert back.codebook_sizes == (4, 4) and back.band_offsets is None


def test_catalog_format():
    assert [catalog_format(p) for p in ("a.csv", "a.TSV", "a.txt", "a.parquet")] == ["csv", "tsv", "tsv", "parquet"]
    with pytest.raises(CatalogError, match="unsupported extension"):
        catalog_format("a.xlsx")
