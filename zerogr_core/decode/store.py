"""A live catalog: versions that change while decoding goes on.

:class:`CatalogStore` holds one immutable :class:`CatalogVersion` at a time (catalog,
index, decoder, deleted rows) and swaps the reference atomically:

- ``apply(deletes=...)`` publishes a new version at once, without a rebuild: it shares
  the index and decoder and adds the rows to a global deny list that every decode passes
  beside the requests' own lists (:func:`~zerogr_core.decode.constraints.build_lists`;
  stored once per batch), so no decode started after ``apply`` returns can return a
  deleted item;
- ``apply(adds=...)``, ``replace(catalog)`` and deletions beyond ``compact_fraction`` of
  the catalog build a new catalog and index off to the side (deleted rows dropped) and
  then publish it.

A decode reads the current version once and finishes on it, so in-flight decodes are
never disturbed by a swap; the version number comes back with the result. Writers are
serialised by a lock; readers take no lock to find their version (one attribute read).
GPU decodes, result copies included, and the warm-up of a new version (where the engine
captures its CUDA graph) share one device lock: an engine's static buffers serve one
decode at a time, and no other thread may touch the device while a graph is captured.
"""
from __future__ import annotations

import contextlib
import threading
import time
from collections import deque
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..catalog.catalog import Catalog
from ..catalog.item_ids import format_item_id
from ..errors import CatalogError, ZeroGRError
from ..index import build_index
from .constraints import _id_array
from .item_table import device_item_ids


DEFAULT_COMPACT_FRACTION = 0.05
#: Changes :attr:`CatalogStore.history` keeps, the latest: a server that changes its catalog every
#: second would otherwise grow it by some 86,000 entries a day, for as long as it runs.
HISTORY_KEPT = 10_000
"""Share of deleted rows beyond which :meth:`CatalogStore.apply` rebuilds without them."""


@dataclass(frozen=True, eq=False)
class CatalogVersion:
    """One published state of a :class:`CatalogStore`.

    Attributes
    ----------
    version : int
        Increases by one with every published change.
    catalog : Catalog
        The catalog the index was built from (deleted rows still in it).
    index : StepIndex
    decoder : Decoder
    deleted_rows : np.ndarray, shape (d,), int64
        Sorted rows of ``catalog`` deleted since the build; no decode returns them.
    published_at : float
        ``time.perf_counter()`` when the version became current.
    """

    version: int
    catalog: Catalog
    index: object
    decoder: object
    deleted_rows: np.ndarray
    published_at: float

    @property
    def n_live(self) -> int:
        """Items a decode may return."""
        return self.catalog.n_items - int(self.deleted_rows.size)

    def live_ids(self) -> np.ndarray:
        """Item ids of the live (not deleted) rows."""
        keep = np.ones(self.catalog.n_items, dtype=bool)
        keep[self.deleted_rows] = False
        return self.catalog.item_ids[keep]


@dataclass
class StoreResult:
    """A decode of a :class:`CatalogStore` and the version it ran on.

    Attributes
    ----------
    result : DecodeResult
    version : int
    item_ids : np.ndarray, shape (batch, beam_width)
        Ids of the beams' items (padding: -1, or ``None`` for string ids).
    snapshot : CatalogVersion
        The version itself (to check results against).
    """

    result: object
    version: int
    item_ids: np.ndarray
    snapshot: CatalogVersion


def _fraction(value) -> float:
    """``compact_fraction`` as a float in [0, 1]: NaN or a negative share would rebuild the
    whole catalog on every delete, and a string would fail with a bare ValueError."""
    ok = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
    if not ok or not 0.0 <= float(value) <= 1.0:
        raise ZeroGRError(f"compact_fraction must be a number in [0, 1] (1: never rebuild for deletes), "
                          f"got {value!r}")
    return float(value)


def _check_adds(base: Catalog, deleted: np.ndarray, adds: Catalog) -> None:
    """Refuse additions in terms of the added items: once merged, the catalog's own checks
    would name rows of the merged table (``row 111, column 's1'``), which the caller never saw."""
    sizes = np.asarray(base.codebook_sizes, dtype=np.int64)
    outside = adds.sids.astype(np.int64) >= sizes
    if outside.any():
        r, level = (int(x) for x in np.argwhere(outside)[0])
        raise CatalogError(f"adds: item {format_item_id(adds.item_ids[r])} has token {int(adds.sids[r, level])} at "
                           f"level {level + 1}, outside the catalog's codebook of {int(sizes[level])}")
    rows = base.rows_of(adds.item_ids, missing="mark", what="adds")
    live = (rows >= 0) & ~np.isin(rows, deleted)
    if live.any():
        r = int(np.flatnonzero(live)[0])
        raise CatalogError(f"adds: item id {format_item_id(adds.item_ids[r])} is already in the catalog (to "
                           f"replace the item, delete it in the same apply)")


