"""Decoders: filtering first, scoring first and unconstrained beam search.

The names below load with their module on first use, so that importing a torch-free part of
the package (:mod:`.work_limits`, the bounds the CLI's parser checks) does not load torch and
the kernels.
"""
from importlib import import_module

_LAZY = {"Decoder": "decoder", "ENGINES": "decoder", "ORDERS": "decoder", "Heads": "heads", "DecodeResult": "search"}

__all__ = ["Decoder", "DecodeResult", "ENGINES", "Heads", "ORDERS"]


def __getattr__(name):
    if name in _LAZY:
        return getattr(import_module(f"{__name__}.{_LAZY[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
