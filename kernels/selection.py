"""Selection and gather: top-M candidates per request and their next beams.

Step 4 of the filtering-first decoding step (docs/design.md §4). Request ``r`` owns
beams ``r * Mb .. r * Mb + Mb - 1`` (``Mb = n_beams // batch``) and their ``Mb * K``
slots; flat position ``p`` of a request is slot ``p % K`` of beam
``r * Mb + p // K``. The ``M = beam_width`` best positions become the next beams.

Order: higher score first, ties broken by the lower flat position. -0.0 and +0.0 tie.
Candidates with score -inf or NaN are never selected: when a request has fewer than ``M``
finite candidates the tail is padded with score -inf, parent -1, token -1, succ -1.

Every candidate becomes an int64 key ``(order-preserving score bits << 32) +
(2**31 - 1 - p)``: keys are unique, so the order above is plain integer order. Four
paths give bit-identical outputs:

- ``"small"``: one program per request loads its ``Mb * K`` candidates as one tile,
  packs the keys, selects the top keys with ``tl.topk`` (bitonic, ``O(n log^2 M)``) and
  gathers. Used when the padded tile fits (``SMALL_AUTO_MAX`` candidates by default, at
  most ``SMALL_MAX``).
- ``"wide"``: a Triton kernel writes the keys, ``torch.topk`` selects per request
  (radix select on CUDA, one CTA per request row), and a small Triton kernel decodes
  and gathers.
- ``"split"``: a chunked tournament. A grid of ``(batch, n_chunks)`` programs each keeps
  the top keys of its chunk of the request, shrinking each row by a factor
  ``CHUNK / BLOCK_OUT``, repeated until a row fits one chunk, whose single program
  selects the final top keys and gathers. The first stage reads the scores directly
  (a few whole slot rows, or a column block of one wide row, per program: the small
  kernel's tile), so keys of all candidates are never written to memory. Fills the GPU
  when a request has many candidates and ``batch`` is small, where ``"wide"`` (one CTA
  per request) and ``"small"`` (one program per request) are latency-bound. The number
  of stages depends only on the shapes, so it is CUDA-graph capturable. Never chosen by
  ``path=None``; the engine's planner picks it by timing.
- ``"prune"``: the split tournament behind a per-request threshold. A row kernel writes
  each beam's log-sum-exp and its best candidate score; a threshold kernel takes ``T``,
  the ``M``-th best of those row bests (``-inf`` when a request has fewer than ``M``
  live beams), so at least ``M`` candidates score ``>= T`` and no candidate below ``T``
  can be selected. Every stage drops candidates below ``T``; a program whose survivors
  fit its ``BLOCK_OUT`` output compacts them with a prefix sum instead of the bitonic
  ``tl.topk``, which is what makes wide, dense-ish steps (a million candidates per
  request, few of them near the top) cheap. Two more launches than ``"split"``; the
  engine's planner times it beside the other paths and keeps it where it is fastest.

With ``beam_scores`` the op takes raw slot logits and fuses the normalisation of
:mod:`zerogr_kernels.normalize` into the key computation (all paths). With ``deferred`` too,
a slot whose successor is below -1 (a catalog-normalised request's slot that only its own
list removes, left live by the filter: :class:`~zerogr_kernels.constraints.SlotLists`)
counts in its row's log-sum-exp but is never a candidate, so such a request is normalised
over the catalog and loses its listed items in the same pass. With ``prefixes`` it also
writes the next step's token prefixes (:func:`extend_prefixes`) in its gather, which
spares a decode step the separate gather/copy launches.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import (FLOAT_DTYPES, cdiv, check_out, check_tensor, next_pow2, pdl_args, pdl_prologue,
                      use_triton)
from .beams_out import TopkOut, _topk_specs, extend_prefixes
from .normalize import (apply_log_softmax, log_softmax_slots_reference, lse_finish, lse_update,
                        row_lse_state, row_tiling)

SMALL_AUTO_MAX = 8192
"""Largest padded candidate tile for which ``path=None`` picks the small kernel."""
SMALL_MAX = 16384
"""Largest padded candidate tile the small kernel accepts."""

PATHS = ("small", "wide", "split", "prune")
"""Selection paths of :func:`topk_gather` (all give the same outputs)."""

SPLIT_CHUNK_MIN = 1024
"""Smallest chunk of the split path (its chunk is ``max(SPLIT_CHUNK_MIN, 4 * BLOCK_OUT)``,
capped at ``SPLIT_CHUNK_MAX`` but never below ``2 * BLOCK_OUT``); see :func:`split_plan`."""
SPLIT_CHUNK_MAX = 8192
"""Largest chunk of the split path unless ``2 * BLOCK_OUT`` is larger."""

# high key word of -inf: ((bits(-inf) as int32) ^ 0x7FFFFFFF); valid keys lie above it
_NEG_INF_HI = tl.constexpr(-2139095041)
# padding key of the split path: high word -2**31 < _NEG_INF_HI, so padding sorts below
# every real key (-inf candidates included) and decodes as padding like them
_PAD_KEY = tl.constexpr(-(2**63) + 1)


def _block_cols(K: int) -> int:
    # a (ROWS, 1) tile reshaped for tl.topk fails Triton 3.6's layout pass on sm_90
    # (seen on the H200 with K = 1); a padded second column is masked off anyway
    return max(2, next_pow2(K))


def small_tile(beams_per_request: int, K: int, beam_width: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_K, BLOCK_OUT)`` of the small kernel; ``BLOCK_M * BLOCK_K`` is the
    padded candidate tile compared with ``SMALL_AUTO_MAX`` / ``SMALL_MAX``."""
    block_k = _block_cols(K)
    # tl.topk cannot select a single element; rank 1 is then masked off
    block_out = max(2, next_pow2(beam_width))
    # a tile of exactly BLOCK_OUT keys (tl.topk selecting them all) also fails that pass
    block_m = max(next_pow2(beams_per_request), next_pow2(cdiv(2 * block_out, block_k)))
    return block_m, block_k, block_out


