"""Item ids of a decode's rows gathered where the rows are (zerogr_core.decode.item_table):
the same ids, padding and errors as the catalog's host lookup."""
import gc
import weakref

import numpy as np
import pytest
import torch

from zerogr_core import Catalog, CatalogError
from zerogr_core.decode.item_table import device_item_ids, ids_of_rows
from zerogr_core.decode.search import DecodeResult

cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _catalog(n=37, seed=0, string=False):
    rng = np.random.default_rng(seed)
    sids = np.stack([np.arange(n) // 6, np.arange(n) % 6], axis=1)
    ids = (rng.permutation(n) - n // 2) * 10**9 + 7919           # unique, negative and past 32 bits
    return Catalog.from_sids(sids, item_ids=[f"a{i}" for i in ids] if string else ids, name="t")


def _rows(cat, shape=(3, 5), seed=1):
    rng = np.random.default_rng(seed)
    rows = rng.integers(0, cat.n_items, size=shape)
    rows[0, -1] = rows[-1, 0] = -1
    return torch.from_numpy(rows)


def _same(got, want):
    assert got.shape == want.shape and got.dtype == want.dtype, (got.shape, got.dtype, want.shape, want.dtype)
    bad = np.argwhere(got != want)
    assert bad.size == 0, f"first mismatches at {bad[:5].tolist()}: {got[tuple(bad[:5].T)]} != {want[tuple(bad[:5].T)]}"


def test_gathered_ids_take_the_host_lookups_checks_and_padding():
    cat = _catalog()
    rows = _rows(cat).numpy()
    gathered = cat.item_ids[np.clip(rows, 0, None)]
    for fill in (-1, 0, 2**62):
        _same(cat.ids_of_rows(rows, fill, gathered=gathered), cat.ids_of_rows(rows, fill))
    bad = rows.copy()
    bad[1, 2] = cat.n_items + 3
    with pytest.raises(CatalogError, match=rf"^row {cat.n_items + 3} is not a row of catalog 't'"):
        cat.ids_of_rows(bad, gathered=gathered)
    with pytest.raises(CatalogError, match=r"^gathered: expected int64 ids of shape \(3, 5\), got \(15,\)$"):
        cat.ids_of_rows(rows, gathered=gathered.reshape(-1))
    with pytest.raises(CatalogError, match="for a catalog of string ids$"):
        _catalog(string=True).ids_of_rows(rows, gathered=gathered)


def test_rows_on_the_cpu_use_the_host_lookup():
    for string in (False, True):
        cat = _catalog(string=string)
        rows = _rows(cat)
        _same(ids_of_rows(cat, rows), cat.ids_of_rows(rows.numpy()))
        result = DecodeResult(tokens=torch.zeros(3, 5, 2, dtype=torch.int64), scores=torch.zeros(3, 5),
                              item_rows=rows)
        _same(result.item_ids(cat, **({} if string else {"fill": 7})),
              cat.ids_of_rows(rows.numpy(), **({} if string else {"fill": 7})))


def test_the_device_copy_lives_as_long_as_its_catalog():
    cat = _catalog()
    table = device_item_ids(cat, "cpu")
    assert table.dtype == torch.int64 and table.tolist() == cat.item_ids.tolist()
    assert device_item_ids(cat, "cpu") is table
    assert device_item_ids(_catalog(string=True), "cpu") is None
    held = weakref.ref(table)
    del cat, table
    gc.collect()
    assert held() is None                                       # the cache let it go with its catalog


@pytest.mark.gpu
@cuda
def test_cuda_rows_are_mapped_on_the_device_like_the_host():
    cat = _catalog(n=1001, seed=3)
    for shape in ((1, 1), (3, 5), (2, 257)):
        rows = _rows(cat, shape, seed=shape[1]).cuda()
        for fill in (-1, 5):
            _same(ids_of_rows(cat, rows, fill), cat.ids_of_rows(rows.cpu().numpy(), fill))
    assert device_item_ids(cat, "cuda").device.type == "cuda"
    assert device_item_ids(cat, torch.device("cuda")) is device_item_ids(cat, rows.device)
    bad = rows.clone()
    bad[0, 1] = cat.n_items
    with pytest.raises(CatalogError, match=rf"^row {cat.n_items} is not a row of catalog 't'"):
        ids_of_rows(cat, bad)
    torch.cuda.synchronize()  # the clamped gather did not fault
    strings = _catalog(string=True)
    rows = _rows(strings).cuda()
    _same(ids_of_rows(strings, rows), strings.ids_of_rows(rows.cpu().numpy()))
