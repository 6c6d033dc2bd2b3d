"""Each row's sum of squares, added in the order eager PyTorch adds them on a GPU.

A bf16 model's RMS norm rounds ``x · rsqrt(mean(x²) + eps)`` to bf16. A float32 sum of the
same squares taken in another order differs in its last bits for many rows, and then a few
normed elements per layer round the other way. Through a few dozen layers those ulps spread
to most of the hidden state (on the Qwen3-1.7B shape, 95 % of the final hidden state's
elements differed from Hugging Face's forward, with tree-ordered sums and the q/k kernel's
contraction below), and with random weights the best items' scores are close enough for
that to change the top item of many requests (81.7 % of 60 agreed with Hugging Face's
decode, 91.7 % since). So the norms of a model whose decode must match Hugging Face's sum in
the order of ``x.float().pow(2).mean(-1)`` on a CUDA device. ATen's reduction kernel gives
each row 32 threads of a warp (rows of a multiple of 128 float32 elements, many rows), reads
the row in vectors of 4, and thread ``t`` keeps four running sums, sum ``i`` over elements
``128 k + 4 t + i`` for k = 0, 1, …; it adds them as ``((s0 + s1) + s2) + s3``, and the warp
adds its 32 values by shuffles at distances 16, 8, 4, 2, 1.

:func:`eager_order` says whether a row width is summed in that order here (a multiple of
128); other widths keep Triton's tree (:func:`sum_squares`). Of candidate orders, this one
alone matched torch 2.11's sums bit for bit on an H100, at 128, 1,024 and 2,048 elements
(``python runs/probe_norm_bits.py``, ``runs/results/llm/session-2026-12-06g/``). A kernel
that calls :func:`sum_squares` compiles with ``enable_fp_fusion=False``: contracted into
multiply-adds, float32 squares would not be rounded before they are added, as torch rounds them.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import cdiv, check_tensor, next_pow2, use_triton

LANES = 32
"""Threads of the warp that reduces one row in ATen's kernel."""
VEC = 4
"""float32 elements per vector load of a row wider than 128."""


HALVES = 3
"""The ``EAGER`` code of a kernel that holds each row of 128 elements as its two halves of 64 in
registers and sums them with :func:`halves_sum_squares`: ``qk_norm_rope``'s choice for heads of 128,
since nothing is loaded again (on an H100 it took 3.76 µs a call at 1,000 rows against 8.53 µs for
the lanes layout and 4.20 µs for Triton's tree, `python runs/probe_norm_bits.py`,
``runs/results/llm/session-2026-12-06h/``)."""

IMPL: int | None = None
"""Overrides every launcher's choice of :func:`sum_squares` code (a probe's A/B; None: each its own).
:data:`HALVES` overrides only the launchers that offer it."""


def eager_order(d: int) -> bool:
    """Whether rows of ``d`` elements are summed in eager PyTorch's order (see the module)."""
    return d >= LANES * VEC and d % (LANES * VEC) == 0


def order_of(d: int, layout: int, halves: bool = False) -> int:
    """The ``EAGER`` argument of :func:`sum_squares` for rows of ``d`` elements: ``layout`` (the
    same additions, laid out for one row per program's heads (1) or for rows of a tile (2)) where
    :func:`eager_order` holds, else 0. ``halves``: the launcher sums rows of 128 from the two
    halves it holds (:data:`HALVES`) unless :data:`IMPL` chooses another code."""
    if not eager_order(d):
        return 0
    halves = halves and d == LANES * VEC
    if IMPL is None:
        return HALVES if halves else layout
    return layout if IMPL == HALVES and not halves else IMPL


@triton.jit
def _halves(v, ROWS: tl.constexpr, HALF: tl.constexpr):
    """(ROWS, 2 HALF) -> (ROWS, HALF): lane l plus lane l + HALF."""
    a, b = tl.split(tl.permute(tl.reshape(v, (ROWS, 2, HALF)), (0, 2, 1)))
    return a + b


