"""Cross-attention of every beam of a request over that request's one encoder memory.

The ``M`` beams of a request share its encoder memory, so their queries attend over the
same keys and values: per request and head, one (M × T) attention. The keys and values
stay where the projection wrote them, (batch, T, heads · d) rows, and each program loads
one tile of them for a block of queries, with an online float32 softmax over key blocks.
At decode sizes (T of tens of tokens, d 64) this is a few microseconds of memory traffic,
far below the general-purpose attention kernels, which pay for layouts, masks and
setup sized for long sequences.

The attention is unscaled (T5's) plus an additive bias, broadcast over (request, head,
query, key): the padding mask of the cross-attention (0 on tokens, a large negative number
on padding), or the encoder's relative position bias with the mask folded in, since the
same kernel serves T5's encoder self-attention (M = T, queries of one sequence).
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
                              sq_b, sq_m, sk_b, sk_t, sv_b, sv_t, sb_b, sb_h, sb_m, sb_t,
                              BLOCK_M: tl.constexpr, BLOCK_T: tl.constexpr, BLOCK_D: tl.constexpr,
                              N_T_BLOCKS: tl.constexpr, PRECISION: tl.constexpr, UPCAST: tl.constexpr):
    req = tl.program_id(1).to(tl.int64)
    head = tl.program_id(2)
    qi = tl.program_id(0) * BLOCK_M + tl.arange(0, BLOCK_M)
    dd = tl.arange(0, BLOCK_D)
    cols = head * D + dd
    q_ok = (qi < M)[:, None] & (dd < D)[None, :]
    q = tl.load(q_ptr + req * sq_b + qi[:, None] * sq_m + cols[None, :], mask=q_ok, other=0.0)
    if UPCAST:
        q = q.to(tl.float32)
    bias_rows = bias_ptr + req * sb_b + head * sb_h + qi[:, None] * sb_m
    m = tl.full([BLOCK_M], float("-inf"), tl.float32)
    s = tl.zeros([BLOCK_M], tl.float32)
    acc = tl.zeros([BLOCK_M, BLOCK_D], tl.float32)
    for tb in range(N_T_BLOCKS):
        t = tb * BLOCK_T + tl.arange(0, BLOCK_T)
        t_ok = t < T
        k = tl.load(k_ptr + req * sk_b + t[None, :] * sk_t + cols[:, None], mask=t_ok[None, :] & (dd < D)[:, None],
                    other=0.0)
        if UPCAST:
            k = k.to(tl.float32)
        score = tl.dot(q, k, input_precision=PRECISION)
        bias = tl.load(bias_rows + t[None, :] * sb_t, mask=(qi < M)[:, None] & t_ok[None, :], other=float("-inf"))
        score = score + bias.to(tl.float32)
        m_new = tl.maximum(m, tl.max(score, axis=1))
        # rows past M see only -inf; a finite reference keeps them free of NaN
        ref = tl.where(m_new == float("-inf"), 0.0, m_new)
        alpha = tl.exp(m - ref)
        p = tl.exp(score - ref[:, None])
        s = s * alpha + tl.sum(p, axis=1)
        v = tl.load(v_ptr + req * sv_b + t[:, None] * sv_t + cols[None, :], mask=t_ok[:, None] & (dd < D)[None, :],
                    other=0.0)
        pv = p.to(v.dtype)
        if UPCAST:
            pv, v = pv.to(tl.float32), v.to(tl.float32)
        acc = acc * alpha[:, None] + tl.dot(pv, v, input_precision=PRECISION)
        m = m_new
    out = acc / tl.where(s > 0.0, s, 1.0)[:, None]
    tl.store(out_ptr + (req * M + qi)[:, None] * HD + cols[None, :], out.to(out_ptr.dtype.element_ty), mask=q_ok)


def _rows(name, x, dtypes, shape, device=None) -> None:
    check_tensor(name, x, dtypes=dtypes, ndim=len(shape), device=device, shape=shape)
    if x.stride(-1) != 1:
        raise ValueError(f"{name} must have unit stride in its last dimension")


def _check(q, k, v, bias, heads, out) -> int:
    _rows("q", q, FLOAT_DTYPES, (None, None, None))
    b, m, hd = q.shape
    if heads < 1 or hd % heads:
        raise ValueError(f"q: last dimension {hd} is not heads · d for heads={heads}")
    _rows("k", k, (q.dtype,), (b, None, hd), q.device)
    t = k.shape[1]
    if t < 1:
        raise ValueError("k: needs at least one key position")
    _rows("v", v, (q.dtype,), (b, t, hd), q.device)
    check_tensor("bias", bias, dtypes=FLOAT_DTYPES, ndim=4, device=q.device)
    try:
        torch.broadcast_shapes(bias.shape, (b, heads, m, t))
    except RuntimeError:
        raise ValueError(f"bias: shape {tuple(bias.shape)} does not broadcast to (batch, heads, M, T) = "
                         f"{(b, heads, m, t)}") from None
    if torch.broadcast_shapes(bias.shape, (b, heads, m, t)) != (b, heads, m, t):
        raise ValueError(f"bias: shape {tuple(bias.shape)} is larger than (batch, heads, M, T) = {(b, heads, m, t)}")
    if out is not None:
        check_tensor("out", out, dtypes=(q.dtype,), ndim=3, device=q.device, shape=(b, m, hd), contiguous=True)
    return hd // heads


def request_attention_triton(q, k, v, bias, *, heads: int, out=None):
    """Triton launcher of :func:`request_attention` (same signature and output)."""
    d = _check(q, k, v, bias, heads, out)
    b, m, hd = q.shape
    t = k.shape[1]
    if out is None:
        out = torch.empty(b, m, hd, dtype=q.dtype, device=q.device)
    if b and m:
        bias = bias.expand(b, heads, m, t)
        # tl.dot needs every dimension ≥ 16; masked lanes load zeros
        block_m, block_t = min(BLOCK_MAX, max(16, next_pow2(m))), min(BLOCK_MAX, max(16, next_pow2(t)))
        # float32 products stay IEEE unless PyTorch's own float32 matmuls may use TF32
        tf32 = q.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
        _request_attention_kernel[(cdiv(m, block_m), b, heads)](
            q, k, v, bias, out, m, t, hd, d, q.stride(0), q.stride(1), k.stride(0), k.stride(1), v.stride(0),
            v.stride(1), *bias.stride(), BLOCK_M=block_m, BLOCK_T=block_t, BLOCK_D=max(16, next_pow2(d)),
            N_T_BLOCKS=cdiv(t, block_t), PRECISION="tf32" if tf32 else "ieee",
            # the interpreter's tl.dot garbles bfloat16 operands; their float32 copies give the same products
            UPCAST=interpreting() and q.dtype == torch.bfloat16, num_warps=4)
    return out


def request_attention_reference(q, k, v, bias, *, heads: int, out=None):
    """Pure-PyTorch reference of :func:`request_attention` (same signature and output)."""
    d = _check(q, k, v, bias, heads, out)
    b, m, hd = q.shape
    t = k.shape[1]
    split = lambda x, n: x.reshape(b, n, heads, d).transpose(1, 2)           # noqa: E731  (b, heads, n, d)
    scores = torch.matmul(split(q, m).float(), split(k, t).float().transpose(-1, -2)) + bias.float()
    p = torch.softmax(scores, dim=-1).to(q.dtype)
    y = torch.matmul(p, split(v, t)).transpose(1, 2).reshape(b, m, hd)
    return y if out is None else out.copy_(y)


def request_attention(q, k, v, bias, *, heads: int, out=None):
    """Unscaled attention of a request's ``M`` queries over its own ``T`` keys and values.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    q : torch.Tensor, shape (batch, M, heads · d), float16, bfloat16 or float32
        The queries of each request's beams, heads concatenated; any strides but a unit
        last one (e.g. a slice of a fused QKV projection).
    k, v : torch.Tensor, shape (batch, T, heads · d), q's dtype, unit last stride
        Each request's keys and values.
    bias : torch.Tensor, 4-D float, broadcastable to (batch, heads, M, T)
        Added to the scores: e.g. (batch, 1, 1, T), a padding mask, or (batch, heads, M,
        T), a position bias with the mask folded in.
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
