"""Qwen3's per-head RMS norm of queries and keys, then the rotary embedding, in one kernel.

Hugging Face's Qwen3 attention normalises every query and key head (``q_norm``,
``k_norm``: float32 variance, the normed row rounded to the input dtype, times the weight)
and then rotates it (``q * cos + rotate_half(q) * sin``, each product and the sum rounded
to the dtype). In eager PyTorch that is about a dozen kernels per layer; at decode sizes
(a few hundred rows) their launches, not their bytes, cost the time.
:func:`qk_norm_rope` does both, for the queries and the keys of a token, in one program
and with the same roundings; on a GPU its outputs are the eager ops' bits. The norm's sum
adds in torch's order (:mod:`zerogr_kernels.row_sums`), and the kernel compiles without
floating-point contraction: with it the compiler turned a rotary product, which the eager ops
round to bf16 before the sum, and that sum into one bf16 multiply-add (``fma.rn.bf16``), and
14 % of the outputs differed in their last bit.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, check_tensor, next_pow2, use_triton
from .row_sums import halves_sum_squares, order_of, sum_squares


@triton.jit
def _norm_rotate_heads(x_ptr, w_ptr, out_ptr, tok, row, out_at, H, half, D, inv_d, eps, cos_lo, cos_hi, sin_lo,
                       sin_hi, EAGER: tl.constexpr, BLOCK_H: tl.constexpr, BLOCK_HALF: tl.constexpr):
    """One token's H heads: RMS norm, weight, rotation, each half of the head loaded once; the
    result goes to ``out_ptr + out_at`` (the token's heads contiguous there)."""
    heads = tl.arange(0, BLOCK_H)
    cols = tl.arange(0, BLOCK_HALF)
    ok = (heads < H)[:, None] & (cols < half)[None, :]
    at = heads[:, None] * D + cols[None, :]
    lo = tl.load(x_ptr + tok * row + at, mask=ok, other=0.0)
    hi = tl.load(x_ptr + tok * row + half + at, mask=ok, other=0.0)
    dt = lo.dtype
    lof, hif = lo.to(tl.float32), hi.to(tl.float32)
    if EAGER == 3:  # row_sums.HALVES: torch's order, from the halves as loaded
        ss = halves_sum_squares(lof, hif, BLOCK_H)
    elif EAGER:  # torch's order (each element reloaded where the order wants it)
        ss = sum_squares(x_ptr, x_ptr, tok * row + heads * D, heads < H, D, False, EAGER, BLOCK_H, 2 * BLOCK_HALF)
    else:
        ss = tl.sum(lof * lof, axis=1) + tl.sum(hif * hif, axis=1)
    # the mean as torch takes it: the sum times 1/D in float32
    r = tl.math.rsqrt(ss * inv_d + eps)[:, None]
    w_lo = tl.load(w_ptr + cols, mask=cols < half, other=0.0).to(tl.float32)[None, :]
    w_hi = tl.load(w_ptr + half + cols, mask=cols < half, other=0.0).to(tl.float32)[None, :]
    # the eager roundings: normed row to the dtype, times the weight, each rotary product, the sum
    y_lo = (w_lo * (lof * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    y_hi = (w_hi * (hif * r).to(dt).to(tl.float32)).to(dt).to(tl.float32)
    # rotate_half(y) = [-y_hi, y_lo]
    o_lo = (y_lo * cos_lo).to(dt).to(tl.float32) + (-(y_hi * sin_lo)).to(dt).to(tl.float32)
    o_hi = (y_hi * cos_hi).to(dt).to(tl.float32) + (y_lo * sin_hi).to(dt).to(tl.float32)
    out = out_ptr + out_at + at
    tl.store(out, o_lo.to(dt), mask=ok)
    tl.store(out + half, o_hi.to(dt), mask=ok)


@triton.jit
def _qk_norm_rope_kernel(q_ptr, k_ptr, v_ptr, qw_ptr, kw_ptr, cos_ptr, sin_ptr, qo_ptr, ko_ptr, vo_ptr, HQ, HK, D,
                         inv_d, eps, q_row, k_row, v_row, R, ko_s0, ko_s1, vo_s0, vo_s1, EAGER: tl.constexpr,
                         BLOCK_HQ: tl.constexpr,
                         BLOCK_HK: tl.constexpr, BLOCK_HALF: tl.constexpr, COPY_V: tl.constexpr,
                         BLOCK_KV: tl.constexpr):
    tok = tl.program_id(0).to(tl.int64)
    # key (and value) row ``tok`` lands at block tok // R, row tok % R of the destination (a cache)
    blk, sub = tok // R, tok % R
    half = D // 2
    cols = tl.arange(0, BLOCK_HALF)
    c_ok = cols < half
    cos_lo = tl.load(cos_ptr + tok * D + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    cos_hi = tl.load(cos_ptr + tok * D + half + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    sin_lo = tl.load(sin_ptr + tok * D + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    sin_hi = tl.load(sin_ptr + tok * D + half + cols, mask=c_ok, other=0.0).to(tl.float32)[None, :]
    _norm_rotate_heads(q_ptr, qw_ptr, qo_ptr, tok, q_row, tok * HQ * D, HQ, half, D, inv_d, eps, cos_lo, cos_hi, sin_lo,
                       sin_hi, EAGER, BLOCK_HQ, BLOCK_HALF)
    _norm_rotate_heads(k_ptr, kw_ptr, ko_ptr, tok, k_row, blk * ko_s0 + sub * ko_s1, HK, half, D, inv_d, eps, cos_lo, cos_hi,
                       sin_lo, sin_hi, EAGER, BLOCK_HK, BLOCK_HALF)
    if COPY_V:
        at = tl.arange(0, BLOCK_KV)
        ok = at < HK * D
        tl.store(vo_ptr + blk * vo_s0 + sub * vo_s1 + at, tl.load(v_ptr + tok * v_row + at, mask=ok), mask=ok)


def _rows_of_heads(name: str, t) -> None:
    """Each row's heads must be contiguous; rows may be strided (a view into a fused QKV output)."""
    n, h, d = t.shape
    if (d > 1 and t.stride(2) != 1) or (h > 1 and t.stride(1) != d) or (n > 1 and t.stride(0) < h * d):
        raise ValueError(f"{name}: each row's (heads, head_dim) must be contiguous, got strides {tuple(t.stride())}")


def _cache_rows(name: str, t, like) -> None:
    """A (blocks, rows, heads, D) destination of ``like``'s (n, heads, D) rows: blocks · rows = n,
    each row's heads contiguous, blocks and rows at any stride (views of a KV cache)."""
    check_tensor(name, t, dtypes=(like.dtype,), ndim=4, device=like.device)
    n, h, d = like.shape
    if t.shape[0] * t.shape[1] != n or tuple(t.shape[2:]) != (h, d):
        raise ValueError(f"{name}: shape {tuple(t.shape)} does not hold {n} rows of ({h}, {d})")
    if (d > 1 and t.stride(3) != 1) or (h > 1 and t.stride(2) != d):
        raise ValueError(f"{name}: each row's (heads, head_dim) must be contiguous, got strides {tuple(t.stride())}")


def _check(q, k, q_weight, k_weight, cos, sin, k_out=None, v=None, v_out=None) -> None:
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
    if k_out is not None:
        _cache_rows("k_out", k_out, k)
    if (v is None) != (v_out is None) or (v is not None and k_out is None):
        raise ValueError("v and v_out go together, and only with k_out")
    if v is not None:
        check_tensor("v", v, dtypes=(q.dtype,), ndim=3, device=q.device, shape=tuple(k.shape))
        _rows_of_heads("v", v)
        _cache_rows("v_out", v_out, k)
        if tuple(v_out.shape) != tuple(k_out.shape):
            raise ValueError(f"v_out: shape {tuple(v_out.shape)} differs from k_out's {tuple(k_out.shape)}")


def qk_norm_rope_triton(q, k, q_weight, k_weight, eps: float, cos, sin, *, k_out=None, v=None, v_out=None):
    """Triton launcher of :func:`qk_norm_rope` (same signature and outputs)."""
    _check(q, k, q_weight, k_weight, cos, sin, k_out, v, v_out)
    n, hq, d = q.shape
    hk = k.shape[1]
    q_out = torch.empty(q.shape, dtype=q.dtype, device=q.device)
    dst = k_out if k_out is not None else torch.empty((1,) + tuple(k.shape), dtype=k.dtype, device=k.device)
    copy_v = v is not None
    if n:
        block_half = next_pow2(d // 2)
        _qk_norm_rope_kernel[(n,)](q, k, v if copy_v else k, q_weight, k_weight, cos, sin, q_out, dst,
                                   v_out if copy_v else dst, hq, hk, d, 1.0 / d, float(eps), q.stride(0), k.stride(0),
                                   v.stride(0) if copy_v else 0, dst.shape[1], dst.stride(0), dst.stride(1),
                                   v_out.stride(0) if copy_v else 0, v_out.stride(1) if copy_v else 0,
                                   EAGER=order_of(d, 1, halves=True), BLOCK_HQ=next_pow2(hq), BLOCK_HK=next_pow2(hk), BLOCK_HALF=block_half,
                                   COPY_V=copy_v, BLOCK_KV=next_pow2(hk * d) if copy_v else 1,
                                   num_warps=4 if next_pow2(hq) * block_half <= 1024 else 8,
                                   enable_fp_fusion=False)
    return q_out, (k_out if k_out is not None else dst[0])


def _rotate(x, cos, sin):
    half = x.shape[-1] // 2
    return x * cos + torch.cat([-x[..., half:], x[..., :half]], dim=-1) * sin


def qk_norm_rope_reference(q, k, q_weight, k_weight, eps: float, cos, sin, *, k_out=None, v=None, v_out=None):
    """Pure-PyTorch reference of :func:`qk_norm_rope` (Hugging Face's ``Qwen3RMSNorm`` and
    ``apply_rotary_pos_emb``, op for op)."""
    _check(q, k, q_weight, k_weight, cos, sin, k_out, v, v_out)
    out = []
    for x, w in ((q, q_weight), (k, k_weight)):
        xf = x.to(torch.float32)
        y = w * (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).to(x.dtype)
        out.append(_rotate(y, cos[:, None], sin[:, None]))
    if k_out is None:
        return out[0], out[1]
    k_out.copy_(out[1].view(k_out.shape))
    if v is not None:
        v_out.copy_(v.view(v_out.shape))
    return out[0], k_out


def qk_norm_rope(q, k, q_weight, k_weight, eps: float, cos, sin, *, k_out=None, v=None, v_out=None):
    """RMS norm of every query and key head, then the rotary embedding of its token; optionally
    the keys and values written straight into a KV cache.

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
    k_out : torch.Tensor, shape (B, R, kv_heads, D), optional
        Where the rotated keys go, row ``i`` at ``[i // R, i % R]`` (B · R = n): a view of a
        KV cache, each row's heads contiguous, blocks and rows at any stride. Saves the copy
        of a new tensor into the cache.
    v, v_out : torch.Tensor, optional
        With ``k_out``: the values (n, kv_heads, D), laid out as ``k``, copied into ``v_out``
        (shaped as ``k_out``) in the same pass.

    Returns
    -------
    (torch.Tensor, torch.Tensor)
        A new contiguous tensor shaped as ``q``, and the keys: ``k_out`` if given, else a new
        contiguous tensor shaped as ``k``.
    """
    fn = qk_norm_rope_triton if use_triton(q) else qk_norm_rope_reference
    return fn(q, k, q_weight, k_weight, eps, cos, sin, k_out=k_out, v=v, v_out=v_out)
