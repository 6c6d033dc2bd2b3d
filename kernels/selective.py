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

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, pdl_args, pdl_prologue, use_triton
from .filtering import TASK_WIDTH


def _check(hidden, weight, slot_tokens, tasks, slot_logits, band_start, tasks_per_program, h_passes=1,
           h_split=1, acc2d=None) -> None:
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
    if not isinstance(h_split, int) or h_split < 1:
        raise ValueError(f"h_split must be an int >= 1, got {h_split!r}")
    if h_split > 1 and h_passes > 1:
        raise ValueError("h_split and h_passes cannot be combined")
    if acc2d not in (None, True, False):
        raise ValueError(f"acc2d must be a bool or None, got {acc2d!r}")


@triton.jit
def _selective_proj_kernel(hidden_ptr, weight_ptr, slot_tok_ptr, tasks_ptr, out_ptr,
                           n_tasks, K, band_start, split_stride,
                           stride_hb, stride_hh, stride_wv, stride_wh,
                           H: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_H: tl.constexpr,
                           TASKS_PER_PROG: tl.constexpr, H_LO: tl.constexpr, N_CHUNKS: tl.constexpr,
                           RESUME: tl.constexpr, ACC2D: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # program (p, s) covers N_CHUNKS chunks of BLOCK_H hidden columns from H_LO + s * N_CHUNKS * BLOCK_H
    # (the last chunk masked at H) and writes its sums to out_ptr + s * split_stride; RESUME
    # continues the sums a previous pass stored, so passes add the same chunks in the same order.
    # ACC2D keeps a (BLOCK_T, BLOCK_H) accumulator and reduces it once at the end instead of
    # after every chunk: the reduction's shuffles and barriers leave the loop.
    offs_t = tl.arange(0, BLOCK_T)
    offs_h = tl.arange(0, BLOCK_H)
    split = tl.program_id(1)
    h_base = H_LO + split * (N_CHUNKS * BLOCK_H)
    out_base = out_ptr + split.to(tl.int64) * split_stride
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
            if ACC2D:
                acc2 = tl.zeros([BLOCK_T, BLOCK_H], tl.float32)
            if RESUME:
                acc = tl.load(out_base + beam * K + slot, mask=valid, other=0.0)
            else:
                acc = tl.zeros([BLOCK_T], tl.float32)
            for c in range(N_CHUNKS):
                hh = h_base + c * BLOCK_H + offs_h
                h_ok = hh < H
                x = tl.load(h_row + hh * stride_hh, mask=h_ok, other=0.0).to(tl.float32)
                w = tl.load(w_rows[:, None] + hh[None, :] * stride_wh,
                            mask=valid[:, None] & h_ok[None, :], other=0.0).to(tl.float32)
                if ACC2D:
                    acc2 += w * x[None, :]
                else:
                    acc += tl.sum(w * x[None, :], axis=1)
            if ACC2D:
                acc += tl.sum(acc2, axis=1)
            tl.store(out_base + beam * K + slot, acc, mask=valid)


@triton.jit
def _split_sum_kernel(part_ptr, slot_tok_ptr, tasks_ptr, out_ptr, n_tasks, K, split_stride,
                      S: tl.constexpr, BLOCK_T: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # program t: the valid slots of task t get the sum of their S partials, in split order
    task = tl.program_id(0)
    count = tl.load(tasks_ptr + task * 3 + 2, mask=task < n_tasks, other=0)
    if count > 0:
        beam = tl.load(tasks_ptr + task * 3).to(tl.int64)
        at = beam * K + tl.load(tasks_ptr + task * 3 + 1) + tl.arange(0, BLOCK_T)
        in_row = at < (beam + 1) * K
        valid = tl.load(slot_tok_ptr + at, mask=in_row, other=-1) >= 0
        acc = tl.load(part_ptr + at, mask=valid, other=0.0)
        for s in tl.static_range(1, S):
            acc += tl.load(part_ptr + s * split_stride + at, mask=valid, other=0.0)
        tl.store(out_ptr + at, acc, mask=valid)


MANY_TASKS = 2048
"""Queue length from which :func:`default_tuning` takes the narrow hidden chunk."""


def default_tuning(n_tasks: int, K: int, H: int) -> tuple[int, int, bool]:
    """``(block_h, num_warps, acc2d)`` for a queue of ``n_tasks`` tasks over rows of ``K`` slots.

    From the H200 sweep (``runs/results/projection-sweep/``, slot rows shaped like the
    search-like steps). With thousands of tasks the GPU is full: a narrow chunk (64 columns)
    with the 2-D accumulator keeps each program's registers low and the masked rows of sparse
    tasks cheap (float32 H 4096 at batch 32: step 3 292 → 141 µs, step 4 147 → 70 µs). With
    a few hundred tasks each program's chain of chunk loads is the latency, so the chunk is
    as wide as a tile of about 8,192 elements allows (one chunk per task when ``K`` is 1),
    reduced after every chunk.
    """
    if n_tasks >= MANY_TASKS:
        return min(next_pow2(H), 64), 4, True
    block_t = min(TASK_WIDTH, next_pow2(K))
    block_h = min(next_pow2(H), max(64, 8192 // block_t))
    return block_h, 8 if block_t * block_h >= 8192 else 4, False


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
                          num_warps: int | None = None, h_passes: int = 1, h_split: int = 1,
                          acc2d: bool | None = None) -> torch.Tensor:
    """Triton launcher of :func:`selective_proj` (same signature and output)."""
    _check(hidden, weight, slot_tokens, tasks, slot_logits, band_start, tasks_per_program, h_passes, h_split, acc2d)
    n_tasks = tasks.shape[0]
    if n_tasks == 0:
        return slot_logits
    n_beams, K = slot_tokens.shape
    H = hidden.shape[1]
    block_t = min(TASK_WIDTH, next_pow2(K))
    auto_h, auto_warps, auto_acc2d = default_tuning(n_tasks, K, H)
    block_h = auto_h if block_h is None else block_h
    num_warps = auto_warps if num_warps is None else num_warps
    acc2d = auto_acc2d if acc2d is None else acc2d
    grid = cdiv(n_tasks, tasks_per_program)
    chunks = cdiv(H, block_h)
    args = (hidden.stride(0), hidden.stride(1), weight.stride(0), weight.stride(1))
    tune = dict(H=H, BLOCK_T=block_t, BLOCK_H=block_h, TASKS_PER_PROG=tasks_per_program, ACC2D=acc2d,
                num_warps=num_warps)
    pdl = pdl_args(slot_logits.device)
    if h_split > 1:
        per = cdiv(chunks, min(h_split, chunks))
        n_split = cdiv(chunks, per)
        part = torch.empty(n_split, n_beams, K, dtype=torch.float32, device=slot_logits.device)
        _selective_proj_kernel[(grid, n_split)](
            hidden, weight, slot_tokens, tasks, part, n_tasks, K, band_start, n_beams * K, *args,
            H_LO=0, N_CHUNKS=per, RESUME=False, **tune, **pdl)
        _split_sum_kernel[(n_tasks,)](part, slot_tokens, tasks, slot_logits, n_tasks, K, n_beams * K, S=n_split,
                                      BLOCK_T=block_t, num_warps=1 if block_t <= 32 else 2, **pdl)
        return slot_logits
    for i, (lo, hi) in enumerate(h_pass_bounds(H, block_h, h_passes)):
        _selective_proj_kernel[(grid, 1)](
            hidden, weight, slot_tokens, tasks, slot_logits, n_tasks, K, band_start, 0, *args,
            H_LO=lo, N_CHUNKS=cdiv(hi - lo, block_h), RESUME=i > 0, **tune, **pdl)
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
                             num_warps: int | None = None, h_passes: int = 1, h_split: int = 1,
                             acc2d: bool | None = None) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`selective_proj` (same signature and output).

    The tuning arguments are checked like the Triton path's and otherwise ignored.
    Candidates are processed in chunks whose float32 temporaries stay near 4 MB: cache-sized
    chunks run about four times faster on a CPU than one large pass.
    """
    _check(hidden, weight, slot_tokens, tasks, slot_logits, band_start, tasks_per_program, h_passes, h_split, acc2d)
    n_beams, K = slot_tokens.shape
    return slot_dot_products(hidden, weight, slot_tokens, covered_slots(tasks, n_beams, K) & (slot_tokens >= 0),
                             slot_logits, band_start)


def slot_dot_products(hidden: torch.Tensor, weight: torch.Tensor, slot_tokens: torch.Tensor, sel: torch.Tensor,
                      slot_logits: torch.Tensor, band_start: int) -> torch.Tensor:
    """``slot_logits[b, k] = hidden[b] . weight[band_start + slot_tokens[b, k]]`` in float32 where
    ``sel[b, k]`` (the references' arithmetic), in chunks whose temporaries stay near 4 MB."""
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
                   num_warps: int | None = None, h_passes: int = 1, h_split: int = 1,
                   acc2d: bool | None = None) -> torch.Tensor:
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
        Triton tuning: hidden-dimension chunk (power of two); :func:`default_tuning` when
        omitted.
    num_warps : int, optional
        Triton tuning: warps per program (:func:`default_tuning` when omitted).
    h_passes : int
        Triton tuning: launch the queue this many times, each over one slice of the hidden
        dimension (cut at ``block_h`` chunks), resuming the float32 sums in ``slot_logits``.
        With ``acc2d=False`` the passes add the same chunks in the same order, so the logits
        are bit-identical to one pass. Each token's head row is gathered once per beam that
        has it; a pass reads only its slice of the band, which can stay in L2 where the whole
        band (e.g. 4096 rows × H 4096 in float32, 64 MB) does not (:func:`passes_for_cache`).
    h_split : int
        Triton tuning: split the hidden dimension over this many programs per task, each
        writing float32 partial sums to a scratch buffer that a second kernel adds in split
        order (more programs for short queues; it won on no search-like shape of the H200
        sweep, so :func:`default_tuning` never picks it; cannot be combined with ``h_passes``).
    acc2d : bool, optional
        Triton tuning: accumulate a (slots × chunk) tile and reduce it once per task rather
        than after every chunk (:func:`default_tuning` when omitted). Either way the sums
        are float32; they differ only in rounding order.

    Returns
    -------
    torch.Tensor
        ``slot_logits``.
    """
    fn = selective_proj_triton if use_triton(slot_tokens) else selective_proj_reference
    return fn(hidden, weight, slot_tokens, tasks, slot_logits, band_start=band_start,
              tasks_per_program=tasks_per_program, block_h=block_h, num_warps=num_warps, h_passes=h_passes,
              h_split=h_split, acc2d=acc2d)
