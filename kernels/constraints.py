"""Per-request constraints: mark candidate slots with no allowed item below them as invalid.

Applied right after filtering (DESIGN.md section 4, step 1), so a dead candidate is
never projected (selective), never enters a request's normalisation (filtering first)
and never takes a beam. Rows of the catalog are sorted by SID, so the prefix a slot
extends to covers one contiguous range of rows ``[lo, hi)``: ``lo = row_start[succ]``
and ``hi = row_start[succ + 1]`` (at the last step the successor is the row itself,
``row_start=None``).

The lists are segments of one sorted, duplicate-free row buffer (CSR): segment 0,
``rows[list_offsets[0]:list_offsets[1]]``, is a *global* deny list shared by every
request (deleted items of a live catalog), and request ``r`` owns segment ``r + 1``
with a mode:

- ``mode[r] == 1`` (allow): the slot is alive iff the request's list holds a row in
  ``[lo, hi)`` (the caller keeps globally denied rows out of allow lists);
- ``mode[r] == 0`` (deny): the slot is alive iff ``hi - lo`` exceeds the number of rows
  in ``[lo, hi)`` listed by the request or globally (the two lists must be disjoint;
  empty lists change nothing).

Bit :data:`CATALOG_NORMALISED` (2) of ``mode[r]`` asks for the request to be normalised over
the catalog's valid tokens, the lists only removing candidates: the reference decoder's
filtering first then calls
:func:`constrain_slots` with ``defer=True``, which applies only the global list to that
request's slots, so the rest are projected, and :func:`constrain_scored_slots` after
projection, which kills them and moves the difference between the two normalisers into the
beam's score. Scoring first normalises over the whole vocabulary anyway and applies every
list with ``defer=False``.

A slot searches a list only when its answer can depend on it: a deny list of k rows (and a
global list of g) cannot empty a prefix of more than k + g rows, so the wide prefixes of the
early steps, and every slot of a request without lists, cost no search. A count is one
lower-bound binary search of the first listed row at or after ``lo``, which settles a range of
one row (the last step), and a second one from there for wider ranges. Each program runs as
many halvings as its longest searched list needs, read from the offsets at run time, so the
kernel, and hence a captured CUDA graph, does not depend on the lists of one call; ``n_iter``
caps them (at least ``bit_length`` of the longest list the buffers can hold).
An optional bitmap of the rows listed anywhere in the batch (one bit per granule of
``2**mark_shift`` rows, request lists and global list together; :mod:`.row_marks`) settles
most of the remaining slots without a search: a range with no marked granule holds no listed
row, so a deny request keeps the slot and an allow request loses it. A deny list of 100 rows in a catalog of
2·10^7 marks one granule in 200,000, and the prefixes of 16 rows that every beam of step 2
extends are settled by one or two loads each instead of two binary searches.
A dead slot gets token -1, successor -1 and logit -inf, exactly like a slot past the end
of its segment. Beam ``b`` belongs to request ``b // beams_per_request``.
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, pdl_args, pdl_prologue, use_triton
from .allow_nodes import node_alive
from .row_marks import _check_marks

BLOCK_SLOTS = 128
"""Slots per column block."""
CHUNKS_PER_PROGRAM = 4
"""Column blocks of one beam per program of :func:`constrain_slots` on grids of more than
:data:`MAX_PROGRAMS` blocks."""
MAX_PROGRAMS = 16_384
"""Most programs :func:`constrain_slots` launches with one column block each."""
ALLOW = 1
"""Bit of ``list_mode``: the request's list is an allow list (else a deny list)."""
CATALOG_NORMALISED = 2
"""Bit of ``list_mode``: normalise the request over the catalog's valid tokens, then drop
its listed candidates (see the module docstring)."""


