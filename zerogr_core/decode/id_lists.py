"""Deny lists that cross to the GPU as the ids the caller gave, resolved inside the decode.

A call that only denies (no allow list, no registered name) of at most
:data:`~zerogr_kernels.deny_ids.MAX_IDS` integer ids per request, on a catalog with a dense
id table, skips the host's lookup and sort (:func:`~zerogr_core.decode.constraints.build_lists`):
:class:`DenyIds` holds the ids per request, the engine's list buffers write them back to back
into their pinned block, and the captured graph's first kernel
(:func:`zerogr_kernels.deny_ids.deny_rows`) turns each request's ids into its sorted, distinct
catalog rows, reading them in place up to :data:`~zerogr_kernels.deny_ids.IN_PLACE_WIDTH` per request
(wider lists cross in one copy first). What the host still does per call is that write into
pinned memory; what the decode returns is the same as with :class:`RequestLists` of the same ids.

A call that only allows (per-call integer ids, no deny list, no registered name) crosses as
:class:`AllowIds`: the ids go to the device as they came, and the graph's first kernel
(:func:`zerogr_kernels.allow_nodes.allow_nodes`) sets, for each allowed row, the bit of the
successor state that holds it at every step, in its request's bitmap of that step. A slot of
such a request is then tested with one load, and nothing is sorted or searched. The bitmaps
take a bit per successor state of every step (:func:`node_tables`: 6.4 MB per request for a
catalog of 2·10^7 rows in 5 steps), so a batch whose bitmaps would pass
:data:`MAX_NODE_BYTES` keeps the row lists.
"""
from __future__ import annotations

import weakref
from dataclasses import dataclass

import numpy as np
import torch

from zerogr_kernels.allow_nodes import derive_tables, node_layout, rank_tables
from zerogr_kernels.constraints import ALLOW, CATALOG_NORMALISED
from zerogr_kernels.deny_ids import IN_PLACE_WIDTH, MAX_IDS, MAX_WIDTH

from ..catalog.item_ids import fits_int64
from .constraints import row_starts
from .device_lists import _crosses_as_is, on_device

MIN_WIDTH = 16
"""Narrowest padded id row: shapes differ only past it, by powers of two."""


@dataclass
class IdLists:
    """Each request's ids as given, which the engine resolves on the device: what
    :class:`DenyIds` and :class:`AllowIds` share.

    Attributes
    ----------
    parts : list of np.ndarray or torch.Tensor
        The requests' non-empty 1-D integer id arrays, in request order (ids not in the catalog
        are skipped); the engine's buffers take them back to back.
    ends : np.ndarray, shape (batch,), int64
        Where each request's ids end, counted from the first request's (the cumulative counts):
        the id offsets the device reads past a leading 0.
    lookup : object
        The catalog's host id → row lookup, with a dense table: the engine fetches its device copy
        (:func:`~zerogr_core.decode.device_lists.lookup_table`) under its lock, so a first call
        never copies while another thread captures a graph.
    n_rows : int
        Catalog rows.
    normalise : {"request", "catalog"}
    """

    parts: list
    ends: np.ndarray
    lookup: object
    n_rows: int
    normalise: str

    @property
    def batch(self) -> int:
        return len(self.ends)

    @property
    def n_ids(self) -> int:
        return int(self.ends[-1]) if len(self.ends) else 0

    @property
    def catalog_normalised(self) -> bool:
        return self.normalise == "catalog"


@dataclass
class DenyIds(IdLists):
    """Deny ids (:class:`ListBuffers` width mode): numpy ``parts`` or int64 tensors on the engine's
    device, and

    Attributes
    ----------
    width : int
        A power of two, at least every count: the rows each request's list holds on the device.
    on_device : bool
        Whether some request's ids are a tensor on the engine's device.
    """

    width: int = MIN_WIDTH
    on_device: bool = False

    @property
    def empty(self) -> bool:
        """Whether nothing is listed (ids that all miss the catalog still count as listed)."""
        return not self.parts

    @property
    def copied(self) -> bool:
        """Whether the ids cross into the device block before the graph reads them: lists wider
        than :data:`~zerogr_kernels.deny_ids.IN_PLACE_WIDTH`, or ids already on the device;
        the others are read where the call wrote them, in pinned memory."""
        return self.width > IN_PLACE_WIDTH or self.on_device

    @property
    def wide(self) -> bool:
        """Whether the rows are sorted by torch between launches (past
        :data:`~zerogr_kernels.deny_ids.MAX_WIDTH` ids) rather than in one program's registers: the
        engine keeps such widths in shapes of their own, so a wide call never pushes later short
        lists onto the slower path."""
        return self.width > MAX_WIDTH

    @property
    def total_rows(self) -> int:
        """Rows of the device buffer: ``width`` per request."""
        return self.batch * self.width

    @property
    def mode(self) -> int:
        """Every request's mode bits: deny, and the catalog bit when so normalised."""
        return CATALOG_NORMALISED if self.catalog_normalised else 0

    def device_mode(self, out: np.ndarray) -> np.ndarray:
        """The kernels' mode bits (:attr:`mode` for every request) into ``out``."""
        out[:] = self.mode
        return out


