"""Per-call allow lists from raw item ids, as one bitmap of alive successors per request and step.

A slot of an allow request is alive when an allowed row lies below the prefix it extends to.
Sorted row lists answer that with a binary search per slot, after a sort of every listed row
on each call. Here each allowed row instead sets, at every step, the bit of the successor state
that holds it, in its request's bitmap of that step: the slot's test is then one load
(:func:`node_alive`), and nothing is sorted. Repeated ids, and ids the catalog does not hold,
set nothing twice or nothing at all.

The state of step ``l`` that holds row ``r``: the successors of step ``l`` cover consecutive row
ranges, state ``q`` starting at row ``row_start[l][q]``
(:func:`zerogr_core.decode.constraints.row_starts`), so it is the number of states starting at
or before ``r``, minus one: a rank query over a bitmap of the start rows (bit ``r & 31`` of word
``r >> 5`` set where a state starts) and the count of start bits before each word
(:func:`rank_tables`), two loads and a population count. At the last step the successor is the
row itself.

Request ``r``'s bitmap of step ``l`` is ``nodes[r, level_words[l]:]``, one bit per successor
state of the step (bit ``q & 31`` of word ``q >> 5``); :func:`node_layout` gives the offsets.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, check_tensor, pdl_args, pdl_prologue, popcount32, use_triton

BLOCK_IDS = 1024
"""Ids per program of :func:`allow_nodes`."""
BLOCK_DERIVE = 256
"""Successors per program of a derived step (whole int32 words: a multiple of 32)."""


def node_layout(level_sizes) -> tuple[list[int], int]:
    """``(level_words, stride)``: the int32 word where each step's bitmap starts in a request's
    row of :func:`allow_nodes`'s ``nodes``, and the row's words, for steps of ``level_sizes``
    successor states (the last step's are the catalog's rows)."""
    words, at = [], 0
    for size in level_sizes:
        words.append(at)
        at += cdiv(max(int(size), 1), 32)
    return words, max(at, 1)


def rank_tables(starts: list, n_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rank structure :func:`allow_nodes` reads: for every step but the last, the bitmap of
    the rows where a successor state starts and the count of start bits before each word.

    Parameters
    ----------
    starts : list of torch.Tensor
        Per step but the last, ``(S + 1,)`` int32/int64 ascending first rows of its ``S``
        successor states, the row count last (:func:`zerogr_core.decode.constraints.row_starts`).
    n_rows : int
        Catalog rows.

    Returns
    -------
    (rank_bits, rank_before) : tuple of torch.Tensor
        ``(max(L - 1, 1), cdiv(n_rows, 32))`` int32 each, on the starts' device (one row of zeros
        when there is no step before the last).
    """
    n_words = cdiv(max(int(n_rows), 1), 32)
    device = starts[0].device if starts else torch.device("cpu")
    bits = torch.zeros(max(len(starts), 1), n_words, dtype=torch.int64, device=device)
    before = torch.zeros_like(bits)
    for level, s in enumerate(starts):
        first = s[:-1].long()
        # distinct start rows own distinct bits of a word, so their sum is their OR
        bits[level].index_add_(0, first >> 5, torch.ones_like(first) << (first & 31))
        counts = torch.bincount(first >> 5, minlength=n_words)
        before[level, 1:] = torch.cumsum(counts, 0)[:-1]
    bits = torch.where(bits >= 2**31, bits - 2**32, bits)
    return bits.to(torch.int32), before.to(torch.int32)


DERIVED_STEPS = 2
"""Early steps whose bitmaps :func:`allow_nodes` derives from the next step's, instead of setting a
bit per allowed row: their few successors take most rows' bits, so those atomics contend (on the
H200, 46 of 114 µs for 200,000 ids at batch 1, 390 of 1,581 µs at batch 32)."""


