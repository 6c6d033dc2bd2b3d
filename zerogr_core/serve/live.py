"""Catalog versions pushed to a serving replica.

A push is declarative: :class:`CatalogPush` names the version label, the catalog file and
the deleted ids the replica must serve, whatever it served before. Ray Serve hands a
replica that starts later (a restart, a new replica) the same ``user_config``, so it
reaches the same state. :class:`LiveCatalog` turns a push into the fewest
:class:`~zerogr_core.decode.store.CatalogStore` changes (deletes at once through the
deny list; a new catalog, or an un-delete, by a rebuild off to the side) and maps the
store's internal version numbers to the pushed labels that results carry.
"""
from __future__ import annotations

import threading
from dataclasses import dataclass
from typing import Callable

import numpy as np

from ..errors import ZeroGRError

PUSH_FIELDS = ("version", "catalog", "deleted")


@dataclass(frozen=True)
class CatalogPush:
    """The catalog state a replica must serve.

    Attributes
    ----------
    version : int
        Label reported as ``catalog_version`` by every result decoded on this state
        (≥ 1; a push never lowers it).
    catalog : str or None
        Catalog file or sample name; ``None``: the replica's configured catalog.
    deleted : tuple of int or str
        Item ids no result may contain.
    """

    version: int
    catalog: str | None = None
    deleted: tuple = ()

    @classmethod
    def from_config(cls, config) -> "CatalogPush":
        """Validate a ``user_config`` dict ({"version": N, "catalog": ..., "deleted": [...]})."""
        if not isinstance(config, dict):
            raise ZeroGRError(f"catalog push: expected a dict with {', '.join(PUSH_FIELDS)}, "
                              f"got {type(config).__name__}")
        unknown = sorted(set(config) - set(PUSH_FIELDS))
        if unknown:
            raise ZeroGRError(f"catalog push: unknown field {unknown[0]!r} (fields: {', '.join(PUSH_FIELDS)})")
        version = config.get("version")
        if not isinstance(version, int) or isinstance(version, bool) or version < 1:
            raise ZeroGRError(f"catalog push: version must be an integer ≥ 1, got {version!r}")
        catalog = config.get("catalog")
        if catalog is not None and not isinstance(catalog, str):
            raise ZeroGRError(f"catalog push: catalog must be a file or sample name, got {catalog!r}")
        deleted = config.get("deleted", [])
        if not isinstance(deleted, (list, tuple)):
            raise ZeroGRError(f"catalog push: deleted must be a list of item ids, got {type(deleted).__name__}")
        return cls(version, catalog, tuple(deleted))

    def to_config(self) -> dict:
        return dict(version=self.version, catalog=self.catalog, deleted=list(self.deleted))


class LiveCatalog:
    """A :class:`CatalogStore` driven by pushes, with the pushed version labels.

    Parameters
    ----------
    store : CatalogStore
        Its first version is the replica's configured catalog (label 1 until a push).
    open_catalog : callable(spec or None) -> Catalog
        Opens a pushed catalog (``None``: the configured one) and checks it fits the model.
    """

    def __init__(self, store, open_catalog: Callable):
        self.store, self.open_catalog = store, open_catalog
        self._lock = threading.Lock()
        self._spec = None
        self._base = store.current.catalog
        self._deleted: set = set()
        self._labels = {store.version: 1}
        self._label = 1

    def label(self, store_version: int) -> int:
        """The pushed label of a store version (the latest label at or before it)."""
        labels = self._labels
        if store_version in labels:
            return labels[store_version]
        return max((lab for v, lab in labels.items() if v <= store_version), default=1)

    @property
    def version(self) -> int:
        """The label of the version now served."""
        return self.label(self.store.version)

    def push(self, push: CatalogPush) -> int:
        """Serve ``push``'s state; returns its label.

        Raises
        ------
        ZeroGRError
            A lower version than the one served, or a catalog that does not open or fit;
            the replica keeps serving what it served.
        """
        with self._lock:
            if push.version < self._label:
                raise ZeroGRError(f"catalog push: version {push.version} is older than the served {self._label}")
            deleted = set(push.deleted)
            if push.catalog != self._spec:
                base = self.open_catalog(push.catalog)
                self.store.replace(base)
                self._spec, self._base, self._deleted = push.catalog, base, set()
            if not self._deleted <= deleted:  # an un-delete: rebuild from the file
                self.store.replace(self._base)
                self._deleted = set()
            new = deleted - self._deleted
            if new:
                self.store.apply(deletes=np.asarray(sorted(new, key=str), dtype=object if _strings(new) else np.int64))
            self._deleted = deleted
            self._labels[self.store.version] = push.version
            self._label = push.version
            return push.version


def _strings(ids) -> bool:
    return any(isinstance(i, str) for i in ids)