class SlotLists(NamedTuple):
    """A step's lists as :func:`zerogr_kernels.filter_slots` applies them while it fills the
    slots (its ``constraint=``): the arguments of :func:`constrain_slots` that are not slots.
    The fields are those of :func:`constrain_slots` (its docstring has their shapes and dtypes).
    With ``defer``, a slot of a catalog-normalised request that only its own list kills stays
    live for projection with its successor ``s`` stored as ``-2 - s``
    (:func:`zerogr_kernels.topk_gather` with ``deferred`` counts it in the normaliser and drops it,
    without a search). With ``nodes`` (``(batch, node_stride)`` int32, :func:`zerogr_kernels.allow_nodes.allow_nodes`'s
    bitmaps, this step's starting at word ``node_off``), an allow request's slot is alive when its
    successor's bit is set, and its row segment is not read. With ``spans`` (``(batch + 1,)``
    int64, at least the longest run of consecutive rows of each segment, the global list's
    first, as :func:`zerogr_kernels.list_spans.list_spans` writes them), a deny request
    searches only the slots whose prefix its lists could empty: none wider than the longest
    run of its rows and the global ones together. ``floor`` is the fewest rows below any
    successor of the step (:func:`zerogr_core.decode.constraints.row_floors`; 1 knows nothing):
    a deny request whose lists cannot empty that many rows reads no row range at all.
    """

    row_start: torch.Tensor | None
    list_offsets: torch.Tensor
    list_rows: torch.Tensor
    list_mode: torch.Tensor
    beams_per_request: int
    n_iter: int
    defer: bool = False
    marks: torch.Tensor | None = None
    mark_shift: int = 0
    nodes: torch.Tensor | None = None
    node_off: int = 0
    node_stride: int = 0
    spans: torch.Tensor | None = None
    floor: int = 1

    def check(self, slot_tokens, slot_succ, slot_logits) -> None:
        """Raise unless the lists fit these slot tensors (:func:`constrain_slots`'s checks)."""
        _check(slot_tokens, slot_succ, slot_logits, self.row_start, self.list_offsets, self.list_rows,
               self.list_mode, self.beams_per_request, self.n_iter)
        _check_marks(self.marks, self.mark_shift, slot_succ.device)
        if self.nodes is not None:
            check_tensor("nodes", self.nodes, dtypes=(torch.int32,), ndim=2, device=slot_succ.device,
                         contiguous=True)
            if self.nodes.shape[0] != self.list_mode.shape[0] or self.nodes.shape[1] != self.node_stride \
                    or not 0 <= self.node_off < self.node_stride:
                raise ValueError(f"nodes must be (batch, node_stride) = ({self.list_mode.shape[0]}, "
                                 f"{self.node_stride}) with node_off inside a row, got {tuple(self.nodes.shape)} "
                                 f"and {self.node_off}")
        if self.spans is not None:
            check_tensor("spans", self.spans, dtypes=(torch.int64,), ndim=1, device=slot_succ.device,
                         shape=(self.list_mode.shape[0] + 1,), contiguous=True)
        if not isinstance(self.floor, int) or self.floor < 1:
            raise ValueError(f"floor must be an int ≥ 1, got {self.floor!r}")

    def launch_args(self) -> tuple:
        """The filter kernels' list pointers and scalars, in their order."""
        last = self.row_start is None
        return (self.list_rows if last else self.row_start, self.list_offsets, self.list_rows, self.list_mode,
                self.list_mode if self.marks is None else self.marks, self.mark_shift,
                self.list_mode if self.nodes is None else self.nodes, self.node_off, self.node_stride,
                self.beams_per_request, self.n_iter, self.list_mode if self.spans is None else self.spans,
                self.floor)

    def launch_flags(self) -> dict:
        return {"LAST": self.row_start is None, "DEFER": bool(self.defer), "MARKS": self.marks is not None,
                "NODES": self.nodes is not None, "SPANS": self.spans is not None}

    def apply_reference(self, slot_tokens, slot_succ, slot_logits) -> None:
        """:func:`constrain_slots_reference` over these slots (in place), the deferred slots
        marked as the filter marks them; with ``nodes``, an allow request's slots read its bitmap."""
        valid, alive, live, catalog = _alive_reference(slot_succ, *self[:5])
        if self.nodes is not None:
            alive = torch.where(self._allowing(slot_succ), self._node_bits(slot_succ), alive)
        if self.defer:
            later = valid & catalog & live & ~alive
            alive = torch.where(catalog, live, alive)
            slot_succ.copy_(torch.where(later, -2 - slot_succ, slot_succ))
        _kill_reference(slot_tokens, slot_succ, slot_logits, valid & ~alive)

    def _allowing(self, slot_succ) -> torch.Tensor:
        """``(n, 1)`` bool: the slot rows of allow requests."""
        req = torch.arange(slot_succ.shape[0], device=slot_succ.device) // self.beams_per_request
        return ((self.list_mode[req].long() & ALLOW) != 0)[:, None]

    def _node_bits(self, slot_succ) -> torch.Tensor:
        """``(n, K)`` bool: each slot's successor bit in its request's ``nodes`` (False where invalid)."""
        req = torch.arange(slot_succ.shape[0], device=slot_succ.device) // self.beams_per_request
        q = slot_succ.clamp(min=0)
        word = self.nodes[req[:, None], self.node_off + (q >> 5)].long()
        return (slot_succ >= 0) & (((word >> (q & 31)) & 1) == 1)