def derive_tables(starts: list, level_words, levels: int = DERIVED_STEPS) -> tuple:
    """What :func:`allow_nodes` needs to derive the bitmaps of the first ``levels`` steps (at most
    all but the last) from the next step's: per step ``l``, ``(child_begin, max_words, parent_word,
    child_word)``. Successor ``q`` of step ``l`` holds an allowed row when one of its children does:
    the successors ``child_begin[q] … child_begin[q + 1] - 1`` of step ``l + 1`` (the rows, at the
    last step).

    Parameters
    ----------
    starts : list of torch.Tensor
        As :func:`rank_tables`.
    level_words : sequence of int
        :func:`node_layout`'s offsets.
    levels : int

    Returns
    -------
    tuple
        Of ``(child_begin, max_words, parent_word, child_word)``: ``(S_l + 1,)`` int32 on the starts'
        device, the most child words one successor spans, and the two steps' word offsets.
    """
    out = []
    for level in range(min(levels, len(starts))):
        parent = starts[level].long()
        child = starts[level + 1].long() if level + 1 < len(starts) else None
        begin = parent if child is None else torch.searchsorted(child, parent)
        span = int((begin[1:] - begin[:-1]).max()) if begin.numel() > 1 else 0
        out.append((begin.to(torch.int32).contiguous(), cdiv(span, 32) + 1, int(level_words[level]),
                    int(level_words[level + 1])))
    return tuple(out)


@triton.jit
def _set_bit(words_ptr, b, on):
    # a plain load first: the early steps' few words take most ids' bits, which are set after the
    # first few, so most lanes skip their atomic (a stale read only costs an atomic it could skip)
    word = words_ptr + (b >> 5)
    bit = ((tl.zeros_like(b) + 1) << (b & 31)).to(tl.uint32).to(tl.int32, bitcast=True)
    seen = tl.load(word, mask=on, other=0)
    tl.atomic_or(word, bit, mask=on & ((seen & bit) == 0))


@triton.jit
def node_alive(nodes_ptr, node_off, node_stride, req, succ, need):
    """Whether successor ``succ`` of request ``req`` is set in its bitmap of the step whose
    words start at ``node_off`` (rows of ``node_stride`` words), for the lanes in ``need``
    (False elsewhere)."""
    safe = tl.where(need, succ, 0).to(tl.int64)
    word = tl.load(nodes_ptr + req * node_stride + node_off + (safe >> 5), mask=need, other=0)
    return need & (((word.to(tl.int64) >> (safe & 31)) & 1) != 0)


