"""Restricting the Decode page's decodes to an item set of the catalog, through the public API.

The set is registered once on both orders' decoders
(:meth:`zerogr_core.Decoder.register_items` with ``kind="allow"``; a set of at least
:data:`~zerogr_core.decode.registry.SUB_INDEX_MIN_ROWS` items gets a sub-catalog index of
its own) and every decode names it (``allow_items=``). Both orders are then constrained to
the set: filtering first normalises each step over the set's alive tokens, scoring first
over the whole codebook before masking, which is where the two can disagree most when
the set is a small share of the catalog (the cold-start case, issue 33).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..errors import ZeroGRError

#: The sets the page offers: kind → label.
ITEM_SETS = {
    "all": "All items of the catalog",
    "cold": "Cold-start items (a seeded share of the catalog, as the coldstart study draws them)",
}
#: The name the page registers its set under on both decoders.
SET_NAME = "decode-page-set"


@dataclass(frozen=True)
class ItemSet:
    """Which items a decode may return.

    Attributes
    ----------
    kind : str
        A key of :data:`ITEM_SETS`.
    share : float
        For ``cold``: share of the catalog's items drawn, in (0, 1).
    seed : int
        For ``cold``: seed of the draw.
    """

    kind: str = "all"
    share: float = 0.02
    seed: int = 0

    def __post_init__(self):
        if self.kind not in ITEM_SETS:
            raise ZeroGRError(f"item set: unknown kind {self.kind!r}; choose one of {', '.join(ITEM_SETS)}")
        if self.kind == "cold" and not 0.0 < float(self.share) < 1.0:
            raise ZeroGRError(f"item set: the cold share must be in (0, 1), got {self.share:g}")

    @property
    def restricted(self) -> bool:
        return self.kind != "all"

    def ids(self, catalog) -> np.ndarray | None:
        """Item ids of the set (catalog dtype, ascending), or ``None`` for the whole catalog."""
        if self.kind == "cold":
            from ..recsys.cold_items import cold_item_set

            if round(self.share * catalog.n_items) >= catalog.n_items:
                raise ZeroGRError(f"item set: a cold share of {100 * self.share:g} % of {catalog.n_items:,} items "
                                  "leaves no other item; lower the share")
            return cold_item_set(catalog, self.share, self.seed)
        return None

    def describe(self, n_items: int, catalog_items: int) -> str:
        if not self.restricted:
            return "all items"
        items = f"{n_items:,} cold-start item{'' if n_items == 1 else 's'}"
        return f"{items} ({100 * n_items / catalog_items:.2g} % of the catalog's {catalog_items:,}, seed {self.seed})"


def register_set(decoders: dict, item_set: ItemSet, catalog) -> np.ndarray | None:
    """Register ``item_set`` on every decoder of ``decoders`` (built with ``catalog=``) as an
    allow list named :data:`SET_NAME`; returns its catalog rows (``None`` for all items)."""
    ids = item_set.ids(catalog)
    if ids is None:
        return None
    for decoder in decoders.values():
        decoder.register_items(SET_NAME, ids, kind="allow")
    return np.sort(catalog.rows_of(ids, what="item set"))


def decode_constraints(item_set: ItemSet, catalog, histories=None, *, exclude_history: bool = False) -> dict:
    """Keyword arguments of :func:`~.profile.profile_decode` and :func:`~.latency.order_runs`
    for a decode restricted to ``item_set`` and, with ``exclude_history``, away from each
    request's history (item rows per request).

    Without a set, a history is denied as the quality study does
    (:func:`~.requests.history_lists`). With a set, every request names the registered set
    and denies its history by item id; filtering first normalises over the request's alive
    tokens.

    Returns
    -------
    dict
        ``lists`` (RequestLists or None) and ``constraints`` (dict or None).
    """
    from .requests import history_lists

    deny = histories if exclude_history and histories is not None else None
    if not item_set.restricted:
        return dict(lists=None if deny is None else history_lists(deny), constraints=None)
    ids = np.asarray(catalog.item_ids)
    deny_ids = None if deny is None else [ids[np.asarray(h, dtype=np.int64)] for h in deny]
    return dict(lists=None, constraints=dict(allow_items=SET_NAME, deny_items=deny_ids))