def search_iterations(capacity: int) -> int:
    """Halvings that find a lower bound in any list of at most ``capacity`` rows."""
    return max(int(capacity), 1).bit_length()


def _check(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
           beams_per_request, n_iter) -> None:
    check_tensor("slot_succ", slot_succ, dtypes=(torch.int64,), ndim=2, contiguous=True)
    n, K = slot_succ.shape
    dev = slot_succ.device
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, device=dev, shape=(n, K),
                 contiguous=True)
    check_tensor("slot_logits", slot_logits, dtypes=FLOAT_DTYPES, ndim=2, device=dev, shape=(n, K),
                 contiguous=True)
    if row_start is not None:
        check_tensor("row_start", row_start, dtypes=(torch.int32, torch.int64), ndim=1, device=dev,
                     contiguous=True)
    check_tensor("list_offsets", list_offsets, dtypes=(torch.int64,), ndim=1, device=dev, contiguous=True)
    check_tensor("list_rows", list_rows, dtypes=(torch.int64,), ndim=1, device=dev, contiguous=True)
    if list_rows.numel() == 0:
        raise ValueError("list_rows must hold at least one element (pad an empty list buffer)")
    if not isinstance(beams_per_request, int) or beams_per_request < 1 or n % beams_per_request:
        raise ValueError(f"beams_per_request must be a positive divisor of {n} beams, got {beams_per_request!r}")
    batch = n // beams_per_request
    check_tensor("list_mode", list_mode, dtypes=(torch.int32,), ndim=1, device=dev, shape=(batch,),
                 contiguous=True)
    if list_offsets.shape[0] != batch + 2:
        raise ValueError(f"list_offsets must hold batch + 2 = {batch + 2} entries (global list, then one per "
                         f"request), got {list_offsets.shape[0]}")
    if not isinstance(n_iter, int) or n_iter < 1:
        raise ValueError(f"n_iter must be a positive int, got {n_iter!r}")


@triton.jit
def _halvings(need, length, n_cap):
    # Halvings that settle a lower bound in a segment of `length` rows, for the longest
    # segment searched by a lane in `need` (0 when no lane searches), at most n_cap.
    # bit_length(m) = ceil(log2(m + 1)); the extra halving absorbs float32 rounding.
    m = tl.max(tl.where(need, length, 0))
    bits = tl.ceil(tl.log2(m.to(tl.float32) + 1.0)).to(tl.int32) + 1
    return tl.minimum(tl.where(m > 0, bits, 0), n_cap)


@triton.jit
def _lower_bound(rows_ptr, start, end, x, need, n_iter):
    # Lower bound of x in rows[start:end] per lane (start may be per lane too); lanes
    # outside `need` return start without a load.
    lo = tl.zeros_like(x) + start
    hi = tl.where(need, tl.zeros_like(x) + end, lo)
    left = n_iter
    while left > 0:  # a runtime count: Triton's interpreter cannot range() over a tensor
        left -= 1
        active = lo < hi
        mid = lo + (hi - lo) // 2
        v = tl.load(rows_ptr + mid, mask=active, other=0)
        right = active & (v < x)
        lo = tl.where(right, mid + 1, lo)
        hi = tl.where(active & ~right, mid, hi)
    return lo


