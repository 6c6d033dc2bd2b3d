"""String item ids (ASIN-style) in loaders, the API, results and the CLI; integer ids unchanged."""
import json

import numpy as np
import polars as pl
import pytest
import torch

from zerogr_core import Catalog, CatalogError, Decoder, build_index
from zerogr_core.catalog.io import load_catalog, save_catalog
from zerogr_core.cli import main

ASINS = "item_id,s1,s2,title\nB00ABC1234,1,0,a\nB07XYZ0001,0,1,b\n0553213113,0,0,c\n"


@pytest.mark.parametrize("ext,sep", [(".csv", ","), (".tsv", "\t"), (".parquet", None)])
def test_asin_ids_load_in_every_format(tmp_path, ext, sep):
    path = tmp_path / f"asins{ext}"
    if sep is None:
        pl.read_csv(ASINS.encode(), infer_schema=False).write_parquet(path)
    else:
        path.write_text(ASINS.replace(",", sep))
    catalog = load_catalog(path)
    assert catalog.string_ids and catalog.item_ids.dtype.kind == "T"
    # rows sorted by SID, the ids follow the sort; "0553213113" keeps its leading zero
    assert catalog.item_ids.tolist() == ["0553213113", "B07XYZ0001", "B00ABC1234"]
    assert catalog.titles.tolist() == ["c", "b", "a"]
    assert catalog.row_of_item("B00ABC1234") == 2
    assert catalog.rows_of(["B07XYZ0001", "nope"], missing="mark").tolist() == [1, -1]
    out = tmp_path / f"again{ext}"
    save_catalog(catalog, out)
    again = load_catalog(out)
    assert again.item_ids.tolist() == catalog.item_ids.tolist()


def test_integer_ids_stay_int64(tmp_path):
    path = tmp_path / "ints.csv"
    path.write_text("item_id,s1\n 12 ,1\n-3,0\n")
    catalog = load_catalog(path)
    assert catalog.item_ids.dtype == np.int64 and catalog.item_ids.tolist() == [-3, 12]
    assert not catalog.string_ids and catalog.rows_of(["12", 12]).tolist() == [1, 1]


@pytest.mark.parametrize("ids,kind", [
    (["1234567890123456789", "-9223372036854775808", "9223372036854775807"], "i"),  # 19 digits within int64
    (["9223372036854775808", "5"], "T"),  # one id past int64: every id stays as written
    (["12345678901234567890", "5"], "T"),
])
def test_ids_of_19_digits_are_integers_while_they_fit_int64(tmp_path, ids, kind):
    path = tmp_path / "long.csv"
    path.write_text("item_id,s1\n" + "".join(f"{v},{r}\n" for r, v in enumerate(ids)))
    catalog = load_catalog(path)
    assert catalog.item_ids.dtype.kind == kind
    assert [str(v) for v in catalog.item_ids.tolist()] == ids
    want = int(ids[0]) if kind == "i" else ids[0]
    assert catalog.rows_of([want]).tolist() == [0]
    out = tmp_path / "again.csv"
    save_catalog(catalog, out)
    assert load_catalog(out).item_ids.tolist() == catalog.item_ids.tolist()


@pytest.mark.parametrize("text,fragments", [
    ("item_id,s1\nB00A,1\nB00B,2\nB00A,3\n", ["row 3", "column 'item_id'", "duplicate item id 'B00A'", "row 1"]),
    ("item_id,s1\nB00A,1\n  ,2\n", ["row 2", "column 'item_id'", "missing value"]),
    ("item_id,s1\n7,1\n007,2\n8,3\n", None),  # "7" and "007" are two string ids
])
def test_string_id_errors_name_the_row_and_id(tmp_path, text, fragments):
    path = tmp_path / "bad.csv"
    path.write_text(text)
    if fragments is None:
        assert load_catalog(path).item_ids.tolist() == ["7", "007", "8"]
        return
    with pytest.raises(CatalogError) as info:
        load_catalog(path)
    for fragment in fragments:
        assert fragment in str(info.value), (fragment, str(info.value))


def test_from_sids_takes_strings_and_rejects_mixes():
    cat = Catalog.from_sids([[1], [0]], item_ids=["x", "y"])
    assert cat.item_ids.tolist() == ["y", "x"]
    assert cat.ids_of_rows([1, -1]).tolist() == ["x", None]
    with pytest.raises(CatalogError, match="empty item id"):
        Catalog.from_sids([[1], [0]], item_ids=["x", ""])
    with pytest.raises(CatalogError, match="duplicate item id 'x'"):
        Catalog.from_sids([[1], [0]], item_ids=["x", "x"])
    with pytest.raises(CatalogError, match="mix integers and strings"):
        Catalog.from_sids([[1], [0]], item_ids=np.array(["x", 3], dtype=object))
    with pytest.raises(CatalogError, match="duplicate item id 4"):
        Catalog.from_sids([[1], [0]], item_ids=[4, 4])
    with pytest.raises(CatalogError, match="shared by items 'b' and 'a'"):
        Catalog.from_sids([[1], [1]], item_ids=["b", "a"])
    assert Catalog.from_sids([[1], [0]], item_ids=[5, 6]).ids_of_rows([0, -1]).tolist() == [6, -1]


