"""Per-call deny lists from raw item ids, turned into sorted catalog rows inside the decode.

A deny-only call ships each request's ids as they came, back to back (request ``r``'s are
``ids[id_offsets[r]:id_offsets[r + 1]]``, at most ``width`` of them), and nothing else: the
id → row lookup, the sort and the removal of repeats, which the host would otherwise do
before the decode could start, run here as the first kernel of the captured graph, one
program per request (past :data:`MAX_WIDTH` ids, as a lookup kernel, torch's sort and two
compaction kernels). Request ``r``'s rows go to ``rows[offsets[r + 1]:offsets[r + 1] + width]``: its distinct catalog rows in ascending order,
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
from .list_spans import longest_run, run_bound
from .row_marks import _check_marks, marks_of_rows

MAX_WIDTH = 1024
"""Widest padded id row (ids per request, a power of two) one program sorts in registers;
wider ones are sorted by torch between a lookup launch and two compaction launches (faster
from 2,048 ids: 36 against 47 µs on the H200, ``runs/results/constraints/wide-sort/``)."""
WIDE_BLOCK = 1024
"""Ids a program of the wide path's launches handles at once (its tile)."""
MAX_IDS = 65_536
"""Most ids per request :func:`deny_rows` takes (its width, a power of two, at most this)."""
IN_PLACE_WIDTH = MAX_IDS
"""Widest id row the engine leaves in pinned host memory for the first kernel to read in
place; wider rows would cross in one copy first. Every width is read in place: at 10,000 ids
per request the in-place reads beat the copy at batch 1, 8 and 32 (0.88 / 0.93 / 0.95 of the
copied call on an H100, ``runs/results/constraints/session-2026-12-06g/``)."""


@triton.jit
def _keys(ids_ptr, id_off_ptr, table_ptr, table_size, base, r, k, n_rows, KEY32: tl.constexpr):
    """Request r's lanes k as catalog rows (``n_rows`` for misses and the padding past its ids),
    int32 below 2^31 rows: half the registers and bytes of the sort that follows."""
    first = tl.load(id_off_ptr + r)
    given = k < tl.load(id_off_ptr + r + 1) - first
    pos = tl.load(ids_ptr + first + k, mask=given, other=0) - base
    inside = given & (pos >= 0) & (pos < table_size)
    row = tl.load(table_ptr + pos, mask=inside, other=-1)
    if KEY32:
        row = row.to(tl.int32)
    else:
        row = row.to(tl.int64)
    return tl.where(row >= 0, row, n_rows)


@triton.jit
def _mark(row, on, marks_ptr, mark_shift, n_words):
    """Set the bits of rows ``row`` where ``on`` in the row bitmap (kernels.row_marks)."""
    g = row.to(tl.int64) >> mark_shift
    bit = (tl.zeros_like(g) + 1) << (g & 31)
    tl.atomic_or(marks_ptr + (g >> 5), bit.to(tl.uint32).to(tl.int32, bitcast=True), mask=on & ((g >> 5) < n_words))


@triton.jit
def _later(a, b):
    return tl.maximum(a, b)


