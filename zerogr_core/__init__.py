"""ZeroGR: filtering-first constrained decoding for generative recommendation.

Public API::

    from zerogr_core import Catalog, build_index, Decoder

The package imports with numpy and torch alone; the decoders (and with them triton) load on
first use of ``Decoder``, and Polars only with the catalog file readers
(:mod:`zerogr_core.catalog.io`).
"""
from importlib import import_module

from .catalog import Catalog
from .errors import CatalogError, ZeroGRError
from .index import IndexConfig, StepIndex, build_index

_LAZY = {"Decoder": "zerogr_core.decode", "DecodeResult": "zerogr_core.decode", "Heads": "zerogr_core.decode"}

__all__ = ["Catalog", "CatalogError", "Decoder", "DecodeResult", "Heads", "IndexConfig", "StepIndex",
           "ZeroGRError", "build_index"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zerogr_core' has no attribute {name!r}")
