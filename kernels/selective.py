"""Selective projection: logits of the valid slots only, computed in place.

Step 2 (*selective*) of the filtering-first decoding step (docs/design.md §4). Each
task of the work queue built by :mod:`zerogr_kernels.filtering` loads its beam's hidden
vector once and takes its dot product with the head rows of the tokens in its run,
reading the rows in place (``band_start`` selects a band of a shared head without a
copy), and writes float32 logits into ``slot_logits``.

Grid choice: one program per ``tasks_per_program`` consecutive tasks (default 1). The
queue already has a static, bounded length, so the grid is fixed for a given shape and
the hardware block scheduler balances the uneven task costs (full runs of 64 slots next
to empty tasks, which exit after one 4-byte load). A persistent grid looping over the
queue would need a runtime trip count, which buys no reuse here (consecutive tasks share
at most the hidden vector, which ``tasks_per_program > 1`` already reuses from L1) and
which the Triton interpreter cannot run with NumPy >= 2.4.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, use_triton
from .filtering import TASK_WIDTH


def _check(hidden, weight, slot_tokens, tasks, slot_logits, band_start, tasks_per_program, h_passes=1) -> None:
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, contiguous=True)
    n_beams, K = slot_tokens.shape
    device = slot_tokens.device
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, ndim=2, device=device, shape=(n_beams, None))
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, ndim=2, device=device,
                 shape=(None, hidden.shape[1]))
    check_tensor("tasks", tasks, dtypes=(torch.int32,), ndim=2, device=device, shape=(None, 3),
                 contiguous=True)
    check_tensor("slot_logits", slot_logits, dtypes=(torch.float32,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    if not 0 <= band_start < max(weight.shape[0], 1):
        raise ValueError(f"band_start={band_start} outside the {weight.shape[0]} rows of weight")
    if tasks_per_program < 1:
        raise ValueError(f"tasks_per_program must be >= 1, got {tasks_per_program}")
    if not isinstance(h_passes, int) or h_passes < 1:
        raise ValueError(f"h_passes must be an int >= 1, got {h_passes!r}")


@triton.jit
def _selective_proj_kernel(hidden_ptr, weight_ptr, slot_tok_ptr, tasks_ptr, out_ptr,
                           n_tasks, K, band_start,
                           stride_hb, stride_hh, stride_wv, stride_wh,
                           H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                           TASKS_PER_PROG: tl.constexpr, H_LO: tl.constexpr, H_HI: tl.constexpr,
                           RESUME: tl.constexpr):
    # one pass covers hidden columns [H_LO, H_HI) (multiples of BLOCK_H; 0 and H in one
    # pass); RESUME continues the sums a previous pass stored, so any split adds the same
    # chunks in the same order
    offs_t = tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    for i in tl.static_range(TASKS_PER_PROG):
        task = tl.program_id(0) * TASKS_PER_PROG + i
        count = tl.load(tasks_ptr + task * 3 + 2, mask=task < n_tasks, other=0)
        if count > 0:
            beam = tl.load(tasks_ptr + task * 3).to(tl.int64)
            slot = tl.load(tasks_ptr + task * 3 + 1) + offs_t
            # dense tasks may have holes: validity comes from the token, not from count
            tok = tl.load(slot_tok_ptr + beam * K + slot, mask=slot < K, other=-1)
            valid = tok >= 0
            w_rows = weight_ptr + (band_start + tok).to(tl.int64) * stride_wv
            h_row = hidden_ptr + beam * stride_hb
            if RESUME:
                acc = tl.load(out_ptr + beam * K + slot, mask=valid, other=0.0)
            else:
                acc = tl.zeros([BLOCK_T], tl.float32)
            # H need not be a power of two: the last chunk is masked
            for h0 in range(H_LO, H_HI, BLOCK_H):
                hh = h0 + offs_h
                h_ok = hh < H
                x = tl.load(h_row + hh * stride_hh, mask=h_ok, other=0.0).to(tl.float32)
                w = tl.load(w_rows[:, None] + hh[None, :] * stride_wh,
                            mask=valid[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
                acc += tl.sum(w * x[None, :], axis=1)
            tl.store(out_ptr + beam * K + slot, acc, mask=valid)


def h_pass_bounds(H: int, block_h: int, h_passes: int) -> list[tuple[int, int]]:
    """Column ranges ``[(lo, hi), ...]`` of ``h_passes`` passes over ``H``, cut at multiples of
    ``block_h`` (fewer passes when there are fewer chunks)."""
    chunks = cdiv(H, block_h)
    per = cdiv(chunks, min(h_passes, chunks))
    return [(c * block_h, min((c + per) * block_h, H)) for c in range(0, chunks, per)]


def passes_for_cache(band_rows: int, H: int, itemsize: int, cache_bytes: int = 16 << 20) -> int:
    """Passes over H that keep one pass's slice of a band of ``band_rows`` rows within
    ``cache_bytes`` (the rows the gathers of one pass share stay cache-resident)."""
    return max(1, cdiv(band_rows * H * itemsize, cache_bytes))


def selective_proj_triton(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                          tasks: torch.Tensor, slot_logits: torch.Tensor, *, band_start: int = 0,
                          tasks_per_program: int = 1, block_h: int | None = None,
                          num_warps: int | None = None, h_passes: int = 1) -> torch.Tensor:
    """Triton launcher of :func:`selective_proj` (same signature and output)."""
    _check(hidden, weight, slot_tokens, tasks, slot_logits, band_start, tasks_per_program, h_passes)
    n_tasks = tasks.shape[0]
    if n_tasks == 0:
        return slot_logits
    K = slot_tokens.shape[1]
    H = hidden.shape[1]
    block_t = min(TASK_WIDTH, next_pow2(K))
    if block_h is None:
        block_h = min(next_pow2(H), max(64, 8192 // block_t))
    if num_warps is None:
        num_warps = 8 if block_t * block_h >= 8192 else 4
    grid = (cdiv(n_tasks, tasks_per_program),)
    for i, (lo, hi) in enumerate(h_pass_bounds(H, block_h, h_passes)):
        _selective_proj_kernel[grid](
            hidden, weight, slot_tokens, tasks, slot_logits, n_tasks, K, band_start,
            hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1),
            H=H, BLOCK_T=block_t, BLOCK_H=block_h, TASKS_PER_PROG=tasks_per_program, H_LO=lo, H_HI=hi,
            RESUME=i > 0, num_warps=num_warps)
    return slot_logits


def covered_slots(tasks: torch.Tensor, n_beams: int, K: int) -> torch.Tensor:
    """Boolean ``(n_beams, K)`` mask of the slots inside tasks with ``count > 0``."""
    beam, start, count = tasks.long().unbind(1)
    live = count > 0
    cols = start[live, None] + torch.arange(TASK_WIDTH, device=tasks.device)
    rows = beam[live, None].expand_as(cols)
    ok = cols < K
    cover = torch.zeros(n_beams, K, dtype=torch.bool, device=tasks.device)
    cover[rows[ok], cols[ok]] = True
    return cover


def selective_proj_reference(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                             tasks: torch.Tensor, slot_logits: torch.Tensor, *, band_start: int = 0,
                             tasks_per_program: int = 1, block_h: int | None = None,
                             num_warps: int | None = None, h_passes: int = 1) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`selective_proj` (same signature and output).

    The tuning arguments are checked like the Triton path's and otherwise ignored.
    Candidates are processed in chunks whose float32 temporaries stay near 4 MB: cache-sized
    chunks run about four times faster on a CPU than one large pass.
    """
    _check(hidden, weight, slot_tokens, tasks, slot_logits, band_start, tasks_per_program, h_passes)
    n_beams, K = slot_tokens.shape
    sel = covered_slots(tasks, n_beams, K) & (slot_tokens >= 0)
    beam, slot = sel.nonzero(as_tuple=True)
    rows = slot_tokens[beam, slot].long() + band_start
    chunk = max(1, (1 << 20) // max(hidden.shape[1], 1))
    for lo in range(0, beam.numel(), chunk):
        b, s, r = beam[lo:lo + chunk], slot[lo:lo + chunk], rows[lo:lo + chunk]
        slot_logits[b, s] = (weight[r].float() * hidden[b].float()).sum(1)
    return slot_logits


def selective_proj(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor,
                   tasks: torch.Tensor, slot_logits: torch.Tensor, *, band_start: int = 0,
                   tasks_per_program: int = 1, block_h: int | None = None,
                   num_warps: int | None = None, h_passes: int = 1) -> torch.Tensor:
    """Compute the logits of the valid slots of every task, in place in ``slot_logits``.

    For every task ``(beam, start, count)`` with ``count > 0`` and every slot ``k`` in
    ``[start, min(start + 64, K))`` with ``slot_tokens[beam, k] >= 0``, writes
    ``slot_logits[beam, k] = hidden[beam] . weight[band_start + slot_tokens[beam, k]]``
    accumulated in float32. Other slots are left untouched (-inf after filtering).
    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation on the Triton path.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(n_beams, H)`` float16, bfloat16 or float32 hidden states (any strides).
    weight : torch.Tensor
        ``(V_total, H)`` float16, bfloat16 or float32 head (any strides; may be the
        whole shared head). Row ``band_start + t`` is token ``t``; the caller guarantees
        it exists (the Triton path cannot check token ids).
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32 slot tokens from :func:`zerogr_kernels.filter_slots`, -1 = invalid.
    tasks : torch.Tensor
        ``(n_tasks, 3)`` int32 work queue ``(beam, start, count)`` from
        :func:`zerogr_kernels.filter_slots`.
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32, contiguous; updated in place.
    band_start : int
        First row of the step's band in ``weight``.
    tasks_per_program : int
        Triton tuning: consecutive tasks per program.
    block_h : int, optional
        Triton tuning: hidden-dimension chunk (power of two); chosen from ``K`` and ``H``
        when omitted.
    num_warps : int, optional
        Triton tuning: warps per program.
    h_passes : int
        Triton tuning: launch the queue this many times, each over one slice of the hidden
        dimension (cut at ``block_h`` chunks), resuming the float32 sums in ``slot_logits``.
        Same chunks, same order: the logits are bit-identical to one pass. Each token's head
        row is gathered once per beam that has it; a pass reads only its slice of the band,
        which can stay in L2 where the whole band (e.g. 4096 rows × H 4096 in float32, 64 MB)
        does not (:func:`passes_for_cache`).

    Returns
    -------
    torch.Tensor
        ``slot_logits``.
    """
    fn = selective_proj_triton if use_triton(slot_tokens) else selective_proj_reference
    return fn(hidden, weight, slot_tokens, tasks, slot_logits, band_start=band_start,
              tasks_per_program=tasks_per_program, block_h=block_h, num_warps=num_warps, h_passes=h_passes)
