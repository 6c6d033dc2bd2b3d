"""Normalisation: log-softmax over the valid slots of each row, plus the beam's score.

Step 3 of the filtering-first decoding step (docs/design.md §4). A slot is valid when
its logit is greater than -inf. Row ``b`` becomes
``(x - logsumexp(valid x)) + beam_scores[b]`` on its valid slots and -inf elsewhere; a
row without valid slots (dead beam, empty segment) stays all -inf, never NaN, and so does a
row holding NaN or +inf (a model output that overflowed), as ``torch.log_softmax`` makes it
NaN and the reference turns NaN into -inf.

The ``@triton.jit`` helpers ``lse_update``, ``row_lse_state``, ``lse_finish`` and
``apply_log_softmax`` are shared with :mod:`zerogr_kernels.selection`, which fuses this
normalisation into selection.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, pdl_args, pdl_prologue, use_triton

MAX_BLOCK_K = 2048
"""Widest column chunk one program holds; wider rows are processed in chunks."""
TILE = 1024
"""Target slots per program for narrow rows (several rows share a program)."""


@triton.jit
def lse_start(ROWS: tl.constexpr):
    """The empty :func:`lse_update` state ``(m, s)`` of ``ROWS`` rows."""
    return tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32)


@triton.jit
def lse_update(m, s, x):
    """Fold a ``(ROWS, BLOCK_K)`` float32 chunk ``x`` into the running row max ``m`` and
    sum ``s = sum(exp(x - m))`` (both ``(ROWS,)``); -inf entries contribute nothing."""
    m_new = tl.maximum(m, tl.max(x, axis=1))
    # rows still all -inf use 0 as the reference so no -inf - -inf NaN appears
    ref = tl.where(m_new == float("-inf"), 0.0, m_new)
    s = s * tl.exp(m - ref) + tl.sum(tl.exp(x - ref[:, None]), axis=1)
    return m_new, s


@triton.jit
def row_lse_state(x_ptr, rows, row_ok, K, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                  N_CHUNKS: tl.constexpr):
    """:func:`lse_update` state ``(m, s)`` of rows ``rows`` ``(ROWS,)`` int64 of a row-major
    ``(n, K)`` array at ``x_ptr``, folded over ``N_CHUNKS`` chunks of ``BLOCK_K`` columns;
    rows where ``row_ok`` is false read as empty."""
    m, s = lse_start(ROWS)
    for c in range(N_CHUNKS):
        cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=float("-inf"))
        m, s = lse_update(m, s, x.to(tl.float32))
    return m, s


@triton.jit
def lse_finish(m, s):
    """Row log-sum-exp from :func:`lse_update` state. Rows without valid slots get 0, a
    finite stand-in that keeps every later -inf free of NaN intermediates; a row holding NaN
    gets NaN (its sum is NaN whether or not the max skipped it), as in ``torch.log_softmax``."""
    return tl.where(m == float("-inf"), 0.0, m) + tl.log(tl.where(s == 0.0, 1.0, s))


@triton.jit
def apply_log_softmax(x, lse, score):
    """``(x - lse) + score`` on valid entries of ``x`` ``(ROWS, BLOCK_K)``, -inf elsewhere and
    on every entry of a row whose log-sum-exp is NaN (the reference's ``nan_to_num``)."""
    y = (x - lse[:, None]) + score[:, None]
    return tl.where((x > float("-inf")) & (y == y), y, float("-inf"))


@triton.jit
def _log_softmax_slots_kernel(x_ptr, score_ptr, out_ptr, n_rows, K,
                              ROWS: tl.constexpr, BLOCK_K: tl.constexpr, N_CHUNKS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    m, s = row_lse_state(x_ptr, rows, row_ok, K, ROWS, BLOCK_K, N_CHUNKS)
    lse = lse_finish(m, s)
    score = tl.load(score_ptr + rows, mask=row_ok, other=float("-inf"))
    # second sweep re-reads x (L2-resident), so out may alias x
    for c in range(N_CHUNKS):
        cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=float("-inf"))
        tl.store(out_ptr + rows[:, None] * K + cols[None, :],
                 apply_log_softmax(x.to(tl.float32), lse, score), mask=ok)


def row_tiling(n_rows: int, K: int) -> tuple[int, int, int]:
    """``(ROWS, BLOCK_K, N_CHUNKS)`` for row-wise kernels over ``(n_rows, K)`` slots."""
    block_k = min(next_pow2(K), MAX_BLOCK_K)
    rows = min(next_pow2(n_rows), max(1, TILE // block_k))
    return rows, block_k, cdiv(K, block_k)


def _check(slot_logits, beam_scores, out) -> None:
    check_tensor("slot_logits", slot_logits, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    n_rows, K = slot_logits.shape
    if K < 1:
        raise ValueError("slot_logits needs at least one column")
    device = slot_logits.device
    check_tensor("beam_scores", beam_scores, dtypes=(torch.float32,), ndim=1, device=device,
                 shape=(n_rows,), contiguous=True)
    if out is not None:
        check_tensor("out", out, dtypes=(torch.float32,), ndim=2, device=device, shape=(n_rows, K),
                     contiguous=True)


def _prepare(slot_logits, beam_scores, out) -> torch.Tensor:
    _check(slot_logits, beam_scores, out)
    if out is None:
        return torch.empty(slot_logits.shape, dtype=torch.float32, device=slot_logits.device)
    return out


def log_softmax_slots_triton(slot_logits: torch.Tensor, beam_scores: torch.Tensor, *,
                             out: torch.Tensor | None = None) -> torch.Tensor:
    """Triton launcher of :func:`log_softmax_slots` (same signature and output)."""
    out = _prepare(slot_logits, beam_scores, out)
    n_rows, K = slot_logits.shape
    if n_rows == 0:
        return out
    rows, block_k, n_chunks = row_tiling(n_rows, K)
    pdl = pdl_args(slot_logits.device)
    _log_softmax_slots_kernel[(cdiv(n_rows, rows),)](
        slot_logits, beam_scores, out, n_rows, K,
        ROWS=rows, BLOCK_K=block_k, N_CHUNKS=n_chunks, num_warps=4, **pdl)
    return out


def log_softmax_slots_reference(slot_logits: torch.Tensor, beam_scores: torch.Tensor, *,
                                out: torch.Tensor | None = None) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`log_softmax_slots` (same signature and output)."""
    _check(slot_logits, beam_scores, out)
    # -inf slots add exp(-inf) = 0 to the sum and stay -inf; a row without valid slots (its
    # max is -inf) comes out NaN and is turned back to -inf in place. As few passes and ops
    # as scoring first's plain softmax: at decode sizes a CPU pays per op, and a mask pass
    # would make filtering first the slower order.
    x = slot_logits if slot_logits.dtype == torch.float32 else slot_logits.float()
    inf = float("inf")
    lp = torch.log_softmax(x, dim=1).add_(beam_scores[:, None]).nan_to_num_(nan=-inf, posinf=inf, neginf=-inf)
    return lp if out is None else out.copy_(lp)


def log_softmax_slots(slot_logits: torch.Tensor, beam_scores: torch.Tensor, *,
                      out: torch.Tensor | None = None) -> torch.Tensor:
    """Log-softmax over the valid (finite) slots of each row, plus the beam's score.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation on the Triton path.

    Parameters
    ----------
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32, float16 or bfloat16 contiguous slot logits, -inf on
        invalid slots.
    beam_scores : torch.Tensor
        ``(n_beams,)`` float32 accumulated score of each beam (-inf for a padded beam).
    out : torch.Tensor, optional
        ``(n_beams, K)`` float32 contiguous output; may be ``slot_logits`` itself
        (in place).

    Returns
    -------
    torch.Tensor
        ``(n_beams, K)`` float32 candidate scores, -inf on invalid slots.
    """
    fn = log_softmax_slots_triton if use_triton(slot_logits) else log_softmax_slots_reference
    return fn(slot_logits, beam_scores, out=out)
