"""T5's RMS layer norm, optionally fused with the residual add that precedes it.

Hugging Face's ``T5LayerNorm`` computes the variance of ``x`` in float32, scales ``x`` by
``rsqrt(variance + eps)`` (float32), rounds to the weight's dtype when the weight is
float16 or bfloat16, and multiplies by the weight. In eager PyTorch that is five or six
kernels per call; a T5 decoder step calls it three times per layer, so at decode sizes the
launches, not the arithmetic, dominate. :func:`rms_layer_norm` does it in one kernel and,
given ``residual``, also adds the residual first (``x + residual`` rounded to ``x``'s
dtype, as the eager add) and returns that sum, which is the next residual stream. The
variance's sum is added in eager PyTorch's order where the row width allows
(:mod:`zerogr_kernels.row_sums`), so on a GPU the kernel rounds as the eager norm does.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, next_pow2, use_triton
from .row_sums import order_of, sum_squares

MAX_WIDTH = 16384
"""Widest row the kernel holds in one block (T5 models stop at d_model 1024)."""
TILE = 2048
"""Target elements per program: narrow rows share a program."""
MANY_ROWS = 1024
"""From this many rows of 2,048 summed in eager order, a program takes 4 rows with 8 warps rather
than one with 4: on an H100, 4.83 against 5.31 µs a call at 1,000 rows with a residual, but 3.40
against 2.53 µs at 256, where its 64 programs leave SMs idle (`python runs/probe_norm_bits.py`,
``runs/results/llm/session-2026-12-06h/``)."""


@triton.jit
def _rms_norm_kernel(x_ptr, res_ptr, w_ptr, out_ptr, sum_ptr, n_rows, D, inv_d, eps,
                     HAS_RES: tl.constexpr, ROUND_W: tl.constexpr, EAGER: tl.constexpr, ROWS: tl.constexpr,
                     BLOCK_D: tl.constexpr):
    rows = tl.program_id(0).to(tl.int64) * ROWS + tl.arange(0, ROWS)
    cols = tl.arange(0, BLOCK_D)
    ok = (rows < n_rows)[:, None] & (cols < D)[None, :]
    at = rows[:, None] * D + cols[None, :]
    x = tl.load(x_ptr + at, mask=ok, other=0.0)
    if HAS_RES:
        # the eager residual add rounds to the stream's dtype before the norm reads it
        x = (x.to(tl.float32) + tl.load(res_ptr + at, mask=ok, other=0.0).to(tl.float32)).to(x.dtype)
        tl.store(sum_ptr + at, x, mask=ok)
    xf = x.to(tl.float32)
    if EAGER:  # torch's order (each element reloaded where the order wants it)
        ss = sum_squares(x_ptr, res_ptr, rows * D, rows < n_rows, D, HAS_RES, EAGER, ROWS, BLOCK_D)
    else:
        ss = tl.sum(xf * xf, axis=1)
    # the mean as torch takes it: the sum times 1/D in float32
    var = ss * inv_d
    y = xf * tl.math.rsqrt(var + eps)[:, None]
    w = tl.load(w_ptr + cols, mask=cols < D, other=0.0)
    if ROUND_W:
        y = y.to(w.dtype).to(tl.float32)
    y = w.to(tl.float32)[None, :] * y
    tl.store(out_ptr + at, y.to(out_ptr.dtype.element_ty), mask=ok)


def out_dtype(weight: torch.Tensor) -> torch.dtype:
    """Output dtype of T5's norm: the weight's when it is half precision, else float32."""
    return weight.dtype if weight.dtype in (torch.float16, torch.bfloat16) else torch.float32


def _check(x, weight, residual) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    n, d = x.shape
    if d < 1:
        raise ValueError("x needs at least one column")
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, ndim=1, device=x.device, shape=(d,), contiguous=True)
    if residual is not None:
        check_tensor("residual", residual, dtypes=(x.dtype,), ndim=2, device=x.device, shape=(n, d),
                     contiguous=True)


def rms_layer_norm_triton(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """Triton launcher of :func:`rms_layer_norm` (same signature and outputs)."""
    _check(x, weight, residual)
    n, d = x.shape
    if d > MAX_WIDTH:
        raise ValueError(f"x: rows of {d} columns exceed the kernel's {MAX_WIDTH}; use rms_layer_norm_reference")
    out = torch.empty(n, d, dtype=out_dtype(weight), device=x.device)
    total = torch.empty_like(x) if residual is not None else None
    if n:
        block_d = next_pow2(d)
        eager = order_of(d, 2)
        rows = 4 if eager and d == TILE and n >= MANY_ROWS else min(next_pow2(n), max(1, TILE // block_d))
        _rms_norm_kernel[(cdiv(n, rows),)](
            x, residual if residual is not None else x, weight, out, total if total is not None else out, n, d,
            1.0 / d, float(eps), HAS_RES=residual is not None, ROUND_W=weight.dtype in (torch.float16, torch.bfloat16),
            EAGER=eager, ROWS=rows, BLOCK_D=block_d, num_warps=4 if block_d * rows <= 4096 else 8,
            enable_fp_fusion=False)
    return out if residual is None else (out, total)


def rms_layer_norm_reference(x: torch.Tensor, weight: torch.Tensor, eps: float,
                             residual: torch.Tensor | None = None):
    """Pure-PyTorch reference of :func:`rms_layer_norm` (Hugging Face's ``T5LayerNorm``)."""
    _check(x, weight, residual)
    if residual is not None:
        x = x + residual
    variance = x.to(torch.float32).pow(2).mean(-1, keepdim=True)
    y = x * torch.rsqrt(variance + eps)
    if weight.dtype in (torch.float16, torch.bfloat16):
        y = y.to(weight.dtype)
    out = weight * y
    return out if residual is None else (out, x)


def rms_layer_norm(x: torch.Tensor, weight: torch.Tensor, eps: float, residual: torch.Tensor | None = None):
    """T5's RMS layer norm of each row, after an optional residual add.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    x : torch.Tensor, shape (n, d), float16, bfloat16 or float32, contiguous
    weight : torch.Tensor, shape (d,), float16, bfloat16 or float32
    eps : float
        Added to the variance (``T5LayerNorm.variance_epsilon``).
    residual : torch.Tensor, shape (n, d), x's dtype, optional
        Added to ``x`` first (in ``x``'s dtype) when given.

    Returns
    -------
    torch.Tensor, shape (n, d)
        The normed rows, in :func:`out_dtype` of the weight. With ``residual``, the tuple
        ``(normed, x + residual)``, the sum in ``x``'s dtype.
    """
    fn = rms_layer_norm_triton if use_triton(x) else rms_layer_norm_reference
    return fn(x, weight, eps, residual)