@triton.jit
def _deny_rows_kernel(ids_ptr, id_off_ptr, table_ptr, table_size, base, rows_ptr, offsets_ptr, n_rows,
                      marks_ptr, mark_shift, n_words, spans_ptr, W: tl.constexpr, KEY32: tl.constexpr,
                      MARKS: tl.constexpr, SPANS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    k = tl.arange(0, W)
    row = tl.sort(_keys(ids_ptr, id_off_ptr, table_ptr, table_size, base, r, k, n_rows, KEY32))
    out = rows_ptr + tl.load(offsets_ptr + r + 1)
    tl.store(out + k, row.to(tl.int64))
    tl.debug_barrier()  # the sorted row is read back, shifted by one, across the program's threads
    prev = tl.load(out + k - 1, mask=k > 0, other=-1).to(row.dtype)
    keep = (row != prev) & (row < n_rows)
    place = tl.cumsum(keep.to(tl.int32), axis=0) - 1
    n_keep = tl.sum(keep.to(tl.int32), axis=0)
    if SPANS:  # the longest run of consecutive rows: a kept row whose predecessor is kept too continues one
        opens = keep & ((k == 0) | (prev != row - 1))
        first = tl.associative_scan(tl.where(opens, place, 0), 0, _later)
        tl.store(spans_ptr + r, tl.max(tl.where(keep, place - first + 1, 0), axis=0).to(tl.int64))
    tl.debug_barrier()  # every thread has read before any overwrites
    tl.store(out + place, row.to(tl.int64), mask=keep)
    tl.store(out + k, tl.zeros_like(row).to(tl.int64) + n_rows, mask=k >= n_keep)
    if MARKS:  # the row bitmap of what this program wrote, without a launch of its own: its kept
        # rows, and the padding once, where mark_rows would mark it (inside the last word)
        _mark(tl.where(keep, row, n_rows), keep | (k == n_keep), marks_ptr, mark_shift, n_words)


@triton.jit
def _deny_keys_kernel(ids_ptr, id_off_ptr, table_ptr, table_size, base, keys_ptr, n_rows,
                      W: tl.constexpr, BLOCK: tl.constexpr, KEY32: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r = tl.program_id(0).to(tl.int64)
    k = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    tl.store(keys_ptr + r * W + k, _keys(ids_ptr, id_off_ptr, table_ptr, table_size, base, r, k, n_rows, KEY32))


@triton.jit
def _distinct(src, k, n_rows):
    """Sorted keys ``src[k]``, whether each is a row (not ``n_rows``) unlike the one before it, and
    whether such a row is one past that one (it continues a run of consecutive rows)."""
    row = tl.load(src + k)
    prev = tl.load(src + k - 1, mask=k > 0, other=-1)
    keep = (row != prev) & (row < n_rows)
    return row, keep, keep & (k > 0) & (prev == row - 1)


@triton.jit
def _deny_count_kernel(keys_ptr, counts_ptr, n_rows, batch, W: tl.constexpr, BLOCK: tl.constexpr,
                       PDL: tl.constexpr):
    pdl_prologue(PDL)
    r, b = tl.program_id(0).to(tl.int64), tl.program_id(1)
    _, keep, joins = _distinct(keys_ptr + r * W, b * BLOCK + tl.arange(0, BLOCK), n_rows)
    tl.store(counts_ptr + r * (W // BLOCK) + b, tl.sum(keep.to(tl.int32), axis=0))
    # second plane: the rows that continue a run, whose count bounds the longest run
    tl.store(counts_ptr + (batch + r) * (W // BLOCK) + b, tl.sum(joins.to(tl.int32), axis=0))


@triton.jit
def _deny_distinct_kernel(keys_ptr, counts_ptr, rows_ptr, offsets_ptr, n_rows, batch, marks_ptr, mark_shift,
                          n_words, spans_ptr, W: tl.constexpr, BLOCK: tl.constexpr, NB: tl.constexpr,
                          MARKS: tl.constexpr, SPANS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    r, b = tl.program_id(0).to(tl.int64), tl.program_id(1)
    c = tl.arange(0, NB)
    counts = tl.load(counts_ptr + r * (W // BLOCK) + c, mask=c < W // BLOCK, other=0)
    before, n_keep = tl.sum(tl.where(c < b, counts, 0), axis=0), tl.sum(counts, axis=0)
    if SPANS:
        if b == 0:  # no run is longer than one row plus every row that continues a run
            joins = tl.load(counts_ptr + (batch + r) * (W // BLOCK) + c, mask=c < W // BLOCK, other=0)
            tl.store(spans_ptr + r, tl.minimum(tl.sum(joins, axis=0) + 1, n_keep).to(tl.int64))
    k = b * BLOCK + tl.arange(0, BLOCK)
    row, keep, _ = _distinct(keys_ptr + r * W, k, n_rows)
    out = rows_ptr + tl.load(offsets_ptr + r + 1)
    tl.store(out + before + tl.cumsum(keep.to(tl.int32), axis=0) - 1, row.to(tl.int64), mask=keep)
    tl.store(out + k, tl.zeros_like(k).to(tl.int64) + n_rows, mask=k >= n_keep)
    if MARKS:  # the block's rows, and the padding once, where mark_rows would mark it (inside the last word)
        _mark(tl.where(keep, row, n_rows), keep | (k == n_keep), marks_ptr, mark_shift, n_words)


def _check(ids, id_offsets, width, table, rows, offsets, marks=None, mark_shift=0, spans=None) -> None:
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
    if spans is not None:
        check_tensor("spans", spans, dtypes=(torch.int64,), ndim=1, device=dev, shape=(batch,), contiguous=True)


def deny_rows_triton(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
                     rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
                     mark_shift: int = 0, spans: torch.Tensor | None = None) -> torch.Tensor:
    """Triton implementation of :func:`deny_rows`, with no host synchronisation: up to
    :data:`MAX_WIDTH` one launch that sorts each request's rows in registers (and sets
    ``marks`` and the exact ``spans``); wider, a lookup launch, torch's sort of the
    ``(batch, width)`` keys along their rows, then blocks of :data:`WIDE_BLOCK` keys, each
    counting its distinct rows (and those that continue a run) in one launch and writing them
    after the blocks before it in a second (which sets ``marks``, and ``spans`` to one more than
    the rows that continue a run, at most the distinct rows: a bound, not the longest run)."""
    _check(ids, id_offsets, width, table, rows, offsets, marks, mark_shift, spans)
    batch = id_offsets.shape[0] - 1
    if marks is not None:
        marks.zero_()
    if not batch:
        return rows
    key32 = n_rows < 2**31 - 1
    mark_args = (rows if marks is None else marks, int(mark_shift), 0 if marks is None else marks.numel())
    span_args = {"SPANS": spans is not None}
    spans = rows if spans is None else spans
    pdl = pdl_args(rows.device)
    if width <= MAX_WIDTH:
        _deny_rows_kernel[(batch,)](ids, id_offsets, table, table.numel(), int(base), rows, offsets, int(n_rows),
                                    *mark_args, spans, W=width, KEY32=key32, MARKS=marks is not None,
                                    num_warps=4, **span_args, **pdl)
        return rows
    # one program's bitonic sort grows as width · log² width: 0.68 ms for 16,384 ids on the H200,
    # where the radix sort of the keys takes tens of µs (runs/results/constraints/wide-sort/)
    keys = torch.empty(batch, width, dtype=torch.int32 if key32 else torch.int64, device=rows.device)
    block = min(width, WIDE_BLOCK)
    _deny_keys_kernel[(batch, width // block)](ids, id_offsets, table, table.numel(), int(base), keys, int(n_rows),
                                               W=width, BLOCK=block, KEY32=key32, num_warps=4, **pdl)
    keys = keys.sort(dim=1).values
    # each block's distinct rows counted, then written after those of the blocks before it
    n_blocks = width // block
    counts = torch.empty(2 * batch, n_blocks, dtype=torch.int32, device=rows.device)
    _deny_count_kernel[(batch, n_blocks)](keys, counts, int(n_rows), batch, W=width, BLOCK=block, num_warps=4,
                                          **pdl)
    _deny_distinct_kernel[(batch, n_blocks)](keys, counts, rows, offsets, int(n_rows), batch, *mark_args, spans,
                                             W=width, BLOCK=block, NB=triton.next_power_of_2(n_blocks),
                                             MARKS=marks is not None, num_warps=4, **span_args, **pdl)
    return rows


def deny_rows_reference(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
                        rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
                        mark_shift: int = 0, spans: torch.Tensor | None = None) -> torch.Tensor:
    """PyTorch reference of :func:`deny_rows` (same signature and output)."""
    _check(ids, id_offsets, width, table, rows, offsets, marks, mark_shift, spans)
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
        if spans is not None:
            spans[r] = longest_run(found) if width <= MAX_WIDTH else run_bound(found)
    if marks is not None:
        marks_of_rows(rows[int(offsets[0]):int(offsets[-1])], marks, mark_shift)
    return rows


def deny_rows(ids: torch.Tensor, id_offsets: torch.Tensor, width: int, table: torch.Tensor, base: int,
              rows: torch.Tensor, offsets: torch.Tensor, n_rows: int, marks: torch.Tensor | None = None,
              mark_shift: int = 0, spans: torch.Tensor | None = None) -> torch.Tensor:
    fn = deny_rows_triton if use_triton(rows) else deny_rows_reference
    return fn(ids, id_offsets, width, table, base, rows, offsets, n_rows, marks, mark_shift, spans)


deny_rows.__doc__ = """Each request's deny ids as its sorted, distinct catalog rows, padded with ``n_rows``.

    Parameters
    ----------
    ids : torch.Tensor
        ``(n,)`` int64 item ids; request ``r`` lists ``ids[id_offsets[r]:id_offsets[r + 1]]``
        (in any order, repeats and unknown ids allowed). ``ids`` and ``id_offsets`` may be
        pinned host tensors beside CUDA ``rows``: the kernels read them in place, so no copy is
        needed (nor captured) before them (the engine does so up to :data:`IN_PLACE_WIDTH`).
    id_offsets : torch.Tensor
        ``(batch + 1,)`` int64, non-decreasing, each request's count at most ``width``.
    width : int
        A power of two, at most :data:`MAX_IDS`: the rows each request's output holds. Past
        :data:`MAX_WIDTH` the rows are sorted by torch between a lookup launch and two compaction launches.
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
        set by the launch that writes the rows. The kernels mark the rows they write, so
        ``offsets`` must then lay the requests' outputs back to back, ``width`` apart, after an
        empty global segment (as the engine's deny-id buffers do).
    mark_shift : int
        log2 of the rows per bit of ``marks``.
    spans : torch.Tensor, optional
        ``(batch,)`` int64, overwritten with a bound on each request's longest run of
        consecutive rows (0 for no row): exact up to :data:`MAX_WIDTH`
        (:func:`~zerogr_kernels.list_spans.longest_run`), past it one more than the rows that
        continue a run, at most the distinct rows (:func:`~zerogr_kernels.list_spans.run_bound`). A
        deny list empties no prefix of more rows than that, which the filters use to skip the
        slots of wider prefixes (:class:`~zerogr_kernels.constraints.SlotLists`' ``spans``).

    Returns
    -------
    torch.Tensor
        ``rows``.
    """
