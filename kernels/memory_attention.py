"""Cross-attention of every beam of a request over that request's one encoder memory.

The ``M`` beams of a request share its encoder memory, so their queries attend over the
same keys and values: per request and head, one (M × T) attention. The keys and values
stay where the projection wrote them, (batch, T, heads · d) rows, and each program loads
one tile of them for a block of queries, with an online float32 softmax over key blocks.
At decode sizes (T of tens of tokens, d 64) this is a few microseconds of memory traffic,
far below the general-purpose attention kernels, which pay for layouts, masks and
setup sized for long sequences.

The attention is unscaled (T5's) plus an additive bias per request and key position (the
padding mask: 0 on tokens, a large negative number on padding).
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, interpreting, next_pow2, use_triton

BLOCK_MAX = 64
"""Most queries and most keys one program holds at a time."""


@triton.jit
def _request_attention_kernel(q_ptr, k_ptr, v_ptr, bias_ptr, out_ptr, M, T, HD, D,
                              BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                              N_T_BLOCKS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    req = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    qi = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    cols = head * D + dd
    q_ok = (qi < M)[:, None] & (dd < D)[None, :]
    q = tl.load(q_ptr + (req * M + qi)[:, None] * HD + cols[None, :], mask=q_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tb in range(N_T_BLOCKS):
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = t < T
        kv_rows = (req * T + t) * HD
        k = tl.load(k_ptr + kv_rows[None, :] + cols[:, None], mask=t_ok[None, :] & (dd < D)[:, None], other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        score = tl.dot(q, k, input_precision=PRECISION)
        bias = tl.load(bias_ptr + req * T + t, mask=t_ok, other=float("-inf")).to(tl.float32)
        score = score + bias[None, :]
        m_new = tl.maximum(m, tl.max(score, axis=1))
        alpha = tl.exp(m - m_new)
        p = tl.exp(score - m_new[:, None])
        s = s * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + kv_rows[:, None] + cols[None, :], mask=t_ok[:, None] & (dd < D)[None, :], other=0.0)
        pv = p.to(v.dtype)
        if UPCAST:
            pv, v = pv.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION)
        m = m_new
    out = acc / s[:, None]
    tl.store(out_ptr + (req * M + qi)[:, None] * HD + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=q_ok)


def _check(q, k, v, bias, heads, out) -> int:
    check_tensor("q", q, dtypes=FLOAT_DTYPES, ndim=3, contiguous=True)
    b, _, hd = q.shape
    if heads < 1 or hd % heads:
        raise ValueError(f"q: last dimension {hd} is not heads · d for heads={heads}")
    check_tensor("k", k, dtypes=(q.dtype,), ndim=3, device=q.device, shape=(b, None, hd), contiguous=True)
    t = k.shape[1]
    if t < 1:
        raise ValueError("k: needs at least one key position")
    check_tensor("v", v, dtypes=(q.dtype,), ndim=3, device=q.device, shape=(b, t, hd), contiguous=True)
    check_tensor("bias", bias, dtypes=FLOAT_DTYPES, ndim=2, device=q.device, shape=(b, t), contiguous=True)
    if out is not None:
        check_tensor("out", out, dtypes=(q.dtype,), ndim=3, device=q.device, shape=tuple(q.shape), contiguous=True)
    return hd // heads


def request_attention_triton(q, k, v, bias, *, heads: int, out=None):
    """Triton launcher of :func:`request_attention` (same signature and output)."""
    d = _check(q, k, v, bias, heads, out)
    b, m, hd = q.shape
    t = k.shape[1]
    if out is None:
        out = torch.empty_like(q)
    if b and m:
        # tl.dot needs every dimension ≥ 16; masked lanes load zeros
        block_m, block_t = min(BLOCK_MAX, max(16, next_pow2(m))), min(BLOCK_MAX, max(16, next_pow2(t)))
        # float32 products stay IEEE unless PyTorch's own float32 matmuls may use TF32
        tf32 = q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        _request_attention_kernel[(cdiv(m, block_m), b, heads)](
            q, k, v, bias, out, m, t, hd, d, BLOCK_M=block_m, BLOCK_T=block_t, BLOCK_D=max(16, next_pow2(d)),
            N_T_BLOCKS=cdiv(t, block_t), PRECISION="tf32" if tf32 else "ieee",
            # the interpreter's tl.dot garbles bfloat16 operands; their float32 copies give the same products
            UPCAST=interpreting() and q.dtype == torch.bfloat16, num_warps=4)
    return out


def request_attention_reference(q, k, v, bias, *, heads: int, out=None):
    """Pure-PyTorch reference of :func:`request_attention` (same signature and output)."""
    d = _check(q, k, v, bias, heads, out)
    b, m, hd = q.shape
    t = k.shape[1]
    split = lambda x, n: x.view(b, n, heads, d).transpose(1, 2)              # noqa: E731  (b, heads, n, d)
    scores = torch.matmul(split(q, m).float(), split(k, t).float().transpose(-1, -2)) + bias.float()[:, None, None, :]
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    y = torch.matmul(p, split(v, t)).transpose(1, 2).reshape(b, m, hd)
    return y if out is None else out.copy_(y)


def request_attention(q, k, v, bias, *, heads: int, out=None):
    """Unscaled attention of a request's ``M`` queries over its own ``T`` keys and values.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    q : torch.Tensor, shape (batch, M, heads · d), float16, bfloat16 or float32, contiguous
        The queries of each request's beams, heads concatenated.
    k, v : torch.Tensor, shape (batch, T, heads · d), q's dtype, contiguous
        Each request's keys and values.
    bias : torch.Tensor, shape (batch, T), float, contiguous
        Added to every score of a request's key position (its padding mask).
    heads : int
    out : torch.Tensor, shape (batch, M, heads · d), q's dtype, optional
        Written in place when given.

    Returns
    -------
    torch.Tensor, shape (batch, M, heads · d), q's dtype
        ``softmax(q · k + bias) · v`` per request and head; scores and softmax in float32,
        the probabilities rounded to q's dtype before they weight ``v`` (as Hugging Face's
        T5 does).
    """
    fn = request_attention_triton if use_triton(q) else request_attention_reference
    return fn(q, k, v, bias, heads=heads, out=out)
