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
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from zerogr_kernels.constraints import CATALOG_NORMALISED
from zerogr_kernels.deny_ids import MAX_IDS

from .device_lists import device_id_table

MIN_WIDTH = 16
"""Narrowest padded id row: shapes differ only past it, by powers of two."""


@dataclass
class DenyIds:
    """Each request's deny ids as given, for the engine (:class:`ListBuffers` width mode).

    Attributes
    ----------
    parts : list of np.ndarray
        The requests' non-empty id arrays, in request order (any integer dtype; ids not in
        the catalog are skipped); the engine's pinned block takes them back to back.
    counts : np.ndarray, shape (batch,), int64
        Ids per request.
    width : int
        A power of two, at least every count: the rows each request's list holds on the device.
    table : torch.Tensor, shape (T,), int32 or int64, on the device
        The catalog's id → row table (:func:`~zerogr_core.decode.device_lists.device_id_table`).
    base : int
        The table's smallest id.
    n_rows : int
        Catalog rows.
    normalise : {"request", "catalog"}
    """

    parts: list
    counts: np.ndarray
    width: int
    table: torch.Tensor
    base: int
    n_rows: int
    normalise: str = "request"

    @property
    def batch(self) -> int:
        return int(self.counts.shape[0])

    @property
    def empty(self) -> bool:
        """Whether nothing is listed (ids that all miss the catalog still count as listed)."""
        return not self.parts

    @property
    def n_ids(self) -> int:
        return int(self.counts.sum())

    @property
    def catalog_normalised(self) -> bool:
        return self.normalise == "catalog"

    @property
    def total_rows(self) -> int:
        """Rows of the device buffer: ``width`` per request."""
        return self.batch * self.width

    def device_mode(self, out: np.ndarray) -> np.ndarray:
        """The kernels' mode bits (deny, and the catalog bit when so normalised) into ``out``."""
        out[:] = CATALOG_NORMALISED if self.catalog_normalised else 0
        return out


def deny_ids(catalog, device, batch: int, deny_items, normalise: str) -> DenyIds | None:
    """:class:`DenyIds` of a call, or ``None`` when the call does not qualify (the caller then
    builds :class:`~zerogr_core.decode.constraints.RequestLists`): a catalog with a dense
    integer id table, and ``deny_items`` a sequence of ``batch`` entries that are each ``None``
    or integer ids, at most :data:`~zerogr_kernels.deny_ids.MAX_IDS` of them."""
    if isinstance(deny_items, (str, bytes)) or not hasattr(deny_items, "__len__") or len(deny_items) != batch:
        return None
    # one pass, no per-call imports: this is host time a batch-1 call waits for
    parts, lengths = [], []
    for e in deny_items:
        if e is None:
            lengths.append(0)
            continue
        try:
            p = e if type(e) is np.ndarray else np.asarray(e)
        except (TypeError, ValueError):
            return None
        # a name, a bare id, text or floats, arrays of other shapes: the host path decides (or refuses)
        if p.ndim != 1 or (p.size and p.dtype.kind not in "iu"):
            return None
        lengths.append(p.size)
        if p.size:
            parts.append(p)
    longest = max(lengths, default=0)
    if longest > MAX_IDS:
        return None
    counts = np.array(lengths, dtype=np.int64)
    lookup = device_id_table(catalog, device)
    if lookup is None:
        return None
    width = MIN_WIDTH
    while width < longest:
        width *= 2
    return DenyIds(parts, counts, width, lookup[1], lookup[0], catalog.n_items, normalise)
