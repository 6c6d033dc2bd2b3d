"""ZeroGR: filtering-first constrained decoding for generative recommendation.

Public API::

    from zerogr_core import Catalog, build_index, Decoder

The package imports with numpy alone, so that the command line can build its parser and
print its help without loading torch; the index (and with it torch) loads on first use of
``build_index`` or ``StepIndex``, the decoders (and with them triton) on first use of
``Decoder``, and Polars only with the catalog file readers
(:mod:`zerogr_core.catalog.io`).
"""
from importlib import import_module

from .catalog import Catalog
from .errors import CatalogError, ZeroGRError
from .index import IndexConfig

_LAZY = {"Decoder": "zerogr_core.decode", "DecodeResult": "zerogr_core.decode", "Heads": "zerogr_core.decode",
         "StepIndex": "zerogr_core.index", "build_index": "zerogr_core.index"}

__all__ = ["Catalog", "CatalogError", "Decoder", "DecodeResult", "Heads", "IndexConfig", "StepIndex",
           "ZeroGRError", "build_index"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'zerogr_core' has no attribute {name!r}")
