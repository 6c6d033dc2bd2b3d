"""What the app shows for an item when its catalog has no titles.

The bundled Amazon Beauty data (tiger-cf's ``inter.json`` and ``index_rqkmeans.json``) holds
item numbers and interactions only: no product names, no ASINs to look them up by. The best
it offers is how popular each item is, so its lists read "item 7632 · in 87 histories"
rather than a bare number.
"""
from __future__ import annotations

import numpy as np

#: Said beside a list whose items are labelled by :func:`popularity_labels`.
NO_TITLES_NOTE = ("This data set has no product titles (tiger-cf ships item numbers and interactions only), so "
                  "items are shown by number with the count of training histories that hold them.")


def has_real_titles(titles, item_ids) -> bool:
    """Whether ``titles`` say more than the item ids do (a catalog without titles often repeats the id)."""
    if titles is None:
        return False
    return any(str(t) != str(i) for t, i in zip(titles, item_ids))


def popularity_labels(item_ids, histories) -> np.ndarray:
    """``"item <id> · in <n> histories"`` for every catalog row.

    Parameters
    ----------
    item_ids : array, shape (N,)
        Item id of every catalog row.
    histories : sequence of int arrays
        Catalog rows of each user's history.

    Returns
    -------
    np.ndarray, shape (N,), object
    """
    rows = np.concatenate([np.asarray(h, dtype=np.int64) for h in histories]) if len(histories) else \
        np.zeros(0, dtype=np.int64)
    counts = np.bincount(rows[rows >= 0], minlength=len(item_ids))
    return np.array([f"item {i} · in {int(n):,} histor{'y' if n == 1 else 'ies'}" for i, n in zip(item_ids, counts)],
                    dtype=object)