_INT64 = np.dtype(np.int64)
_UNSIGNED_WIDE = tuple(getattr(torch, t) for t in ("uint16", "uint32", "uint64") if hasattr(torch, t))


def _as_ids(entry, device=None):
    """One request's entry as a 1-D integer array, or ``None`` when it is of another kind (a name,
    a bare id, text or floats, arrays of other shapes: the host path decides, or refuses). A
    tensor on ``device`` stays there (as int64), a CPU tensor becomes its array, a tensor on
    another device is left to the lists' other paths."""
    if isinstance(entry, torch.Tensor):
        if entry.ndim != 1 or entry.is_floating_point() or entry.is_complex() or entry.dtype == torch.bool \
                or entry.dtype in _UNSIGNED_WIDE:
            return None
        if device is not None and on_device(entry, torch.device(device)):
            return entry if entry.dtype == torch.int64 else entry.to(torch.int64)
        if entry.device.type != "cpu":
            return None
        entry = entry.detach().numpy()
    try:
        p = entry if type(entry) is np.ndarray else np.asarray(entry)
    except (TypeError, ValueError):
        return None
    # integers past int64 (a uint64 array) name no item: the host path skips them
    return p if p.ndim == 1 and (not p.size or (p.dtype.kind in "iu" and fits_int64(p))) else None


def deny_ids(catalog, batch: int, deny_items, normalise: str, device=None) -> DenyIds | None:
    """:class:`DenyIds` of a call, or ``None`` when the call does not qualify (the caller then
    builds :class:`~zerogr_core.decode.constraints.RequestLists`): a catalog with a dense
    integer id table, and ``deny_items`` a sequence of ``batch`` entries that are each ``None``
    or integer ids, at most :data:`~zerogr_kernels.deny_ids.MAX_IDS` of them. Ids in a tensor on
    ``device`` (the engine's) stay there: the call then copies them device to device."""
    if isinstance(deny_items, (str, bytes)) or not hasattr(deny_items, "__len__") or len(deny_items) != batch:
        return None
    # one pass, no per-call imports: this is host time a batch-1 call waits for
    parts, ends = [], []
    total = longest = 0
    tensors = False
    for e in deny_items:
        if e is not None:
            # a 1-D int64 array, the common entry, needs no conversion and no check
            p = e if type(e) is np.ndarray and e.dtype is _INT64 and e.ndim == 1 else _as_ids(e, device)
            if p is None:
                return None
            n = p.shape[0]
            if n:
                tensors = tensors or type(p) is not np.ndarray
                parts.append(p)
                total += n
                if n > longest:
                    longest = n
        ends.append(total)
    if longest > MAX_IDS:
        return None
    lookup = catalog._id_lookup
    if lookup.table is None:
        return None
    width = MIN_WIDTH
    while width < longest:
        width *= 2
    return DenyIds(parts, np.array(ends, dtype=np.int64), lookup, catalog.n_items, normalise, width, tensors)


MAX_NODE_BYTES = 1 << 30
"""Most bytes the per-request bitmaps of one :class:`AllowIds` batch may take (batch 32 over a
catalog of 2·10^7 rows in 5 steps takes 205 MB)."""


