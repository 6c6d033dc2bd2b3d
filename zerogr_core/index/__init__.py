"""The step-sliced index, its builders, and the baseline indexes.

The names of the modules that import torch load with their module on first use, so that the
torch-free part of the package (:mod:`.config`, the presets the CLI's parser offers) does not
load torch.
"""
from importlib import import_module

from .config import BUILDERS, INDEX_PRESETS, IndexConfig, dense_bytes, sparse_bytes

_LAZY = {"build_index": "builders", "build_phases": "builders", "h2d_gbps": "builders", "HostTrie": "host_trie",
         "StepIndex": "layout", "StepMapping": "layout", "static_style_bytes": "layout",
         "StaticIndex": "static_style", "build_static_index": "static_style"}

__all__ = ["BUILDERS", "build_index", "build_phases", "dense_bytes", "h2d_gbps", "HostTrie", "INDEX_PRESETS",
           "IndexConfig", "sparse_bytes", "StepIndex", "StepMapping", "StaticIndex", "build_static_index",
           "static_style_bytes"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
