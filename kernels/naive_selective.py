"""Naive selective projection: the ablation of the paper's Table 1.

Instead of scoring the candidates where they sit in their slot rows
(:mod:`zerogr_kernels.selective`), this baseline packs them into a compact list through a
prefix sum (``torch.nonzero``), gathers a temporary ``(n_valid, H)`` weight matrix and
the matching hidden rows, runs one batched dot product, and scatters the logits back into
the slots. The compact list has a data-dependent length, so the op synchronises with the
host and cannot be captured in a CUDA graph: it exists to be timed in eager mode.
"""
from __future__ import annotations

import torch

from ._common import FLOAT_DTYPES, check_tensor


def naive_selective_proj(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                         slot_logits: torch.Tensor, *, band_start: int = 0) -> torch.Tensor:
    """Compute the logits of all valid slots through a packed candidate list, in place.

    Writes ``slot_logits[b, k] = hidden[b] . weight[band_start + slot_tokens[b, k]]`` for
    every slot with ``slot_tokens[b, k] >= 0``; other slots are left untouched. The dot
    products run as one ``torch.bmm`` in the input dtype (float32 accumulation on CUDA,
    result rounded to that dtype), then stored as float32.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(n_beams, H)`` float16, bfloat16 or float32 hidden states.
    weight : torch.Tensor
        ``(V_total, H)`` head of the same dtype; row ``band_start + t`` is token ``t``.
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32 slot tokens, -1 = invalid.
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32 contiguous; updated in place.
    band_start : int
        First row of the step's band in ``weight``.

    Returns
    -------
    torch.Tensor
        ``slot_logits``.
    """
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, contiguous=True)
    n_beams, K = slot_tokens.shape
    device = slot_tokens.device
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, ndim=2, device=device, shape=(n_beams, None))
    check_tensor("weight", weight, dtypes=(hidden.dtype,), ndim=2, device=device,
                 shape=(None, hidden.shape[1]))
    check_tensor("slot_logits", slot_logits, dtypes=(torch.float32,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    flat_tok = slot_tokens.view(-1)
    # prefix sum over the validity mask: flat slot index of every candidate, in order
    pos = torch.nonzero(flat_tok >= 0).squeeze(1)
    w = weight.index_select(0, flat_tok[pos].long() + band_start)
    h = hidden.index_select(0, pos // K)
    dots = torch.bmm(w.unsqueeze(1), h.unsqueeze(2)).view(-1)
    slot_logits.view(-1).index_copy_(0, pos, dots.float())
    return slot_logits
