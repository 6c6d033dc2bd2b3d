"""Item ids: their validation and compact storage, and the id → row lookup of a catalog.

Numpy only, as :mod:`zerogr_core.catalog.catalog`, which keeps the ids these functions check.
"""
from __future__ import annotations

import numpy as np
from numpy.dtypes import StringDType

from ..errors import CatalogError, shown


class IdLookup:
    """Item id → row: a direct table when integer ids are dense (span at most
    :data:`DENSE_ID_SPAN` times the catalog), else the sorted ids and their rows."""

    def __init__(self, item_ids: np.ndarray):
        n = item_ids.shape[0]
        self.table = self.sorted_ids = self.order = None
        if item_ids.dtype.kind == "i" and n:
            self.base = int(item_ids.min())
            span = int(item_ids.max()) - self.base + 1
            if span <= DENSE_ID_SPAN * n:
                self.table = np.full(span, -1, dtype=np.int32 if n < 2**31 else np.int64)
                self.table[item_ids - self.base] = np.arange(n, dtype=self.table.dtype)
                return
        if item_ids.dtype.kind != "i":
            # fixed-width UTF-8 bytes (byte order is code-point order): numpy's searchsorted
            # copies a StringDType haystack on every call, a fixed-width one it does not
            item_ids = np.strings.encode(item_ids, "utf-8")
        self.order = np.argsort(item_ids, kind="stable")
        self.sorted_ids = item_ids[self.order]

    def rows(self, ids: np.ndarray) -> np.ndarray:
        """Rows of ``ids`` (same kind as the catalog's), -1 where absent; int32 below 2^31
        items, else int64."""
        if self.table is not None:
            pos = ids - self.base if self.base else ids
            # one reduction tells whether every id lies in the table (a negative position
            # is a huge unsigned one), so the usual call is a single gather
            if pos.size and pos.view(np.uint64).max() < self.table.size:
                return self.table.take(pos)
            inside = (pos >= 0) & (pos < self.table.size)
            rows = self.table.take(np.where(inside, pos, 0))
            return np.where(inside, rows, -1).astype(self.table.dtype, copy=False)
        n = self.order.size
        longer = False
        if self.sorted_ids.dtype.kind == "S":
            ids = np.strings.encode(ids, "utf-8")
            width = self.sorted_ids.dtype.itemsize
            if ids.dtype.itemsize > width:  # an id longer than every catalog id is absent
                longer = np.strings.str_len(ids) > width
            ids = ids.astype(self.sorted_ids.dtype)
        pos = np.searchsorted(self.sorted_ids, ids)
        pos_c = np.minimum(pos, max(n - 1, 0))
        found = (pos < n) & (self.sorted_ids[pos_c] == ids) & np.logical_not(longer)
        return np.where(found, self.order[pos_c], -1).astype(np.int32 if n < 2**31 else np.int64)


DENSE_ID_SPAN = 4
"""Integer ids spanning at most this many times the catalog's size are looked up through a
direct table (4 bytes per id of the span) instead of binary searches."""


def format_item_id(value) -> str:
    """An item id as messages quote it: integers bare, strings in quotes (or withheld
    inside :func:`~zerogr_core.errors.redacted_values`)."""
    if isinstance(value, (int, np.integer)):
        return shown(int(value))
    return shown(str(value))


def _is_string_array(arr: np.ndarray) -> bool:
    return arr.dtype.kind in "USTO"