@triton.jit
def _count_in_range(rows_ptr, start, end, lo, hi, need, n_cap):
    # Rows of the sorted segment rows[start:end] in [lo, hi), for the lanes in `need`
    # (0 elsewhere). One search finds the first row >= lo; a range of one row (every
    # slot of the last step) is then settled by one load, a wider one by a second
    # search from there.
    n_iter = _halvings(need, end - start, n_cap)
    first = _lower_bound(rows_ptr, start, end, lo, need, n_iter)
    inside = need & (first < end)
    inside = inside & (tl.load(rows_ptr + first, mask=inside, other=0) < hi)
    wide = inside & (hi - lo > 1)
    past = _lower_bound(rows_ptr, first, end, hi, wide, tl.where(tl.max(wide.to(tl.int32)) > 0, n_iter, 0))
    return tl.where(wide, past - first, inside.to(tl.int64))


@triton.jit
def _may_decide(marks_ptr, shift, lo, hi, need, deny):
    # Whether a list can decide [lo, hi), for the lanes in `need` (True elsewhere): a granule
    # of it is marked (ranges over more than two words are assumed so), and, for a deny list,
    # every granule of the range in its first word is marked too: an unmarked granule holds
    # a row no list has, so the range keeps a row and no search can kill it.
    g_lo = lo >> shift
    g_hi = (hi - 1) >> shift
    w0 = g_lo >> 5
    w1 = g_hi >> 5
    near = need & (w1 - w0 <= 1)
    two = near & (w1 != w0)
    a = tl.load(marks_ptr + w0, mask=need, other=0).to(tl.int64) & 0xFFFFFFFF
    b = tl.load(marks_ptr + w1, mask=two, other=0).to(tl.int64) & 0xFFFFFFFF
    one = tl.zeros_like(lo) + 1
    s0 = g_lo & 31
    e0 = tl.where(w1 != w0, 31, g_hi & 31)
    m0 = ((one << (e0 - s0 + 1)) - 1) << s0
    m1 = (one << ((g_hi & 31) + 1)) - 1
    hit = ((a & m0) != 0) | (two & ((b & m1) != 0))
    return tl.where(need, tl.where(near, hit, True) & (~deny | ((a & m0) == m0)), True)


@triton.jit
def _slot_alive(succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr, req, allow, n_cap,
                marks_ptr, mark_shift, nodes_ptr, node_off, node_stride, spans_ptr, floor, LAST: tl.constexpr,
                MARKS: tl.constexpr, NODES: tl.constexpr, SPANS: tl.constexpr):
    # Per slot: whether its row range [lo, hi) holds a row request `req` may return (alive),
    # and a row that is not globally denied (live: still in the catalog). Only lanes whose
    # answer can depend on a list search it: a deny list of k rows (global g) cannot empty
    # a range of more than k + g rows, so wide prefixes of early steps cost two loads. With
    # SPANS (bounds s on the longest runs of consecutive rows, s_g of the global list's), no
    # range wider than the longest run of both lists together: its own rows, at most k, part
    # runs of global rows, each at most s_g (and the other way round).
    g_start = tl.load(list_off_ptr)
    n_glob = tl.load(list_off_ptr + 1) - g_start
    start = tl.load(list_off_ptr + req + 1)
    n_req = tl.load(list_off_ptr + req + 2) - start
    reach = n_req + n_glob
    if SPANS:
        s_own = tl.load(spans_ptr + req + 1)
        s_glob = tl.load(spans_ptr)
        reach = tl.minimum(reach, tl.minimum(n_req + (n_req + 1) * s_glob, n_glob + (n_glob + 1) * s_own))
    # every successor of the step holds at least `floor` (≥ 1) rows
    listing = valid & (allow | (reach >= floor))
    # the row ranges load under `valid`, not `listing`: so they need not wait for the loads of the
    # list bounds above (the filter's latency at small batches is this chain of dependent loads)
    safe = tl.where(valid, succ, 0)
    if LAST:
        lo = safe
        hi = safe + 1
    else:
        lo = tl.load(row_start_ptr + safe, mask=valid, other=0).to(tl.int64)
        hi = tl.load(row_start_ptr + safe + 1, mask=valid, other=0).to(tl.int64)
    size = hi - lo
    search = listing
    if MARKS:  # a range with no listed row anywhere in the batch holds none of this request's
        search = search & _may_decide(marks_ptr, mark_shift, lo, hi, listing & (allow | (size <= reach)), ~allow)
    own = search & (n_req > 0) & (allow | (size <= reach))
    if NODES:  # an allow request's bitmap of alive successors settles it in one load (kernels.allow_nodes)
        own = own & ~allow
    in_glob = search & (n_glob > 0) & (size <= tl.where(allow, n_glob, reach))
    listed = tl.zeros_like(lo)
    glob = tl.zeros_like(lo)
    # in most tiles no lane searches (the bitmap cleared them): one reduction then skips the
    # searches' own reductions and loads
    if tl.max((own | in_glob).to(tl.int32)) > 0:
        listed = _count_in_range(list_rows_ptr, start, start + n_req, lo, hi, own, n_cap)
        glob = _count_in_range(list_rows_ptr, g_start, g_start + n_glob, lo, hi, in_glob, n_cap)
    if NODES:
        listed = tl.where(allow, node_alive(nodes_ptr, node_off, node_stride, req, succ, listing & allow).to(tl.int64),
                          listed)
    alive = tl.where(allow, listed > 0, size > listed + glob)
    return tl.where(listing, alive, True), tl.where(listing, size > glob, True)


