"""Standing lists registered once on a :class:`~zerogr_core.decode.decoder.Decoder` and
referenced per request by name.

A recommender's standing lists (what is in stock, a region's items, the cold-start set,
what is out of stock) change far less often than requests arrive. Registered once, they
cost nothing per call that scales with their size:

- an **allow set** of at least :data:`SUB_INDEX_MIN_ROWS` rows becomes a sub-catalog
  with an index of its own, built once by the streaming builder
  (:func:`~zerogr_core.index.build_index`) and decoded by its own decoder (with its own
  plans and captured graphs): a batch whose requests all name it decodes over that index,
  without any list, and its rows map back to the catalog's. Beams, tokens and scores
  equal those of the row-list path (filtering first normalises over the request's alive
  tokens, which are the sub-catalog's valid tokens; scoring first normalises over the
  whole vocabulary either way). Per-request deny lists on top of it are mapped into the
  sub-catalog's rows;
- a **deny set** named by every request of a request-normalised batch is the batch's
  global deny segment: the same array object call after call, so the engine's device
  buffer keeps it and copies it once.

Anything else (a set named by some requests only, or an allow set under
``normalise="catalog"``, whose normaliser is the whole catalog's) is expanded into the
request's row list, exactly as if its ids had been passed.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass

import numpy as np
import torch

from ..errors import ZeroGRError

KINDS = ("allow", "deny")
"""What a registered list does to the requests that name it."""

SUB_INDEX_MIN_ROWS = 1024
"""Smallest allow set that gets an index of its own by default (below it the row list is
short enough to ship, and an index and its plans are not worth building)."""


@dataclass(frozen=True, eq=False)
class RegisteredList:
    """One registered list.

    Attributes
    ----------
    name : str
    kind : {"allow", "deny"}
    rows : np.ndarray, shape (k,), int64
        Sorted, duplicate-free catalog rows (ids not in the catalog dropped).
    decoder : Decoder or None
        For an allow set with its own index: the decoder over the sub-catalog.
    device_rows : torch.Tensor or None, shape (k + 1,), int64
        ``rows`` on the index's device, then -1: indexed by the sub-decoder's rows (-1 for
        padding picks the last entry) it maps them back in one gather.
    """

    name: str
    kind: str
    rows: np.ndarray
    decoder: object = None
    device_rows: torch.Tensor | None = None

    @property
    def indexed(self) -> bool:
        return self.decoder is not None


class ListRegistry:
    """Named standing lists of one decoder (thread-safe registration)."""

    def __init__(self):
        self._lists: dict[str, RegisteredList] = {}
        self._lock = threading.Lock()
        # (name, batch, normalise) -> (entry, lists): the lists of a deny set that a whole batch names
        self._named: dict = {}

    def __contains__(self, name) -> bool:
        return name in self._lists

    def __len__(self) -> int:
        return len(self._lists)

    def names(self) -> list[str]:
        return sorted(self._lists)

    def get(self, name: str, what: str = "list") -> RegisteredList:
        found = self._lists.get(name)
        if found is None:
            raise ZeroGRError(f"{what}: {name!r} is not a registered list (Decoder.register_items)")
        return found

    def rows(self, name: str, argument: str, request: int) -> np.ndarray:
        """Rows of list ``name`` named by ``argument[request]`` (its kind must match the argument)."""
        entry = self.get(name, f"{argument}[{request}]")
        if f"{entry.kind}_items" != argument:
            raise ZeroGRError(f"{argument}[{request}]: {name!r} is registered as {'an' if entry.kind[0] in 'aeiou' else 'a'} {entry.kind} list")
        return entry.rows

    def add(self, entry: RegisteredList) -> None:
        with self._lock:
            self._lists[entry.name] = entry
            self._forget(entry.name)

    def remove(self, name: str) -> None:
        with self._lock:
            if self._lists.pop(name, None) is None:
                raise ZeroGRError(f"unregister_items: {name!r} is not a registered list")
            self._forget(name)

    def _forget(self, name: str) -> None:
        for key in [k for k in self._named if k[0] == name]:
            del self._named[key]

    def named_lists(self, entry: RegisteredList, batch: int, normalise: str, build):
        """The lists of a batch of ``batch`` requests that all name the deny set ``entry`` and
        nothing else (:meth:`shared`; built by ``build()`` the first time, then the same object
        until the name is registered again or removed): such a call then costs no list work on
        the host, and the engine, finding the lists it loaded last, copies nothing (its caller
        must not modify them)."""
        key = (entry.name, batch, normalise)
        hit = self._named.get(key)
        if hit is not None and hit[0] is entry:
            return hit[1]
        lists = build()
        with self._lock:
            if self._lists.get(entry.name) is entry:
                self._named[key] = (entry, lists)
        return lists

    def shared(self, entries, kind: str) -> RegisteredList | None:
        """The registered list every one of ``entries`` names (``kind``), else None."""
        first = entries[0] if len(entries) else None
        if not isinstance(first, str) or any(not isinstance(e, str) or e != first for e in entries):
            return None
        entry = self._lists.get(first)
        return entry if entry is not None and entry.kind == kind else None


def register(decoder, name: str, items, kind: str, index) -> RegisteredList:
    """Build the :class:`RegisteredList` of ``items`` for ``decoder`` (see
    :meth:`Decoder.register_items`)."""
    from ..catalog.catalog import Catalog
    from ..index.builders import build_index

    if not isinstance(name, str) or not name:
        raise ZeroGRError(f"register_items: name must be a non-empty string, got {name!r}")
    if kind not in KINDS:
        raise ZeroGRError(f"register_items: kind must be one of {KINDS}, got {kind!r}")
    if index not in (None, True, False):
        raise ZeroGRError(f"register_items: index must be None (automatic), True or False, got {index!r}")
    catalog = decoder.catalog
    if catalog is None:
        raise ZeroGRError("register_items needs the item ids: pass catalog= to Decoder")
    from .constraints import _id_array

    rows = np.unique(catalog.rows_of(_id_array(items, f"register_items({name!r})"), missing="drop",
                                     what=f"register_items({name!r})"))
    if index and kind != "allow":
        raise ZeroGRError(f"register_items({name!r}): only an allow set gets an index of its own")
    if index is None:
        index = kind == "allow" and rows.size >= SUB_INDEX_MIN_ROWS and decoder.order != "unconstrained"
    if not index or rows.size == 0:
        return RegisteredList(name, kind, rows)
    sub = Catalog.from_sids(catalog.sids[rows], catalog.codebook_sizes, item_ids=catalog.item_ids[rows],
                            band_offsets=catalog.band_offsets, name=f"{catalog.name}/{name}", assume_sorted=True)
    sub_index = build_index(sub, device=decoder.index.device, config=decoder.index.config)
    heads = decoder.heads
    shared = heads.shared is not None
    child = type(decoder)(sub_index, heads.shared if shared else list(heads.bands), decoder.beam_width,
                          decoder.order, band_offsets=heads.band_offsets if shared else None,
                          projection=decoder.projection, engine=decoder.engine, catalog=sub)
    mapping = torch.from_numpy(np.append(rows, -1).astype(np.int64)).to(decoder.index.device)
    return RegisteredList(name, kind, rows, child, mapping)


def sub_lists(entry: RegisteredList, lists):
    """``lists`` (deny lists over the catalog's rows, all requests in deny mode) as lists over
    the sub-catalog of ``entry``: rows outside the allow set are dropped (nothing to deny)."""
    from .constraints import RequestLists

    def inside(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        pos = np.searchsorted(entry.rows, rows)
        ok = pos < entry.rows.size
        ok[ok] = entry.rows[pos[ok]] == rows[ok]
        return pos, ok

    pos, ok = inside(lists.rows)
    owner = np.repeat(np.arange(lists.batch), np.diff(lists.offsets))
    offsets = np.zeros(lists.batch + 1, dtype=np.int64)
    offsets[1:] = np.cumsum(np.bincount(owner[ok], minlength=lists.batch))
    gpos, gok = inside(lists.glob)
    return RequestLists(offsets, pos[ok].astype(np.int64), lists.mode, gpos[gok].astype(np.int64), lists.normalise)
