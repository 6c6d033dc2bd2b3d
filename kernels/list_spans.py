"""A bound on the longest run of consecutive rows in every list segment, which lets the
constraint kernels skip the slots of prefixes no deny list can empty.

A deny list kills a prefix only when it lists every row of the prefix's range, and the
rows of a range are consecutive. So a list whose longest run of consecutive rows
(``v, v + 1, …``) is ``s`` empties no prefix of more than ``s`` rows: the filters of the
early steps, whose prefixes hold hundreds or thousands of rows, need no search and no
bitmap load for such a list (:class:`~zerogr_kernels.constraints.SlotLists`' ``spans``).
Random deny lists have runs of one row; a user's history, whose items cluster, has
short ones.

:func:`list_spans` writes ``min(1 + j, n)`` per segment, ``n`` its rows and ``j`` those
that continue a run (the row before is one less): at least the longest run, and equal to
it when the segment holds one run at most. It runs inside the captured graph beside the
first step, a lane per used row of the buffer (as the row bitmap's marking), each finding
its segment in the offsets, and reads the used length from the offsets on the device.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_tensor, pdl_args, pdl_prologue, use_triton

SPAN_BLOCK = 1024
"""Listed rows per program of :func:`list_spans`."""


def longest_run(rows: torch.Tensor) -> int:
    """The most consecutive values (``v, v + 1, …``) in sorted, distinct ``rows`` (0 when empty)."""
    if rows.numel() == 0:
        return 0
    opens = torch.ones(rows.numel(), dtype=torch.bool, device=rows.device)
    opens[1:] = rows[1:] != rows[:-1] + 1
    starts = torch.nonzero(opens).flatten()
    return int(torch.diff(starts, append=starts.new_tensor([rows.numel()])).max())


def run_bound(rows: torch.Tensor) -> int:
    """:func:`list_spans`' value for sorted, distinct ``rows``: one more than the rows that
    continue a run, at most the rows (0 when empty)."""
    return min(int((rows[1:] == rows[:-1] + 1).sum()) + 1, rows.numel())


@triton.jit
def _spans_kernel(list_off_ptr, list_rows_ptr, spans_ptr, n_segments, BLOCK: tl.constexpr,
                  HALVINGS: tl.constexpr, PDL: tl.constexpr):
    # Each used row adds 1 to its segment's count when it opens the segment or continues a run,
    # so a zeroed count ends as min(1 + j, n). A block whose rows lie in one segment (all but
    # those that straddle a boundary) adds its sum with one atomic, so a long list costs what
    # marking it does.
    pdl_prologue(PDL)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    used = (idx >= tl.load(list_off_ptr)) & (idx < tl.load(list_off_ptr + n_segments))
    # the segment of each row: the last offset at or before it (empty segments share their offset
    # with the next, which the search passes)
    lo = tl.zeros_like(idx)
    hi = tl.zeros_like(idx) + n_segments - 1
    for _ in tl.static_range(HALVINGS):
        mid = (lo + hi + 1) // 2
        right = tl.load(list_off_ptr + mid, mask=used, other=0) <= idx
        lo = tl.where(right, mid, lo)
        hi = tl.where(right, hi, mid - 1)
    opens = idx == tl.load(list_off_ptr + lo, mask=used, other=-1)
    row = tl.load(list_rows_ptr + idx, mask=used, other=0)
    prev = tl.load(list_rows_ptr + idx - 1, mask=used & ~opens, other=0)
    adds = used & (opens | (row == prev + 1))
    first = tl.min(tl.where(used, lo, n_segments), axis=0)
    if first == tl.max(tl.where(used, lo, -1), axis=0):
        tl.atomic_add(spans_ptr + first, tl.sum(adds.to(tl.int64), axis=0))
    else:
        tl.atomic_add(spans_ptr + lo, tl.zeros_like(idx) + 1, mask=adds)


def _check(list_offsets, list_rows, spans) -> None:
    check_tensor("list_offsets", list_offsets, dtypes=(torch.int64,), ndim=1, contiguous=True)
    dev = list_offsets.device
    check_tensor("list_rows", list_rows, dtypes=(torch.int64,), ndim=1, device=dev, contiguous=True)
    check_tensor("spans", spans, dtypes=(torch.int64,), ndim=1, device=dev, shape=(list_offsets.numel() - 1,),
                 contiguous=True)


def list_spans_triton(list_offsets: torch.Tensor, list_rows: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """Triton implementation of :func:`list_spans` (no host sync: the segments are read on the device)."""
    _check(list_offsets, list_rows, spans)
    spans.zero_()
    if spans.numel() and list_rows.numel():
        n = spans.numel()
        _spans_kernel[(triton.cdiv(list_rows.numel(), SPAN_BLOCK),)](
            list_offsets, list_rows, spans, n, BLOCK=SPAN_BLOCK, HALVINGS=max(n - 1, 1).bit_length(),
            num_warps=4, **pdl_args(spans.device))
    return spans


def list_spans_reference(list_offsets: torch.Tensor, list_rows: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    """PyTorch reference of :func:`list_spans` (same signature and output)."""
    _check(list_offsets, list_rows, spans)
    sizes = list_offsets[1:] - list_offsets[:-1]
    rows = list_rows[int(list_offsets[0]):int(list_offsets[-1])]
    segment = torch.repeat_interleave(torch.arange(spans.numel(), device=spans.device), sizes,
                                      output_size=rows.numel())
    joins = (rows[1:] == rows[:-1] + 1) & (segment[1:] == segment[:-1])
    counts = torch.bincount(segment[1:][joins], minlength=spans.numel())
    spans.copy_(torch.minimum(counts + 1, sizes))  # run_bound of every segment at once
    return spans


def list_spans(list_offsets: torch.Tensor, list_rows: torch.Tensor, spans: torch.Tensor) -> torch.Tensor:
    fn = list_spans_triton if use_triton(spans) else list_spans_reference
    return fn(list_offsets, list_rows, spans)


list_spans.__doc__ = """Each list segment's bound on its longest run of consecutive rows (module docstring).

    Parameters
    ----------
    list_offsets : torch.Tensor
        ``(batch + 2,)`` int64 CSR offsets, as for :func:`~zerogr_kernels.constraints.constrain_slots`
        (segment 0 the global list, segment ``r + 1`` request ``r``'s).
    list_rows : torch.Tensor
        ``(capacity,)`` int64, sorted and duplicate-free within each segment.
    spans : torch.Tensor
        ``(batch + 1,)`` int64 output, overwritten: entry ``s`` bounds segment ``s``'s longest
        run (0 for an empty segment).

    Returns
    -------
    torch.Tensor
        ``spans``.
    """