def normalize_item_ids(values, n: int | None = None, *, column: str = "item_id") -> np.ndarray:
    """Validate item ids and store them compactly.

    Parameters
    ----------
    values : array-like, shape (N,)
        Integers, or strings (Python ``str``, numpy ``U``/``S``/``StringDType`` or an
        object array of ``str``). Integer-valued floats count as integers.
    n : int, optional
        Expected length.
    column : str
        Column named in messages.

    Returns
    -------
    np.ndarray, shape (N,)
        int64 for integer ids, ``StringDType`` for string ids (kept exactly as given,
        so ``"007"`` and ``"7"`` are two items).

    Raises
    ------
    CatalogError
        Wrong shape, a mix of integers and strings, empty (or blank) string ids, or a
        duplicate id; row-level errors name the (0-based) row and the id.
    """
    arr = np.asarray(values)
    if n is not None and arr.shape != (n,):
        raise CatalogError(f"item_ids has shape {arr.shape}, expected ({n},)", column=column)
    if arr.ndim != 1:
        raise CatalogError(f"item_ids must be 1-D, got shape {arr.shape}", column=column)
    if arr.dtype.kind == "O":
        kinds = np.array([isinstance(v, str) for v in arr], dtype=bool)
        if kinds.all():
            arr = arr.astype(StringDType())
        elif kinds.any():
            r = int(np.argmin(kinds)) if kinds[0] else int(np.argmax(kinds))
            raise CatalogError(f"item ids mix integers and strings ({shown(arr[r])})", row=r, column=column)
        else:
            try:
                arr = arr.astype(np.float64) if any(isinstance(v, float) for v in arr) else arr.astype(np.int64)
            except (TypeError, ValueError, OverflowError):
                raise CatalogError("item ids must be integers or strings", column=column) from None
    if arr.dtype.kind == "f":
        bad = ~np.isfinite(arr) | (arr != np.round(arr))
        if bad.any():
            r = int(np.argmax(bad))
            raise CatalogError(f"item id {shown(arr[r])} is not an integer or a string", row=r, column=column)
        # 2.0**63 is the first float past int64: the cast below would wrap it to another id
        past = (arr >= 2.0**63) | (arr < -2.0**63)
        if past.any():
            r = int(np.argmax(past))
            raise CatalogError(f"item id {shown(arr[r])} is past the 64-bit signed range", row=r, column=column)
        arr = arr.astype(np.int64)
    if arr.dtype.kind == "u" and not fits_int64(arr):  # numpy makes [1, 2**63] uint64; int64 would wrap it
        r = int(np.argmax(arr > INT64_MAX))
        raise CatalogError(f"item id {shown(arr[r])} is past the 64-bit signed range", row=r, column=column)
    if arr.dtype.kind == "S":
        arr = np.char.decode(arr, "utf-8")
    if arr.dtype.kind in "UT":
        ids = arr.astype(StringDType())
        empty = np.strings.str_len(np.strings.strip(ids)) == 0
        if empty.any():
            raise CatalogError("empty item id", row=int(np.argmax(empty)), column=column)
    elif arr.dtype.kind in "iub":
        ids = arr.astype(np.int64)
    else:
        raise CatalogError(f"item ids must be integers or strings, got dtype {arr.dtype}", column=column)
    if ids.size > 1:
        order = np.argsort(ids, kind="stable")
        ranked = ids[order]
        same = ranked[1:] == ranked[:-1]
        if same.any():
            # The first duplicate in file order: the smallest second occurrence.
            second = order[1:][same]
            r = int(second.min())
            # a comparison, not a search: numpy 2.4's searchsorted misplaces StringDType
            # strings of 16 bytes or more
            first = int(np.flatnonzero(ids == ids[r:r + 1])[0])
            raise CatalogError(f"duplicate item id {format_item_id(ids[r])} (also on row {first + 1})",
                               row=r, column=column)
    return ids


INT64_MAX = 2**63 - 1


def fits_int64(arr: np.ndarray) -> bool:
    """Whether the integer array ``arr`` holds only values of int64 (a uint64 one may not)."""
    return arr.dtype != np.uint64 or not arr.size or int(arr.max()) <= INT64_MAX


def lookup_keys(values, string_ids: bool, what: str) -> tuple[np.ndarray, np.ndarray | None]:
    """``(keys, outside)``: ids to look up, converted to the catalog's id kind (one-line error
    otherwise), and for an integer catalog the mask of integers past int64 (no item has such an
    id; their keys are stand-ins), or ``None`` when there are none."""
    arr = np.asarray(values)
    if arr.ndim == 0:
        arr = arr.reshape(1)
    if arr.size == 0:
        return np.zeros(0, dtype=StringDType() if string_ids else np.int64), None
    if string_ids:
        if arr.dtype.kind in "iu":
            return arr.astype(str).astype(StringDType()), None
        return (arr.astype(str).astype(StringDType()) if arr.dtype.kind != "T" else arr), None
    if arr.dtype.kind in "iu":
        if fits_int64(arr):
            return arr.astype(np.int64, copy=False), None
        outside = arr > INT64_MAX
        return np.where(outside, 0, arr).astype(np.int64), outside
    try:
        parsed = [int(str(v).strip()) for v in arr.ravel()]
    except ValueError:
        bad = next(str(v) for v in arr.ravel() if not str(v).strip().lstrip("-").isdigit())
        raise CatalogError(f"{what}: {shown(bad)} is not an integer, and this catalog's ids are integers") from None
    outside = np.array([not -INT64_MAX - 1 <= v <= INT64_MAX for v in parsed], dtype=bool)
    if not outside.any():
        return np.array(parsed, dtype=np.int64), None
    return np.array([0 if o else v for v, o in zip(parsed, outside)], dtype=np.int64), outside
