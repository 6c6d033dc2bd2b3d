"""Random heads and requests, for decoding a catalog without a trained model.

The random head has the catalog's layout: one shared head with a band per level when the
catalog declares band offsets (the paper's Search model), per-level heads otherwise. A
random request is a seeded context vector per (request, step) plus an embedding of the
beam's last token, so beams of one request see different hidden states. The hidden
function uses tensor ops only (no host synchronisation), so the GPU engine can capture it
in a CUDA graph.
"""
from __future__ import annotations

import torch

from ..catalog.catalog import Catalog
from ..errors import ZeroGRError
from .dtype_names import DTYPE_NAMES, check_dtype_name
from .heads import HIDDEN_STD
from .heads import random_heads as draw_heads

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


def resolve_dtype(name: str) -> torch.dtype:
    return DTYPES[check_dtype_name(name)]


def random_heads(catalog: Catalog, hidden_size: int, dtype: str = "float32", device="cpu", seed: int = 0):
    """A seeded random output projection in the catalog's layout.

    Returns
    -------
    heads : torch.Tensor (rows, H) or list of torch.Tensor (|V_l|, H)
        Shared head when ``catalog.band_offsets`` is set, else per-level heads.
    band_offsets : tuple of int or None
    """
    heads = draw_heads(catalog.codebook_sizes, catalog.band_offsets, hidden_size, resolve_dtype(dtype), device,
                       torch.Generator().manual_seed(seed))
    if heads.shared is not None:
        return heads.shared, heads.band_offsets
    return list(heads.bands), None


def random_hidden_fn(batch: int, hidden_size: int, codebook_sizes, dtype: str = "float32", device="cpu",
                     seed: int = 1):
    """Seeded hidden states for ``batch`` random requests.

    ``h(b, step, beam) = context[b, step] + 0.5 · E_step[last token of the beam]``, with
    ``context ~ N(0, HIDDEN_STD²)`` (the scale the benchmarks draw their hidden states with).

    Returns
    -------
    callable(step, prefixes) -> torch.Tensor (batch, beams, H)
    """
    if batch < 1:
        raise ZeroGRError(f"batch must be ≥ 1, got {batch}")
    gen = torch.Generator().manual_seed(seed)
    dt = resolve_dtype(dtype)
    levels = len(codebook_sizes)
    context = (HIDDEN_STD * torch.randn(batch, levels, hidden_size, generator=gen)).to(dt).to(device)
    width = max(codebook_sizes)
    embed = (0.5 * torch.randn(levels, width, hidden_size, generator=gen)).to(dt).to(device)

    def hidden_fn(step: int, prefixes: torch.Tensor) -> torch.Tensor:
        beams = prefixes.shape[1]
        base = context[:, step, None, :].expand(batch, beams, hidden_size)
        if step == 0:
            return base.contiguous()
        last = prefixes[..., step - 1].clamp(min=0)
        return base + embed[step - 1][last]

    return hidden_fn
