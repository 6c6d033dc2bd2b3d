"""Catalog-normalised requests' own lists applied after projection (the reference decoder's pass).

Filtering first normalises a request with bit :data:`~zerogr_kernels.constraints.CATALOG_NORMALISED`
over the catalog's valid tokens: its own list only removes candidates. The reference decoder
applies only the global list before projection (:func:`~zerogr_kernels.constraints.constrain_slots`
with ``defer=True``), then this op kills the request's listed slots and moves the difference between
the two normalisers into the beam's score. The engine settles the same slots in its selection instead
(:func:`zerogr_kernels.topk_gather`'s ``deferred``). The slot test is
:mod:`zerogr_kernels.constraints`'s.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, check_tensor, pdl_args, pdl_prologue, use_triton
from .constraints import _LISTS_DOC, _alive_reference, _check, _kill, _kill_reference, _slot_alive
from .normalize import lse_finish, lse_start, lse_update, row_tiling
from .row_marks import _check_marks


@triton.jit
def _constrain_scored_kernel(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, row_start_ptr,
                             list_off_ptr, list_rows_ptr, list_mode_ptr, marks_ptr, mark_shift, score_ptr,
                             out_score_ptr, n_rows, K, beams_per_request, n_iter, LAST: tl.constexpr,
                             ROWS: tl.constexpr, BLOCK: tl.constexpr, N_CHUNKS: tl.constexpr, MARKS: tl.constexpr,
                             PDL: tl.constexpr):
    pdl_prologue(PDL)
    rows, row_ok, req, mode, active = _catalog_rows(list_mode_ptr, n_rows, beams_per_request, ROWS)
    # log-sum-exp states over every live slot (m_all, s_all) and over the alive ones
    m_all, s_all = lse_start(ROWS)
    m_alive, s_alive = lse_start(ROWS)
    for c in range(N_CHUNKS):
        cols = c * BLOCK + tl.arange(0, BLOCK)
        ok = active[:, None] & (cols < K)[None, :]
        slot = rows[:, None] * K + cols[None, :]
        succ = tl.load(slot_succ_ptr + slot, mask=ok, other=-1)
        valid = succ >= 0
        x = tl.load(slot_logit_ptr + slot, mask=valid, other=float("-inf")).to(tl.float32)
        alive, live = _slot_alive(succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr, req[:, None],
                                  ((mode & 1) != 0)[:, None], n_iter, marks_ptr, mark_shift, marks_ptr, 0, 0,
                                  marks_ptr, 1, LAST, MARKS, False, False)
        x = tl.where(live, x, float("-inf"))
        m_all, s_all = lse_update(m_all, s_all, x)
        m_alive, s_alive = lse_update(m_alive, s_alive, tl.where(alive, x, float("-inf")))
        _kill(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, slot, valid & ~alive)
    _store_shifted(score_ptr, out_score_ptr, rows, row_ok, active, m_all, s_all, m_alive, s_alive)


@triton.jit
def _catalog_rows(list_mode_ptr, n_rows, beams_per_request, ROWS: tl.constexpr):
    # this program's beams, their requests and modes, and which are catalog-normalised (the
    # others read nothing and keep their scores)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    req = tl.minimum(rows, n_rows - 1) // beams_per_request
    mode = tl.load(list_mode_ptr + req, mask=row_ok, other=0)
    return rows, row_ok, req, mode, row_ok & ((mode & 2) != 0)


@triton.jit
def _store_shifted(score_ptr, out_score_ptr, rows, row_ok, active, m_all, s_all, m_alive, s_alive):
    # the beam scores of catalog-normalised rows (`active`) moved by lse(alive) - lse(live); -inf
    # where nothing is alive; the other rows' scores unchanged
    score = tl.load(score_ptr + rows, mask=row_ok, other=float("-inf"))
    shift = lse_finish(m_alive, s_alive) - lse_finish(m_all, s_all)
    out = tl.where(m_alive == float("-inf"), float("-inf"), score + shift)
    tl.store(out_score_ptr + rows, tl.where(active, out, score), mask=row_ok)


def _check_scores(slot_succ, beam_scores, out_scores) -> None:
    n, dev = slot_succ.shape[0], slot_succ.device
    check_tensor("beam_scores", beam_scores, dtypes=(torch.float32,), ndim=1, device=dev, shape=(n,),
                 contiguous=True)
    check_tensor("out_scores", out_scores, dtypes=(torch.float32,), ndim=1, device=dev, shape=(n,),
                 contiguous=True)


def constrain_scored_slots_triton(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                                  row_start: torch.Tensor | None, list_offsets: torch.Tensor,
                                  list_rows: torch.Tensor, list_mode: torch.Tensor, beams_per_request: int,
                                  n_iter: int, beam_scores: torch.Tensor, out_scores: torch.Tensor,
                                  marks: torch.Tensor | None = None, mark_shift: int = 0) -> torch.Tensor:
    """Triton implementation of :func:`constrain_scored_slots` (no host sync)."""
    _check(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
           beams_per_request, n_iter)
    _check_marks(marks, mark_shift, slot_succ.device)
    _check_scores(slot_succ, beam_scores, out_scores)
    n, K = slot_succ.shape
    if n == 0:
        return out_scores
    rows, block, n_chunks = row_tiling(n, K)
    last = row_start is None
    pdl = pdl_args(slot_succ.device)
    _constrain_scored_kernel[(cdiv(n, rows),)](
        slot_tokens, slot_succ, slot_logits, list_rows if last else row_start, list_offsets, list_rows,
        list_mode, list_mode if marks is None else marks, mark_shift, beam_scores, out_scores, n, K,
        beams_per_request, n_iter, LAST=last, ROWS=rows, BLOCK=block, N_CHUNKS=n_chunks, MARKS=marks is not None,
        **pdl)
    return out_scores


def constrain_scored_slots_reference(slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                                     slot_logits: torch.Tensor, row_start: torch.Tensor | None,
                                     list_offsets: torch.Tensor, list_rows: torch.Tensor, list_mode: torch.Tensor,
                                     beams_per_request: int, n_iter: int, beam_scores: torch.Tensor,
                                     out_scores: torch.Tensor, marks: torch.Tensor | None = None,
                                     mark_shift: int = 0) -> torch.Tensor:
    """PyTorch reference of :func:`constrain_scored_slots` (same signature and output)."""
    _check(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
           beams_per_request, n_iter)
    _check_marks(marks, mark_shift, slot_succ.device)
    _check_scores(slot_succ, beam_scores, out_scores)
    if slot_succ.shape[0] == 0:
        return out_scores
    valid, alive, live, catalog = _alive_reference(slot_succ, row_start, list_offsets, list_rows, list_mode,
                                                   beams_per_request)
    x = slot_logits.float().masked_fill(~(valid & live), float("-inf"))
    lse_all = torch.logsumexp(x, dim=1)
    lse_alive = torch.logsumexp(x.masked_fill(~alive, float("-inf")), dim=1)
    any_alive = (valid & alive).any(dim=1)
    safe = torch.where(any_alive, lse_alive - lse_all, 0.0)
    shifted = torch.where(any_alive, beam_scores + safe, float("-inf"))
    out_scores.copy_(torch.where(catalog[:, 0], shifted, beam_scores))
    _kill_reference(slot_tokens, slot_succ, slot_logits, valid & ~alive & catalog)
    return out_scores


def constrain_scored_slots(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                           row_start: torch.Tensor | None, list_offsets: torch.Tensor, list_rows: torch.Tensor,
                           list_mode: torch.Tensor, beams_per_request: int, n_iter: int,
                           beam_scores: torch.Tensor, out_scores: torch.Tensor, marks: torch.Tensor | None = None,
                           mark_shift: int = 0) -> torch.Tensor:
    fn = constrain_scored_slots_triton if use_triton(slot_succ) else constrain_scored_slots_reference
    return fn(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
              beams_per_request, n_iter, beam_scores, out_scores, marks, mark_shift)


constrain_scored_slots.__doc__ = f"""Apply the lists of catalog-normalised requests after projection.

    For every beam of a request with bit :data:`CATALOG_NORMALISED`: kill its dead slots (as
    :func:`constrain_slots`) and set ``out_scores[b] = beam_scores[b] + lse(alive) - lse(live)``,
    the log-sum-exp of the beam's alive slot logits and of those still in the catalog (not
    globally denied); -inf when nothing is alive. A log-softmax over the alive slots plus that
    score then equals the log-softmax over the catalog's slots, so the request keeps the
    catalog's normalisation. Other beams keep their
    slots, and ``out_scores[b] = beam_scores[b]``.

    Parameters
    ----------
{_LISTS_DOC}
    beam_scores : torch.Tensor
        ``(n_beams,)`` float32 accumulated beam scores.
    out_scores : torch.Tensor
        ``(n_beams,)`` float32 output (must not alias ``beam_scores``).

    Returns
    -------
    torch.Tensor
        ``out_scores``.
    """

