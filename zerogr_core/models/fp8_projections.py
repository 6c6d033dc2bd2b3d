"""A decoder layer's weight GEMMs in FP8: float8 e4m3 weights and activations, one scale per row.

The opt-in ``projections="fp8"`` of :class:`~zerogr_core.models.qwen3.Qwen3StepModel`. Each
projection weight ``W`` (out, in) is quantized once, row by row (one scale per output
feature); each call quantizes its activations row by row
(:func:`zerogr_kernels.quantize_rows`) and multiplies with ``torch._scaled_mm``, which
applies ``scale_x[i] · scale_w[j]`` to output ``(i, j)``, adds the bias and rounds to the
model's dtype (on a CPU, the same product of the dequantized operands in float32). On an
H100 or H200 the float8 tensor cores run at twice the bf16 rate and the weights take half
the bytes; the price is the rounding of weights and activations to 3 mantissa bits (the
bf16 targets and the agreement with Hugging Face's decode are not this mode's).
"""
from __future__ import annotations

import weakref

import torch

from zerogr_kernels.fp8_rows import quantize_rows, quantize_rows_reference

from ..errors import ZeroGRError

KINDS = ("qkv", "o", "gate_up", "down")
"""A layer's projections, in the order a layer runs them."""

_CACHE: "weakref.WeakKeyDictionary[torch.nn.Module, tuple]" = weakref.WeakKeyDictionary()


def unsupported(device: torch.device, shapes) -> str | None:
    """Why FP8 projections cannot run here (``None`` when they can): a CUDA device before Ada/Hopper
    (compute capability 8.9), or a weight whose rows or columns are not a multiple of 16. ``shapes``:
    the weights' (out, in). (The model's dtype: :func:`~zerogr_core.models.qwen3.projections_problem`.)"""
    if device.type == "cuda" and torch.cuda.get_device_capability(device) < (8, 9):
        return f"FP8 projections need compute capability 8.9 or later, got {torch.cuda.get_device_capability(device)}"
    for n, k in shapes:
        if n % 16 or k % 16:
            return f"FP8 projections need weights whose sizes are multiples of 16, got ({n}, {k})"
    return None


def quantize_weight(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale)`` of a weight (out, in): ``q`` (out, in) float8_e4m3fn, ``scale`` (1, out) float32."""
    q, scale = quantize_rows(w.detach())
    return q, scale.view(1, -1)


def _dequantized_product(xq, xs, q, scale, bias, dtype) -> torch.Tensor:
    """The scaled product in float32 from the dequantized operands, rounded to ``dtype``."""
    y = (xq.float() * xs) @ (q.float() * scale.view(-1, 1)).t()
    if bias is not None:
        y = y + bias.float()
    return y.to(dtype)


def fp8_linear_reference(x: torch.Tensor, q: torch.Tensor, scale: torch.Tensor,
                         bias: torch.Tensor | None = None) -> torch.Tensor:
    """What :meth:`Fp8Projections.__call__` computes, from the reference quantization of ``x`` (on a
    GPU the scaled GEMM sums in its own order, so the two differ by rounding)."""
    xq, xs = quantize_rows_reference(x)
    return _dequantized_product(xq, xs, q, scale, bias, x.dtype)


class Fp8Projections:
    """The quantized weights of every layer's projections, and the FP8 GEMM that uses them.

    Parameters
    ----------
    weights : dict of str to list of torch.Tensor
        For each of :data:`KINDS`, one (out, in) weight per layer.
    """

    def __init__(self, weights: dict):
        self.weights = {kind: [quantize_weight(w) for w in weights[kind]] for kind in KINDS}

    def __call__(self, x: torch.Tensor, kind: str, layer: int, bias: torch.Tensor | None = None) -> torch.Tensor:
        """``x @ W.T + bias`` of layer ``layer``'s ``kind`` projection; x (n, in) contiguous rows,
        returns (n, out) in ``x``'s dtype."""
        q, scale = self.weights[kind][layer]
        xq, xs = quantize_rows(x)
        if not x.is_cuda:  # torch's CPU scaled GEMM takes row scales only in recent releases
            return _dequantized_product(xq, xs, q, scale, bias, x.dtype)
        return torch._scaled_mm(xq, q.t(), scale_a=xs, scale_b=scale, bias=bias, out_dtype=x.dtype)


def for_model(model: torch.nn.Module, weights: dict) -> Fp8Projections:
    """:class:`Fp8Projections` of ``weights``, built once per model: another wrap of the same module,
    with the same weights unchanged, reuses them (a changed weight builds them again)."""
    missing = [kind for kind in KINDS if kind not in weights]
    if missing:
        raise ZeroGRError(f"FP8 projections: no weights for {', '.join(missing)}")
    key = tuple((w.data_ptr(), w._version, tuple(w.shape)) for kind in KINDS for w in weights[kind])
    cached = _CACHE.get(model)
    if cached is None or cached[0] != key:
        cached = (key, Fp8Projections(weights))
        _CACHE[model] = cached
    return cached[1]