def test_padding_id_can_be_told_from_an_item_whose_id_is_minus_one():
    cat = Catalog.from_sids([[0, 1], [1, 0], [1, 1]], [2, 2], item_ids=[-1, 5, 7])
    index = build_index(cat)
    heads = [torch.randn(2, 4), torch.randn(2, 4)]
    result = Decoder(index, heads, 4).decode(lambda step, p: torch.randn(p.shape[0], p.shape[1], 4), 1)
    assert sorted(result.item_ids(cat)[0].tolist()) == [-1, -1, 5, 7]      # item -1 and one padded beam
    assert sorted(result.item_ids(cat, fill=-2**63)[0].tolist()) == [-2**63, -1, 5, 7]
    assert (result.item_rows < 0).sum() == 1
    for bad in (None, 1.5, True, 2**63, "x"):
        with pytest.raises(CatalogError, match="fill: expected a 64-bit integer id"):
            cat.ids_of_rows([0, -1], fill=bad)


def test_cli_next_prints_string_ids(tmp_path, capsys):
    path = tmp_path / "asins.csv"
    path.write_text(ASINS)
    assert main(["next", str(path), "--prefix", "0", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["item_ids"] == ["0553213113", "B07XYZ0001"]
    assert main(["stats", str(path)]) == 0
    assert "string item ids" in capsys.readouterr().out
    assert main(["stats", str(path), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["item_ids"] == "string"


def test_parquet_string_ids_stay_strings(tmp_path):
    path = tmp_path / "typed.parquet"
    pl.DataFrame({"item_id": ["1", "2"], "s1": [0, 1]}).write_parquet(path)
    assert load_catalog(path).item_ids.tolist() == ["1", "2"]
    cat = Catalog.from_sids([[0], [1]], item_ids=["1", "2"])
    save_catalog(cat, path)
    assert load_catalog(path).string_ids


def test_integers_past_int64_name_no_item():
    import torch

    from zerogr_core import Decoder, build_index

    # ids -1 and 2**63 - 1: what 2**64 - 1 and 2**63 would wrap onto in int64
    ids = np.array([-1, 11, 12, 13, 14, 2**63 - 1])
    cat = Catalog.from_sids(np.array([[0, 0], [0, 1], [1, 0], [1, 1], [2, 0], [3, 3]]), [4, 4], item_ids=ids)
    for past in ([2**64 - 1], np.array([2**64 - 1], dtype=np.uint64), [2**70], ["18446744073709551615"]):
        assert cat.rows_of(past, missing="mark").tolist() == [-1], past
    assert cat.rows_of(np.array([2**64 - 1, 12], dtype=np.uint64), missing="drop").tolist() == [2]
    with pytest.raises(CatalogError, match=r"item id\[0\]: item id 1180591620717411303424 is not in catalog"):
        cat.rows_of([2**70])
    heads = [torch.randn(4, 8) for _ in range(2)]
    dec = Decoder(build_index(cat), heads, 4, catalog=cat)
    h = torch.randn(8)

    def model(step, prefixes):
        return h.expand(prefixes.shape[0], prefixes.shape[1], 8)

    nothing = dec.decode(model, 2, allow_items=[[2**64 - 1], np.array([2**70], dtype=object)])
    assert (nothing.item_rows == -1).all()
    kept = dec.decode(model, 1, allow_items=[np.array([2**64 - 1, 11], dtype=np.uint64)])
    assert kept.item_rows[0].tolist() == [1, -1, -1, -1]
    wide = Decoder(build_index(cat), heads, 6, catalog=cat)  # every item fits: a denied one would show
    assert torch.equal(wide.decode(model, 1, deny_items=[[2**64 - 1]]).item_rows, wide.decode(model, 1).item_rows)


def test_catalog_ids_past_int64_are_refused_not_wrapped():
    """numpy reads [1, 2**63] as float64 and 2**64 - 1 fits only uint64: their cast to int64 wrapped them onto
    other ids (-2**63, -1) silently, so the catalog named items the caller never gave."""
    sids = [[0], [1]]
    for ids, shown_id in (([1, 2**63], "9.223372036854776e\\+18"), (np.array([1, 2**64 - 1], dtype=np.uint64),
                                                                  "18446744073709551615"),
                          ([1.0, 1e30], "1e\\+30"), ([1.0, 2.0**63], "9.223372036854776e\\+18"),
                          ([1.0, -1e19], "-1e\\+19")):
        with pytest.raises(CatalogError, match=rf"^row 2, column 'item_id': item id {shown_id} is past the 64-bit "
                                               rf"signed range$"):
            Catalog.from_sids(sids, item_ids=ids)
    assert Catalog.from_sids(sids, item_ids=[1, 2**63 - 1]).item_ids.tolist() == [1, 2**63 - 1]
    assert Catalog.from_sids(sids, item_ids=np.array([1, 2**63 - 1], dtype=np.uint64)).item_ids.dtype == np.int64
    assert Catalog.from_sids(sids, item_ids=[-2.0**63, 5.0]).item_ids.tolist() == [-2**63, 5]


def test_rows_outside_the_catalog_are_refused_not_clipped():
    """result.item_ids(catalog) with the rows of a decode over a larger catalog clipped every row past
    the end onto the last item, so a stale or wrong catalog named real-looking items."""
    cat = Catalog.from_sids([[0], [1]], item_ids=[10, 11], name="small")
    with pytest.raises(CatalogError, match=r"^row 5 is not a row of catalog 'small' \(2 items\): were these rows "
                                           r"decoded over another catalog\?$"):
        cat.ids_of_rows(np.array([[0, 5], [1, -1]]))
    with pytest.raises(CatalogError, match="row -2 is not a row"):
        Catalog.from_sids([[0], [1]], item_ids=["a", "b"]).ids_of_rows([-2])
    assert cat.ids_of_rows(np.array([[1, -1], [0, 1]])).tolist() == [[11, -1], [10, 11]]
    assert cat.ids_of_rows(np.zeros((0, 3), dtype=np.int64)).shape == (0, 3)