def split_plan(n_cand: int, beam_width: int) -> tuple[int, int, list[int]]:
    """``(CHUNK, BLOCK_OUT, n_chunks per stage)`` of the split path for ``n_cand = Mb * K``
    candidates per request.

    Each stage maps a row of ``L`` keys to ``cdiv(L, CHUNK) * BLOCK_OUT`` keys; the last
    stage has one chunk. ``CHUNK >= 2 * BLOCK_OUT`` makes every non-final stage shrink the
    row (``L > CHUNK`` gives ``cdiv(L, CHUNK) * BLOCK_OUT < L / 2 + BLOCK_OUT < L``), so
    the loop ends; ``4 * BLOCK_OUT`` shrinks it about 4x per stage for few stages, at
    least ``SPLIT_CHUNK_MIN`` keeps the per-program work above launch/latency noise, and
    at most ``SPLIT_CHUNK_MAX`` bounds the registers of one bitonic ``tl.topk`` tile.
    Shapes only: no data-dependent control flow.
    """
    block_out = max(2, next_pow2(beam_width))
    chunk = max(2 * block_out, min(SPLIT_CHUNK_MAX, max(next_pow2(SPLIT_CHUNK_MIN), 4 * block_out)))
    stages, length = [], n_cand
    while True:
        n = cdiv(length, chunk)
        stages.append(n)
        if n == 1:
            return chunk, block_out, stages
        length = n * block_out


