"""Rows of activations quantized to float8 (e4m3) with one scale per row, for FP8 GEMMs.

An FP8 projection (``torch._scaled_mm`` with row-wise scales) multiplies float8 inputs and
float8 weights and applies ``scale_a[i] · scale_b[j]`` to output ``(i, j)``. The weights are
quantized once; the activations of every call are quantized here, in one pass per row: the
row's largest magnitude ``amax`` sets ``scale = amax / 448`` (448 is e4m3's largest finite
value), and each element becomes ``x / scale`` rounded to the nearest e4m3 value (the
division rounded, so the GPU kernel and the reference agree bit for bit). A row of zeros
gets a tiny scale and stays zero.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl

from ._common import FLOAT_DTYPES, cdiv, check_tensor, interpreting, next_pow2, use_triton

FP8_MAX = 448.0
"""Largest finite float8 e4m3 (``torch.float8_e4m3fn``) value."""
MIN_AMAX = 1e-12
"""Floor of a row's largest magnitude, so a row of zeros divides by a positive scale."""
BLOCK = 8192
"""Most columns a program holds at once; wider rows take two passes over their column blocks (a
kernel specialised per block count)."""


@triton.jit
def _quantize_rows_kernel(x_ptr, q_ptr, scale_ptr, K, x_stride, FP8_MAX: tl.constexpr, MIN_AMAX: tl.constexpr,
                          BLOCK: tl.constexpr, N_BLOCKS: tl.constexpr, RAW: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    src, dst = x_ptr + row * x_stride, q_ptr + row * K
    cols = tl.arange(0, BLOCK)
    if N_BLOCKS == 1:
        x = tl.load(src + cols, mask=cols < K, other=0.0).to(tl.float32)
        amax = tl.max(tl.abs(x), axis=0)
    else:
        amax = 0.0
        for b in range(N_BLOCKS):
            c0 = b * BLOCK
            xb = tl.load(src + c0 + cols, mask=c0 + cols < K, other=0.0).to(tl.float32)
            amax = tl.maximum(amax, tl.max(tl.abs(xb), axis=0))
    scale = tl.math.div_rn(tl.maximum(amax, MIN_AMAX), FP8_MAX)
    tl.store(scale_ptr + row, scale)
    if N_BLOCKS == 1:
        q = tl.math.div_rn(x, scale)
        # the interpreter's float8 cast truncates: it hands the scaled values to the launcher, which rounds
        tl.store(dst + cols, q if RAW else q.to(tl.float8e4nv), mask=cols < K)
    else:
        for b in range(N_BLOCKS):
            c0 = b * BLOCK
            q = tl.math.div_rn(tl.load(src + c0 + cols, mask=c0 + cols < K, other=0.0).to(tl.float32), scale)
            tl.store(dst + c0 + cols, q if RAW else q.to(tl.float8e4nv), mask=c0 + cols < K)


def _check(x) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2)
    if x.shape[1] > 1 and x.stride(1) != 1:
        raise ValueError(f"x: rows must be contiguous, got strides {tuple(x.stride())}")


def quantize_rows_triton(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Triton launcher of :func:`quantize_rows` (same signature and output)."""
    _check(x)
    n, k = x.shape
    raw = interpreting()
    q = torch.empty(n, k, dtype=torch.float32 if raw else torch.float8_e4m3fn, device=x.device)
    scale = torch.empty(n, 1, dtype=torch.float32, device=x.device)
    if n and k:
        block = min(next_pow2(k), BLOCK)
        _quantize_rows_kernel[(n,)](x, q, scale, k, x.stride(0), FP8_MAX=FP8_MAX, MIN_AMAX=MIN_AMAX, BLOCK=block,
                                    N_BLOCKS=cdiv(k, block), RAW=raw, num_warps=8 if block >= 4096 else 4)
    elif n:
        scale.fill_(MIN_AMAX).div_(FP8_MAX)
    return (q.to(torch.float8_e4m3fn) if raw else q), scale


def quantize_rows_reference(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Pure-PyTorch reference of :func:`quantize_rows` (same signature and output)."""
    _check(x)
    xf = x.float()
    amax = xf.abs().amax(dim=1, keepdim=True) if x.shape[1] else xf.new_zeros(x.shape[0], 1)
    # a tensor divisor: torch divides by a Python number on a GPU through its reciprocal, one unit off at times
    scale = amax.clamp(min=MIN_AMAX) / torch.full_like(amax, FP8_MAX)
    return (xf / scale).to(torch.float8_e4m3fn), scale


def quantize_rows(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row of ``x`` as float8 e4m3 values and the row's scale: ``x ≈ q · scale``.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference; both return the same bits. No host synchronisation.

    Parameters
    ----------
    x : torch.Tensor, shape (n, k), float16, bfloat16 or float32
        Rows contiguous, possibly strided.

    Returns
    -------
    q : torch.Tensor, shape (n, k), float8_e4m3fn, contiguous
        ``x / scale`` rounded to the nearest e4m3 value (at most 448 in magnitude).
    scale : torch.Tensor, shape (n, 1), float32
        ``max(amax, MIN_AMAX) / 448`` of each row, ``amax`` its largest magnitude.
    """
    fn = quantize_rows_triton if use_triton(x) else quantize_rows_reference
    return fn(x)
