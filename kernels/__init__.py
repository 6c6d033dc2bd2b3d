"""Triton kernels of the ZeroGR filtering-first decoder, each beside its PyTorch reference.

The folder is ``kernels/``; the package installs and imports as ``zerogr_kernels``
(``pyproject.toml``), so it never meets Hugging Face's PyPI package ``kernels``.

Every public op ``op`` dispatches to ``op_triton`` for CUDA tensors or when
``TRITON_INTERPRET=1`` (CPU tensors then run in the Triton interpreter, which must be
enabled before this package is imported), and to ``op_reference`` otherwise; both are
exported so tests can compare them. Ops never synchronise with the host on the Triton
path (except the naive ablation), so a whole decode can be captured in a CUDA graph.

Per decoding step (docs/design.md §4), op (module):

1. :func:`filter_slots` (``filtering``) - slot rows and the work queue, sparse or dense;
   with per-request lists (``constraint=constraints.SlotLists(...)``) it also kills the slots
   with no allowed row below them as it fills them (``constraints.constrain_slots`` is the
   same test as a kernel of its own, which the reference decoder runs after the filter); for
   catalog-normalised requests it defers the slots only their own list removes, which step 4
   counts in the normaliser and drops (``scored_constraints.constrain_scored_slots`` on the reference
   path); both read the bitmap of listed rows that ``row_marks.mark_rows`` sets at the first step, and the bound on
   each list's longest run of consecutive rows that ``list_spans.list_spans`` writes beside it, which spares the slots
   of wider prefixes (deny lists given as item ids are first turned into rows, marked and bounded, by
   ``deny_ids.deny_rows``); allow lists given as item ids are instead
   bitmaps of the successors that hold an allowed row, set by ``allow_nodes.allow_nodes``, one load per slot.
2. :func:`selective_proj` (``selective``), or :func:`shared_selective_proj`
   (``shared_selective``: one gather of a head row for the beams of several requests in one
   state, after :func:`group_beams` (``beam_groups``) sorts the beams by state), or
   :func:`full_proj` (``full_projection``) followed by ``filter_slots(logits=...)``, or the
   ablation :func:`naive_selective_proj` (``naive_selective``) - logits of the valid slots.
3. :func:`log_softmax_slots` (``normalize``) - normalisation plus beam scores.
4. :func:`topk_gather` (``selection``) - top-M per request and the next beams; with
   ``beam_scores`` it fuses step 3 (and, with ``deferred``, settles the filter's deferred
   slots), with ``prefixes`` it also writes the next step's token prefixes
   (:func:`extend_prefixes` (``beams_out``) is the unfused form).

Beside the decoding step, eight kernels serve the models that feed it (a T5 decoder step,
a Qwen3 layer): :func:`cached_self_attention` (``beam_attention``), :func:`request_attention`
(``memory_attention``), :func:`beam_context_attention` (``context_attention``),
:func:`rms_layer_norm` (``rms_norm``), :func:`qk_norm_rope` (``head_norm_rope``),
:func:`silu_mul` (``swiglu``), :func:`row_sum_squares` (``row_sums``, the norms' variance
sums added in eager PyTorch's order) and :func:`quantize_rows` (``fp8_rows``, the activations of
the opt-in FP8 projections). On a GPU the norm, q/k norm + rotary and SwiGLU kernels
return the bits of the eager ops they replace, at the widths :func:`row_sums.eager_order` names.

Launches: on Hopper and later (compute capability 9+) the step's kernels launch with
programmatic dependent launch and open with ``_common.pdl_prologue`` (wait for the previous
kernel, then let the next be scheduled), which overlaps each launch with the tail of the
kernel before it in a replayed graph; ``ZEROGR_PDL=0`` turns it off. The filter that copies
a band GEMM's logits launches without it (with it, the GEMM's step was a fifth slower on the
H200, most likely because cuBLAS's kernels let dependents start early).

Modules are not named after their ops, so ``zerogr_kernels.filter_slots`` is always the function.

Numeric contract (every path of every op a plan can choose): heads and hidden states share
one dtype, float16, bfloat16 or float32. Projections accumulate in float32 and store float32
logits (:func:`full_proj` through cuBLAS with a float32 output, :func:`selective_proj` and
:func:`shared_selective_proj` in-kernel, the references on upcast inputs); normalisation
and beam scores are float32. The naive ablation :func:`naive_selective_proj`, never planned,
rounds its products to the input dtype. :func:`topk_gather` orders candidates by higher score, then lower
flat candidate index (parent beam, then slot, which follows token order), on every path.
Options differ only in float32 summation order, so a decode returns the same tokens under
any plan, with scores within about 1e-5.
"""
from .beam_attention import (cached_self_attention, cached_self_attention_reference,
                             cached_self_attention_triton)
