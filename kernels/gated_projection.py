"""The gate/up GEMM of a SwiGLU MLP with the gate in its epilogue: ``silu(x Wg^T) * (x Wu^T)``.

Qwen3's MLP computes ``down(silu(gate(x)) * up(x))``. With the gate and up weights stacked
into one (2 F, H) matrix, :mod:`zerogr_core.models.qwen3` runs one cuBLAS GEMM for both, writes
the (n, 2 F) ``[gate | up]`` product, and :func:`~zerogr_kernels.silu_mul` reads it back to
write ``silu(gate) * up``. At prefill sizes (8,000 to 40,000 rows, F = 6,144, bfloat16) that
round trip is about 300 MB a layer. :func:`gate_up_silu` computes both projections of an
output tile from the same loads of ``x`` (two float32 accumulators, one over the gate rows
``n`` of the weight and one over the up rows ``F + n``) and writes only the product.

The epilogue rounds as the unfused ops do: each accumulator to the output dtype first (what
cuBLAS writes), then :func:`~zerogr_kernels.silu_mul`'s arithmetic (SiLU in float32 with
libdevice's exp and a rounded division, rounded to the dtype; times ``up`` in float32,
rounded), without contraction. The GEMM's float32 summation order is not cuBLAS's, so a
half-precision output can differ from the unfused one where a gate or up value lies near a
rounding boundary (a unit in the last place of that value, carried through the SiLU).

The tiling (:class:`GateUpTiling`) is chosen by row count (:func:`choose_tiling`); the presets
are plausible Hopper tiles until ``runs/probe_gate_up.py`` times them against cuBLAS.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch
import triton
import triton.language as tl
from triton.language.extra import libdevice

from ._common import FLOAT_DTYPES, cdiv, check_tensor, interpreting, use_triton
from .swiglu import silu_mul_reference

SMEM_BYTES = 232_448
"""Shared memory one program may use on Hopper (227 KiB, the opt-in maximum of sm_90): the
launcher lowers a tiling's pipeline stages until its operand buffers fit."""


