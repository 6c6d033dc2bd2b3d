"""The Qwen3 architecture on the Decode page: the two orders compared at LLM scale.

The model is a ``transformers`` ``Qwen3ForCausalLM`` of a named shape
(:data:`~zerogr_core.models.qwen3.QWEN3_PRESETS`: ``qwen3-1.7b`` on a GPU in bf16, ``tiny``
on a CPU in float32) with **random weights**, since no checkpoint is shipped: its latency
and memory are those of the real shape, its lists mean nothing. The active catalog's SID
tokens are appended to the model's vocabulary (one band per level), so any catalog the
app loads can be decoded. Requests are seeded random contexts of the model's own
vocabulary, prefilled once (context KV stored once per request) through
:class:`~zerogr_core.models.qwen3.Qwen3StepModel`; both orders then decode from the same
prefilled step model, so the timed decodes compare the orders, not the prefill, which is
timed on its own.
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import torch

from ..errors import ZeroGRError
from ..timing import Stopwatch
from .requests import DecodeInputs

#: The shapes the page offers: preset name → label.
LLM_SHAPES = {
    "tiny": "tiny Qwen3 (2 layers, width 64): the same architecture, for a CPU",
    "qwen3-1.7b": "Qwen3-1.7B shape (28 layers, width 2,048, 16/8 heads, FFN 6,144), bf16, for a GPU",
}
#: Context lengths are padded to a multiple of this (nearby lengths share buffers and graphs).
CONTEXT_BUCKET = 64


@dataclass(frozen=True)
class LLMSpec:
    """One Qwen3 configuration of the page.

    Attributes
    ----------
    shape : str
        A key of :data:`LLM_SHAPES`.
    context : int
        Context tokens per request (1 … the shape's ``max_positions`` less the SID levels).
    dtype : str
        ``bfloat16`` on a GPU, ``float32`` on a CPU (:func:`llm_dtype`).
    projections : str
        ``model`` or ``fp8`` (:class:`~zerogr_core.models.qwen3.Qwen3StepModel`'s ``projections``;
        ``fp8`` needs ``bfloat16``).
    partial_last_step : bool
        Filtering first's last step runs the layers on the beams whose prefix holds more than one
        item only (:class:`~zerogr_core.models.qwen3.Qwen3StepModel`'s ``partial_last_step``).
    """

    shape: str
    context: int
    dtype: str
    projections: str = "model"
    partial_last_step: bool = True

    def __post_init__(self):
        if self.shape not in LLM_SHAPES:
            raise ZeroGRError(f"model shape: unknown Qwen3 shape {self.shape!r}; choose one of {', '.join(LLM_SHAPES)}")
        if self.dtype not in ("float32", "bfloat16", "float16"):
            raise ZeroGRError(f"dtype: expected float32, bfloat16 or float16, got {self.dtype!r}")
        if isinstance(self.context, bool) or not isinstance(self.context, int) or self.context < 1:
            raise ZeroGRError(f"context length: expected a positive whole number of tokens, got {self.context!r}")
        from ..models.protocol import partial_flag
        from ..models.qwen3 import projections_problem

        why = projections_problem(self.projections, self.dtype)
        if why:
            raise ZeroGRError(why)
        partial_flag(self.partial_last_step)


def llm_dtype(gpu: bool) -> str:
    """The dtype the page runs the Qwen3 shapes in: bf16 on a GPU (as served), float32 on a CPU."""
    return "bfloat16" if gpu else "float32"


def shape_preset(shape: str, codebook_sizes):
    """The Qwen3 shape ``shape`` with ``codebook_sizes`` as its appended SID bands."""
    from ..models.qwen3 import QWEN3_PRESETS

    if shape not in QWEN3_PRESETS:
        raise ZeroGRError(f"model shape: unknown Qwen3 shape {shape!r}; choose one of {', '.join(QWEN3_PRESETS)}")
    return replace(QWEN3_PRESETS[shape], codebook_sizes=tuple(int(s) for s in codebook_sizes))


def llm_preset(spec: LLMSpec, codebook_sizes):
    """The Qwen3 shape of ``spec`` with the catalog's SID levels as its appended bands.

    Raises
    ------
    ZeroGRError
        A context that does not fit the shape's positions with the SID tokens after it.
    """
    preset = shape_preset(spec.shape, codebook_sizes)
    room = preset.max_positions - len(preset.codebook_sizes)
    if spec.context > room:
        raise ZeroGRError(f"context length: {spec.context:,} tokens do not fit the {spec.shape} shape's "
                          f"{preset.max_positions:,} positions with {len(preset.codebook_sizes)} SID tokens after "
                          f"them (at most {room:,})")
    return preset


def model_params(spec: LLMSpec, codebook_sizes) -> int:
    """Parameters of the shape's layers (what every token's forward multiplies by)."""
    return llm_preset(spec, codebook_sizes).non_embedding_params()


def build_llm(shape: str, dtype: str, codebook_sizes, device: str):
    """The random-weight ``Qwen3ForCausalLM`` of ``shape`` with the SID bands
    ``codebook_sizes``, in ``dtype`` on ``device`` (weights seed 0; any context length
    within the shape's positions decodes with it).

    Returns
    -------
    (transformers.Qwen3ForCausalLM, Qwen3Preset)
    """
    from ..models.qwen3 import build_random

    return build_random(shape_preset(shape, codebook_sizes), device=device, dtype=getattr(torch, dtype), seed=0)


def weight_bytes(model) -> int:
    """Bytes of the model's parameters (the tied embedding counted once)."""
    seen, total = set(), 0
    for p in model.parameters():
        if p.data_ptr() not in seen:
            seen.add(p.data_ptr())
            total += p.numel() * p.element_size()
    return total


def llm_inputs(model, preset, spec: LLMSpec, device, batch: int, beam: int, seed: int) -> DecodeInputs:
    """Heads and requests of the Qwen3 recommender: the SID rows of its tied embedding as a
    shared head (a band per level at ``preset.token_offsets``), and ``batch`` seeded random
    contexts of ``spec.context`` tokens prefilled for ``beam`` beams.

    Returns
    -------
    DecodeInputs
        ``random_weights`` set, ``prefill_ms`` the prefill's wall time (device synchronised).
    """
    from ..models.qwen3 import Qwen3StepModel

    llm_preset(spec, preset.codebook_sizes)  # the context fits the shape
    step_model = Qwen3StepModel(model, preset.token_offsets, context_bucket=CONTEXT_BUCKET,
                                projections=spec.projections, partial_last_step=spec.partial_last_step)
    generator = torch.Generator().manual_seed(seed)
    contexts = torch.randint(0, preset.base_vocab, (batch, spec.context), generator=generator).to(device)
    with torch.no_grad(), Stopwatch(device) as sw:
        step_model.prefill(contexts, beam_width=beam)
    return DecodeInputs(step_model.head, preset.token_offsets, step_model,
                        ("qwen3", spec, tuple(preset.codebook_sizes), str(device), batch, seed, beam),
                        random_weights=True, prefill_ms=sw.ms)
