"""The bitmap of a decode's listed rows, which lets the constraint kernels skip searches.

Bit ``g & 31`` of int32 word ``g >> 5`` is set when a row of granule ``g = row >> shift`` is
listed in any segment of the lists (the global deny list and every request's), laid out as
:func:`zerogr_kernels.constraints.constrain_slots` takes them. A granule is one row up to
:data:`MARK_GRANULES` rows and grows by powers of two past it, so the bitmap stays within
4 MiB for any catalog. The kernel reads the used length from the offsets on the device, so
marking is part of a captured graph and needs no host synchronisation.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, check_tensor, pdl_args, pdl_prologue, use_triton

MARK_GRANULES = 1 << 25
"""Most granules a row bitmap covers (4 MiB of bits): the granule grows by powers of two with
the catalog (:func:`mark_shift`)."""
MARK_BLOCK = 1024
"""Listed rows per program of :func:`mark_rows`."""


def mark_shift(n_rows: int) -> int:
    """log2 of the rows per granule of a bitmap over ``n_rows`` rows (at most :data:`MARK_GRANULES` granules)."""
    shift = 0
    while (max(int(n_rows), 1) - 1) >> shift >= MARK_GRANULES:
        shift += 1
    return shift


def mark_words(n_rows: int) -> int:
    """int32 words of the bitmap over ``n_rows`` rows (:func:`mark_rows`'s ``marks``)."""
    return cdiv(((max(int(n_rows), 1) - 1) >> mark_shift(n_rows)) + 1, 32)


def _check_marks(marks, shift, device) -> None:
    """The constraint kernels' optional ``marks`` / ``mark_shift`` arguments (``None``: no bitmap)."""
    if marks is None:
        return
    check_tensor("marks", marks, dtypes=(torch.int32,), ndim=1, device=device, contiguous=True)
    if not isinstance(shift, int) or not 0 <= shift < 63:
        raise ValueError(f"mark_shift must be an int in [0, 63), got {shift!r}")


@triton.jit
def _mark_kernel(list_off_ptr, list_rows_ptr, marks_ptr, n_segments, mark_shift, n_words, BLOCK: tl.constexpr,
                 PDL: tl.constexpr):
    pdl_prologue(PDL)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    used = (idx >= tl.load(list_off_ptr)) & (idx < tl.load(list_off_ptr + n_segments))
    g = tl.load(list_rows_ptr + idx, mask=used, other=0) >> mark_shift
    used = used & ((g >> 5) < n_words)  # padding past the last row (kernels.deny_ids) marks nothing
    bit = (tl.zeros_like(g) + 1) << (g & 31)
    tl.atomic_or(marks_ptr + (g >> 5), bit.to(tl.uint32).to(tl.int32, bitcast=True), mask=used)


def _check_mark_args(list_offsets, list_rows, marks, shift) -> None:
    check_tensor("list_offsets", list_offsets, dtypes=(torch.int64,), ndim=1, contiguous=True)
    dev = list_offsets.device
    check_tensor("list_rows", list_rows, dtypes=(torch.int64,), ndim=1, device=dev, contiguous=True)
    if marks is None:
        raise ValueError("marks must be an int32 tensor of mark_words(n_rows) words")
    _check_marks(marks, shift, dev)


def mark_rows_triton(list_offsets: torch.Tensor, list_rows: torch.Tensor, marks: torch.Tensor,
                     mark_shift: int) -> torch.Tensor:
    """Triton implementation of :func:`mark_rows` (no host sync: the used length is read on the device)."""
    _check_mark_args(list_offsets, list_rows, marks, mark_shift)
    marks.zero_()
    if list_rows.numel():
        _mark_kernel[(cdiv(list_rows.numel(), MARK_BLOCK),)](
            list_offsets, list_rows, marks, list_offsets.numel() - 1, mark_shift, marks.numel(), BLOCK=MARK_BLOCK,
            **pdl_args(list_rows.device))
    return marks


def mark_rows_reference(list_offsets: torch.Tensor, list_rows: torch.Tensor, marks: torch.Tensor,
                        mark_shift: int) -> torch.Tensor:
    """PyTorch reference of :func:`mark_rows` (same signature and output)."""
    _check_mark_args(list_offsets, list_rows, marks, mark_shift)
    return marks_of_rows(list_rows[int(list_offsets[0]):int(list_offsets[-1])], marks, mark_shift)


def marks_of_rows(rows: torch.Tensor, marks: torch.Tensor, mark_shift: int) -> torch.Tensor:
    """``marks`` overwritten with the bitmap of ``rows`` (int64, any order, rows past the
    bitmap ignored): the PyTorch computation behind the references that mark rows."""
    granules = torch.unique(rows >> mark_shift)
    granules = granules[(granules >> 5) < marks.numel()]
    words = torch.zeros(marks.numel(), dtype=torch.int64, device=marks.device)
    # distinct granules of a word own distinct bits, so their sum is their OR
    words.index_add_(0, granules >> 5, torch.ones_like(granules) << (granules & 31))
    marks.copy_(torch.where(words >= 2**31, words - 2**32, words).to(torch.int32))
    return marks


def mark_rows(list_offsets: torch.Tensor, list_rows: torch.Tensor, marks: torch.Tensor,
              mark_shift: int) -> torch.Tensor:
    fn = mark_rows_triton if use_triton(list_rows) else mark_rows_reference
    return fn(list_offsets, list_rows, marks, mark_shift)


mark_rows.__doc__ = """The bitmap of every listed row, for the kernels' ``marks``: bit ``g & 31`` of word
    ``g >> 5`` is set when a row of granule ``g = row >> mark_shift`` is listed, in any
    segment (the global list and every request's); a row past the bitmap's last word (the
    padding of :func:`~zerogr_kernels.deny_ids.deny_rows`) marks nothing.

    Parameters
    ----------
    list_offsets : torch.Tensor
        ``(batch + 2,)`` int64 CSR offsets, as for :func:`constrain_slots`; the rows used are
        ``list_rows[list_offsets[0]:list_offsets[-1]]``.
    list_rows : torch.Tensor
        ``(capacity,)`` int64 rows.
    marks : torch.Tensor
        ``(mark_words(n_rows),)`` int32 output, overwritten.
    mark_shift : int
        log2 of the rows per granule (:func:`mark_shift` of the catalog's rows).

    Returns
    -------
    torch.Tensor
        ``marks``.
    """