@triton.jit
def _lanes_sum(v, ROWS: tl.constexpr):
    """(ROWS, 32) -> (ROWS,): lanes 16 apart first, then 8, 4, 2, 1, as a warp's shuffle-down
    reduction ends in its first lane."""
    v = _halves(_halves(_halves(_halves(_halves(v, ROWS, 16), ROWS, 8), ROWS, 4), ROWS, 2), ROWS, 1)
    return tl.reshape(v, (ROWS,))


@triton.jit
def _vector_sums(sq, ROWS: tl.constexpr, THREADS: tl.constexpr):
    """(ROWS, 4 THREADS) or (ROWS, THREADS, 4) -> (ROWS, THREADS): each thread's vector of 4 added
    as ``((s0 + s1) + s2) + s3``."""
    e0, e1 = tl.split(tl.reshape(sq, (ROWS, THREADS, 2, 2)))     # i = 0, 2 and i = 1, 3
    s0, s2 = tl.split(e0)
    s1, s3 = tl.split(e1)
    return ((s0 + s1) + s2) + s3


@triton.jit
def halves_sum_squares(lo, hi, ROWS: tl.constexpr):
    """Sums of squares (ROWS,) float32, in eager PyTorch's order, of rows of 128 elements held in
    registers as their halves ``lo`` and ``hi`` (ROWS, 64) float32. In that order thread t's
    vector is elements 4 t … 4 t + 3, so ``lo`` holds threads 0–15 and ``hi`` threads 16–31, and
    the warp's first shuffle (distance 16) adds ``lo``'s thread t to ``hi``'s: no element is
    loaded again and no lane moves before that add."""
    v = tl.reshape(_vector_sums(lo * lo, ROWS, 16) + _vector_sums(hi * hi, ROWS, 16), (ROWS, 2, 2, 2, 2))
    # thread t = 8 b + 4 c + 2 d + e: then distances 8, 4, 2, 1
    return tl.sum(tl.sum(tl.sum(tl.sum(v, axis=1), axis=1), axis=1), axis=1)


