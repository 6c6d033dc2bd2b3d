"""Selection and gather: top-M candidates per request and their next beams.

Step 4 of the filtering-first decoding step (DESIGN.md section 4). Request ``r`` owns
beams ``r * Mb .. r * Mb + Mb - 1`` (``Mb = n_beams // batch``) and their ``Mb * K``
slots; flat position ``p`` of a request is slot ``p % K`` of beam
``r * Mb + p // K``. The ``M = beam_width`` best positions become the next beams.

Order: higher score first, ties broken by the lower flat position. -0.0 and +0.0 tie.
Candidates with score -inf are never selected: when a request has fewer than ``M``
finite candidates the tail is padded with score -inf, parent -1, token -1, succ -1.
Inputs must not hold NaN.

Three paths give bit-identical outputs:

- ``"small"``: one program per request loads all ``Mb * K`` candidates, packs each into
  an int64 key ``(order-preserving score bits << 32) + (2**31 - 1 - p)`` (unique keys, so
  the order above is plain integer order), selects the top keys with ``tl.topk``
  (bitonic, ``O(n log^2 M)``) and gathers. Used when the padded tile fits
  (``SMALL_AUTO_MAX`` candidates by default, at most ``SMALL_MAX``).
- ``"wide"``: a Triton kernel writes the keys, ``torch.topk`` selects per request
  (radix select on CUDA, one CTA per request row), and a small Triton kernel decodes
  and gathers.
- ``"split"``: the same key kernel, then a chunked tournament: a grid of
  ``(batch, n_chunks)`` programs each keeps the top keys of ``CHUNK`` consecutive keys
  of its request (``tl.topk``), shrinking each row by a factor ``CHUNK / BLOCK_OUT``,
  repeated until a row fits one chunk, whose single program selects the final top keys
  and gathers. Fills the GPU when a request has many candidates and ``batch`` is small,
  where ``"wide"`` (one CTA per request) and ``"small"`` (one program per request)
  are latency-bound. The number of stages depends only on the shapes, so it is
  CUDA-graph capturable. Never chosen by ``path=None``; the engine's planner picks it
  by timing.

With ``beam_scores`` the op takes raw slot logits and fuses the normalisation of
:mod:`kernels.normalize` into the key computation (all paths).
"""
from __future__ import annotations

from typing import NamedTuple

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_out, check_tensor, next_pow2, use_triton
from .normalize import (apply_log_softmax, log_softmax_slots_reference, lse_finish,
                                lse_update, row_tiling)

SMALL_AUTO_MAX = 8192
"""Largest padded candidate tile for which ``path=None`` picks the small kernel."""
SMALL_MAX = 16384
"""Largest padded candidate tile the small kernel accepts."""

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


class TopkOut(NamedTuple):
    """Outputs of :func:`topk_gather` (also the layout of its ``out=`` tuple).

    Attributes
    ----------
    scores : torch.Tensor
        ``(batch, M)`` float32 scores, best first; -inf for padding.
    parents : torch.Tensor
        ``(batch, M)`` int64 absolute parent beam (``r * Mb + p // K``); -1 for padding.
    tokens : torch.Tensor
        ``(batch, M)`` int32 next token ``slot_tokens[parent, p % K]``; -1 for padding.
    succ : torch.Tensor
        ``(batch, M)`` int64 next state ``slot_succ[parent, p % K]``; -1 for padding.
    """

    scores: torch.Tensor
    parents: torch.Tensor
    tokens: torch.Tensor
    succ: torch.Tensor


def small_tile(beams_per_request: int, K: int, beam_width: int) -> tuple[int, int, int]:
    """``(BLOCK_M, BLOCK_K, BLOCK_OUT)`` of the small kernel; ``BLOCK_M * BLOCK_K`` is the
    padded candidate tile compared with ``SMALL_AUTO_MAX`` / ``SMALL_MAX``."""
    block_k = next_pow2(K)
    # tl.topk cannot select a single element; rank 1 is then masked off
    block_out = max(2, next_pow2(beam_width))
    block_m = max(next_pow2(beams_per_request), next_pow2(cdiv(block_out, block_k)))
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