@triton.jit
def _filter_lists(rows, row_ok, n_beams, succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr, list_mode_ptr,
                  marks_ptr, mark_shift, nodes_ptr, node_off, node_stride, beams_per_request, n_cap, spans_ptr,
                  floor, LAST: tl.constexpr, DEFER: tl.constexpr, MARKS: tl.constexpr, NODES: tl.constexpr,
                  SPANS: tl.constexpr):
    # For a (ROWS, BLOCK) tile of beams `rows` whose slots a caller holds in registers (the
    # filter): (kept, succ), the slots the lists leave and their successors, -1 where killed
    # and, with DEFER, -2 - s for the live slots of catalog-normalised requests that their own
    # list kills after projection.
    req = tl.minimum(rows, n_beams - 1) // beams_per_request
    mode = tl.load(list_mode_ptr + req, mask=row_ok, other=0)
    alive, live = _slot_alive(succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr, req[:, None],
                              ((mode & 1) != 0)[:, None], n_cap, marks_ptr, mark_shift, nodes_ptr, node_off,
                              node_stride, spans_ptr, floor, LAST, MARKS, NODES, SPANS)
    later = valid & False
    if DEFER:
        catalog = ((mode & 2) != 0)[:, None]
        later = valid & catalog & live & ~alive
        alive = tl.where(catalog, live, alive)
    kept = valid & alive
    return kept, tl.where(kept, tl.where(later, -2 - succ, succ), -1)


@triton.jit
def _kill(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, slot, dead):
    # marks the slots at int64 offsets `slot` (any shape) where `dead` is true as invalid
    minus_one = tl.zeros_like(slot) - 1
    tl.store(slot_tok_ptr + slot, minus_one.to(tl.int32), mask=dead)
    tl.store(slot_succ_ptr + slot, minus_one, mask=dead)
    tl.store(slot_logit_ptr + slot, (minus_one.to(tl.float32) * float("inf")).to(slot_logit_ptr.dtype.element_ty),
             mask=dead)


