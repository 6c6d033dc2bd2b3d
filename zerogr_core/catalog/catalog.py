"""The in-memory SID catalog: a lexicographically sorted (N, L) token table.

File formats live in :mod:`zerogr_core.catalog.io`; this module needs numpy only so that
the GPU path (index, decoders, kernels, bench) imports without Polars.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property

import numpy as np
from numpy.dtypes import StringDType

from ..arg_types import whole_values
from ..errors import CatalogError, shown
from .item_ids import IdLookup, format_item_id, lookup_keys, normalize_item_ids


def level_names(n_levels: int) -> list[str]:
    """Column names of the per-level layout: ``s1 … sL``."""
    return [f"s{i + 1}" for i in range(n_levels)]


def lexsort_rows(sids: np.ndarray) -> np.ndarray:
    """Return the permutation that sorts the rows of ``sids`` lexicographically.

    Parameters
    ----------
    sids : np.ndarray, shape (N, L), integer, non-negative

    Returns
    -------
    np.ndarray, shape (N,), int64
        Stable order (ties keep input order).
    """
    n, n_levels = sids.shape
    if n == 0:
        return np.zeros(0, dtype=np.int64)
    maxes = sids.max(axis=0).astype(np.int64) + 1
    bits = [int(m - 1).bit_length() or 1 for m in maxes]
    if sum(bits) <= 63:
        # Pack the row into one integer key: one stable argsort instead of L passes.
        key = np.zeros(n, dtype=np.int64)
        for level in range(n_levels):
            key <<= bits[level]
            key |= sids[:, level].astype(np.int64)
        return np.argsort(key, kind="stable")
    return np.lexsort(sids.T[::-1])


def lcp_with_previous(sids: np.ndarray) -> np.ndarray:
    """Longest common prefix of each row with the row before it (row 0 gets 0).

    Parameters
    ----------
    sids : np.ndarray, shape (N, L), rows sorted lexicographically

    Returns
    -------
    np.ndarray, shape (N,), int8
        ``h[i] = LCP(T[i-1], T[i])``; ``h[i] == L`` marks a duplicate SID.
    """
    n, n_levels = sids.shape
    h = np.zeros(n, dtype=np.int8)
    if n < 2:
        return h
    alive = np.ones(n - 1, dtype=bool)
    for level in range(n_levels):
        col = sids[:, level]
        alive &= col[1:] == col[:-1]
        h[1:] += alive
    return h


@dataclass(frozen=True, eq=False)
class Catalog:
    """A validated catalog of items and their semantic IDs, sorted lexicographically.

    Attributes
    ----------
    sids : np.ndarray, shape (N, L)
        Per-level local token ids, sorted lexicographically, rows unique. dtype is the
        smallest signed type that holds every codebook (int16 up to 32,767 tokens).
    codebook_sizes : tuple[int, ...]
        |V_l| per level, length L.
    item_ids : np.ndarray, shape (N,), int64 or StringDType
        Item id of each row (same order as ``sids``): int64 when every id is an integer,
        otherwise numpy's variable-width ``StringDType`` (short ids such as ASINs are
        stored inline, 16 bytes per row). See :func:`normalize_item_ids`.
    titles : np.ndarray or None, shape (N,), object
        Optional human-readable names (same order as ``sids``).
    band_offsets : tuple[int, ...] or None
        For models with one shared head: the first head row of each level's band.
    name : str
        Label used in reports.
    """

    sids: np.ndarray
    codebook_sizes: tuple[int, ...]
    item_ids: np.ndarray
    titles: np.ndarray | None = None
    band_offsets: tuple[int, ...] | None = None
    name: str = "catalog"
    collision_level_added: bool = False
    duplicate_groups: int = field(default=0)

    # ------------------------------------------------------------------ construction
    @classmethod
    def from_sids(cls, sids, codebook_sizes=None, *, item_ids=None, titles=None,
                  band_offsets=None, on_duplicate: str = "error", name: str = "catalog",
                  assume_sorted: bool = False) -> "Catalog":
        """Validate, sort and wrap a SID table.

        Parameters
        ----------
        sids : array-like, shape (N, L), integer
            Token ids per level. N ≥ 1, L ≥ 1.
        codebook_sizes : sequence of int, optional
            |V_l| per level. Inferred as ``max + 1`` per level when omitted.
        item_ids : array-like, shape (N,), int or str, optional
            Item ids; default ``arange(N)``. Integers or strings (e.g. ``"B00ABC1234"``),
            unique and non-empty (:func:`normalize_item_ids`).
        titles : array-like, shape (N,), optional
        band_offsets : sequence of int, optional
            First head row of each level when the model uses one shared head.
        on_duplicate : {"error", "collision"}
            What to do when two items share a SID: raise, or append a collision level
            (TIGER style: 0, 1, 2, … within each group of equal SIDs).
        name : str
        assume_sorted : bool
            Skip sorting when the caller guarantees lexicographic order (generators).

        Raises
        ------
        CatalogError
            Empty table, non-integer or negative tokens, tokens outside their codebook,
            duplicate item ids, or duplicate SIDs with ``on_duplicate="error"``.
        """
        if on_duplicate not in ("error", "collision"):
            raise CatalogError(f"on_duplicate must be 'error' or 'collision', got {on_duplicate!r}",
                               column="on_duplicate")
        try:
            arr = np.asarray(sids)
        except ValueError:  # numpy refuses rows of different lengths
            raise CatalogError("SID table must be 2-D (items × levels): its rows have different lengths") from None
        if arr.ndim != 2:
            raise CatalogError(f"SID table must be 2-D (items × levels), got shape {arr.shape}")
        if arr.shape[0] == 0:
            raise CatalogError("catalog is empty: no items")
        if arr.shape[1] == 0:
            raise CatalogError("catalog has no SID levels")
        if arr.shape[1] > MAX_LEVELS:
            raise CatalogError(f"{arr.shape[1]} SID levels, over the {MAX_LEVELS} a catalog holds (common prefix "
                               f"lengths are stored in int8)")
        n, n_levels = arr.shape
        names = level_names(n_levels)
        if arr.dtype.kind == "f":
            bad = ~np.isfinite(arr) | (arr != np.round(arr))
            if bad.any():
                r, c = np.argwhere(bad)[0]
                raise CatalogError(f"token {shown(arr[r, c])} is not an integer", row=int(r), column=names[c])
            arr = arr.astype(np.int64)
        elif arr.dtype.kind not in "iu":
            raise CatalogError(f"SID tokens must be integers, got dtype {arr.dtype}")
        neg = arr < 0
        if neg.any():
            r, c = np.argwhere(neg)[0]
            raise CatalogError(f"negative token {shown(int(arr[r, c]))}", row=int(r), column=names[c])
        big = arr > MAX_TOKEN
        if big.any():  # tokens are stored as int32 at most
            r, c = np.argwhere(big)[0]
            raise CatalogError(f"token {shown(int(arr[r, c]))} exceeds the largest supported token {MAX_TOKEN}",
                               row=int(r), column=names[c])
        observed = arr.max(axis=0).astype(np.int64) + 1
        if codebook_sizes is None:
            sizes = tuple(int(v) for v in observed)
        else:
            sizes = _codebook_sizes(codebook_sizes)
            if len(sizes) != n_levels:
                raise CatalogError(f"the SIDs have {n_levels} levels, the codebook sizes {'/'.join(map(str, sizes))} "
                                   f"have {len(sizes)}", column="codebook_sizes")
            for level, size in enumerate(sizes):
                if size < 1 or size > MAX_TOKEN + 1:
                    # The declared sizes are at fault, not the level's column of the data.
                    raise CatalogError(f"codebook size {level + 1} must be in [1, {MAX_TOKEN + 1}] (tokens are "
                                       f"stored as int32), got {size}", column="codebook_sizes")
                if observed[level] > size:
                    r = int(np.argmax(arr[:, level] >= size))
                    raise CatalogError(
                        f"token {shown(int(arr[r, level]))} ≥ codebook size {size}", row=r, column=names[level])
        if item_ids is None:
            ids = np.arange(n, dtype=np.int64)
        else:
            ids = normalize_item_ids(item_ids, n)
        titles_arr = None if titles is None else np.asarray(titles, dtype=object)
        if titles_arr is not None and titles_arr.shape != (n,):
            raise CatalogError(f"titles has shape {titles_arr.shape}, expected ({n},)", column="title")
        if band_offsets is not None:
            given, band_offsets = band_offsets, whole_values(band_offsets)
            if band_offsets is None or min(band_offsets, default=0) < 0:
                raise CatalogError(f"band offsets must be one non-negative whole number per level, got "
                                   f"{shown(given)}", column="band_offsets")
            if len(band_offsets) != n_levels:
                raise CatalogError(f"{len(band_offsets)} band offsets for {n_levels} levels",
                                   column="band_offsets")

        if assume_sorted:
            order = np.arange(n)
            table = arr
        else:
            order = lexsort_rows(arr)
            table = arr[order]
            ids = ids[order]
            if titles_arr is not None:
                titles_arr = titles_arr[order]
        h = lcp_with_previous(table)
        dup_mask = h == n_levels
        groups = 0
        collision = False
        if dup_mask.any():
            groups = int(np.count_nonzero(np.diff(np.concatenate([[0], dup_mask.astype(np.int8)])) == 1))
            if on_duplicate == "error":
                r = int(np.argmax(dup_mask))
                raise CatalogError(
                    f"SID {shown(' '.join(map(str, table[r])), quote=False)} is shared by items "
                    f"{format_item_id(ids[r - 1])} and {format_item_id(ids[r])} ({groups} duplicated SIDs in all; "
                    f"use the collision option to append a disambiguating level)", row=int(order[r]), column="sid")
            # Rank within each run of equal SIDs: position minus the run's start.
            run_start = np.maximum.accumulate(np.where(~dup_mask, np.arange(n), 0))
            extra = (np.arange(n) - run_start).astype(np.int64)
            table = np.concatenate([table.astype(np.int64), extra[:, None]], axis=1)
            sizes = sizes + (int(extra.max()) + 1,)
            if band_offsets is not None:
                band_offsets = band_offsets + (band_offsets[-1] + sizes[-2],)
            collision = True
        dtype = token_dtype(max(sizes))
        return cls(sids=np.ascontiguousarray(table.astype(dtype, copy=False)), codebook_sizes=sizes,
                   item_ids=ids, titles=titles_arr, band_offsets=band_offsets, name=name,
                   collision_level_added=collision, duplicate_groups=groups)

    # ------------------------------------------------------------------ properties
    @property
    def n_items(self) -> int:
        return int(self.sids.shape[0])

    @property
    def n_levels(self) -> int:
        return int(self.sids.shape[1])

    def sid_table_bytes_int16(self) -> int:
        """Bytes of the raw SID table stored as int16 (N·L·2), the memory yardstick."""
        return self.n_items * self.n_levels * 2

    @property
    def string_ids(self) -> bool:
        """Whether item ids are strings (else int64)."""
        return self.item_ids.dtype.kind != "i"

    @cached_property
    def _id_lookup(self) -> "IdLookup":
        # built once per catalog on the first lookup, so a lookup of k ids costs O(k)
        # (dense integer ids) or k binary searches, and never touches all N ids again
        return IdLookup(self.item_ids)

    def rows_of(self, item_ids, *, missing: str = "error", what: str = "item id",
                compact: bool = False) -> np.ndarray:
        """Rows of ``item_ids`` in the sorted table.

        Parameters
        ----------
        item_ids : array-like, shape (k,), int or str
            Ids of this catalog's kind; an integer catalog also takes integer strings.
        missing : {"error", "drop", "mark"}
            Unknown ids raise :class:`CatalogError`, are dropped, or map to -1.
        what : str
            How messages name the list.
        compact : bool
            Return the rows in the smallest dtype that holds every row (int32 below
            2^31 items) instead of int64, sparing a conversion to callers that narrow
            them anyway.

        Returns
        -------
        np.ndarray, shape (k,) (fewer with ``missing="drop"``), int64 (or int32, ``compact``)
        """
        ids, outside = lookup_keys(item_ids, self.string_ids, what)
        rows = self._id_lookup.rows(ids)
        if outside is not None:  # integers past int64 name no item (their keys are stand-ins)
            rows = np.where(outside, -1, rows).astype(rows.dtype, copy=False)
            ids = np.asarray(item_ids, dtype=object).reshape(-1)
        if not compact:
            rows = rows.astype(np.int64, copy=False)
        if missing == "mark":  # nothing to check: -1 is the answer for an unknown id
            return rows
        found = rows >= 0
        if not found.all():
            if missing == "error":
                bad = int(np.flatnonzero(~found)[0])
                # indexed from 0, as the servers' other field errors are (``input_ids[0]``)
                raise CatalogError(f"{what}[{bad}]: item id {format_item_id(ids[bad])} is not in "
                                   f"catalog {self.name!r}")
            if missing == "drop":
                rows = rows[found]
        return rows

    def row_of_item(self, item_id) -> int:
        """Row of ``item_id`` in the sorted table (raises ``KeyError`` if absent)."""
        try:
            rows = self.rows_of([item_id], missing="mark")
        except CatalogError:
            raise KeyError(item_id) from None
        if rows[0] < 0:
            raise KeyError(item_id)
        return int(rows[0])

    def fresh_ids(self, count: int, prefix: str = "new-") -> np.ndarray:
        """``count`` ids of this catalog's kind that it does not hold (for generated items).

        Integer ids continue after the largest one; string ids are ``prefix`` + a number.
        """
        if not self.string_ids:
            start = int(self.item_ids.max()) + 1 if self.n_items else 0
            return np.arange(start, start + count, dtype=np.int64)
        out, k = [], 0
        while len(out) < count:
            batch = np.array([f"{prefix}{k + i}" for i in range(2 * (count - len(out)))], dtype=StringDType())
            k += batch.size
            free = batch[self.rows_of(batch, missing="mark") < 0]
            out.extend(free[:count - len(out)].tolist())
        return np.array(out, dtype=StringDType())

    def ids_of_rows(self, rows, fill=-1, *, gathered=None) -> np.ndarray:
        """Item ids of catalog ``rows``, padding (-1 rows) included; a row outside the catalog
        (decoded over another one) raises :class:`CatalogError` (clipped, it named the last item).

        Parameters
        ----------
        rows : array_like of int
            Catalog rows, -1 for padding.
        fill : int, optional
            The id written for padding with integer ids (default -1: pass another where -1 is
            an item's id, or tell padding by ``rows < 0``).
        gathered : np.ndarray, optional, same shape as ``rows``, int64
            The rows' ids already gathered from a copy of ``item_ids`` (on a GPU:
            :func:`zerogr_core.decode.item_table.ids_of_rows`); only the checks and the padding
            are done here.

        Returns
        -------
        np.ndarray, same shape as ``rows``
            int64 with ``fill`` for padding (integer ids), or object with ``None`` for padding
            (string ids).
        """
        if isinstance(fill, (bool, np.bool_)) or not isinstance(fill, (int, np.integer)) \
                or not -2**63 <= fill < 2**63:
            raise CatalogError(f"fill: expected a 64-bit integer id, got {shown(fill)}")
        rows = np.asarray(rows, dtype=np.int64)
        outside = (rows >= self.n_items) | (rows < -1)
        if outside.any():
            raise CatalogError(f"row {int(rows[outside].flat[0])} is not a row of catalog {self.name!r} "
                               f"({self.n_items} items): were these rows decoded over another catalog?")
        if gathered is None:
            ids = self.item_ids[np.clip(rows, 0, max(self.n_items - 1, 0))]
        elif self.string_ids or np.shape(gathered) != rows.shape:
            raise CatalogError(f"gathered: expected int64 ids of shape {rows.shape}, got {np.shape(gathered)}"
                               + (" for a catalog of string ids" if self.string_ids else ""))
        else:
            ids = np.asarray(gathered, dtype=np.int64)
        if self.string_ids:
            return np.where(rows >= 0, ids.astype(object), None)
        return np.where(rows >= 0, ids, np.int64(fill))

    def step_stats(self) -> list[dict]:
        """Per-step statistics of the prefix tree.

        Returns
        -------
        list of dict, one per step l (0-based) with keys ``step`` (1-based), ``codebook``,
        ``states`` (S_l), ``entries`` (E_l), ``density`` (catalog-level: E_l / (S_l·|V_l|)),
        ``max_segment`` and ``mean_segment``.
        """
        h = lcp_with_previous(self.sids)
        out = []
        states = 1
        for level in range(self.n_levels):
            seg = _segment_lengths(h, level)
            entries = int(seg.sum())
            size = self.codebook_sizes[level]
            out.append(dict(step=level + 1, codebook=size, states=states, entries=entries,
                            density=entries / (states * size), max_segment=int(seg.max()),
                            mean_segment=entries / states))
            states = entries
        return out

    def segment_lengths(self, level: int) -> np.ndarray:
        """Branching factor of every state at ``level`` (0-based), shape (S_l,), int64."""
        return _segment_lengths(lcp_with_previous(self.sids), level)


def _segment_lengths(h: np.ndarray, level: int) -> np.ndarray:
    # Entries of step l are rows with h <= l; a state opens where h < l.
    sub = h[h <= level]
    starts = np.flatnonzero(sub < level) if level else np.zeros(1, dtype=np.int64)
    return np.diff(np.append(starts, sub.size))


MAX_TOKEN = 2**31 - 1
"""Largest SID token a catalog holds (tokens are stored in at most int32)."""

MAX_LEVELS = 127
"""Most SID levels a catalog holds: :func:`lcp_with_previous` and the index builders keep each
row's common prefix length in int8, so from 128 levels on equal SIDs would pass for distinct."""


def _codebook_sizes(values) -> tuple[int, ...]:
    """``codebook_sizes`` as a tuple of ints, or a one-line :class:`CatalogError` (a scalar, a
    string, a fraction: ``int()`` would fail deep in a comprehension or truncate 4.7 to 4)."""
    sizes = whole_values(values)
    if sizes is not None:
        return sizes
    raise CatalogError(f"codebook sizes must be one whole number per level, got {shown(values)}",
                       column="codebook_sizes")


def token_dtype(max_codebook: int) -> np.dtype:
    """Smallest signed integer dtype that holds local ids ``0 … max_codebook-1``."""
    if max_codebook <= 128:
        return np.dtype(np.int8)
    if max_codebook <= 32768:
        return np.dtype(np.int16)
    return np.dtype(np.int32)
