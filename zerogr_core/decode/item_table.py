"""Item ids of a decode's rows, looked up where the rows are.

A GPU decode ends with its rows on the device. Reading them back and gathering their ids from the
catalog's host table costs 0.3 ms of a 10 ms Qwen3 call on a lent H100
(``runs/probe_llm_host_gaps.py``): 256 random reads of an 80 MB table whose cache lines the host
lost while it waited on the decode. A device copy of the integer ids (8 bytes per item) turns that
into one gather beside the rows, read back with them.

The copy is made once per catalog and device, on first use (or when :class:`CatalogStore` builds a
version's index), and lives as long as the :class:`~zerogr_core.catalog.Catalog` object does: a
store's delete-only versions share their catalog, and a rebuild makes a new one with its new index.
String ids stay on the host (the catalog's own lookup).
"""
from __future__ import annotations

import threading
import weakref

import numpy as np
import torch

_tables: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()
_lock = threading.Lock()


def device_item_ids(catalog, device) -> torch.Tensor | None:
    """The catalog's integer item ids on ``device`` (made on first call), or ``None`` for string ids.

    Parameters
    ----------
    catalog : Catalog
    device : torch.device or str

    Returns
    -------
    torch.Tensor, shape (N,), int64, or None
    """
    if catalog.string_ids:
        return None
    device = torch.device(device)
    if device.type == "cuda" and device.index is None:
        device = torch.device("cuda", torch.cuda.current_device())
    with _lock:
        per_device = _tables.setdefault(catalog, {})
        table = per_device.get(device)
        if table is None:
            table = per_device[device] = torch.from_numpy(np.ascontiguousarray(catalog.item_ids)).to(device)
    return table


def ids_of_rows(catalog, rows: torch.Tensor, fill=-1) -> np.ndarray:
    """Item ids of catalog ``rows`` (:meth:`Catalog.ids_of_rows`, same checks and padding), gathered
    on the rows' device when they are on a GPU and the ids are integers.

    Parameters
    ----------
    catalog : Catalog
    rows : torch.Tensor, any shape, integer
        Catalog rows, -1 for padding.
    fill : int, optional

    Returns
    -------
    np.ndarray, same shape as ``rows``
    """
    table = device_item_ids(catalog, rows.device) if rows.is_cuda else None
    if table is None:
        return catalog.ids_of_rows(rows.cpu().numpy(), fill)
    rows = rows.to(torch.int64)
    # clamped, so that a row of another catalog cannot fault the gather: the host's check of the
    # rows read back names it, as the host lookup does
    both = torch.stack((rows, table[rows.clamp(0, table.shape[0] - 1)])).cpu().numpy()
    return catalog.ids_of_rows(both[0], fill, gathered=both[1])
