"""Decoder self-attention of one new position per beam over a beam-search cache read through ancestors.

A beam decoder's self-attention cache must follow each beam's parent. Reordering it
moves every cached key and value at every step (read, gather, write back), which at
beam 128 costs more than the attention itself. Here nothing moves: step ``j`` writes its
queries, keys and values in its own rows, ``qkv[j]``, and ``ancestors[j, r]`` says which
row of step ``j`` is the ancestor of the current beam ``r``. The query at position
``step`` attends over the ``step + 1`` positions of its own lineage, reading each key and
value once, in place, with a float32 softmax. With at most L ≤ a few positions a softmax
in registers beats a cuBLAS batched GEMV, which is what ``scaled_dot_product_attention``
becomes for one query.

The attention is unscaled (T5's) plus an additive bias per head and key position (T5's
relative position bias of the query position).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, use_triton

TILE = 2048
"""Target (rows × head width) elements per program."""


@triton.jit
def _cached_attention_kernel(qkv_ptr, anc_ptr, bias_ptr, out_ptr, n, rows_max, D, HD, L_BIAS,
                             STEP: tl.constexpr, ROWS: tl.constexpr, BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    head = tl.program_id(1)
    cols = head * D + tl.arange(0, BLOCK_D)
    row_ok = rows < n
    ok = row_ok[:, None] & (tl.arange(0, BLOCK_D) < D)[None, :]
    width = 3 * HD
    q = tl.load(qkv_ptr + (STEP * rows_max + rows)[:, None] * width + cols[None, :], mask=ok, other=0.0)
    q = q.to(tl.float32)
    m = tl.full([ROWS], float("-inf"), tl.float32)
    s = tl.zeros([ROWS], tl.float32)
    acc = tl.zeros([ROWS, BLOCK_D], tl.float32)
    for j in tl.static_range(STEP + 1):
        if j == STEP:
            src = rows
        else:
            src = tl.load(anc_ptr + j * rows_max + rows, mask=row_ok, other=0)
        at = (j * rows_max + src)[:, None] * width + cols[None, :]
        k = tl.load(qkv_ptr + at + HD, mask=ok, other=0.0).to(tl.float32)
        v = tl.load(qkv_ptr + at + 2 * HD, mask=ok, other=0.0).to(tl.float32)
        score = tl.sum(q * k, axis=1) + tl.load(bias_ptr + head * L_BIAS + j)
        m_new = tl.maximum(m, score)
        alpha = tl.exp(m - m_new)
        p = tl.exp(score - m_new)
        s = s * alpha + p
        acc = acc * alpha[:, None] + p[:, None] * v
        m = m_new
    out = acc / s[:, None]
    tl.store(out_ptr + rows[:, None] * HD + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=ok)


def _check(qkv, ancestors, bias, step, n, heads, out) -> int:
    check_tensor("qkv", qkv, dtypes=FLOAT_DTYPES, ndim=3, contiguous=True)
    n_pos, rows_max, width = qkv.shape
    if heads < 1 or width % (3 * heads):
        raise ValueError(f"qkv: last dimension {width} is not 3 · heads · d for heads={heads}")
    if not 0 <= step < n_pos:
        raise ValueError(f"step {step} outside the cache's {n_pos} positions")
    if not 0 <= n <= rows_max:
        raise ValueError(f"n {n} outside the cache's {rows_max} rows")
    check_tensor("ancestors", ancestors, dtypes=(torch.int64,), ndim=2, device=qkv.device, shape=(n_pos, rows_max),
                 contiguous=True)
    check_tensor("bias", bias, dtypes=(torch.float32,), ndim=2, device=qkv.device, shape=(heads, None),
                 contiguous=True)
    if bias.shape[1] <= step:
        raise ValueError(f"bias: {bias.shape[1]} key positions, step {step} needs {step + 1}")
    hd = width // 3
    if out is not None:
        check_tensor("out", out, dtypes=(qkv.dtype,), ndim=2, device=qkv.device, shape=(n, hd), contiguous=True)
    return hd // heads


def cached_self_attention_triton(qkv, ancestors, bias, *, step: int, n: int, heads: int, out=None):
    """Triton launcher of :func:`cached_self_attention` (same signature and output)."""
    d = _check(qkv, ancestors, bias, step, n, heads, out)
    rows_max = qkv.shape[1]
    if out is None:
        out = torch.empty(n, heads * d, dtype=qkv.dtype, device=qkv.device)
    if n:
        block_d = next_pow2(d)
        rows = min(next_pow2(n), max(1, TILE // block_d))
        _cached_attention_kernel[(cdiv(n, rows), heads)](
            qkv, ancestors, bias, out, n, rows_max, d, heads * d, bias.shape[1],
            STEP=step, ROWS=rows, BLOCK_D=block_d, num_warps=4)
    return out


def cached_self_attention_reference(qkv, ancestors, bias, *, step: int, n: int, heads: int, out=None):
    """Pure-PyTorch reference of :func:`cached_self_attention` (same signature and output)."""
    d = _check(qkv, ancestors, bias, step, n, heads, out)
    hd = heads * d
    own = torch.arange(n, device=qkv.device)
    src = torch.cat([ancestors[:step, :n], own[None]])                         # (S, n)
    lineage = qkv[torch.arange(step + 1, device=qkv.device)[:, None], src]     # (S, n, 3 · heads · d)
    q = qkv[step, :n, :hd].reshape(n, heads, d).float()
    k = lineage[..., hd:2 * hd].reshape(step + 1, n, heads, d).float()
    v = lineage[..., 2 * hd:].reshape(step + 1, n, heads, d).float()
    scores = (q[None] * k).sum(-1) + bias[:, :step + 1].T[:, None, :]       # (S, n, heads)
    p = torch.softmax(scores, dim=0)
    y = (p[..., None] * v).sum(0).reshape(n, hd).to(qkv.dtype)
    return y if out is None else out.copy_(y)


def cached_self_attention(qkv, ancestors, bias, *, step: int, n: int, heads: int, out=None):
    """One query position per beam attending over its lineage in a cache that never moves.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    qkv : torch.Tensor, shape (L, rows_max, 3 · heads · d), float16, bfloat16 or float32, contiguous
        ``qkv[j, r]`` holds the query, key and value (heads concatenated, in that order) of
        row ``r`` of step ``j``. Steps ``0 … step`` must be written.
    ancestors : torch.Tensor, shape (L, rows_max), int64, contiguous
        ``ancestors[j, r]``, for ``j < step``, the row of step ``j`` that beam ``r`` of step
        ``step`` descends from (valid rows only). Later rows are not read.
    bias : torch.Tensor, shape (heads, ≥ step + 1), float32, contiguous
        Added to the score of each head and key position.
    step : int
        The query position; it attends over positions ``0 … step``.
    n : int
        Rows of step ``step`` to compute.
    heads : int
    out : torch.Tensor, shape (n, heads · d), qkv's dtype, optional
        Written in place when given.

    Returns
    -------
    torch.Tensor, shape (n, heads · d), qkv's dtype
        ``softmax(q · k + bias) · v`` per head (unscaled), softmax and sums in float32.
    """
    fn = cached_self_attention_triton if use_triton(qkv) else cached_self_attention_reference
    return fn(qkv, ancestors, bias, step=step, n=n, heads=heads, out=out)
