"""Per-call deny lists from raw item ids, turned into sorted catalog rows inside the decode.

A deny-only call ships each request's ids as they came, back to back (request ``r``'s are
``ids[id_offsets[r]:id_offsets[r + 1]]``, at most ``width`` of them), and nothing else: the
id → row lookup, the sort and the removal of repeats, which the host would otherwise do
before the decode could start, run here as the first kernel of the captured graph, one
program per request. Request ``r``'s rows go to ``rows[offsets[r + 1]:offsets[r + 1] + width]``: its distinct catalog rows in ascending order,
then ``n_rows`` (one past the last row) in every place left over, ids that are not in the
catalog included. :func:`zerogr_kernels.constraints.constrain_slots` reads such a segment as
it is: ``n_rows`` lies in no prefix's row range, so it is never counted nor found, and a
lower-bound search in a sorted segment stops before it.

The lookup is the catalog's dense table (``table[id - base]`` is the row of ``id``, -1 where
the table has a hole); ids outside the table are misses too.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import check_tensor, pdl_args, pdl_prologue, use_triton
from .row_marks import _check_marks, mark_rows, marks_of_rows

MAX_WIDTH = 2048
"""Widest padded id row (ids per request, a power of two) one program sorts in registers;
wider ones go through :func:`deny_rows_sorted`."""
MAX_IDS = 65_536
"""Most ids per request :func:`deny_rows` takes (its width, a power of two, at most this)."""


@triton.jit
def _deny_rows_kernel(ids_ptr, id_off_ptr, table_ptr, table_size, base, rows_ptr, offsets_ptr, n_rows,
                      marks_ptr, mark_shift, n_words, W: tl.constexpr, MARKS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, W)
    first = tl.load(id_off_ptr + r)
    given = k < tl.load(id_off_ptr + r + 1) - first
    pos = tl.load(ids_ptr + first + k, mask=given, other=0) - base
    inside = given & (pos >= 0) & (pos < table_size)
    row = tl.load(table_ptr + pos, mask=inside, other=-1).to(tl.int64)
    row = tl.sort(tl.where(row >= 0, row, n_rows))
    out = rows_ptr + tl.load(offsets_ptr + r + 1)
    tl.store(out + k, row)
    tl.debug_barrier()  # the sorted row is read back, shifted by one, across the program's threads
    prev = tl.load(out + k - 1, mask=k > 0, other=-1)
    keep = (row != prev) & (row < n_rows)
    place = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    n_keep = tl.sum(keep.to(tl.int32), axis=0)
    tl.debug_barrier()  # every thread has read before any overwrites
    tl.store(out + place, row, mask=keep)
    tl.store(out + k, tl.zeros_like(row) + n_rows, mask=k >= n_keep)
    if MARKS:  # the row bitmap (kernels.row_marks) of what this program wrote, without a launch of its own:
        # its kept rows, and the padding where mark_rows would mark it (inside the last word)
        g = tl.where(keep, row, n_rows) >> mark_shift
        bit = (tl.zeros_like(g) + 1) << (g & 31)
        tl.atomic_or(marks_ptr + (g >> 5), bit.to(tl.uint32).to(tl.int32, bitcast=True),
                     mask=(keep | (k >= n_keep)) & ((g >> 5) < n_words))


def _check(ids, id_offsets, width, table, rows, offsets, marks=None, mark_shift=0) -> None:
    check_tensor("rows", rows, dtypes=(torch.int64,), ndim=1, contiguous=True)
    dev = rows.device
    # the ids may stay in pinned host memory, which a GPU kernel reads in place
    host = dev.type == "cuda" and ids.device.type == "cpu" and ids.is_pinned() and id_offsets.is_pinned()
    src = ids.device if host else dev
    check_tensor("ids", ids, dtypes=(torch.int64,), ndim=1, device=src, contiguous=True)
    if not isinstance(width, int) or width < 1 or width & (width - 1) or width > MAX_IDS:
        raise ValueError(f"width must be a power of two at most {MAX_IDS}, got {width!r}")
    check_tensor("id_offsets", id_offsets, dtypes=(torch.int64,), ndim=1, device=src, contiguous=True)
    batch = id_offsets.shape[0] - 1
    check_tensor("table", table, dtypes=(torch.int32, torch.int64), ndim=1, device=dev, contiguous=True)
    check_tensor("offsets", offsets, dtypes=(torch.int64,), ndim=1, device=dev, shape=(batch + 2,),
                 contiguous=True)
    _check_marks(marks, mark_shift, dev)


def deny_rows_triton(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
                     rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
                     mark_shift: int = 0) -> torch.Tensor:
    """Triton implementation of :func:`deny_rows` (one launch, and a fill of ``marks``; no host
    synchronisation), up to :data:`MAX_WIDTH`."""
    _check(ids, id_offsets, width, table, rows, offsets, marks, mark_shift)
    if width > MAX_WIDTH:
        raise ValueError(f"width must be at most {MAX_WIDTH} for the Triton kernel, got {width}")
    batch = id_offsets.shape[0] - 1
    if marks is not None:
        marks.zero_()
    if batch:
        _deny_rows_kernel[(batch,)](ids, id_offsets, table, table.numel(), int(base), rows, offsets, int(n_rows),
                                    rows if marks is None else marks, int(mark_shift),
                                    0 if marks is None else marks.numel(), W=width, MARKS=marks is not None,
                                    num_warps=4, **pdl_args(rows.device))
    return rows


def deny_rows_reference(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
                        rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
                        mark_shift: int = 0) -> torch.Tensor:
    """PyTorch reference of :func:`deny_rows` (same signature and output)."""
    _check(ids, id_offsets, width, table, rows, offsets, marks, mark_shift)
    ids, id_offsets = ids.to(rows.device), id_offsets.to(rows.device)
    for r in range(id_offsets.shape[0] - 1):
        first = int(id_offsets[r])
        pos = ids[first:first + min(int(id_offsets[r + 1]) - first, width)] - int(base)
        pos = pos[(pos >= 0) & (pos < table.numel())]
        found = table[pos].to(torch.int64)
        found = torch.unique(found[found >= 0])  # sorted
        start = int(offsets[r + 1])
        rows[start:start + width] = n_rows
        rows[start:start + found.numel()] = found
    if marks is not None:
        marks_of_rows(rows[int(offsets[0]):int(offsets[-1])], marks, mark_shift)
    return rows


def deny_rows_sorted(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
                     rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
                     mark_shift: int = 0) -> torch.Tensor:
    """:func:`deny_rows` in whole-batch torch operations (a padded ``(batch, width)`` matrix
    sorted along its rows, in int32 below 2^31 rows, then each row's distinct rows moved to its
    front by a stable partition): no host synchronisation, so a CUDA graph can hold it; what
    widths past :data:`MAX_WIDTH` run."""
    _check(ids, id_offsets, width, table, rows, offsets, marks, mark_shift)
    if ids.device != rows.device:
        raise ValueError("deny_rows_sorted needs the ids on the rows' device")
    batch = id_offsets.shape[0] - 1
    if not batch or not ids.numel():
        return deny_rows_reference(ids, id_offsets, width, table, base, rows, offsets, n_rows, marks, mark_shift)
    k = torch.arange(width, device=ids.device)
    first = id_offsets[:-1, None]
    given = k < (id_offsets[1:, None] - first)
    pos = ids[(first + k).clamp_(max=ids.numel() - 1)] - base
    inside = given & (pos >= 0) & (pos < table.numel())
    row = table[pos.clamp_(0, table.numel() - 1)]
    # a radix sort's passes follow the key's width
    row = row.to(torch.int32 if n_rows < 2**31 - 1 else torch.int64)
    row = torch.where(inside & (row >= 0), row, n_rows).sort(dim=1).values
    keep = row < n_rows
    keep[:, 1:] &= row[:, 1:] != row[:, :-1]
    kept = keep.cumsum(dim=1)
    # kept rows to the front in order, the rest (n_rows once written) behind them
    place = torch.where(keep, kept - 1, kept[:, -1:] + (k + 1 - kept) - 1)
    row = torch.where(keep, row, n_rows).long()
    rows.scatter_(0, (offsets[1:batch + 1, None] + place).flatten(), row.flatten())
    if marks is not None:
        mark_rows(offsets, rows, marks, mark_shift)
    return rows


def deny_rows(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
              rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
              mark_shift: int = 0) -> torch.Tensor:
    if width > MAX_WIDTH:
        fn = deny_rows_sorted
    else:
        fn = deny_rows_triton if use_triton(rows) else deny_rows_reference
    return fn(ids, id_offsets, width, table, base, rows, offsets, n_rows, marks, mark_shift)


deny_rows.__doc__ = """Each request's deny ids as its sorted, distinct catalog rows, padded with ``n_rows``.

    Parameters
    ----------
    ids : torch.Tensor
        ``(n,)`` int64 item ids; request ``r`` lists ``ids[id_offsets[r]:id_offsets[r + 1]]``
        (in any order, repeats and unknown ids allowed). Up to :data:`MAX_WIDTH`, ``ids`` and
        ``id_offsets`` may be pinned host tensors beside CUDA ``rows``: the kernel reads them
        in place, so no copy is needed (nor captured) before it.
    id_offsets : torch.Tensor
        ``(batch + 1,)`` int64, non-decreasing, each request's count at most ``width``.
    width : int
        A power of two, at most :data:`MAX_IDS`: the rows each request's output holds. Past
        :data:`MAX_WIDTH` the op runs as :func:`deny_rows_sorted`.
    table : torch.Tensor
        ``(T,)`` int32 or int64: the row of id ``v`` is ``table[v - base]`` (-1: not in the catalog).
    base : int
        The smallest id of the table.
    rows : torch.Tensor
        ``(capacity,)`` int64 output; request ``r``'s ``width`` entries start at ``offsets[r + 1]``.
    offsets : torch.Tensor
        ``(batch + 2,)`` int64, as :func:`~zerogr_kernels.constraints.constrain_slots` takes them
        (entry 0 starts the global segment, which this op leaves alone).
    n_rows : int
        The catalog's rows: the padding value, past every real row.
    marks : torch.Tensor, optional
        ``(mark_words(n_rows),)`` int32, overwritten with the bitmap of
        ``rows[offsets[0]:offsets[-1]]`` after the op (:func:`~zerogr_kernels.row_marks.mark_rows`),
        set by the same launch up to :data:`MAX_WIDTH`. The kernel marks the rows it writes, so
        ``offsets`` must then lay the requests' outputs back to back, ``width`` apart, after an
        empty global segment (as the engine's deny-id buffers do).
    mark_shift : int
        log2 of the rows per bit of ``marks``.

    Returns
    -------
    torch.Tensor
        ``rows``.
    """
