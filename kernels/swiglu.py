"""SwiGLU's gate, ``silu(gate) * up``, in one pass over a fused gate/up projection.

Qwen3's MLP (and Llama's) computes ``down(silu(gate(x)) * up(x))``. With the gate and up
weights stacked into one GEMM, its output row is ``[gate | up]``; eager PyTorch then
launches two kernels (SiLU, the product) and writes the SiLU back to memory in between.
At prefill sizes (tens of thousands of rows × an FFN of 6,144) those are memory-bound
passes of a gigabyte or more; :func:`silu_mul` reads the fused row once and writes the
product once, with the eager roundings (SiLU in float32 rounded to the dtype, then the
product rounded). On a GPU it returns the eager ops' bits: the SiLU is computed as torch
computes it, with libdevice's exp and a rounded division, and without contraction.
"""
from __future__ import annotations

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._common import FLOAT_DTYPES, cdiv, check_tensor, interpreting, use_triton

BLOCK = 1024
"""Columns per program."""


@triton.jit
def _silu_mul_kernel(gu_ptr, out_ptr, F, row_stride, ACCURATE_EXP: tl.constexpr, BLOCK: tl.constexpr):
    row = tl.program_id(0).to(tl.int64)
    cols = tl.program_id(1) * BLOCK + tl.arange(0, BLOCK)
    ok = cols < F
    g = tl.load(gu_ptr + row * row_stride + cols, mask=ok, other=0.0)
    u = tl.load(gu_ptr + row * row_stride + F + cols, mask=ok, other=0.0)
    gf = g.to(tl.float32)
    # torch's SiLU, x / (1 + exp(-x)) in float32 with the accurate exp and division (Triton's own
    # exp and "/" are approximate, and a last-bit difference can round the bf16 result apart)
    if ACCURATE_EXP:
        e = libdevice.exp(-gf)
    else:  # the interpreter's exp (numpy's) is accurate already, and it has no libdevice
        e = tl.exp(-gf)
    s = tl.math.div_rn(gf, 1.0 + e).to(g.dtype).to(tl.float32)
    tl.store(out_ptr + row * F + cols, (s * u.to(tl.float32)).to(g.dtype), mask=ok)


def _check(gate_up) -> None:
    check_tensor("gate_up", gate_up, dtypes=FLOAT_DTYPES, ndim=2)
    n, two_f = gate_up.shape
    if two_f % 2 or two_f == 0:
        raise ValueError(f"gate_up: expected an even, positive number of columns [gate | up], got {two_f}")
    if two_f > 1 and gate_up.stride(1) != 1:
        raise ValueError(f"gate_up: rows must be contiguous, got strides {tuple(gate_up.stride())}")


def silu_mul_triton(gate_up: torch.Tensor) -> torch.Tensor:
    """Triton launcher of :func:`silu_mul` (same signature and output)."""
    _check(gate_up)
    n, f = gate_up.shape[0], gate_up.shape[1] // 2
    out = torch.empty(n, f, dtype=gate_up.dtype, device=gate_up.device)
    if n:
        _silu_mul_kernel[(n, cdiv(f, BLOCK))](gate_up, out, f, gate_up.stride(0), ACCURATE_EXP=not interpreting(),
                                             BLOCK=BLOCK, num_warps=4, enable_fp_fusion=False)
    return out


def silu_mul_reference(gate_up: torch.Tensor) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`silu_mul` (``F.silu(gate) * up``, as the eager MLP)."""
    _check(gate_up)
    f = gate_up.shape[1] // 2
    return torch.nn.functional.silu(gate_up[:, :f]) * gate_up[:, f:]


def silu_mul(gate_up: torch.Tensor) -> torch.Tensor:
    """``silu(gate) * up`` of a fused gate/up projection.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    gate_up : torch.Tensor, shape (n, 2 F), float16, bfloat16 or float32
        Each row is ``[gate | up]``; rows contiguous, possibly strided.

    Returns
    -------
    torch.Tensor, shape (n, F), ``gate_up``'s dtype, contiguous
    """
    fn = silu_mul_triton if use_triton(gate_up) else silu_mul_reference
    return fn(gate_up)