def split_first_stage(beams_per_request: int, K: int, beam_width: int) -> tuple[int, int, int, int]:
    """``(ROWS, BLOCK_C, N_COL, n_chunks)`` of the split path's first stage.

    A program reads a ``(ROWS, BLOCK_C)`` tile of slot rows straight from the scores:
    ``ROWS`` whole rows (``BLOCK_C = next_pow2(K)``, at least 2, ``N_COL = 1``) when a row is
    narrower than a :func:`split_plan` chunk, else one chunk-wide column block of one row
    (``N_COL = cdiv(K, BLOCK_C)`` blocks per row). A tile holds about one chunk and at
    least ``2 * BLOCK_OUT`` keys; ``n_chunks`` programs serve each request.
    """
    chunk, block_out, _ = split_plan(beams_per_request * K, beam_width)
    block_k = _block_cols(K)
    if block_k >= chunk:
        return 1, chunk, cdiv(K, chunk), beams_per_request * cdiv(K, chunk)
    rows = max(chunk // block_k, cdiv(2 * block_out, block_k))
    rows = min(rows, max(next_pow2(beams_per_request), cdiv(2 * block_out, block_k)))
    return rows, block_k, 1, cdiv(beams_per_request, rows)


def _prepare(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores, path, out, prefixes,
             deferred) -> TopkOut:
    check_tensor("scores", scores, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    n_beams, K = scores.shape
    device = scores.device
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    check_tensor("slot_succ", slot_succ, dtypes=(torch.int64,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    if deferred and beam_scores is None:
        raise ValueError("deferred slots need beam_scores (they count in the fused normalisation)")
    if beam_scores is not None:
        check_tensor("beam_scores", beam_scores, dtypes=(torch.float32,), ndim=1, device=device,
                     shape=(n_beams,), contiguous=True)
    if not isinstance(batch, int) or batch < 1 or n_beams % batch:
        raise ValueError(f"batch={batch!r} must be a positive int dividing n_beams={n_beams}")
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be a positive int, got {beam_width!r}")
    if K < 1 or (n_beams // batch) * K >= 2**31:
        raise ValueError(f"need 1 <= beams_per_request * K < 2**31, got K={K}")
    if path not in (None,) + PATHS:
        raise ValueError(f"path must be None or one of {PATHS}, got {path!r}")
    if prefixes is not None:
        if not isinstance(prefixes, (tuple, list)) or len(prefixes) != 2:
            raise ValueError("prefixes must be a (prev, next) pair of tensors")
        prev, nxt = prefixes
        check_tensor("prefixes[0]", prev, dtypes=(torch.int64,), ndim=3, device=device, contiguous=True)
        level = prev.shape[2]
        check_tensor("prefixes[0]", prev, dtypes=(torch.int64,), ndim=3, device=device,
                     shape=(batch, n_beams // batch, level), contiguous=True)
        check_tensor("prefixes[1]", nxt, dtypes=(torch.int64,), ndim=3, device=device,
                     shape=(batch, beam_width, level + 1), contiguous=True)
    if out is None:
        return TopkOut.empty(batch, beam_width, device)
    check_out(out, _topk_specs(batch, beam_width, device))
    return TopkOut(*out)


@triton.jit
def _pack_keys(x, pos):
    """int64 keys of float32 scores ``x`` at request positions ``pos`` (< 2**31):
    integer order = (score descending, position ascending) order."""
    # -0.0 must tie with +0.0 as in a float sort; NaN, like -inf, is never selected
    bits = tl.where(x == 0.0, 0.0, tl.where(x != x, float("-inf"), x)).to(tl.int32, bitcast=True)
    hi = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (hi.to(tl.int64) << 32) + (2147483647 - pos).to(tl.int64)


@triton.jit
def _gather_store(key, valid, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                  out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                  prev_ptr, next_ptr, level, EXTEND: tl.constexpr, LP: tl.constexpr):
    # key: (BLOCK_OUT,) selected keys, best first; o: output ranks
    hi = (key >> 32).to(tl.int32)
    valid = valid & (hi > _NEG_INF_HI)
    bits = tl.where(hi >= 0, hi, hi ^ 0x7FFFFFFF)
    score = tl.where(valid, bits.to(tl.float32, bitcast=True), float("-inf"))
    pos = tl.where(valid, 2147483647 - (key - ((key >> 32) << 32)), 0)
    parent = req * Mb + pos // K
    slot = parent * K + pos % K
    keep = o < M
    tok = tl.load(slot_tok_ptr + slot, mask=valid & keep, other=-1)
    succ = tl.load(slot_succ_ptr + slot, mask=valid & keep, other=-1)
    dst = req * M + o
    tl.store(out_score_ptr + dst, score, mask=keep)
    tl.store(out_parent_ptr + dst, tl.where(valid, parent, -1), mask=keep)
    tl.store(out_tok_ptr + dst, tok, mask=keep)
    tl.store(out_succ_ptr + dst, succ, mask=keep)
    if EXTEND:
        # next prefix row dst (level + 1 tokens) = parent's prefix row + token; saves the
        # gather/where/copy launches a separate extension costs every step
        j = tl.arange(0, LP)
        take = (valid & keep)[:, None] & (j < level)[None, :]
        head = tl.load(prev_ptr + parent[:, None] * level + j[None, :], mask=take, other=-1)
        row = tl.where(j[None, :] == level, tok.to(tl.int64)[:, None], head)
        tl.store(next_ptr + dst[:, None] * (level + 1) + j[None, :], row,
                 mask=keep[:, None] & (j <= level)[None, :])


@triton.jit
def _store_survivors(keys, dst_ptr, BLOCK_OUT: tl.constexpr):
    """Write the top of a 1-D key tile (non-final stage output, ``BLOCK_OUT`` keys at
    ``dst_ptr``, any order): its live (non-padding) keys when they fit, compacted by a
    prefix sum, else the bitonic top ``BLOCK_OUT``."""
    live = keys != _PAD_KEY
    count = tl.sum(live.to(tl.int32), axis=0)
    o = tl.arange(0, BLOCK_OUT)
    if count <= BLOCK_OUT:
        at = tl.cumsum(live.to(tl.int32), axis=0) - 1
        tl.store(dst_ptr + at, keys, mask=live)
        tl.store(dst_ptr + o, tl.full([BLOCK_OUT], _PAD_KEY, tl.int64), mask=o >= count)
    else:
        tl.store(dst_ptr + o, tl.topk(keys, BLOCK_OUT))


@triton.jit
def _drop_deferred(x, slot_succ_ptr, slot, ok):
    # deferred slots (successor < -1) were in the normaliser; they are not candidates
    succ = tl.load(slot_succ_ptr + slot, mask=ok, other=-1)
    return tl.where(succ < -1, float("-inf"), x)


@triton.jit
def _rows_topk_kernel(scores_ptr, beam_scores_ptr, top_ptr, lse_ptr, thr_ptr,
                      slot_tok_ptr, slot_succ_ptr, out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                      prev_ptr, next_ptr, level, Mb, K, M,
                      NORMALIZE: tl.constexpr, DEFER: tl.constexpr, ROWS: tl.constexpr, BLOCK_C: tl.constexpr,
                      N_COL: tl.constexpr, BLOCK_OUT: tl.constexpr, FINAL: tl.constexpr,
                      PRUNE: tl.constexpr, EXTEND: tl.constexpr, LP: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # program (req, c): a (ROWS, BLOCK_C) tile of request req's slot rows, column block
    # c % N_COL of rows (c // N_COL) * ROWS + [0, ROWS); keys never go to memory.
    # FINAL (one program per request: the small path) decodes and gathers. PRUNE reads
    # the row log-sum-exps of the row-stats kernel (so scores match its row bests bit for
    # bit) and drops candidates below the request's threshold.
    req = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    r = (c // N_COL) * ROWS + tl.arange(0, ROWS)
    col = (c % N_COL) * BLOCK_C + tl.arange(0, BLOCK_C)
    beam = req * Mb + r
    row_ok = r < Mb
    ok = row_ok[:, None] & (col < K)[None, :]
    x = tl.load(scores_ptr + beam[:, None] * K + col[None, :], mask=ok,
                other=float("-inf")).to(tl.float32)
    if NORMALIZE:
        if PRUNE:
            lse = tl.load(lse_ptr + beam, mask=row_ok, other=0.0)
        else:
            if N_COL == 1:
                m, s = lse_update(tl.full([ROWS], float("-inf"), tl.float32), tl.zeros([ROWS], tl.float32), x)
            else:  # the row spans several programs: each folds the whole (L2-resident) row
                m, s = row_lse_state(scores_ptr, beam, row_ok, K, ROWS, BLOCK_C, N_COL)
            lse = lse_finish(m, s)
        bs = tl.load(beam_scores_ptr + beam, mask=row_ok, other=float("-inf"))
        x = apply_log_softmax(x, lse, bs)
        if DEFER:
            x = _drop_deferred(x, slot_succ_ptr, beam[:, None] * K + col[None, :], ok)
    if PRUNE:
        ok = ok & (x > float("-inf")) & (x >= tl.load(thr_ptr + req))
    # padding cells get the padding key: below every real key, never output
    keys = tl.reshape(tl.where(ok, _pack_keys(x, r[:, None] * K + col[None, :]), _PAD_KEY),
                      [ROWS * BLOCK_C])
    if FINAL:
        o = tl.arange(0, BLOCK_OUT)
        _gather_store(tl.topk(keys, BLOCK_OUT), o >= 0, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                      out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                      prev_ptr, next_ptr, level, EXTEND, LP)
    else:
        dst = top_ptr + (req * tl.num_programs(1) + c) * BLOCK_OUT
        if PRUNE:
            _store_survivors(keys, dst, BLOCK_OUT)
        else:
            tl.store(dst + tl.arange(0, BLOCK_OUT), tl.topk(keys, BLOCK_OUT))


@triton.jit
def _row_stats_kernel(x_ptr, beam_scores_ptr, lse_ptr, best_ptr, slot_succ_ptr, n_rows, K,
                      NORMALIZE: tl.constexpr, DEFER: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                      N_CHUNKS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # per row: log-sum-exp of the valid slots and the row's best candidate score
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    m, s = row_lse_state(x_ptr, rows, row_ok, K, ROWS, BLOCK_K, N_CHUNKS)
    if NORMALIZE:
        lse = lse_finish(m, s)
        bs = tl.load(beam_scores_ptr + rows, mask=row_ok, other=float("-inf"))
        if DEFER:  # the best candidate, which no deferred slot is
            m = tl.full([ROWS], float("-inf"), tl.float32)
            for c in range(N_CHUNKS):
                cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
                ok = row_ok[:, None] & (cols < K)[None, :]
                x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=float("-inf"))
                x = _drop_deferred(x.to(tl.float32), slot_succ_ptr, rows[:, None] * K + cols[None, :], ok)
                m = tl.maximum(m, tl.max(x, axis=1))
        # the same expression the selection kernels apply to the row's maximum
        best = tl.reshape(apply_log_softmax(tl.reshape(m, [ROWS, 1]), lse, bs), [ROWS])
        tl.store(lse_ptr + rows, lse, mask=row_ok)
    else:
        best = m
    tl.store(best_ptr + rows, best, mask=row_ok)


@triton.jit
def _threshold_kernel(best_ptr, thr_ptr, Mb, M, BLOCK_MB: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # T = M-th largest row best of the request (-inf when fewer than M rows): at least
    # M candidates score >= T, so nothing below T can be among the top M
    req = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_MB)
    best = tl.load(best_ptr + req * Mb + r, mask=r < Mb, other=float("-inf"))
    ranked = tl.sort(best, descending=True)
    thr = tl.max(tl.where(r == M - 1, ranked, float("-inf")), axis=0)
    tl.store(thr_ptr + req, thr)


@triton.jit
def _slot_keys_kernel(x_ptr, beam_scores_ptr, keys_ptr, slot_succ_ptr, n_rows, Mb, K,
                      NORMALIZE: tl.constexpr, DEFER: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                      N_CHUNKS: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    if NORMALIZE:
        m, s = row_lse_state(x_ptr, rows, row_ok, K, ROWS, BLOCK_K, N_CHUNKS)
        lse = lse_finish(m, s)
        bs = tl.load(beam_scores_ptr + rows, mask=row_ok, other=float("-inf"))
    # position of slot (row, col) inside its request
    base = (rows % Mb) * K
    for c in range(N_CHUNKS):
        cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
        ok = row_ok[:, None] & (cols < K)[None, :]
        x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok,
                    other=float("-inf")).to(tl.float32)
        if NORMALIZE:
            x = apply_log_softmax(x, lse, bs)
            if DEFER:
                x = _drop_deferred(x, slot_succ_ptr, rows[:, None] * K + cols[None, :], ok)
        tl.store(keys_ptr + rows[:, None] * K + cols[None, :],
                 _pack_keys(x, base[:, None] + cols[None, :]), mask=ok)


@triton.jit
def _gather_kernel(top_ptr, n_top, slot_tok_ptr, slot_succ_ptr,
                   out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                   prev_ptr, next_ptr, level, Mb, K, M,
                   BLOCK_OUT: tl.constexpr, EXTEND: tl.constexpr, LP: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # one program per request; ranks >= n_top (fewer candidates than M) are padding
    req = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK_OUT)
    key = tl.load(top_ptr + req * n_top + o, mask=o < n_top, other=0)
    _gather_store(key, o < n_top, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                  out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                  prev_ptr, next_ptr, level, EXTEND, LP)


@triton.jit
def _chunk_topk_kernel(keys_ptr, L, top_ptr, slot_tok_ptr, slot_succ_ptr,
                       out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                       prev_ptr, next_ptr, level, Mb, K, M,
                       CHUNK: tl.constexpr, BLOCK_OUT: tl.constexpr, FINAL: tl.constexpr,
                       PRUNE: tl.constexpr, EXTEND: tl.constexpr, LP: tl.constexpr, PDL: tl.constexpr):
    pdl_prologue(PDL)
    # program (req, c): top BLOCK_OUT of keys [c * CHUNK, (c + 1) * CHUNK) of row req
    # (row length L, rows contiguous); FINAL (one chunk per row) decodes and gathers
    req = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    n_chunks = tl.num_programs(1).to(tl.int64)
    i = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(keys_ptr + req * L + i, mask=i < L, other=_PAD_KEY)
    o = tl.arange(0, BLOCK_OUT)
    if FINAL:
        _gather_store(tl.topk(x, BLOCK_OUT), o >= 0, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                      out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                      prev_ptr, next_ptr, level, EXTEND, LP)
    else:
        dst = top_ptr + (req * n_chunks + c) * BLOCK_OUT
        if PRUNE:  # only survivors of the threshold are live here
            _store_survivors(x, dst, BLOCK_OUT)
        else:
            tl.store(dst + o, tl.topk(x, BLOCK_OUT))


def _warps(tile: int) -> int:
    return 4 if tile <= 1024 else (8 if tile <= 4096 else 16)


def topk_gather_triton(scores: torch.Tensor, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                       batch: int, beam_width: int, *, beam_scores: torch.Tensor | None = None,
                       path: str | None = None, out=None, prefixes=None, deferred: bool = False) -> TopkOut:
    """Triton launcher of :func:`topk_gather` (same signature and outputs)."""
    res = _prepare(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores, path, out, prefixes, deferred)
    n_beams, K = scores.shape
    mb = n_beams // batch
    dev = scores.device
    block_m, block_k, block_out = small_tile(mb, K, beam_width)
    tile = block_m * block_k
    if path is None:
        path = "small" if tile <= SMALL_AUTO_MAX else "wide"
    normalize = beam_scores is not None
    bs = beam_scores if normalize else scores
    # prefix extension arguments of every gathering kernel (dummies when not fused)
    prev, nxt = prefixes if prefixes is not None else (res.parents, res.parents)
    level = prev.shape[2] if prefixes is not None else 0
    ext = dict(EXTEND=prefixes is not None, LP=max(2, next_pow2(level + 1)))
    gather_args = (slot_tokens, slot_succ, *res, prev, nxt, level, mb, K, beam_width)
    pdl = pdl_args(dev)
    if path == "small":
        if tile > SMALL_MAX:
            raise ValueError(f"small path: padded tile {block_m}x{block_k} exceeds {SMALL_MAX}")
        _rows_topk_kernel[(batch, 1)](
            scores, bs, res.scores, res.scores, res.scores, *gather_args, NORMALIZE=normalize, DEFER=deferred,
            ROWS=block_m,
            BLOCK_C=block_k, N_COL=1, BLOCK_OUT=block_out, FINAL=True, PRUNE=False, **ext,
            num_warps=_warps(tile), **pdl)
        return res
    if path in ("split", "prune"):
        prune = path == "prune"
        lse = thr = res.scores  # dummies unless pruning
        if prune:
            lse = torch.empty(n_beams, dtype=torch.float32, device=dev)
            best = torch.empty(n_beams, dtype=torch.float32, device=dev)
            thr = torch.empty(batch, dtype=torch.float32, device=dev)
            rows, kb, n_chunks = row_tiling(n_beams, K)
            _row_stats_kernel[(cdiv(n_beams, rows),)](
                scores, bs, lse, best, slot_succ, n_beams, K, NORMALIZE=normalize, DEFER=deferred, ROWS=rows,
                BLOCK_K=kb,
                N_CHUNKS=n_chunks, num_warps=4, **pdl)
            _threshold_kernel[(batch,)](best, thr, mb, beam_width, BLOCK_MB=max(2, next_pow2(mb)),
                                        num_warps=4, **pdl)
        rows, block_c, n_col, n_first = split_first_stage(mb, K, beam_width)
        final = n_first == 1
        keys = res.scores if final else torch.empty(batch, n_first * block_out, dtype=torch.int64, device=dev)
        _rows_topk_kernel[(batch, n_first)](
            scores, bs, keys, lse, thr, *gather_args, NORMALIZE=normalize, DEFER=deferred, ROWS=rows, BLOCK_C=block_c,
            N_COL=n_col, BLOCK_OUT=block_out, FINAL=final, PRUNE=prune, **ext, num_warps=_warps(rows * block_c), **pdl)
        if final:
            return res
        length = n_first * block_out
        chunk, block_out, stages = split_plan(length, beam_width)
        for n in stages:
            final = n == 1
            top = keys if final else torch.empty(batch, n * block_out, dtype=torch.int64, device=dev)
            _chunk_topk_kernel[(batch, n)](
                keys, length, top, *gather_args, CHUNK=chunk, BLOCK_OUT=block_out, FINAL=final, PRUNE=prune,
                **ext, num_warps=_warps(chunk), **pdl)
            keys, length = top, n * block_out
        return res
    keys = torch.empty(n_beams, K, dtype=torch.int64, device=dev)
    rows, kb, n_chunks = row_tiling(n_beams, K)
    _slot_keys_kernel[(cdiv(n_beams, rows),)](
        scores, bs, keys, slot_succ, n_beams, mb, K,
        NORMALIZE=normalize, DEFER=deferred, ROWS=rows, BLOCK_K=kb, N_CHUNKS=n_chunks, num_warps=4, **pdl)
    n_top = min(beam_width, mb * K)
    top = torch.topk(keys.view(batch, mb * K), n_top, dim=1, largest=True, sorted=True).values
    _gather_kernel[(batch,)](
        top, n_top, *gather_args, BLOCK_OUT=block_out, **ext, num_warps=4 if block_out <= 512 else 8, **pdl)
    return res


def topk_gather_reference(scores: torch.Tensor, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                          batch: int, beam_width: int, *, beam_scores: torch.Tensor | None = None,
                          path: str | None = None, out=None, prefixes=None, deferred: bool = False) -> TopkOut:
    """Pure-PyTorch reference of :func:`topk_gather` (same signature and outputs).

    A stable descending sort implements the tie order; ``path`` is checked and ignored.
    """
    res = _prepare(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores, path, out, prefixes, deferred)
    n_beams, K = scores.shape
    mb = n_beams // batch
    if beam_scores is not None:
        scores = log_softmax_slots_reference(scores, beam_scores)
        if deferred:
            scores = scores.masked_fill(slot_succ < -1, float("-inf"))
    flat = scores.float().view(batch, mb * K)
    # torch's sort ranks NaN above everything: it would take the place of finite candidates
    flat = torch.nan_to_num(flat, nan=float("-inf"), posinf=float("inf"), neginf=float("-inf"))
    val, pos = torch.sort(flat, dim=1, descending=True, stable=True)
    n_top = min(beam_width, mb * K)
    val, pos = val[:, :n_top], pos[:, :n_top]
    valid = val > float("-inf")
    req = torch.arange(batch, device=scores.device)[:, None]
    parent = req * mb + pos // K
    slot = pos % K
    pad = beam_width - n_top
    fill = torch.nn.functional.pad
    res.scores.copy_(fill(torch.where(valid, val, float("-inf")), (0, pad), value=float("-inf")))
    res.parents.copy_(fill(torch.where(valid, parent, -1), (0, pad), value=-1))
    res.tokens.copy_(fill(torch.where(valid, slot_tokens[parent, slot], -1), (0, pad), value=-1))
    res.succ.copy_(fill(torch.where(valid, slot_succ[parent, slot], -1), (0, pad), value=-1))
    if prefixes is not None:
        extend_prefixes(prefixes[0], prefixes[1], res)
    return res


def topk_gather(scores: torch.Tensor, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                batch: int, beam_width: int, *, beam_scores: torch.Tensor | None = None,
                path: str | None = None, out=None, prefixes=None, deferred: bool = False) -> TopkOut:
    """Select the top ``beam_width`` candidates of each request and gather their beams.

    Runs the Triton kernels for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation on the Triton path (the wide path
    allocates an ``(n_beams, K)`` int64 key buffer, split and prune one smaller buffer per
    stage and prune its row statistics, from the caching allocator, which CUDA-graph
    capture supports).

    Parameters
    ----------
    scores : torch.Tensor
        ``(n_beams, K)`` float32 (or float16/bfloat16) contiguous candidate scores, -inf
        on invalid slots, ``n_beams = batch * Mb``. With ``beam_scores``: raw slot
        logits, normalised first as by :func:`zerogr_kernels.log_softmax_slots`.
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32 slot tokens from :func:`zerogr_kernels.filter_slots`.
    slot_succ : torch.Tensor
        ``(n_beams, K)`` int64 slot successor states from :func:`zerogr_kernels.filter_slots`.
    batch : int
        Number of requests; must divide ``n_beams``.
    beam_width : int
        ``M``, the number of beams kept per request (may differ from ``Mb``).
    beam_scores : torch.Tensor, optional
        ``(n_beams,)`` float32 accumulated beam scores; fuses the normalisation.
    path : {None, "small", "wide", "split", "prune"}
        Kernel choice; ``None`` picks ``"small"`` when the padded tile
        (:func:`small_tile`) holds at most ``SMALL_AUTO_MAX`` candidates, else
        ``"wide"`` (never ``"split"`` or ``"prune"``; the engine's planner times them all).
    out : tuple of torch.Tensor, optional
        Preallocated contiguous outputs in :class:`TopkOut` order.
    prefixes : tuple of torch.Tensor, optional
        ``(prev, next)``: int64 contiguous ``(batch, Mb, l)`` prefixes of the step's beams
        and the ``(batch, M, l + 1)`` buffer that receives the next step's prefixes, as
        :func:`extend_prefixes` writes them (fused into the gather on the Triton path).
    deferred : bool
        With ``beam_scores``: slots whose ``slot_succ`` is below -1 count in their row's
        log-sum-exp but are never selected (catalog-normalised lists, module docstring).

    Returns
    -------
    TopkOut
        ``(scores, parents, tokens, succ)``, each ``(batch, M)``; see :class:`TopkOut`.
    """
    fn = topk_gather_triton if use_triton(scores) else topk_gather_reference
    return fn(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores=beam_scores,
              path=path, out=out, prefixes=prefixes, deferred=deferred)