def _prepare(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores, path, out) -> TopkOut:
    check_tensor("scores", scores, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    n_beams, K = scores.shape
    device = scores.device
    check_tensor("slot_tokens", slot_tokens, dtypes=(torch.int32,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    check_tensor("slot_succ", slot_succ, dtypes=(torch.int64,), ndim=2, device=device,
                 shape=(n_beams, K), contiguous=True)
    if beam_scores is not None:
        check_tensor("beam_scores", beam_scores, dtypes=(torch.float32,), ndim=1, device=device,
                     shape=(n_beams,), contiguous=True)
    if not isinstance(batch, int) or batch < 1 or n_beams % batch:
        raise ValueError(f"batch={batch!r} must be a positive int dividing n_beams={n_beams}")
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ValueError(f"beam_width must be a positive int, got {beam_width!r}")
    if K < 1 or (n_beams // batch) * K >= 2**31:
        raise ValueError(f"need 1 <= beams_per_request * K < 2**31, got K={K}")
    if path not in (None, "small", "wide", "split"):
        raise ValueError(f"path must be None, 'small', 'wide' or 'split', got {path!r}")
    specs = [("scores", (batch, beam_width), torch.float32, device),
             ("parents", (batch, beam_width), torch.int64, device),
             ("tokens", (batch, beam_width), torch.int32, device),
             ("succ", (batch, beam_width), torch.int64, device)]
    if out is None:
        return TopkOut(*(torch.empty(shape, dtype=dtype, device=device) for _, shape, dtype, _ in specs))
    check_out(out, specs)
    return TopkOut(*out)


@triton.jit
def _pack_keys(x, pos):
    """int64 keys of float32 scores ``x`` at request positions ``pos`` (< 2**31):
    integer order = (score descending, position ascending) order."""
    # -0.0 must tie with +0.0 as in a float sort
    bits = tl.where(x == 0.0, 0.0, x).to(tl.int32, bitcast=True)
    hi = tl.where(bits >= 0, bits, bits ^ 0x7FFFFFFF)
    return (hi.to(tl.int64) << 32) + (2147483647 - pos).to(tl.int64)


@triton.jit
def _gather_store(key, valid, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                  out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr):
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


@triton.jit
def _topk_small_kernel(scores_ptr, beam_scores_ptr, slot_tok_ptr, slot_succ_ptr,
                       out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                       Mb, K, M,
                       NORMALIZE: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_K: tl.constexpr,
                       BLOCK_OUT: tl.constexpr):
    # one program per request: its (Mb, K) candidates fit one (BLOCK_M, BLOCK_K) tile
    req = tl.program_id(0).to(tl.int64)
    r = tl.arange(0, BLOCK_M)
    c = tl.arange(0, BLOCK_K)
    beam = req * Mb + r
    ok = (r < Mb)[:, None] & (c < K)[None, :]
    x = tl.load(scores_ptr + beam[:, None] * K + c[None, :], mask=ok,
                other=float("-inf")).to(tl.float32)
    if NORMALIZE:
        m, s = lse_update(tl.full([BLOCK_M], float("-inf"), tl.float32),
                          tl.zeros([BLOCK_M], tl.float32), x)
        bs = tl.load(beam_scores_ptr + beam, mask=r < Mb, other=float("-inf"))
        x = apply_log_softmax(x, lse_finish(m, s), bs)
    # padding cells are -inf, so their (possibly repeated) positions are never output
    keys = _pack_keys(x, r[:, None] * K + c[None, :])
    top = tl.topk(tl.reshape(keys, [BLOCK_M * BLOCK_K]), BLOCK_OUT)
    o = tl.arange(0, BLOCK_OUT)
    _gather_store(top, o >= 0, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                  out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr)


@triton.jit
def _slot_keys_kernel(x_ptr, beam_scores_ptr, keys_ptr, n_rows, Mb, K,
                      NORMALIZE: tl.constexpr, ROWS: tl.constexpr, BLOCK_K: tl.constexpr,
                      N_CHUNKS: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    row_ok = rows < n_rows
    if NORMALIZE:
        m = tl.full([ROWS], float("-inf"), tl.float32)
        s = tl.zeros([ROWS], tl.float32)
        for c in range(N_CHUNKS):
            cols = c * BLOCK_K + tl.arange(0, BLOCK_K)
            ok = row_ok[:, None] & (cols < K)[None, :]
            x = tl.load(x_ptr + rows[:, None] * K + cols[None, :], mask=ok, other=float("-inf"))
            m, s = lse_update(m, s, x.to(tl.float32))
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
        tl.store(keys_ptr + rows[:, None] * K + cols[None, :],
                 _pack_keys(x, base[:, None] + cols[None, :]), mask=ok)


@triton.jit
def _gather_kernel(top_ptr, n_top, slot_tok_ptr, slot_succ_ptr,
                   out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                   Mb, K, M, BLOCK_OUT: tl.constexpr):
    # one program per request; ranks >= n_top (fewer candidates than M) are padding
    req = tl.program_id(0).to(tl.int64)
    o = tl.arange(0, BLOCK_OUT)
    key = tl.load(top_ptr + req * n_top + o, mask=o < n_top, other=0)
    _gather_store(key, o < n_top, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                  out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr)


@triton.jit
def _chunk_topk_kernel(keys_ptr, L, top_ptr, slot_tok_ptr, slot_succ_ptr,
                       out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr,
                       Mb, K, M, CHUNK: tl.constexpr, BLOCK_OUT: tl.constexpr,
                       FINAL: tl.constexpr):
    # program (req, c): top BLOCK_OUT of keys [c * CHUNK, (c + 1) * CHUNK) of row req
    # (row length L, rows contiguous); FINAL (one chunk per row) decodes and gathers
    req = tl.program_id(0).to(tl.int64)
    c = tl.program_id(1).to(tl.int64)
    n_chunks = tl.num_programs(1).to(tl.int64)
    i = c * CHUNK + tl.arange(0, CHUNK)
    x = tl.load(keys_ptr + req * L + i, mask=i < L, other=_PAD_KEY)
    top = tl.topk(x, BLOCK_OUT)
    o = tl.arange(0, BLOCK_OUT)
    if FINAL:
        _gather_store(top, o >= 0, o, req, M, Mb, K, slot_tok_ptr, slot_succ_ptr,
                      out_score_ptr, out_parent_ptr, out_tok_ptr, out_succ_ptr)
    else:
        tl.store(top_ptr + (req * n_chunks + c) * BLOCK_OUT + o, top)


def topk_gather_triton(scores: torch.Tensor, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                       batch: int, beam_width: int, *, beam_scores: torch.Tensor | None = None,
                       path: str | None = None, out=None) -> TopkOut:
    """Triton launcher of :func:`topk_gather` (same signature and outputs)."""
    res = _prepare(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores, path, out)
    n_beams, K = scores.shape
    mb = n_beams // batch
    block_m, block_k, block_out = small_tile(mb, K, beam_width)
    tile = block_m * block_k
    if path is None:
        path = "small" if tile <= SMALL_AUTO_MAX else "wide"
    normalize = beam_scores is not None
    bs = beam_scores if normalize else scores
    if path == "small":
        if tile > SMALL_MAX:
            raise ValueError(f"small path: padded tile {block_m}x{block_k} exceeds {SMALL_MAX}")
        _topk_small_kernel[(batch,)](
            scores, bs, slot_tokens, slot_succ, *res, mb, K, beam_width,
            NORMALIZE=normalize, BLOCK_M=block_m, BLOCK_K=block_k, BLOCK_OUT=block_out,
            num_warps=4 if tile <= 1024 else (8 if tile <= 4096 else 16))
        return res
    keys = torch.empty(n_beams, K, dtype=torch.int64, device=scores.device)
    rows, kb, n_chunks = row_tiling(n_beams, K)
    _slot_keys_kernel[(cdiv(n_beams, rows),)](
        scores, bs, keys, n_beams, mb, K,
        NORMALIZE=normalize, ROWS=rows, BLOCK_K=kb, N_CHUNKS=n_chunks, num_warps=4)
    if path == "split":
        chunk, block_out, stages = split_plan(mb * K, beam_width)
        length = mb * K
        warps = 4 if chunk <= 1024 else (8 if chunk <= 4096 else 16)
        for n in stages:
            final = n == 1
            top = keys if final else torch.empty(batch, n * block_out, dtype=torch.int64,
                                                 device=scores.device)
            _chunk_topk_kernel[(batch, n)](
                keys, length, top, slot_tokens, slot_succ, *res, mb, K, beam_width,
                CHUNK=chunk, BLOCK_OUT=block_out, FINAL=final, num_warps=warps)
            keys, length = top, n * block_out
        return res
    n_top = min(beam_width, mb * K)
    top = torch.topk(keys.view(batch, mb * K), n_top, dim=1, largest=True, sorted=True).values
    _gather_kernel[(batch,)](
        top, n_top, slot_tokens, slot_succ, *res, mb, K, beam_width,
        BLOCK_OUT=block_out, num_warps=4 if block_out <= 512 else 8)
    return res


def topk_gather_reference(scores: torch.Tensor, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                          batch: int, beam_width: int, *, beam_scores: torch.Tensor | None = None,
                          path: str | None = None, out=None) -> TopkOut:
    """Pure-PyTorch reference of :func:`topk_gather` (same signature and outputs).

    A stable descending sort implements the tie order; ``path`` is checked and ignored.
    """
    res = _prepare(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores, path, out)
    n_beams, K = scores.shape
    mb = n_beams // batch
    if beam_scores is not None:
        scores = log_softmax_slots_reference(scores, beam_scores)
    flat = scores.float().view(batch, mb * K)
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
    return res


def topk_gather(scores: torch.Tensor, slot_tokens: torch.Tensor, slot_succ: torch.Tensor,
                batch: int, beam_width: int, *, beam_scores: torch.Tensor | None = None,
                path: str | None = None, out=None) -> TopkOut:
    """Select the top ``beam_width`` candidates of each request and gather their beams.

    Runs the Triton kernels for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation on the Triton path (the wide and split
    paths allocate an ``(n_beams, K)`` int64 key buffer, and split one smaller buffer
    per stage, from the caching allocator, which CUDA-graph capture supports).

    Parameters
    ----------
    scores : torch.Tensor
        ``(n_beams, K)`` float32 (or float16/bfloat16) contiguous candidate scores, -inf
        on invalid slots, ``n_beams = batch * Mb``. With ``beam_scores``: raw slot
        logits, normalised first as by :func:`kernels.log_softmax_slots`.
    slot_tokens : torch.Tensor
        ``(n_beams, K)`` int32 slot tokens from :func:`kernels.filter_slots`.
    slot_succ : torch.Tensor
        ``(n_beams, K)`` int64 slot successor states from :func:`kernels.filter_slots`.
    batch : int
        Number of requests; must divide ``n_beams``.
    beam_width : int
        ``M``, the number of beams kept per request (may differ from ``Mb``).
    beam_scores : torch.Tensor, optional
        ``(n_beams,)`` float32 accumulated beam scores; fuses the normalisation.
    path : {None, "small", "wide", "split"}
        Kernel choice; ``None`` picks ``"small"`` when the padded tile
        (:func:`small_tile`) holds at most ``SMALL_AUTO_MAX`` candidates, else
        ``"wide"`` (never ``"split"``; the engine's planner times all three).
    out : tuple of torch.Tensor, optional
        Preallocated contiguous outputs in :class:`TopkOut` order.

    Returns
    -------
    TopkOut
        ``(scores, parents, tokens, succ)``, each ``(batch, M)``; see :class:`TopkOut`.
    """
    fn = topk_gather_triton if use_triton(scores) else topk_gather_reference
    return fn(scores, slot_tokens, slot_succ, batch, beam_width, beam_scores=beam_scores,
              path=path, out=out)