# n_levels == 1 (a one-level catalog: only the rows' bits) would be specialised as a constant, and
# Triton 3.6's coalesce pass then fails to compile the dead loop (PassManager::run failed on an H100)
@triton.jit(do_not_specialize=["n_levels"])
def _allow_nodes_kernel(ids_ptr, id_off_ptr, table_ptr, table_size, base, rank_bits_ptr, rank_before_ptr,
                        n_words, level_words_ptr, n_levels, nodes_ptr, stride, BATCH: tl.constexpr,
                        LOG_B: tl.constexpr, BLOCK: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    idx = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    used = idx < tl.load(id_off_ptr + BATCH)
    # the id's request: the first r with id_offsets[r] > idx, less one (an empty request
    # shares its offset with the next, which this skips)
    lo = tl.zeros_like(idx)
    hi = lo + BATCH + 1
    for _ in tl.static_range(LOG_B):
        active = lo < hi
        mid = (lo + hi) // 2
        above = tl.load(id_off_ptr + mid, mask=active & used, other=0) > idx
        hi = tl.where(active & above, mid, hi)
        lo = tl.where(active & ~above, mid + 1, lo)
    req = tl.maximum(lo - 1, 0)
    pos = tl.load(ids_ptr + idx, mask=used, other=0) - base
    inside = used & (pos >= 0) & (pos < table_size)
    row = tl.load(table_ptr + pos, mask=inside, other=-1).to(tl.int64)
    ok = inside & (row >= 0)
    row = tl.where(ok, row, 0)
    own = nodes_ptr + req * stride
    w = row >> 5
    upto = ((tl.zeros_like(row) + 2) << (row & 31)) - 1  # bits 0 .. row & 31 of its word
    level = 0
    while level < n_levels - 1:  # a runtime count: Triton's interpreter cannot range() over an argument
        bits = tl.load(rank_bits_ptr + level * n_words + w, mask=ok, other=0).to(tl.int64) & 0xFFFFFFFF
        before = tl.load(rank_before_ptr + level * n_words + w, mask=ok, other=0).to(tl.int64)
        _set_bit(own + tl.load(level_words_ptr + level), before + popcount32(bits & upto) - 1, ok)
        level += 1
    _set_bit(own + tl.load(level_words_ptr + n_levels - 1), row, ok)


@triton.jit
def _derive_kernel(nodes_ptr, stride, begin_ptr, n_parent, parent_word, child_word, max_words,
                   BLOCK: tl.constexpr):
    # one request's successors q of one step, BLOCK at a time (whole words: each program writes
    # its words outright, no atomics): q is set when a bit of its children's span is
    q = tl.program_id(0).to(tl.int64) * BLOCK + tl.arange(0, BLOCK)
    row = nodes_ptr + tl.program_id(1).to(tl.int64) * stride
    inb = q < n_parent
    a = tl.load(begin_ptr + q, mask=inb, other=0).to(tl.int64)
    b = tl.load(begin_ptr + q + 1, mask=inb, other=0).to(tl.int64)
    alive = tl.zeros([BLOCK], dtype=tl.int32)
    k = 0
    while k < max_words:
        w = (a >> 5) + k
        need = inb & (w * 32 < b)
        word = tl.load(row + child_word + w, mask=need, other=0).to(tl.int64) & 0xFFFFFFFF
        lo = tl.minimum(tl.maximum(a - w * 32, 0), 32)
        hi = tl.minimum(tl.maximum(b - w * 32, 0), 32)
        span = ((tl.zeros_like(hi) + 1) << hi) - ((tl.zeros_like(lo) + 1) << lo)
        alive = alive | tl.where(need & ((word & span) != 0), 1, 0)
        k += 1
    bits = tl.where(alive != 0, (tl.zeros_like(q) + 1) << (q & 31), 0)
    words = tl.sum(tl.reshape(bits, (BLOCK // 32, 32)), axis=1)  # distinct bits: the sum is the OR
    wq = tl.program_id(0).to(tl.int64) * (BLOCK // 32) + tl.arange(0, BLOCK // 32)
    tl.store(row + parent_word + wq, words.to(tl.uint32).to(tl.int32, bitcast=True), mask=wq * 32 < n_parent)


def _check(ids, id_offsets, table, rank_bits, rank_before, level_words, nodes) -> None:
    check_tensor("nodes", nodes, dtypes=(torch.int32,), ndim=2, contiguous=True)
    dev = nodes.device
    for name, t in (("ids", ids), ("id_offsets", id_offsets), ("level_words", level_words)):
        check_tensor(name, t, dtypes=(torch.int64,), ndim=1, device=dev, contiguous=True)
    check_tensor("table", table, dtypes=(torch.int32, torch.int64), ndim=1, device=dev, contiguous=True)
    check_tensor("rank_bits", rank_bits, dtypes=(torch.int32,), ndim=2, device=dev, contiguous=True)
    check_tensor("rank_before", rank_before, dtypes=(torch.int32,), ndim=2, device=dev,
                 shape=tuple(rank_bits.shape), contiguous=True)
    if id_offsets.numel() != nodes.shape[0] + 1:
        raise ValueError(f"id_offsets must hold batch + 1 = {nodes.shape[0] + 1} entries, got {id_offsets.numel()}")
    if level_words.numel() < 1 or level_words.numel() - 1 > rank_bits.shape[0]:
        raise ValueError(f"level_words must hold one offset per step (1 to {rank_bits.shape[0] + 1}), "
                         f"got {level_words.numel()}")


def allow_nodes_triton(ids: torch.Tensor, id_offsets: torch.Tensor, table: torch.Tensor, base: int,
                       rank_bits: torch.Tensor, rank_before: torch.Tensor, level_words: torch.Tensor,
                       nodes: torch.Tensor, derived: tuple = ()) -> torch.Tensor:
    """Triton implementation of :func:`allow_nodes` (no host sync: the ids used are counted on the device)."""
    _check(ids, id_offsets, table, rank_bits, rank_before, level_words, nodes)
    nodes.zero_()
    batch = nodes.shape[0]
    d = len(derived)
    if d >= level_words.numel():
        raise ValueError(f"derived: at most {level_words.numel() - 1} steps (all but the last), got {d}")
    if ids.numel():  # the steps from d on, bit by bit
        _allow_nodes_kernel[(cdiv(ids.numel(), BLOCK_IDS),)](
            ids, id_offsets, table, table.numel(), base, rank_bits[d:], rank_before[d:], rank_bits.shape[1],
            level_words[d:], level_words.numel() - d, nodes, nodes.shape[1], BATCH=batch,
            LOG_B=(batch + 1).bit_length(), BLOCK=BLOCK_IDS, **pdl_args(nodes.device))
    for begin, max_words, parent_word, child_word in reversed(derived):  # then each step from the next
        n_parent = begin.numel() - 1
        if n_parent > 0:
            _derive_kernel[(cdiv(n_parent, BLOCK_DERIVE), batch)](
                nodes, nodes.shape[1], begin, n_parent, parent_word, child_word, max_words, BLOCK=BLOCK_DERIVE)
    return nodes


def allow_nodes_reference(ids: torch.Tensor, id_offsets: torch.Tensor, table: torch.Tensor, base: int,
                          rank_bits: torch.Tensor, rank_before: torch.Tensor, level_words: torch.Tensor,
                          nodes: torch.Tensor, derived: tuple = ()) -> torch.Tensor:
    """PyTorch reference of :func:`allow_nodes` (same signature and output). It finds each row's
    state at every step by a running count over the unpacked start bitmap, without ``rank_before``
    and without deriving any step (``derived`` is the kernel's way to the same bits)."""
    _check(ids, id_offsets, table, rank_bits, rank_before, level_words, nodes)
    batch, stride = nodes.shape
    dev = nodes.device
    n = int(id_offsets[-1])
    req = torch.searchsorted(id_offsets[1:], torch.arange(n, device=dev), right=True)
    pos = ids[:n] - base
    inside = (pos >= 0) & (pos < table.numel())
    row = torch.where(inside, table[torch.where(inside, pos, 0)].long(), -1)
    ok = row >= 0
    req, row = req[ok], row[ok]
    shifts = torch.arange(32, device=dev)
    flat = []
    for level in range(level_words.numel()):
        if level + 1 < level_words.numel():
            starts = ((rank_bits[level].long()[:, None] >> shifts) & 1).flatten()
            node = torch.cumsum(starts, 0)[row] - 1
        else:
            node = row
        flat.append(req * stride * 32 + int(level_words[level]) * 32 + node)
    bits = torch.unique(torch.cat(flat)) if flat else torch.zeros(0, dtype=torch.int64, device=dev)
    words = torch.zeros(batch * stride, dtype=torch.int64, device=dev)
    words.index_add_(0, bits >> 5, torch.ones_like(bits) << (bits & 31))
    nodes.copy_(torch.where(words >= 2**31, words - 2**32, words).to(torch.int32).view(batch, stride))
    return nodes


def allow_nodes(ids: torch.Tensor, id_offsets: torch.Tensor, table: torch.Tensor, base: int,
                rank_bits: torch.Tensor, rank_before: torch.Tensor, level_words: torch.Tensor,
                nodes: torch.Tensor, derived: tuple = ()) -> torch.Tensor:
    fn = allow_nodes_triton if use_triton(nodes) else allow_nodes_reference
    return fn(ids, id_offsets, table, base, rank_bits, rank_before, level_words, nodes, derived)


allow_nodes.__doc__ = """Each request's allowed ids as bitmaps of the successor states that hold an allowed row.

    Parameters
    ----------
    ids : torch.Tensor
        ``(capacity,)`` int64 item ids; request ``r`` allows ``ids[id_offsets[r]:id_offsets[r + 1]]``
        (any order, repeats and unknown ids allowed); entries past ``id_offsets[-1]`` are ignored.
    id_offsets : torch.Tensor
        ``(batch + 1,)`` int64, non-decreasing, from 0.
    table : torch.Tensor
        ``(T,)`` int32 or int64: the row of id ``v`` is ``table[v - base]`` (-1: not in the catalog).
    base : int
        The smallest id of the table.
    rank_bits, rank_before : torch.Tensor
        ``(max(L - 1, 1), cdiv(n_rows, 32))`` int32: :func:`rank_tables` of the index's steps.
    level_words : torch.Tensor
        ``(L,)`` int64: where each step's bitmap starts in a request's row (:func:`node_layout`).
    nodes : torch.Tensor
        ``(batch, stride)`` int32 output, overwritten: bit ``q & 31`` of word
        ``level_words[l] + (q >> 5)`` of row ``r`` is set when successor ``q`` of step ``l`` holds
        a row request ``r`` allows (at the last step, ``q`` is the row).
    derived : tuple, optional
        :func:`derive_tables`: steps whose bits the kernel derives from the next step's.

    Returns
    -------
    torch.Tensor
        ``nodes``.
    """
