"""Filtering: expand each beam's valid next tokens into a fixed-width slot row.

Step 1 of the filtering-first decoding step (docs/design.md §4). Every beam ``b`` in
state ``q = states[b]`` gets a row of ``K`` candidate slots holding its valid next
tokens, their successor states and a score, plus a static work queue of valid-slot runs
for the selective projection.

Work-queue format
-----------------
``tasks`` is an ``(n_beams * T, 3)`` int32 tensor, ``T = ceil(K / 64)``. Row
``t = b * T + c`` is ``(beam, start, count)`` with ``beam = b``, ``start = 64 * c`` and
``count`` = the number of valid slots among ``[start, min(start + 64, K))``. The shape
depends only on ``(n_beams, K)``, so the queue can live in a static buffer of a CUDA
graph; tasks with ``count == 0`` are kept (dead beams, short segments) and consumers
skip them.

- sparse mapping: the valid slots of a task are exactly ``[start, start + count)``.
- dense mapping: a task is a fixed 64-wide column block and its valid slots need not be
  consecutive; consumers mask slots by ``slot_tokens >= 0`` (which is also correct for
  sparse rows, and is what :mod:`zerogr_kernels.selective` does).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import (FLOAT_DTYPES, cdiv, check_out, check_tensor, next_pow2, pdl_args, pdl_prologue,
                      use_triton)
from .constraints import SlotLists, _filter_lists

TASK_WIDTH = 64
"""Slots per work-queue task (the task at column block ``c`` starts at ``64 * c``)."""


class FilterOut(NamedTuple):
    """Outputs of :func:`filter_slots` (also the layout of its ``out=`` tuple).

    Attributes
    ----------
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32: local token id of each slot, -1 when invalid.
    slot_succ : torch.Tensor
        ``(n_beams, K)`` int64: successor state of each slot, -1 when invalid.
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32: the copied logit of each valid slot, or -inf
        placeholders when no logits were given; -inf for invalid slots.
    seg_len : torch.Tensor
        ``(n_beams,)`` int32: number of valid slots per beam (0 for dead beams).
    tasks : torch.Tensor
        ``(n_beams * ceil(K / 64), 3)`` int32 work queue, rows ``(beam, start, count)``
        (see the module docstring).
    """

    slot_tokens: torch.Tensor
    slot_succ: torch.Tensor
    slot_logits: torch.Tensor
    seg_len: torch.Tensor
    tasks: torch.Tensor

    @classmethod
    def empty(cls, n_beams: int, K: int, device) -> "FilterOut":
        """Buffers for ``filter_slots(states, K, ..., out=...)`` over ``n_beams`` beams (as a CUDA
        graph needs: allocated once, written by every replay)."""
        return cls(*(torch.empty(shape, dtype=dtype, device=device)
                     for _, shape, dtype, _ in _out_specs(n_beams, K, device)))


def num_tasks(n_beams: int, K: int) -> int:
    """Capacity of the work queue for ``n_beams`` slot rows of width ``K``."""
    return n_beams * cdiv(K, TASK_WIDTH)


def _out_specs(n_beams: int, K: int, device: torch.device):
    return [
        ("slot_tokens", (n_beams, K), torch.int32, device),
        ("slot_succ", (n_beams, K), torch.int64, device),
        ("slot_logits", (n_beams, K), torch.float32, device),
        ("seg_len", (n_beams,), torch.int32, device),
        ("tasks", (num_tasks(n_beams, K), 3), torch.int32, device),
    ]


def _prepare(states, K, tokens, offsets, table, logits, out) -> FilterOut:
    """Validate the arguments of :func:`filter_slots` and return the output buffers."""
    check_tensor("states", states, dtypes=(torch.int64,), ndim=1, contiguous=True)
    device = states.device
    if not isinstance(K, int) or K < 1:
        raise ValueError(f"K must be a positive int, got {K!r}")
    if cdiv(K, TASK_WIDTH) > 65535:
        raise ValueError(f"K={K} needs more than 65535 column tasks")
    sparse = tokens is not None or offsets is not None
    if sparse == (table is not None) or (sparse and (tokens is None or offsets is None)):
        raise ValueError("pass either tokens and offsets (sparse mapping) or table (dense mapping)")
    if sparse:
        check_tensor("tokens", tokens, dtypes=(torch.int8, torch.int16, torch.int32), ndim=1,
                     device=device, contiguous=True)
        check_tensor("offsets", offsets, dtypes=(torch.int32, torch.int64), ndim=1, device=device,
                     contiguous=True)
        if offsets.numel() < 1:
            raise ValueError("offsets must hold S + 1 >= 1 entries")
    else:
        check_tensor("table", table, dtypes=(torch.int32, torch.int64), ndim=2, device=device)
        if table.shape[1] != K:
            raise ValueError(f"dense mapping: K must equal the table width {table.shape[1]}, got {K}")
    n_beams = states.shape[0]
    if logits is not None:
        check_tensor("logits", logits, dtypes=FLOAT_DTYPES, ndim=2, device=device,
                     shape=(n_beams, None if sparse else K))
    if out is None:
        return FilterOut.empty(n_beams, K, device)
    check_out(out, _out_specs(n_beams, K, device))
    return FilterOut(*out)


@triton.jit
def _store_slots(rows, row_ok, cols, K, col_task, valid, tok, succ, lg,
                 slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, tasks_ptr, n_col_tasks,
                 TASK_W: tl.constexpr):
    # rows: (ROWS,) int64 beams; cols: (BLOCK_K,) slot ids of this column task
    slot = rows[:, None] * K + cols[None, :]
    in_tile = row_ok[:, None] & (cols < K)[None, :]
    tl.store(slot_tok_ptr + slot, tok, mask=in_tile)
    tl.store(slot_succ_ptr + slot, succ, mask=in_tile)
    tl.store(slot_logit_ptr + slot, lg, mask=in_tile)
    count = tl.sum(valid.to(tl.int32), axis=1)
    task = (rows * n_col_tasks + col_task) * 3
    tl.store(tasks_ptr + task, rows.to(tl.int32), mask=row_ok)
    tl.store(tasks_ptr + task + 1, tl.zeros_like(count) + col_task * TASK_W, mask=row_ok)
    tl.store(tasks_ptr + task + 2, count, mask=row_ok)
    return count


@triton.jit
def _filter_sparse_kernel(states_ptr, tokens_ptr, offsets_ptr, logits_ptr,
                          slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, seg_len_ptr, tasks_ptr,
                          n_beams, K, n_col_tasks, stride_lb, stride_lv,
                          row_start_ptr, list_off_ptr, list_rows_ptr, list_mode_ptr, marks_ptr, mark_shift,
                          nodes_ptr, node_off, node_stride, beams_per_request, n_iter, spans_ptr, floor,
                          HAS_LOGITS: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                          TASK_W: tl.constexpr, CONSTRAIN: tl.constexpr, LAST: tl.constexpr, DEFER: tl.constexpr,
                          MARKS: tl.constexpr, NODES: tl.constexpr, SPANS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # grid: (beam blocks of ROWS, column tasks of TASK_W slots); BLOCK_K <= TASK_W
    col_task = tl.program_id(1)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_beams
    q = tl.load(states_ptr + rows, mask=row_ok, other=-1)
    alive = q >= 0
    start = tl.load(offsets_ptr + q, mask=alive, other=0).to(tl.int64)
    end = tl.load(offsets_ptr + q + 1, mask=alive, other=0).to(tl.int64)
    # K is the longest segment; clamping keeps a too-small K from writing past the row
    seg = tl.minimum(end - start, K)
    cols = col_task * TASK_W + tl.arange(0, BLOCK_K)
    valid = cols[None, :] < seg[:, None]
    # the position of an entry in A is its successor state
    entry = start[:, None] + cols[None, :]
    tok = tl.load(tokens_ptr + entry, mask=valid, other=-1).to(tl.int32)
    succ = tl.where(valid, entry, -1)
    kept = valid
    if CONSTRAIN:
        kept, succ = _filter_lists(rows, row_ok, n_beams, succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr,
                                   list_mode_ptr, marks_ptr, mark_shift, nodes_ptr, node_off, node_stride,
                                   beams_per_request, n_iter, spans_ptr, floor, LAST, DEFER, MARKS, NODES, SPANS)
        tok = tl.where(kept, tok, -1)
    if HAS_LOGITS:
        lg = tl.load(logits_ptr + rows[:, None] * stride_lb + tok.to(tl.int64) * stride_lv,
                     mask=kept, other=float("-inf")).to(tl.float32)
    else:
        lg = tl.full([ROWS, BLOCK_K], float("-inf"), tl.float32)
    _store_slots(rows, row_ok, cols, K, col_task, valid, tok, succ, lg,
                 slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, tasks_ptr, n_col_tasks, TASK_W)
    tl.store(seg_len_ptr + rows, seg.to(tl.int32), mask=row_ok & (col_task == 0))


@triton.jit
def _filter_dense_kernel(states_ptr, table_ptr, logits_ptr,
                         slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, seg_len_ptr, tasks_ptr,
                         n_beams, K, n_col_tasks, stride_ds, stride_dv, stride_lb, stride_lv,
                         row_start_ptr, list_off_ptr, list_rows_ptr, list_mode_ptr, marks_ptr, mark_shift,
                         nodes_ptr, node_off, node_stride, beams_per_request, n_iter, spans_ptr, floor,
                         HAS_LOGITS: tl.constexpr, ATOMIC_LEN: tl.constexpr, ROWS: tl.constexpr,
                         BLOCK_K: tl.constexpr, TASK_W: tl.constexpr, CONSTRAIN: tl.constexpr, LAST: tl.constexpr,
                         DEFER: tl.constexpr, MARKS: tl.constexpr, NODES: tl.constexpr, SPANS: tl.constexpr,
                         PDL: tl.constexpr):
    pdl_prologue(PDL)
    # grid: (beam blocks of ROWS, column tasks of TASK_W slots); slot k <-> token k
    col_task = tl.program_id(1)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_beams
    q = tl.load(states_ptr + rows, mask=row_ok, other=-1)
    cols = col_task * TASK_W + tl.arange(0, BLOCK_K)
    live = (q >= 0)[:, None] & (cols < K)[None, :]
    succ = tl.load(table_ptr + q[:, None] * stride_ds + cols[None, :] * stride_dv,
                   mask=live, other=-1).to(tl.int64)
    valid = succ >= 0
    succ = tl.where(valid, succ, -1)
    kept = valid
    if CONSTRAIN:
        kept, succ = _filter_lists(rows, row_ok, n_beams, succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr,
                                   list_mode_ptr, marks_ptr, mark_shift, nodes_ptr, node_off, node_stride,
                                   beams_per_request, n_iter, spans_ptr, floor, LAST, DEFER, MARKS, NODES, SPANS)
    tok = tl.where(kept, cols[None, :], -1)
    if HAS_LOGITS:
        lg = tl.load(logits_ptr + rows[:, None] * stride_lb + cols[None, :] * stride_lv,
                     mask=kept, other=float("-inf")).to(tl.float32)
    else:
        lg = tl.full([ROWS, BLOCK_K], float("-inf"), tl.float32)
    count = _store_slots(rows, row_ok, cols, K, col_task, valid, tok, succ, lg,
                         slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, tasks_ptr, n_col_tasks, TASK_W)
    # a row spans several column programs: their counts meet in a zeroed seg_len
    if ATOMIC_LEN:
        tl.atomic_add(seg_len_ptr + rows, count, mask=row_ok)
    else:
        tl.store(seg_len_ptr + rows, count, mask=row_ok)


LIST_FILTER_PDL = True
"""Whether a filter that applies lists launches with PDL where PDL is on (a switch for A/B runs:
``runs/probe_constrained_pdl.py``)."""


def filter_slots_triton(states: torch.Tensor, K: int, *, tokens: torch.Tensor | None = None,
                        offsets: torch.Tensor | None = None, table: torch.Tensor | None = None,
                        logits: torch.Tensor | None = None, out=None,
                        constraint: SlotLists | None = None) -> FilterOut:
    """Triton launcher of :func:`filter_slots` (same signature and outputs)."""
    res = _prepare(states, K, tokens, offsets, table, logits, out)
    n_beams = states.shape[0]
    if constraint is not None:
        constraint.check(res.slot_tokens, res.slot_succ, res.slot_logits)
    if n_beams == 0:
        return res
    if constraint is None:
        lists = (states,) * 5 + (0, states, 0, 0, 1, 0, states, 1)
        flags = {"LAST": False, "DEFER": False, "MARKS": False, "NODES": False, "SPANS": False}
    else:
        lists, flags = constraint.launch_args(), constraint.launch_flags()
    n_col = cdiv(K, TASK_WIDTH)
    block_k = min(TASK_WIDTH, next_pow2(K))
    rows = min(next_pow2(n_beams), max(1, 512 // block_k))
    grid = (cdiv(n_beams, rows), n_col)
    has_logits = logits is not None
    lg = logits if has_logits else res.slot_logits
    lg_strides = (logits.stride(0), logits.stride(1)) if has_logits else (0, 0)
    # after a band GEMM (logits given) the launch stays serialised: with PDL here the GEMM's
    # step took a fifth longer on the H200 (step 2, FP16 batch 32: 118 -> 142 µs,
    # runs/results/pdl-ab/), most likely because cuBLAS's Hopper kernels let dependents start
    # early and this kernel's waiting blocks then hold SM slots
    pdl = pdl_args(states.device) if logits is None and (constraint is None or LIST_FILTER_PDL) else {"PDL": False}
    if table is None:
        _filter_sparse_kernel[grid](
            states, tokens, offsets, lg, res.slot_tokens, res.slot_succ, res.slot_logits,
            res.seg_len, res.tasks, n_beams, K, n_col, *lg_strides, *lists,
            HAS_LOGITS=has_logits, ROWS=rows, BLOCK_K=block_k, TASK_W=TASK_WIDTH,
            CONSTRAIN=constraint is not None, **flags, num_warps=4, **pdl)
    else:
        atomic = n_col > 1
        if atomic:
            res.seg_len.zero_()
        _filter_dense_kernel[grid](
            states, table, lg, res.slot_tokens, res.slot_succ, res.slot_logits,
            res.seg_len, res.tasks, n_beams, K, n_col, table.stride(0), table.stride(1), *lg_strides, *lists,
            HAS_LOGITS=has_logits, ATOMIC_LEN=atomic, ROWS=rows, BLOCK_K=block_k,
            TASK_W=TASK_WIDTH, CONSTRAIN=constraint is not None, **flags, num_warps=4, **pdl)
    return res


def filter_slots_reference(states: torch.Tensor, K: int, *, tokens: torch.Tensor | None = None,
                           offsets: torch.Tensor | None = None, table: torch.Tensor | None = None,
                           logits: torch.Tensor | None = None, out=None,
                           constraint: SlotLists | None = None) -> FilterOut:
    """Pure-PyTorch reference of :func:`filter_slots` (same signature and outputs): the
    slots, then ``constraint`` applied to them as :func:`~zerogr_kernels.constraints.constrain_slots`
    does."""
    res = _prepare(states, K, tokens, offsets, table, logits, out)
    if constraint is not None:
        constraint.check(res.slot_tokens, res.slot_succ, res.slot_logits)
    n_beams = states.shape[0]
    device = states.device
    alive = states >= 0
    q = torch.where(alive, states, 0)
    cols = torch.arange(K, device=device)
    if table is None:
        start = offsets.long()[q]
        seg = torch.where(alive, (offsets.long()[q + 1] - start).clamp(max=K), 0)
        valid = cols[None, :] < seg[:, None]
        entry = start[:, None] + cols[None, :]
        tok = torch.full((n_beams, K), -1, dtype=torch.int32, device=device)
        tok[valid] = tokens[entry[valid]].int()
        succ = torch.where(valid, entry, -1)
    else:
        succ = torch.where(alive[:, None], table[q].long(), -1)
        valid = succ >= 0
        succ = torch.where(valid, succ, -1)
        tok = torch.where(valid, cols[None, :], -1).int()
    lg = torch.full((n_beams, K), float("-inf"), dtype=torch.float32, device=device)
    if logits is not None:
        beam, slot = valid.nonzero(as_tuple=True)
        lg[beam, slot] = logits[beam, tok[beam, slot].long()].float()
    n_col = cdiv(K, TASK_WIDTH)
    padded = torch.nn.functional.pad(valid, (0, n_col * TASK_WIDTH - K))
    count = padded.view(n_beams, n_col, TASK_WIDTH).sum(-1)
    tasks = torch.stack([
        torch.arange(n_beams, device=device)[:, None].expand(n_beams, n_col),
        (torch.arange(n_col, device=device) * TASK_WIDTH)[None, :].expand(n_beams, n_col),
        count,
    ], dim=-1).reshape(-1, 3)
    for dst, src in zip(res, (tok, succ, lg, valid.sum(1), tasks)):
        dst.copy_(src)
    if constraint is not None and n_beams:
        constraint.apply_reference(res.slot_tokens, res.slot_succ, res.slot_logits)
    return res


def filter_slots(states: torch.Tensor, K: int, *, tokens: torch.Tensor | None = None,
                 offsets: torch.Tensor | None = None, table: torch.Tensor | None = None,
                 logits: torch.Tensor | None = None, out=None,
                 constraint: SlotLists | None = None) -> FilterOut:
    """Expand each beam's valid next tokens into its slot row and build the work queue.

    Pass either a sparse mapping (``tokens``, ``offsets``) or a dense one (``table``).
    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation on the Triton path.

    Parameters
    ----------
    states : torch.Tensor
        ``(n_beams,)`` int64 state of each beam (a row of the mapping), -1 for a dead
        or padded beam. States must lie in ``[0, S)``; the Triton path cannot check it.
    K : int
        Slot row width: the longest segment of the step (sparse; longer segments are
        truncated to ``K``) or the codebook size ``V`` (dense).
    tokens : torch.Tensor, optional
        ``(E,)`` int8, int16 or int32 local token ids, segment by segment (sparse A).
    offsets : torch.Tensor, optional
        ``(S + 1,)`` int32 or int64 segment offsets (sparse R); state ``q`` owns
        ``tokens[offsets[q]:offsets[q + 1]]`` and entry position ``e`` is its successor.
    table : torch.Tensor, optional
        ``(S, V)`` int32 or int64 successor table (dense D, any strides); a cell
        ``< 0`` marks an invalid token.
    logits : torch.Tensor, optional
        ``(n_beams, V)`` float16, bfloat16 or float32 full-projection logits (any
        strides, e.g. a view); the logit of each valid token is copied into its slot.
        For sparse mappings every token id must be ``< V``.
    out : tuple of torch.Tensor, optional
        Preallocated contiguous outputs in :class:`FilterOut` order; all are overwritten.
    constraint : SlotLists, optional
        Per-request lists (:class:`zerogr_kernels.constraints.SlotLists`) applied while the
        slots are filled: the outputs equal this call without them followed by
        :func:`~zerogr_kernels.constraints.constrain_slots` with the same lists (a killed slot
        gets token -1, successor -1 and logit -inf; ``seg_len`` and the work queue still count
        it, as consumers mask by ``slot_tokens >= 0``), in one launch and one pass over the slots.
        With ``constraint.defer``, the slots of catalog-normalised requests that only their own
        list kills keep their token and logit, their successor ``s`` stored as ``-2 - s``, for
        :func:`~zerogr_kernels.topk_gather` with ``deferred`` after projection.

    Returns
    -------
    FilterOut
        ``(slot_tokens, slot_succ, slot_logits, seg_len, tasks)``; see
        :class:`FilterOut` and the module docstring for the work-queue format.
    """
    fn = filter_slots_triton if use_triton(states) else filter_slots_reference
    return fn(states, K, tokens=tokens, offsets=offsets, table=table, logits=logits, out=out, constraint=constraint)