class CatalogStore:
    """Versions of a catalog with its index and decoder, changed while decoding.

    Parameters
    ----------
    catalog : Catalog
    make_decoder : callable(catalog, index) -> Decoder
        Builds the decoder of a version (heads, beam width, order, engine); it must pass
        ``catalog=catalog`` so that item ids resolve.
    device : str or torch.device
        Where indexes are built.
    index_config : IndexConfig, optional
    compact_fraction : float in [0, 1]
        Deletions beyond this share of a version's rows trigger a rebuild that drops them
        (the deny list costs 8 bytes per deleted row on the device and two more binary
        searches per candidate).
    warmup : callable(Decoder), optional
        Run on a new version's decoder before it is published (a GPU engine plans and
        captures its graph there, not in the first request).

    Attributes
    ----------
    history : collections.deque of dict
        The latest :data:`HISTORY_KEPT` changes, oldest first: version, change, items, live.
    """

    def __init__(self, catalog: Catalog, make_decoder: Callable, *, device="cpu", index_config=None,
                 compact_fraction: float = DEFAULT_COMPACT_FRACTION, warmup: Callable | None = None):
        self.make_decoder, self.device, self.index_config = make_decoder, device, index_config
        self.warmup = warmup
        if not callable(make_decoder):
            raise ZeroGRError(f"make_decoder: expected a callable(catalog, index) -> Decoder, "
                              f"got {type(make_decoder).__name__}")
        self.compact_fraction = _fraction(compact_fraction)
        self._write = threading.Lock()
        self._device = threading.RLock()
        self.history: deque[dict] = deque(maxlen=HISTORY_KEPT)
        self._standing: dict[str, tuple] = {}  # name -> (ids, kind, index): registered again on every rebuild
        self._current = self._build(catalog, 1, "initial")

    # ------------------------------------------------------------------ reading
    @property
    def current(self) -> CatalogVersion:
        return self._current

    @property
    def version(self) -> int:
        return self._current.version

    @property
    def device_lock(self) -> threading.RLock:
        """The lock GPU decodes and warm-ups hold (re-entrant): a caller whose decode input
        is shared state (a prefilled step model) holds it from the prefill to the result."""
        return self._device

    def decode(self, hidden_fn, batch_size: int, *, allow_items=None, deny_items=None,
               snapshot: CatalogVersion | None = None, normalise: str = "request") -> StoreResult:
        """Decode on the current version (read once), or on ``snapshot`` (a version read
        earlier, when the requests were prepared against its rows); deleted items are
        denied to every request. ``normalise``: see :class:`~zerogr_core.decode.constraints.RequestLists`."""
        v = self._current if snapshot is None else snapshot
        if not isinstance(v, CatalogVersion):  # a version number would fail as 'int' has no attribute 'decoder'
            raise ZeroGRError(f"snapshot: expected a CatalogVersion (store.current, or a result's .snapshot), "
                              f"got {type(snapshot).__name__}")
        # the lists are built on the GPU: not while another version's graph is captured
        with self._device if v.decoder.gpu_engine is not None else contextlib.nullcontext():
            if v.deleted_rows.size:  # the deleted rows join every request's deny list as the global segment
                lists = v.decoder.request_lists(batch_size, allow_items, deny_items,
                                                global_deny_rows=v.deleted_rows, normalise=normalise)
                result = v.decoder.decode(hidden_fn, batch_size, lists=lists)
            else:  # the id lists as given: the decoder's own paths (deny ids, allow bitmaps, sub-catalogs)
                result = v.decoder.decode(hidden_fn, batch_size, allow_items=allow_items, deny_items=deny_items,
                                          normalise=normalise)
            ids = result.item_ids(v.catalog)  # the host copy finishes the decode
        return StoreResult(result, v.version, ids, v)

    # ------------------------------------------------------------------ writing
    def apply(self, adds: Catalog | None = None, deletes=None) -> int:
        """Delete and/or add items; returns the published version.

        Parameters
        ----------
        adds : Catalog, optional
            New items (their SIDs within this catalog's codebooks, ids not already live).
            Triggers a rebuild that also drops every deleted row.
        deletes : array-like of item ids, optional
            Ids to remove; ids that are not live are ignored. Without ``adds`` they take
            effect at once through the global deny set. Deleting every item publishes a
            version whose decodes return only padding (no rebuild: no catalog is empty).

        Raises
        ------
        CatalogError
            Bad additions (an id already live, a SID already taken, a token outside the
            catalog's codebooks), named by the added item; the current version stays as it was.
        """
        if adds is not None and not isinstance(adds, Catalog):
            raise CatalogError(f"adds must be a Catalog of the new items (Catalog.from_sids), "
                               f"got {type(adds).__name__}")
        with self._write:
            v = self._current
            rows = np.zeros(0, dtype=np.int64)
            if deletes is not None:
                rows = v.catalog.rows_of(np.asarray(deletes).reshape(-1), missing="drop", what="deletes")
            deleted = np.union1d(v.deleted_rows, rows).astype(np.int64)
            # deleting every item stays a deny list: a catalog of no items cannot be built
            everything = deleted.size == v.catalog.n_items
            if adds is None and (everything or deleted.size <= self.compact_fraction * v.catalog.n_items):
                if deleted.size == v.deleted_rows.size:
                    return v.version
                self._publish(CatalogVersion(v.version + 1, v.catalog, v.index, v.decoder, deleted,
                                             time.perf_counter()), f"deleted {deleted.size - v.deleted_rows.size}")
                return v.version + 1
            merged = self._merge(v.catalog, deleted, adds)
            added = 0 if adds is None else adds.n_items
            self._publish(self._build(merged, v.version + 1, None),
                          f"rebuilt: +{added} items, -{deleted.size} deleted rows dropped")
            return v.version + 1

    def replace(self, catalog: Catalog) -> int:
        """Swap in a whole new catalog (rebuilt off to the side); returns the published version."""
        if not isinstance(catalog, Catalog):
            raise CatalogError(f"replace takes a Catalog, got {type(catalog).__name__}")
        with self._write:
            self._publish(self._build(catalog, self._current.version + 1, None), "replaced")
            return self._current.version

    def register_items(self, name: str, items, kind: str = "allow", *, index: bool | None = None):
        """Register a standing list (:meth:`Decoder.register_items`) on the current version and on
        every version built after it, resolved against each one's catalog (ids it lacks skipped).

        A list registered on ``store.current.decoder`` itself lives only as long as that
        decoder: an add or a replace builds a new one, where requests naming it are refused.
        """
        with self._write:
            entry = self._current.decoder.register_items(name, items, kind, index=index)
            # the ids as given, so that one a later add brings in joins the list then
            self._standing[name] = (np.array(_id_array(items, f"register_items({name!r})")), kind, index)
            return entry

    def unregister_items(self, name: str) -> None:
        """Forget a list registered with :meth:`register_items`."""
        with self._write:
            self._current.decoder.unregister_items(name)
            self._standing.pop(name, None)

    # ------------------------------------------------------------------ internals
    def _merge(self, base: Catalog, deleted: np.ndarray, adds: Catalog | None) -> Catalog:
        keep = np.ones(base.n_items, dtype=bool)
        keep[deleted] = False
        sids, ids = base.sids[keep], base.item_ids[keep]
        titles = None if base.titles is None else base.titles[keep]
        if adds is not None:
            if adds.n_levels != base.n_levels:
                raise CatalogError(f"added items have {adds.n_levels} SID levels, the catalog has {base.n_levels}")
            if adds.string_ids != base.string_ids:
                kind = "string" if base.string_ids else "integer"
                raise CatalogError(f"added items must have {kind} ids like the catalog")
            _check_adds(base, deleted, adds)
            sids = np.concatenate([sids.astype(np.int64), adds.sids.astype(np.int64)])
            ids = np.concatenate([ids, adds.item_ids])
            if titles is not None or adds.titles is not None:
                old = titles if titles is not None else np.full(keep.sum(), "", dtype=object)
                new = adds.titles if adds.titles is not None else np.full(adds.n_items, "", dtype=object)
                titles = np.concatenate([old, new])
        return Catalog.from_sids(sids, base.codebook_sizes, item_ids=ids, titles=titles,
                                 band_offsets=base.band_offsets, name=base.name)

    def _build(self, catalog: Catalog, version: int, note) -> CatalogVersion:
        kwargs = {} if self.index_config is None else {"config": self.index_config}
        index = build_index(catalog, device=self.device, **kwargs)
        if index.device.type == "cuda":  # results' ids are gathered there: copied with the index, not by a request
            device_item_ids(catalog, index.device)
        decoder = self.make_decoder(catalog, index)
        if getattr(decoder, "catalog", None) is not catalog:
            raise ZeroGRError("make_decoder must build its Decoder with catalog=catalog")
        for name, (ids, kind, sub_index) in self._standing.items():
            decoder.register_items(name, ids, kind, index=sub_index)
        if self.warmup is not None:
            with self._device:
                self.warmup(decoder)
        v = CatalogVersion(version, catalog, index, decoder, np.zeros(0, dtype=np.int64), time.perf_counter())
        if note:
            self.history.append(dict(version=version, change=note, items=catalog.n_items, live=v.n_live))
        return v

    def _publish(self, v: CatalogVersion, note: str) -> None:
        object.__setattr__(v, "published_at", time.perf_counter())
        self._current = v  # one reference assignment: readers see the old or the new version
        self.history.append(dict(version=v.version, change=note, items=v.catalog.n_items, live=v.n_live))