@triton.jit
def _constrain_kernel(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, row_start_ptr,
                      list_off_ptr, list_rows_ptr, list_mode_ptr, marks_ptr, mark_shift, K, beams_per_request,
                      n_iter, LAST: tl.constexpr, DEFER: tl.constexpr, BLOCK: tl.constexpr, CHUNKS: tl.constexpr,
                      MARKS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    beam = tl.program_id(0).to(tl.int64)
    req = beam // beams_per_request
    mode = tl.load(list_mode_ptr + req)
    # a deny request with nothing listed, and no global list, keeps its slots: its
    # program reads none of them
    work = ((mode & 1) != 0) | (tl.load(list_off_ptr + req + 2) > tl.load(list_off_ptr + req + 1)) | \
        (tl.load(list_off_ptr + 1) > tl.load(list_off_ptr))
    if work:
        for c in tl.static_range(CHUNKS):
            cols = (tl.program_id(1) * CHUNKS + c) * BLOCK + tl.arange(0, BLOCK)
            in_row = cols < K
            slot = beam * K + cols
            succ = tl.load(slot_succ_ptr + slot, mask=in_row, other=-1)
            valid = succ >= 0
            alive, live = _slot_alive(succ, valid, row_start_ptr, list_off_ptr, list_rows_ptr, req,
                                      (mode & 1) != 0, n_iter, marks_ptr, mark_shift, marks_ptr, 0, 0, marks_ptr,
                                      1, LAST, MARKS, False, False)
            if DEFER:
                # a catalog-normalised request loses only what left the catalog here; its
                # own list is applied after projection
                alive = tl.where((mode & 2) != 0, live, alive)
            _kill(slot_tok_ptr, slot_succ_ptr, slot_logit_ptr, slot, in_row & valid & ~alive)


def constrain_slots_triton(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                           row_start: torch.Tensor | None, list_offsets: torch.Tensor,
                           list_rows: torch.Tensor, list_mode: torch.Tensor, beams_per_request: int,
                           n_iter: int, defer: bool = False, marks: torch.Tensor | None = None,
                           mark_shift: int = 0) -> None:
    """Triton implementation of :func:`constrain_slots` (in place, no host sync)."""
    _check(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
           beams_per_request, n_iter)
    _check_marks(marks, mark_shift, slot_succ.device)
    n, K = slot_succ.shape
    if n == 0:
        return
    block = min(BLOCK_SLOTS, next_pow2(K))
    last = row_start is None
    pdl = pdl_args(slot_succ.device)
    # past MAX_PROGRAMS (batch 32 × beam 128 × 16 blocks: 65,536 programs per step, most of
    # which may find nothing to test) a program takes a few column blocks; below it the
    # blocks spread over more programs (on the H200, 4 blocks per program took batch 1's
    # searches from 18 to 25 µs a decode and batch 32's empty lists from 53 to 29 µs)
    blocks = cdiv(K, block)
    chunks = min(CHUNKS_PER_PROGRAM, blocks) if n * blocks > MAX_PROGRAMS else 1
    _constrain_kernel[(n, cdiv(blocks, chunks))](
        slot_tokens, slot_succ, slot_logits, list_rows if last else row_start, list_offsets, list_rows,
        list_mode, list_mode if marks is None else marks, mark_shift, K, beams_per_request, n_iter, LAST=last,
        DEFER=bool(defer), BLOCK=block, CHUNKS=chunks, MARKS=marks is not None, **pdl)


def _alive_reference(slot_succ, row_start, list_offsets, list_rows, list_mode, beams_per_request):
    """``(valid, alive, live)`` bool ``(n, K)`` masks of every slot (live: a row below it is
    not globally denied), and the catalog-normalised requests' rows ``(n, 1)``."""
    n, K = slot_succ.shape
    valid = slot_succ >= 0
    safe = slot_succ.clamp(min=0)
    if row_start is None:
        lo, hi = safe, safe + 1
    else:
        lo, hi = row_start[safe].long(), row_start[safe + 1].long()
    batch = list_mode.shape[0]
    dev = slot_succ.device
    req = torch.arange(n, device=dev) // beams_per_request
    # One sorted key space: segment s's rows live at s * span + row, so one searchsorted
    # answers every segment's count (segment 0 global, request r segment r + 1).
    first, total = int(list_offsets[0]), int(list_offsets[-1])
    sizes = list_offsets[1:] - list_offsets[:-1]
    owner = torch.repeat_interleave(torch.arange(batch + 1, device=dev), sizes, output_size=total - first)
    rows = list_rows[first:total]
    span = int(max(int(hi.max()) if hi.numel() else 0, int(rows.max()) + 1 if rows.numel() else 0)) + 1
    keys = owner * span + rows

    def count(segment):
        base = (segment * span)[:, None]
        return torch.searchsorted(keys, base + hi) - torch.searchsorted(keys, base + lo)

    listed, glob = count(req + 1), count(torch.zeros_like(req))
    mode = list_mode[req].long()
    allow = ((mode & ALLOW) != 0)[:, None]
    alive = torch.where(allow, listed > 0, (hi - lo) > listed + glob)
    return valid, alive, (hi - lo) > glob, ((mode & CATALOG_NORMALISED) != 0)[:, None]


def _kill_reference(slot_tokens, slot_succ, slot_logits, dead) -> None:
    slot_tokens.masked_fill_(dead, -1)
    slot_succ.masked_fill_(dead, -1)
    slot_logits.masked_fill_(dead, float("-inf"))


def constrain_slots_reference(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                              row_start: torch.Tensor | None, list_offsets: torch.Tensor,
                              list_rows: torch.Tensor, list_mode: torch.Tensor, beams_per_request: int,
                              n_iter: int, defer: bool = False, marks: torch.Tensor | None = None,
                              mark_shift: int = 0) -> None:
    """PyTorch reference of :func:`constrain_slots` (same signature, in place; the bitmap
    only saves the kernel searches, so the reference reads the lists alone)."""
    _check(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
           beams_per_request, n_iter)
    _check_marks(marks, mark_shift, slot_succ.device)
    if slot_succ.shape[0] == 0:
        return
    valid, alive, live, catalog = _alive_reference(slot_succ, row_start, list_offsets, list_rows, list_mode,
                                                   beams_per_request)
    if defer:
        alive = torch.where(catalog, live, alive)
    _kill_reference(slot_tokens, slot_succ, slot_logits, valid & ~alive)


_LISTS_DOC = """    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32 slot tokens from :func:`zerogr_kernels.filter_slots` (-1 invalid).
    slot_succ : torch.Tensor
        ``(n_beams, K)`` int64 successor states (-1 invalid).
    slot_logits : torch.Tensor
        ``(n_beams, K)`` float32/float16/bfloat16 slot logits (or -inf placeholders).
    row_start : torch.Tensor or None
        ``(S_next + 1,)`` int32/int64 first catalog row of every successor state, with
        the row count last (every state covers at least one row, as in a step index);
        ``None`` at the last step, where the successor is the row.
    list_offsets : torch.Tensor
        ``(batch + 2,)`` int64 CSR offsets into ``list_rows``: segment 0 is the global
        deny list, segment ``r + 1`` request ``r``'s list.
    list_rows : torch.Tensor
        ``(capacity,)`` int64, capacity >= 1: sorted, duplicate-free rows per segment
        (a request's deny list disjoint from the global one); entries past
        ``list_offsets[-1]`` are ignored.
    list_mode : torch.Tensor
        ``(batch,)`` int32 bits: :data:`ALLOW` (1) the list is an allow list, else a deny
        list; :data:`CATALOG_NORMALISED` (2) the request is normalised over the catalog.
    beams_per_request : int
        Slot rows per request (``n_beams = batch * beams_per_request``).
    n_iter : int
        Cap on the binary-search halvings, at least :func:`search_iterations` of the
        longest list (the kernels stop at what the lists of the call need).
    marks : torch.Tensor, optional
        ``(mark_words(n_rows),)`` int32 bitmap of the listed rows (:func:`mark_rows` of these
        lists, :func:`zerogr_kernels.row_marks.mark_rows`); lets the kernel settle a slot whose range
        holds no listed row without a search.
    mark_shift : int
        log2 of the rows per bit of ``marks`` (:func:`zerogr_kernels.row_marks.mark_shift`)."""


def constrain_slots(slot_tokens: torch.Tensor, slot_succ: torch.Tensor, slot_logits: torch.Tensor,
                    row_start: torch.Tensor | None, list_offsets: torch.Tensor, list_rows: torch.Tensor,
                    list_mode: torch.Tensor, beams_per_request: int, n_iter: int, defer: bool = False,
                    marks: torch.Tensor | None = None, mark_shift: int = 0) -> None:
    fn = constrain_slots_triton if use_triton(slot_succ) else constrain_slots_reference
    fn(slot_tokens, slot_succ, slot_logits, row_start, list_offsets, list_rows, list_mode,
       beams_per_request, n_iter, defer, marks, mark_shift)


constrain_slots.__doc__ = f"""Invalidate, in place, every slot whose prefix has no allowed catalog row below it.

    Parameters
    ----------
{_LISTS_DOC}
    defer : bool
        Apply only the global list to catalog-normalised requests (filtering first, before
        projection; :func:`constrain_scored_slots` applies their own lists afterwards).

    Returns
    -------
    None
        The three slot tensors are updated in place: dead slots get -1, -1, -inf.
    """