@dataclass(frozen=True)
class GateUpTiling:
    """One launch configuration of :func:`gate_up_silu_triton`.

    Parameters
    ----------
    block_m : int
        Rows of ``x`` per program (a power of two, at least 16: ``tl.dot``'s smallest tile).
    block_n : int
        Output columns per program; the program accumulates ``block_n`` gate and ``block_n``
        up columns, so its GEMM tile is ``block_m × 2 block_n``.
    block_k : int
        Hidden-dimension step of the main loop.
    group_m : int
        Row blocks per group of the program order: consecutive programs walk the column
        blocks of ``group_m`` row blocks, which keeps their ``x`` rows and weight columns in L2.
    num_warps, num_stages : int
        Triton's launch options (``num_stages`` operand buffers in the software pipeline).
    """

    block_m: int
    block_n: int
    block_k: int
    group_m: int = 8
    num_warps: int = 4
    num_stages: int = 3

    def __post_init__(self):
        for name in ("block_m", "block_n", "block_k"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 16 or v & (v - 1):
                raise ValueError(f"tiling: {name} must be a power of two >= 16, got {v!r}")
        for name in ("group_m", "num_warps", "num_stages"):
            v = getattr(self, name)
            if not isinstance(v, int) or v < 1:
                raise ValueError(f"tiling: {name} must be a positive integer, got {v!r}")

    def smem_bytes(self, itemsize: int = 2) -> int:
        """Shared memory of the operand pipeline: per stage an ``x`` tile and two weight tiles."""
        return self.num_stages * (self.block_m * self.block_k + 2 * self.block_k * self.block_n) * itemsize

    def __str__(self) -> str:
        return (f"{self.block_m}x{self.block_n}x{self.block_k} g{self.group_m} "
                f"w{self.num_warps} s{self.num_stages}")


TILINGS = {
    # decode-sized calls (a few hundred rows): narrower row blocks give more programs than SMs
    # (256 rows × F = 6,144: 4 × 48 = 192 programs on an H100's 132 SMs); two 64 × 128 float32
    # accumulators are 128 registers a thread over 4 warps; 4 stages, 160 KiB of bfloat16 operands
    "small": GateUpTiling(64, 128, 64, group_m=8, num_warps=4, num_stages=4),
    # prefills: a 128 × (2 × 128) GEMM tile, the shape of the usual 128 × 256 Hopper tile; two
    # 128 × 128 accumulators need 8 warps to stay at 128 registers a thread; 4 stages, 192 KiB
    "large": GateUpTiling(128, 128, 64, group_m=8, num_warps=8, num_stages=4),
}
"""Named tilings that :func:`choose_tiling` picks from (the probe times them)."""

SMALL_ROWS = 512
"""Calls of at most this many rows take ``TILINGS["small"]``, larger ones ``TILINGS["large"]``."""


def choose_tiling(n: int) -> GateUpTiling:
    """Preset tiling of a call over ``n`` rows (:data:`SMALL_ROWS`)."""
    return TILINGS["small" if n <= SMALL_ROWS else "large"]


def _fit(tiling: GateUpTiling, itemsize: int) -> GateUpTiling:
    """``tiling`` with no more pipeline stages than :data:`SMEM_BYTES` holds (float32 operands
    take twice the bytes of the half-precision tiles the presets are sized for); at least one."""
    per_stage = tiling.smem_bytes(itemsize) // tiling.num_stages
    stages = max(1, min(tiling.num_stages, SMEM_BYTES // per_stage))
    return tiling if stages == tiling.num_stages else replace(tiling, num_stages=stages)


@triton.jit
def _gate_up_silu_kernel(x_ptr, w_ptr, out_ptr, n, F, H: tl.constexpr, UPCAST: tl.constexpr, PRECISION: tl.constexpr,
                         ACCURATE_EXP: tl.constexpr, BLOCK_M: tl.constexpr, BLOCK_N: tl.constexpr,
                         BLOCK_K: tl.constexpr, GROUP_M: tl.constexpr):
    # grouped order: programs pid .. pid + GROUP_M · col_blocks - 1 cover GROUP_M row blocks,
    # column block by column block, so a wave of programs shares a few x rows and weight columns
    pid = tl.program_id(0)
    row_blocks = tl.cdiv(n, BLOCK_M)
    col_blocks = tl.cdiv(F, BLOCK_N)
    per_group = GROUP_M * col_blocks
    first = (pid // per_group) * GROUP_M
    group_rows = tl.minimum(row_blocks - first, GROUP_M)
    pid_m = first + (pid % per_group) % group_rows
    pid_n = (pid % per_group) // group_rows

    rows = pid_m * BLOCK_M + tl.arange(0, BLOCK_M)
    cols = pid_n * BLOCK_N + tl.arange(0, BLOCK_N)
    ks = tl.arange(0, BLOCK_K)
    # the edge tiles load wrapped rows and columns (valid addresses, results never stored), so
    # the main loop masks only a ragged hidden dimension
    x_rows = (rows % n).to(tl.int64)
    w_rows = (cols % F).to(tl.int64)
    x_ptrs = x_ptr + x_rows[:, None] * H + ks[None, :]                 # (BLOCK_M, BLOCK_K)
    # the weight is (2 F, H), row-major: its transposed tiles, (BLOCK_K, BLOCK_N), by strides
    g_ptrs = w_ptr + w_rows[None, :] * H + ks[:, None]
    u_ptrs = w_ptr + (w_rows + F)[None, :] * H + ks[:, None]           # rows F + n: the up projection
    acc_g = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    acc_u = tl.zeros([BLOCK_M, BLOCK_N], dtype=tl.float32)
    # the hidden size is a compile-time constant (one per model): the loop's trip count is known,
    # a multiple of BLOCK_K loads without masks, and the interpreter can iterate (it cannot range
    # over a runtime argument)
    for k0 in range(0, H, BLOCK_K):
        if H % BLOCK_K == 0:
            a = tl.load(x_ptrs)
            bg = tl.load(g_ptrs)
            bu = tl.load(u_ptrs)
        else:
            left = H - k0
            a = tl.load(x_ptrs, mask=ks[None, :] < left, other=0.0)
            bg = tl.load(g_ptrs, mask=ks[:, None] < left, other=0.0)
            bu = tl.load(u_ptrs, mask=ks[:, None] < left, other=0.0)
        if UPCAST:  # the interpreter's tl.dot garbles bfloat16 operands; float32 copies give the same products
            a, bg, bu = a.to(tl.float32), bg.to(tl.float32), bu.to(tl.float32)
        acc_g = tl.dot(a, bg, acc_g, input_precision=PRECISION)
        acc_u = tl.dot(a, bu, acc_u, input_precision=PRECISION)
        x_ptrs += BLOCK_K
        g_ptrs += BLOCK_K
        u_ptrs += BLOCK_K

    # the unfused path's roundings: the GEMM's output in the dtype, then silu_mul's arithmetic
    dtype = out_ptr.dtype.element_ty
    g = acc_g.to(dtype).to(tl.float32)
    u = acc_u.to(dtype).to(tl.float32)
    # torch's SiLU, x / (1 + exp(-x)) in float32 with the accurate exp and division (Triton's own
    # exp and "/" are approximate, and a last-bit difference can round the half-precision result apart)
    if ACCURATE_EXP:
        e = libdevice.exp(-g)
    else:  # the interpreter's exp (numpy's) is accurate already, and it has no libdevice
        e = tl.exp(-g)
    s = tl.math.div_rn(g, 1.0 + e).to(dtype).to(tl.float32)
    out = (s * u).to(dtype)
    ok = (rows < n)[:, None] & (cols < F)[None, :]
    tl.store(out_ptr + rows.to(tl.int64)[:, None] * F + cols[None, :], out, mask=ok)


def _check(x, weight) -> None:
    check_tensor("x", x, dtypes=FLOAT_DTYPES, ndim=2, contiguous=True)
    check_tensor("weight", weight, dtypes=FLOAT_DTYPES, ndim=2, device=x.device, contiguous=True)
    if weight.dtype != x.dtype:
        raise ValueError(f"weight: dtype {str(weight.dtype).replace('torch.', '')} differs from "
                         f"x's {str(x.dtype).replace('torch.', '')}")
    two_f, h = weight.shape
    if two_f % 2 or two_f == 0:
        raise ValueError(f"weight: expected an even, positive number of rows [gate; up], got {two_f}")
    if h != x.shape[1]:
        raise ValueError(f"weight: expected {x.shape[1]} columns (x's hidden size), got {h}")


def gate_up_silu_triton(x: torch.Tensor, weight: torch.Tensor, tiling: GateUpTiling | None = None) -> torch.Tensor:
    """Triton launcher of :func:`gate_up_silu` (same signature and output).

    ``tiling`` overrides :func:`choose_tiling`'s preset; either way its pipeline stages are
    capped to fit :data:`SMEM_BYTES` at the operands' width (float32 halves them).
    """
    _check(x, weight)
    if tiling is not None and not isinstance(tiling, GateUpTiling):
        raise ValueError(f"tiling: expected a GateUpTiling or None, got {type(tiling).__name__}")
    n, h = x.shape
    f = weight.shape[0] // 2
    out = torch.empty(n, f, dtype=x.dtype, device=x.device)
    if n == 0 or h == 0:  # nothing to launch; an empty sum gives silu(0) * 0 = 0
        return out.zero_()
    t = _fit(tiling or choose_tiling(n), x.element_size())
    tf32 = x.dtype == torch.float32 and torch.backends.cuda.matmul.allow_tf32
    grid = (cdiv(n, t.block_m) * cdiv(f, t.block_n),)
    _gate_up_silu_kernel[grid](
        x, weight, out, n, f, H=h,
        UPCAST=interpreting() and x.dtype == torch.bfloat16, PRECISION="tf32" if tf32 else "ieee",
        ACCURATE_EXP=not interpreting(), BLOCK_M=t.block_m, BLOCK_N=t.block_n, BLOCK_K=t.block_k,
        GROUP_M=t.group_m, num_warps=t.num_warps, num_stages=t.num_stages, enable_fp_fusion=False)
    return out


def gate_up_silu_reference(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Pure-PyTorch reference of :func:`gate_up_silu`: the unfused path, ``F.linear`` then
    :func:`~zerogr_kernels.swiglu.silu_mul_reference`."""
    _check(x, weight)
    return silu_mul_reference(torch.nn.functional.linear(x, weight))


def gate_up_silu(x: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``silu(x @ gate.T) * (x @ up.T)`` for a stacked ``weight = [gate; up]``, one GEMM pass.

    Runs the Triton kernel for CUDA tensors or under ``TRITON_INTERPRET=1``, else the
    PyTorch reference. No host synchronisation.

    Parameters
    ----------
    x : torch.Tensor, shape (n, H), float16, bfloat16 or float32, contiguous
        Rows to project (n may be 0).
    weight : torch.Tensor, shape (2 F, H), ``x``'s dtype and device, contiguous
        The gate projection's weight (rows ``0 … F - 1``) over the up projection's (rows
        ``F … 2 F - 1``), as ``nn.Linear`` stores them.

    Returns
    -------
    torch.Tensor, shape (n, F), ``x``'s dtype, contiguous
        Each projection rounded to the dtype, then SiLU and product rounded as
        :func:`~zerogr_kernels.silu_mul` rounds them. float32 inputs take TF32 products when
        ``torch.backends.cuda.matmul.allow_tf32`` is set, as ``F.linear`` does.

    Raises
    ------
    TypeError
        A non-tensor or a dtype outside float16, bfloat16, float32.
    ValueError
        Wrong ranks, mismatched dtypes, devices or hidden sizes, an odd number of weight
        rows, a non-contiguous argument (messages name the argument).
    """
    fn = gate_up_silu_triton if use_triton(x) else gate_up_silu_reference
    return fn(x, weight)
