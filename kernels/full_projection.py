"""Full projection: one GEMM of the hidden states against the step's band of the head.

Step 2 (*full*) of the filtering-first decoding step (docs/design.md §4). The band is a
``narrow`` view of the head, never a copy; :func:`zerogr_kernels.filter_slots` then copies the
valid logits into the slots (sparse) or masks the invalid columns (dense).

Numeric contract (the one of every projection, see :mod:`zerogr_kernels`): the inputs share one
dtype (float16, bfloat16 or float32), products are accumulated in float32 and the logits
are stored in float32. On CUDA, cuBLAS does the work: for half-precision inputs through
``torch.mm(..., out_dtype=torch.float32)``, which accumulates in float32 and writes the
float32 output without a rounding to the input dtype; float32 stays plain float32 unless
the caller enabled TF32 in torch. Elsewhere (and on CUDA if that overload is missing) the
inputs are upcast first: a product of two float16 (or bfloat16) values is exact in
float32, so this is the same arithmetic.
"""
from __future__ import annotations

import contextlib
import functools

import torch

from ._common import FLOAT_DTYPES, check_tensor


@functools.lru_cache(maxsize=None)
def _fp32_out_gemm(device: torch.device, dtype: torch.dtype) -> bool:
    """Whether cuBLAS takes ``dtype`` inputs with a float32 output here (torch >= 2.8 ships
    mm's ``out_dtype`` overload). Probed once per device and dtype with a tiny eager GEMM
    (dispatch errors raise on the host, so no synchronisation); the first call of a shape is
    always eager (warm-up, planner), never inside a graph capture."""
    if not hasattr(torch.ops.aten.mm, "dtype_out"):
        return False
    try:
        a = torch.zeros(2, 2, dtype=dtype, device=device)
        torch.mm(a, a.t(), torch.float32, out=torch.empty(2, 2, device=device))
    except (RuntimeError, TypeError, NotImplementedError):
        return False
    return True


@contextlib.contextmanager
def _fp32_reductions():
    """Forbid cuBLAS's reduced-precision (half) split-K reductions for one call, so the
    sum stays float32 end to end; torch's global setting is restored afterwards."""
    m = torch.backends.cuda.matmul
    before = (m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction)
    m.allow_fp16_reduced_precision_reduction = m.allow_bf16_reduced_precision_reduction = False
    try:
        yield
    finally:
        m.allow_fp16_reduced_precision_reduction, m.allow_bf16_reduced_precision_reduction = before


def full_proj_reference(hidden: torch.Tensor, weight: torch.Tensor, band_start: int, n_tokens: int, *,
                        out: torch.Tensor | None = None) -> torch.Tensor:
    """Float32 GEMM of the upcast inputs (same signature and output as :func:`full_proj`)."""
    band = _check(hidden, weight, band_start, n_tokens, out)
    return torch.mm(hidden.float(), band.float().t(), out=out)


def _check(hidden, weight, band_start, n_tokens, out) -> torch.Tensor:
    check_tensor("hidden", hidden, dtypes=FLOAT_DTYPES, ndim=2)
    check_tensor("weight", weight, dtypes=(hidden.dtype,), ndim=2, device=hidden.device,
                 shape=(None, hidden.shape[1]))
    if band_start < 0 or n_tokens < 1 or band_start + n_tokens > weight.shape[0]:
        raise ValueError(f"band [{band_start}, {band_start + n_tokens}) outside the "
                         f"{weight.shape[0]} rows of weight")
    if out is not None:
        check_tensor("out", out, dtypes=(torch.float32,), ndim=2, device=hidden.device,
                     shape=(hidden.shape[0], n_tokens))
    return weight.narrow(0, band_start, n_tokens)


def full_proj(hidden: torch.Tensor, weight: torch.Tensor, band_start: int, n_tokens: int, *,
              out: torch.Tensor | None = None, out_dtype: torch.dtype = torch.float32) -> torch.Tensor:
    """Logits of every token of a band: ``hidden @ weight[band_start:band_start + n_tokens].T``.

    Parameters
    ----------
    hidden : torch.Tensor
        ``(n_beams, H)`` float16, bfloat16 or float32.
    weight : torch.Tensor
        ``(V_total, H)`` head of the same dtype.
    band_start : int
        First row of the band.
    n_tokens : int
        Codebook size ``V`` of the step (rows of the band).
    out : torch.Tensor, optional
        ``(n_beams, V)`` preallocated float32 output.
    out_dtype : torch.dtype
        ``torch.float32`` (the contract). Passing the input dtype instead runs the plain
        GEMM that rounds the logits to it, which only the benchmark's cost comparison uses.

    Returns
    -------
    torch.Tensor
        ``(n_beams, V)`` float32 logits, accumulated in float32.
    """
    if out_dtype != torch.float32:
        if out_dtype != hidden.dtype:
            raise ValueError(f"out_dtype must be float32 or the input dtype, got {out_dtype}")
        band = _check(hidden, weight, band_start, n_tokens, None)
        return torch.mm(hidden, band.t())
    band = _check(hidden, weight, band_start, n_tokens, out)
    if hidden.dtype == torch.float32:
        return torch.mm(hidden, band.t(), out=out)
    if hidden.is_cuda and _fp32_out_gemm(hidden.device, hidden.dtype):
        with _fp32_reductions():
            if out is None:
                return torch.mm(hidden, band.t(), torch.float32)
            return torch.mm(hidden, band.t(), torch.float32, out=out)
    return full_proj_reference(hidden, weight, band_start, n_tokens, out=out)