from .context_attention import (beam_context_attention, beam_context_attention_reference,
                                beam_context_attention_triton)
from .filtering import (TASK_WIDTH, FilterOut, filter_slots, filter_slots_reference,
                           filter_slots_triton, num_tasks)
from .full_projection import full_proj, full_proj_reference
from .fp8_rows import quantize_rows, quantize_rows_reference, quantize_rows_triton
from .normalize import log_softmax_slots, log_softmax_slots_reference, log_softmax_slots_triton
from .naive_selective import naive_selective_proj
from .memory_attention import request_attention, request_attention_reference, request_attention_triton
from .head_norm_rope import qk_norm_rope, qk_norm_rope_reference, qk_norm_rope_triton
from .rms_norm import rms_layer_norm, rms_layer_norm_reference, rms_layer_norm_triton
from .row_sums import row_sum_squares, row_sum_squares_reference, row_sum_squares_triton
from .swiglu import silu_mul, silu_mul_reference, silu_mul_triton
from .selective import selective_proj, selective_proj_reference, selective_proj_triton
from .beam_groups import BeamGroups, group_beams, group_beams_reference, group_beams_triton
from .shared_selective import shared_selective_proj, shared_selective_proj_reference, shared_selective_proj_triton
from .selection import (PATHS as TOPK_PATHS, SMALL_AUTO_MAX, SMALL_MAX, SPLIT_CHUNK_MAX, SPLIT_CHUNK_MIN,
                        TopkOut, extend_prefixes, small_tile, split_first_stage, split_plan, topk_gather,
                        topk_gather_reference, topk_gather_triton)

__all__ = [
    "cached_self_attention", "cached_self_attention_reference", "cached_self_attention_triton",
    "request_attention", "request_attention_reference", "request_attention_triton",
    "beam_context_attention", "beam_context_attention_reference", "beam_context_attention_triton",
    "rms_layer_norm", "rms_layer_norm_reference", "rms_layer_norm_triton",
    "row_sum_squares", "row_sum_squares_reference", "row_sum_squares_triton",
    "qk_norm_rope", "qk_norm_rope_reference", "qk_norm_rope_triton",
    "silu_mul", "silu_mul_reference", "silu_mul_triton",
    "quantize_rows", "quantize_rows_reference", "quantize_rows_triton",
    "TASK_WIDTH", "FilterOut", "filter_slots", "filter_slots_reference", "filter_slots_triton",
    "num_tasks", "full_proj", "full_proj_reference", "log_softmax_slots", "log_softmax_slots_reference",
    "log_softmax_slots_triton", "naive_selective_proj", "selective_proj",
    "selective_proj_reference", "selective_proj_triton", "BeamGroups", "group_beams",
    "group_beams_reference", "group_beams_triton", "shared_selective_proj",
    "shared_selective_proj_reference", "shared_selective_proj_triton", "SMALL_AUTO_MAX", "SMALL_MAX",
    "SPLIT_CHUNK_MAX", "SPLIT_CHUNK_MIN", "TOPK_PATHS", "TopkOut", "extend_prefixes", "small_tile",
    "split_first_stage", "split_plan", "topk_gather", "topk_gather_reference", "topk_gather_triton",
]
