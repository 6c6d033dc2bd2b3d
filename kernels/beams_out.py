"""The selection's outputs: the next beams of each request (:class:`TopkOut`, what
:func:`zerogr_kernels.topk_gather` writes) and their token prefixes (:func:`extend_prefixes`)."""
from __future__ import annotations

from typing import NamedTuple

import torch


class TopkOut(NamedTuple):
    """Outputs of :func:`topk_gather` (also the layout of its ``out=`` tuple).

    Attributes
    ----------
    scores : torch.Tensor
        ``(batch, M)`` float32 scores, best first; -inf for padding.
    parents : torch.Tensor
        ``(batch, M)`` int64 absolute parent beam (``r * Mb + p // K``); -1 for padding.
    tokens : torch.Tensor
        ``(batch, M)`` int32 next token ``slot_tokens[parent, p % K]``; -1 for padding.
    succ : torch.Tensor
        ``(batch, M)`` int64 next state ``slot_succ[parent, p % K]``; -1 for padding.
    """

    scores: torch.Tensor
    parents: torch.Tensor
    tokens: torch.Tensor
    succ: torch.Tensor

    @classmethod
    def empty(cls, batch: int, beam_width: int, device) -> "TopkOut":
        """Buffers for ``topk_gather(..., out=...)`` of ``batch`` requests and ``beam_width``
        beams (as a CUDA graph needs: allocated once, written by every replay)."""
        return cls(*(torch.empty(shape, dtype=dtype, device=device)
                     for _, shape, dtype, _ in _topk_specs(batch, beam_width, device)))


def _topk_specs(batch: int, beam_width: int, device):
    return [("scores", (batch, beam_width), torch.float32, device),
            ("parents", (batch, beam_width), torch.int64, device),
            ("tokens", (batch, beam_width), torch.int32, device),
            ("succ", (batch, beam_width), torch.int64, device)]


def extend_prefixes(prev: torch.Tensor, nxt: torch.Tensor, top: TopkOut) -> None:
    """Write the next step's prefixes into ``nxt`` from a selection (PyTorch ops).

    Parameters
    ----------
    prev : torch.Tensor
        ``(batch, Mb, l)`` int64 prefixes of the step's beams.
    nxt : torch.Tensor
        ``(batch, M, l + 1)`` int64 output: row ``(r, m)`` is the prefix of parent
        ``top.parents[r, m]`` followed by ``top.tokens[r, m]``; a padded beam (parent -1)
        gets -1 everywhere.
    top : TopkOut
    """
    level = prev.shape[2]
    if level:
        kept = prev.reshape(-1, level).index_select(0, top.parents.clamp(min=0).view(-1)).view(nxt.shape[0], -1, level)
        nxt[..., :level] = torch.where(top.parents[..., None] >= 0, kept, -1)
    nxt[..., level] = top.tokens
