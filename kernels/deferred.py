"""Catalog-normalised lists after projection, settled from what the filter already decided.

A request with bit :data:`~zerogr_kernels.constraints.CATALOG_NORMALISED` is normalised over the
catalog's live slots, its own list only removing candidates. The filter, given its lists with
``defer`` (:class:`~zerogr_kernels.constraints.SlotLists`), kills the slots with nothing live
below them and keeps those that only the request's own list kills, their successor ``s``
stored as ``-2 - s``, so that they are projected. After projection this op, per beam of such a
request, adds the log-sum-exp of its alive slots minus that of its live slots to the beam's
score and kills the deferred slots: the same result as
:func:`~zerogr_kernels.constraints.constrain_scored_slots`, which searches the lists again, but
with no search, only one pass over each beam's slots.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, pdl_args, pdl_prologue, use_triton
from .constraints import _catalog_rows, _kill, _store_shifted
from .normalize import lse_start, lse_update, row_tiling


@triton.jit
def _finish_deferred_kernel(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, list_mode_ptr, score_ptr, out_score_ptr,
                            n_rows, K, beams_per_request, ROWS: tl.constexpr, BLOCK: tl.constexpr,
                            N_CHUNKS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    rows, row_ok, req, mode, active = _catalog_rows(list_mode_ptr, n_rows, beams_per_request, ROWS)
    # log-sum-exp states over every live slot (m_all, s_all) and over the alive ones
    m_all, s_all = lse_start(ROWS)
    m_alive, s_alive = lse_start(ROWS)
    for c in range(N_CHUNKS):
        cols = c * BLOCK + tl.arange(0, BLOCK)
        slot = rows[:, None] * K + cols[None, :]
        live = tl.load(slot_tok_ptr + slot, mask=active[:, None] & (cols < K)[None, :], other=-1) >= 0
        succ = tl.load(slot_succ_ptr + slot, mask=live, other=-1)
        x = tl.load(slot_logit_ptr + slot, mask=live, other=float("-inf")).to(tl.float32)
        m_all, s_all = lse_update(m_all, s_all, x)
        m_alive, s_alive = lse_update(m_alive, s_alive, tl.where(succ >= 0, x, float("-inf")))
        _kill(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, slot, live & (succ < -1))
    _store_shifted(score_ptr, out_score_ptr, rows, row_ok, active, m_all, s_all, m_alive, s_alive)


def _check(slot_tokens, slot_succ, slot_logits, list_mode, beams_per_request, beam_scores, out_scores) -> None:
    check_tensor("slot_succ", slot_succ, dtypes=(torch.int64,), ndim=2, contiguous=True)
    n, K = slot_succ.shape
    dev = slot_succ.device
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, device=dev, shape=(n, K),
                 contiguous=True)
    check_tensor("slot_logits", slot_logits, dtypes=FLOAT_DTYPES, ndim=2, device=dev, shape=(n, K),
                 contiguous=True)
    if not isinstance(beams_per_request, int) or beams_per_request < 1 or n % beams_per_request:
        raise ValueError(f"beams_per_request must be a positive divisor of {n} beams, got {beams_per_request!r}")
    check_tensor("list_mode", list_mode, dtypes=(torch.int32,), ndim=1, device=dev, shape=(n // beams_per_request,),
                 contiguous=True)
    for name, t in (("beam_scores", beam_scores), ("out_scores", out_scores)):
        check_tensor(name, t, dtypes=(torch.float32,), ndim=1, device=dev, shape=(n,), contiguous=True)


def finish_deferred_triton(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                           list_mode: torch.Tensor, beams_per_request: int, beam_scores: torch.Tensor,
                           out_scores: torch.Tensor) -> torch.Tensor:
    """Triton implementation of :func:`finish_deferred` (one launch, no host sync)."""
    _check(slot_tokens, slot_succ, slot_logits, list_mode, beams_per_request, beam_scores, out_scores)
    n, K = slot_succ.shape
    if n == 0:
        return out_scores
    rows, block, n_chunks = row_tiling(n, K)
    _finish_deferred_kernel[(cdiv(n, rows),)](
        slot_tokens, slot_succ, slot_logits, list_mode, beam_scores, out_scores, n, K, beams_per_request,
        ROWS=rows, BLOCK=block, N_CHUNKS=n_chunks, **pdl_args(slot_succ.device))
    return out_scores


def finish_deferred_reference(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                              list_mode: torch.Tensor, beams_per_request: int, beam_scores: torch.Tensor,
                              out_scores: torch.Tensor) -> torch.Tensor:
    """PyTorch reference of :func:`finish_deferred` (same signature and output)."""
    _check(slot_tokens, slot_succ, slot_logits, list_mode, beams_per_request, beam_scores, out_scores)
    n = slot_succ.shape[0]
    if n == 0:
        return out_scores
    req = torch.arange(n, device=slot_succ.device) // beams_per_request
    catalog = ((list_mode[req] & 2) != 0)[:, None]
    live = (slot_tokens >= 0) & catalog
    alive = live & (slot_succ >= 0)
    x = slot_logits.float().masked_fill(~live, float("-inf"))
    lse_alive = torch.logsumexp(x.masked_fill(~alive, float("-inf")), dim=1)
    # as the kernel: -inf where nothing alive has a finite logit (alive ⊂ live, so lse(live) is finite there)
    some = lse_alive > float("-inf")
    shift = torch.where(some, lse_alive - torch.logsumexp(x, dim=1), 0.0)
    shifted = torch.where(some, beam_scores + shift, float("-inf"))
    out_scores.copy_(torch.where(catalog[:, 0], shifted, beam_scores))
    later = live & (slot_succ < -1)
    slot_tokens.masked_fill_(later, -1)
    slot_succ.masked_fill_(later, -1)
    slot_logits.masked_fill_(later, float("-inf"))
    return out_scores


def finish_deferred(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                    list_mode: torch.Tensor, beams_per_request: int, beam_scores: torch.Tensor,
                    out_scores: torch.Tensor) -> torch.Tensor:
    """Kill the deferred slots of catalog-normalised requests and move the difference of the two
    normalisers into their beams' scores (after projection).

    For every beam of a request with bit 2 of ``list_mode``: ``out_scores[b] = beam_scores[b] +
    lse(alive) - lse(live)`` over its slot logits, where live slots have a token (``>= 0``) and
    alive ones also a successor (``>= 0``); -inf when nothing is alive. Then its deferred slots
    (token ``>= 0``, successor ``< -1``) get token -1, successor -1 and logit -inf. Other beams
    keep their slots and ``out_scores[b] = beam_scores[b]``.

    Parameters
    ----------
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32, from :func:`zerogr_kernels.filter_slots` with deferred lists.
    slot_succ : torch.Tensor
        ``(n_beams, K)`` int64; ``-2 - s`` marks a deferred slot with successor ``s``.
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32/float16/bfloat16 projected slot logits.
    list_mode : torch.Tensor
        ``(batch,)`` int32 mode bits (:mod:`zerogr_kernels.constraints`).
    beams_per_request : int
    beam_scores : torch.Tensor
        ``(n_beams,)`` float32.
    out_scores : torch.Tensor
        ``(n_beams,)`` float32 output (must not alias ``beam_scores``).

    Returns
    -------
    torch.Tensor
        ``out_scores``.
    """
    fn = finish_deferred_triton if use_triton(slot_succ) else finish_deferred_reference
    return fn(slot_tokens, slot_succ, slot_logits, list_mode, beams_per_request, beam_scores, out_scores)