@dataclass(frozen=True)
class NodeTables:
    """What :func:`~zerogr_kernels.allow_nodes.allow_nodes` reads of one index, on its device.

    Attributes
    ----------
    rank_bits, rank_before : torch.Tensor
        ``(max(L - 1, 1), cdiv(n_rows, 32))`` int32: the start rows of every step's successor
        states, and the start bits before each word (:func:`~zerogr_kernels.allow_nodes.rank_tables`).
    level_words : torch.Tensor
        ``(L,)`` int64: where each step's bitmap starts in a request's row of words.
    words : tuple of int
        The same offsets on the host (each step's ``SlotLists.node_off``).
    stride : int
        int32 words of one request's bitmaps.
    derived : tuple
        :func:`~zerogr_kernels.allow_nodes.derive_tables`: the early steps derived from the next.
    """

    rank_bits: torch.Tensor
    rank_before: torch.Tensor
    level_words: torch.Tensor
    words: tuple
    stride: int
    derived: tuple = ()


_NODE_TABLES: "weakref.WeakKeyDictionary[object, NodeTables]" = weakref.WeakKeyDictionary()


def node_words(index) -> tuple[list[int], int]:
    """:func:`~zerogr_kernels.allow_nodes.node_layout` of ``index``'s steps, from the host's counts
    alone (step ``l``'s successors are its entries; the last step's are the rows)."""
    return node_layout([s.n_entries for s in index.steps[:-1]] + [index.n_items])


def node_tables(index) -> NodeTables:
    """:class:`NodeTables` of ``index``, built once per index on its device: GPU work, so the
    engine builds them under its lock (never while one of its graphs is captured)."""
    cached = _NODE_TABLES.get(index)
    if cached is None:
        starts = row_starts(index)[:-1]
        bits, before = rank_tables(starts, index.n_items)
        words, stride = node_words(index)
        cached = NodeTables(bits, before, torch.tensor(words, dtype=torch.int64, device=index.device), tuple(words),
                            stride, derive_tables(starts, words))
        _NODE_TABLES[index] = cached
    return cached


@dataclass
class AllowIds(IdLists):
    """Allow ids (:class:`ListBuffers` bitmap mode): ``parts`` may also be tensors, pinned or on the
    index's device (they cross without a gather), and

    Attributes
    ----------
    allowing : np.ndarray, shape (batch,), bool
        Requests that give an allow list (an empty one allows nothing).
    stride : int
        int32 words of one request's bitmaps (:func:`node_words`).
    """

    allowing: np.ndarray = None
    stride: int = 0

    @property
    def empty(self) -> bool:
        """Whether no request allows (an empty allow list still allows nothing)."""
        return not self.allowing.any()

    @property
    def total_rows(self) -> int:
        """Ids the device buffer must hold."""
        return self.n_ids

    def device_mode(self, out: np.ndarray) -> np.ndarray:
        """The kernels' mode bits (allow where a request allows, the catalog bit when so normalised) into ``out``."""
        out[:] = np.where(self.allowing, ALLOW, 0) | (CATALOG_NORMALISED if self.catalog_normalised else 0)
        return out


def allow_ids(catalog, index, batch: int, allow_items, normalise: str) -> AllowIds | None:
    """:class:`AllowIds` of a call that only allows, or ``None`` when it does not qualify (the
    caller then builds row lists): a catalog with a dense integer id table, ``allow_items`` a
    sequence of ``batch`` entries that are each ``None`` or 1-D integer ids (numpy arrays or
    lists, or tensors: pinned or on the index's device cross as they are, others are read on the
    host), and bitmaps within :data:`MAX_NODE_BYTES`."""
    if isinstance(allow_items, (str, bytes)) or not hasattr(allow_items, "__len__") or len(allow_items) != batch:
        return None
    device = index.device
    parts, ends, allowing = [], [], []
    total = 0
    for e in allow_items:
        allowing.append(e is not None)
        if e is None:
            ends.append(total)
            continue
        if isinstance(e, torch.Tensor):
            if e.ndim != 1 or e.is_floating_point() or e.dtype in (torch.bool, torch.complex64, torch.complex128):
                return None
            p = e if _crosses_as_is(e, device) else e.cpu().numpy()
        else:
            p = _as_ids(e)
            if p is None:
                return None
        total += int(p.shape[0])
        ends.append(total)
        if p.shape[0]:
            parts.append(p)
    lookup = catalog._id_lookup
    if lookup.table is None or not any(allowing):
        return None
    stride = node_words(index)[1]  # the host's counts: no GPU work outside the engine's lock
    if batch * stride * 4 > MAX_NODE_BYTES:
        return None
    return AllowIds(parts, np.array(ends, dtype=np.int64), lookup, catalog.n_items, normalise,
                    np.array(allowing), stride)
