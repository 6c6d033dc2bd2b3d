"""Qwen3's per-head RMS norm of queries and keys, then the rotary embedding, in one kernel.

Hugging Face's Qwen3 attention normalises every query and key head (``q_norm``,
``k_norm``: float32 variance, the normed row rounded to the input dtype, times the weight)
and then rotates it (``q * cos + rotate_half(q) * sin``, each product and the sum rounded
to the dtype). In eager PyTorch that is about a dozen kernels per layer; at decode sizes
(a few hundred rows) their launches, not their bytes, cost the time.
:func:`qk_norm_rope` does both, for the queries and the keys of a token, in one program
and with the same roundings.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check_tensor, next_pow2, use_triton


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, HQ, HK, D, eps,
                         q_row, k_row, BLOCK_H: tl.constexpr, BLOCK_D: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_D)
    half = D // 2
    # rotate_half(x)[d] = -x[d + half] for d < half, x[d - half] after
    partner = tl.where(cols < half, cols + half, cols - half)
    sign = tl.where(cols < half, -1.0, 1.0)
    col_ok = cols < D
    cos = tl.load(cos_ptr + tok * D + cols, mask=col_ok, other=0.0).to(tl.float32)
    sin = tl.load(sin_ptr + tok * D + cols, mask=col_ok, other=0.0).to(tl.float32)
    is_k = heads >= HQ
    hq = tl.where(is_k, 0, heads)
    hk = tl.where(is_k, heads - HQ, 0)
    ok = (heads < HQ + HK)[:, None] & col_ok[None, :]
    q_ok = ok & (~is_k)[:, None]
    k_ok = ok & is_k[:, None]
    src_q = q_ptr + tok * q_row + hq[:, None] * D
    src_k = k_ptr + tok * k_row + hk[:, None] * D
    x = tl.where(is_k[:, None], tl.load(src_k + cols[None, :], mask=k_ok, other=0.0),
                 tl.load(src_q + cols[None, :], mask=q_ok, other=0.0))
    xp = tl.where(is_k[:, None], tl.load(src_k + partner[None, :], mask=k_ok, other=0.0),
                  tl.load(src_q + partner[None, :], mask=q_ok, other=0.0))
    w = tl.where(is_k[:, None], tl.load(kw_ptr + cols, mask=col_ok, other=0.0)[None, :],
                 tl.load(qw_ptr + cols, mask=col_ok, other=0.0)[None, :])
    wp = tl.where(is_k[:, None], tl.load(kw_ptr + partner, mask=col_ok, other=0.0)[None, :],
                  tl.load(qw_ptr + partner, mask=col_ok, other=0.0)[None, :])
    dt = x.dtype
    xf = x.to(tl.float32)
    r = tl.math.rsqrt(tl.sum(xf * xf, axis=1) / D + eps)[:, None]
    # the eager roundings: normed row to the dtype, times the weight, each rotary product, the sum
    y = (w.to(tl.float32) * (xf * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    yp = (wp.to(tl.float32) * (xp.to(tl.float32) * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    a = (y * cos[None, :]).to(dt).to(tl.float32)
    b = (sign[None, :] * yp * sin[None, :]).to(dt).to(tl.float32)
    out = (a + b).to(dt)
    tl.store(qo_ptr + tok * HQ * D + hq[:, None] * D + cols[None, :], out, mask=q_ok)
    tl.store(ko_ptr + tok * HK * D + hk[:, None] * D + cols[None, :], out, mask=k_ok)


def _rows_of_heads(name: str, t) -> None:
    """Each row's heads must be contiguous; rows may be strided (a view into a fused QKV output)."""
    n, h, d = t.shape
    if (d > 1 and t.stride(2) != 1) or (h > 1 and t.stride(1) != d) or (n > 1 and t.stride(0) < h * d):
        raise ValueError(f"{name}: each row's (heads, head_dim) must be contiguous, got strides {tuple(t.stride())}")


def _check(q, k, q_weight, k_weight, cos, sin) -> None:
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3)
    n, _, d = q.shape
    if d % 2:
        raise ValueError(f"q: head_dim must be even for the rotary embedding, got {d}")
    check_tensor("k", k, dtypes=(q.dtype,), ndim=3, device=q.device)
    _rows_of_heads("q", q)
    _rows_of_heads("k", k)
    if k.shape[0] != n or k.shape[2] != d:
        raise ValueError(f"k: shape {tuple(k.shape)} does not match q's {tuple(q.shape)}")
    for name, w in (("q_weight", q_weight), ("k_weight", k_weight)):
        check_tensor(name, w, dtypes=(q.dtype,), ndim=1, device=q.device, shape=(d,), contiguous=True)
    for name, t in (("cos", cos), ("sin", sin)):
        check_tensor(name, t, dtypes=(q.dtype,), ndim=2, device=q.device, shape=(n, d), contiguous=True)


def qk_norm_rope_triton(q, k, q_weight, k_weight, eps: float, cos, sin):
    """Triton launcher of :func:`qk_norm_rope` (same signature and outputs)."""
    _check(q, k, q_weight, k_weight, cos, sin)
    n, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    k_out = torch.empty(k.shape, dtype=k.dtype, device=k.device)
    if n:
        block_h, block_d = next_pow2(hq + hk), next_pow2(d)
        _qk_norm_rope_kernel[(n,)](q, k, q_weight, k_weight, cos, sin, q_out, k_out, hq, hk, d, float(eps),
                                   q.stride(0), k.stride(0), BLOCK_H=block_h, BLOCK_D=block_d, num_warps=4 if block_h * block_d <= 2048 else 8)
    return q_out, k_out


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def qk_norm_rope_reference(q, k, q_weight, k_weight, eps: float, cos, sin):
    """Pure-PyTorch reference of :func:`qk_norm_rope` (Hugging Face's ``Qwen3RMSNorm`` and
    ``apply_rotary_pos_emb``, op for op)."""
    _check(q, k, q_weight, k_weight, cos, sin)
    out = []
    for x, w in ((q, q_weight), (k, k_weight)):
        xf = x.to(torch.float32)
        y = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        out.append(_rotate(y, cos[:, None], sin[:, None]))
    return out[0], out[1]


def qk_norm_rope(q, k, q_weight, k_weight, eps: float, cos, sin):
    """RMS norm of every query and key head, then the rotary embedding of its token.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    q : torch.Tensor, shape (n, heads, D), float16, bfloat16 or float32
        Each row's heads contiguous; rows may be strided (views into one fused QKV output).
    k : torch.Tensor, shape (n, kv_heads, D), q's dtype, laid out as ``q``
    q_weight, k_weight : torch.Tensor, shape (D,), q's dtype
        The norms' weights (``q_norm.weight``, ``k_norm.weight``).
    eps : float
        Added to the variance.
    cos, sin : torch.Tensor, shape (n, D), q's dtype
        The rotary embedding of each row's position (the model's rotary module's output).

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        New contiguous tensors shaped as ``q`` and ``k``.
    """
    fn = qk_norm_rope_triton if use_triton(q) else qk_norm_rope_reference
    return fn(q, k, q_weight, k_weight, eps, cos, sin)