@triton.jit
def _square_at(x_ptr, res_ptr, at, ok, HAS_RES: tl.constexpr):
    """The squares of the elements at ``at`` (float32; 0 where not ``ok``), of ``x + res``
    rounded to x's dtype when ``HAS_RES`` (the eager residual add)."""
    x = tl.load(x_ptr + at, mask=ok, other=0.0)
    if HAS_RES:
        x = (x.to(tl.float32) + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
    xf = x.to(tl.float32)
    return xf * xf


@triton.jit
def sum_squares(x_ptr, res_ptr, base, ok_rows, D, HAS_RES: tl.constexpr, EAGER: tl.constexpr,
                ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    """Sums of squares (ROWS,) float32 of the rows starting at ``x_ptr + base`` (base: (ROWS,)
    int64, rows where ``ok_rows``), each of ``D`` contiguous elements; with ``res_ptr`` added
    first when ``HAS_RES`` (the same offsets). ``EAGER`` 1 or 2: in eager PyTorch's order (D must
    pass :func:`eager_order`), laid out as (ROWS, 32) lanes or as (ROWS, 32, 4) tiles; 0: Triton's
    tree over a (ROWS, BLOCK_D) tile (a caller that holds the row already sums it itself)."""
    if EAGER == 2:
        # (thread t, lane i of its vector) holds elements 128 k + 4 t + i, added k after k
        tv = tl.arange(0, 32)[:, None] * 4 + tl.arange(0, 4)[None, :]
        acc = tl.zeros((ROWS, 32, 4), dtype=tl.float32)
        for k in tl.static_range(BLOCK_D // 128):
            at = base[:, None, None] + (128 * k + tv)[None, :, :]
            ok = ok_rows[:, None, None] & ((128 * k + tv) < D)[None, :, :]
            acc += _square_at(x_ptr, res_ptr, at, ok, HAS_RES)
        # thread t = 16 a + 8 b + 4 c + 2 d + e: the warp adds a's pairs first, then b's, …
        v = tl.reshape(_vector_sums(acc, ROWS, 32), (ROWS, 2, 2, 2, 2, 2))
        v = tl.sum(tl.sum(tl.sum(tl.sum(tl.sum(v, axis=1), axis=1), axis=1), axis=1), axis=1)
        return v
    elif EAGER == 1:
        # vectors of 4: running sum i of thread t holds elements 128 k + 4 t + i
        lane = tl.arange(0, 32)
        s0 = tl.zeros((ROWS, 32), dtype=tl.float32)
        s1 = tl.zeros((ROWS, 32), dtype=tl.float32)
        s2 = tl.zeros((ROWS, 32), dtype=tl.float32)
        s3 = tl.zeros((ROWS, 32), dtype=tl.float32)
        for k in tl.static_range(BLOCK_D // 128):
            at = base[:, None] + (128 * k + 4 * lane)[None, :]
            ok = ok_rows[:, None] & ((128 * k + 4 * lane) < D)[None, :]
            s0 += _square_at(x_ptr, res_ptr, at, ok, HAS_RES)
            s1 += _square_at(x_ptr, res_ptr, at + 1, ok, HAS_RES)
            s2 += _square_at(x_ptr, res_ptr, at + 2, ok, HAS_RES)
            s3 += _square_at(x_ptr, res_ptr, at + 3, ok, HAS_RES)
        return _lanes_sum(((s0 + s1) + s2) + s3, ROWS)
    else:
        cols = tl.arange(0, BLOCK_D)
        at = base[:, None] + cols[None, :]
        sq = _square_at(x_ptr, res_ptr, at, ok_rows[:, None] & (cols < D)[None, :], HAS_RES)
        return tl.sum(sq, axis=1)


@triton.jit
def _row_sum_squares_kernel(x_ptr, out_ptr, n_rows, D, EAGER: tl.constexpr, ROWS: tl.constexpr,
                            BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    ok = rows < n_rows
    s = sum_squares(x_ptr, x_ptr, rows * D, ok, D, False, EAGER, ROWS, BLOCK_D)
    tl.store(out_ptr + rows, s, mask=ok)


def _check(x) -> None:
    check_tensor("x", x, dtypes=(torch.float16, torch.bfloat16, torch.float32), ndim=2, contiguous=True)


def row_sum_squares_triton(x: torch.Tensor) -> torch.Tensor:
    """Triton launcher of :func:`row_sum_squares` (same signature and output)."""
    _check(x)
    n, d = x.shape
    out = torch.empty(n, dtype=torch.float32, device=x.device)
    if n and d:
        rows = 4
        _row_sum_squares_kernel[(cdiv(n, rows),)](x, out, n, d, EAGER=order_of(d, 2), ROWS=rows,
                                                  BLOCK_D=next_pow2(d), num_warps=4, enable_fp_fusion=False)
    elif n:
        out.zero_()
    return out


def _lanes_sum_reference(v: torch.Tensor) -> torch.Tensor:
    while v.shape[-1] > 1:
        half = v.shape[-1] // 2
        v = v[..., :half] + v[..., half:]
    return v[..., 0]


def row_sum_squares_reference(x: torch.Tensor) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`row_sum_squares`: the same additions, one tensor
    operation each (so one rounding each, on any device); where :func:`eager_order` is false,
    ``x.float().pow(2).sum(-1)``."""
    _check(x)
    n, d = x.shape
    sq = x.to(torch.float32).pow(2)
    if not eager_order(d):
        return sq.sum(-1)
    parts = sq.view(n, d // 128, LANES, VEC)      # [k, thread, i]: element 128 k + 4 t + i
    s = parts[:, 0]
    for k in range(1, d // 128):
        s = s + parts[:, k]
    return _lanes_sum_reference(((s[..., 0] + s[..., 1]) + s[..., 2]) + s[..., 3])


def row_sum_squares(x: torch.Tensor) -> torch.Tensor:
    """Each row's sum of squares in float32, added in eager PyTorch's CUDA order where
    :func:`eager_order` holds for the row width.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference.

    Parameters
    ----------
    x : torch.Tensor, shape (n, d), float16, bfloat16 or float32, contiguous

    Returns
    -------
    torch.Tensor, shape (n,), float32
    """
    fn = row_sum_squares_triton if use_triton(x) else row_sum_squares_reference
    return fn(x)
