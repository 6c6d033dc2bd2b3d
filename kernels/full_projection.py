"""Full projection: one GEMM of the hidden states against the step's band of the head.

Step 2 (*full*) of the filtering-first decoding step (docs/design.md §4). The band is a
``narrow`` view of the head, never a copy; :func:`kernels.filter_slots` then copies the
valid logits into the slots (sparse) or masks the invalid columns (dense). cuBLAS does the
work; float32 stays plain float32 unless the caller enabled TF32 in torch.
"""
from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, check_tensor


def full_proj(hidden: torch.Tensor, weight: torch.Tensor, band_start: int, n_tokens: int, *,
              out: torch.Tensor | None = None) -> torch.Tensor:
    """Logits of every token of a band: ``hidden @ weight[band_start:band_start + n_tokens].T``.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(n_beams, H)`` float16, bfloat16 or float32.
    weight : torch.Tensor
        ``(V_total, H)`` head of the same dtype.
    band_start : int
        First row of the band.
    n_tokens : int
        Codebook size ``V`` of the step (rows of the band).
    out : torch.Tensor, optional
        ``(n_beams, V)`` preallocated output of the input dtype.

    Returns
    -------
    torch.Tensor
        ``(n_beams, V)`` logits in the input dtype.
    """
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, ndim=2)
    check_tensor("weight", weight, dtypes=(hidden.dtype,), ndim=2, device=hidden.device,
                 shape=(None, hidden.shape[1]))
    if band_start < 0 or n_tokens < 1 or band_start + n_tokens > weight.shape[0]:
        raise ValueError(f"band [{band_start}, {band_start + n_tokens}) outside the "
                         f"{weight.shape[0]} rows of weight")
    return torch.matmul(hidden, weight.narrow(0, band_start, n_tokens).t(), out=out)
