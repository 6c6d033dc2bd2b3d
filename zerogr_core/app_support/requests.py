"""Random heads and requests, for decoding a catalog without a trained model.

The random head has the catalog's layout: one shared head with a band per level when the
catalog declares band offsets (the paper's Search model), per-level heads otherwise. A
random request is a seeded context vector per (request, step) plus an embedding of the
beam's last token, so beams of one request see different hidden states. The hidden
function uses tensor ops only (no host synchronisation), so the GPU engine can capture it
in a CUDA graph.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import torch

from ..catalog.catalog import Catalog
from ..decode.heads import HIDDEN_STD
from ..decode.heads import random_heads as draw_heads
from ..errors import ZeroGRError

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(name: str) -> torch.dtype:
    if name not in DTYPES:
        raise ZeroGRError(f"dtype must be one of {', '.join(DTYPES)}, got {name!r}")
    return DTYPES[name]


def random_heads(catalog: Catalog, hidden_size: int, dtype: str = "float32", device="cpu", seed: int = 0):
    """A seeded random output projection in the catalog's layout.

    Returns
    -------
    heads : torch.Tensor (rows, H) or list of torch.Tensor (|V_l|, H)
        Shared head when ``catalog.band_offsets`` is set, else per-level heads.
    band_offsets : tuple of int or None
    """
    heads = draw_heads(catalog.codebook_sizes, catalog.band_offsets, hidden_size, resolve_dtype(dtype), device,
                       torch.Generator().manual_seed(seed))
    if heads.shared is not None:
        return heads.shared, heads.band_offsets
    return list(heads.bands), None


def random_hidden_fn(batch: int, hidden_size: int, codebook_sizes, dtype: str = "float32", device="cpu",
                     seed: int = 1):
    """Seeded hidden states for ``batch`` random requests.

    ``h(b, step, beam) = context[b, step] + 0.5 · E_step[last token of the beam]``, with
    ``context ~ N(0, HIDDEN_STD²)`` (the scale the benchmarks draw their hidden states with).

    Returns
    -------
    callable(step, prefixes) -> torch.Tensor (batch, beams, H)
    """
    if batch < 1:
        raise ZeroGRError(f"batch must be ≥ 1, got {batch}")
    gen = torch.Generator().manual_seed(seed)
    dt = resolve_dtype(dtype)
    levels = len(codebook_sizes)
    context = (HIDDEN_STD * torch.randn(batch, levels, hidden_size, generator=gen)).to(dt).to(device)
    width = max(codebook_sizes)
    embed = (0.5 * torch.randn(levels, width, hidden_size, generator=gen)).to(dt).to(device)

    def hidden_fn(step: int, prefixes: torch.Tensor) -> torch.Tensor:
        beams = prefixes.shape[1]
        base = context[:, step, None, :].expand(batch, beams, hidden_size)
        if step == 0:
            return base.contiguous()
        last = prefixes[..., step - 1].clamp(min=0)
        return base + embed[step - 1][last]

    return hidden_fn


@dataclass(frozen=True, eq=False)
class DecodeInputs:
    """What a page decodes: heads, the requests' hidden states, and who the requests are.

    Attributes
    ----------
    heads : torch.Tensor (rows, H) or list of torch.Tensor (|V_l|, H)
        As :class:`~zerogr_core.Decoder` takes them.
    band_offsets : tuple of int or None
        For a shared head.
    hidden_fn : callable(step, prefixes) -> torch.Tensor, or StepModel
        Random requests: a ``hidden_fn``. A bundled recommender: its KV-cache step model
        (:class:`~zerogr_core.models.tiger.TigerStepModel` or, for the T5,
        :class:`~zerogr_core.models.t5.T5StepModel`), prefilled with the requests, which
        every decoder takes in place of a ``hidden_fn``.
    model_key : tuple
        Identifies the model (cache key of decoders built on these heads).
    targets, user_ids : np.ndarray or None
        For test users of the bundled recommender: held-out item rows and user ids.
    """

    heads: object
    band_offsets: tuple | None
    hidden_fn: object
    model_key: tuple
    targets: np.ndarray | None = None
    user_ids: np.ndarray | None = None

    @property
    def random(self) -> bool:
        return self.model_key[0] == "random"


def random_inputs(catalog: Catalog, hidden_size: int, dtype: str, device, batch: int, seed: int) -> DecodeInputs:
    """Random heads (always seed 0: one model per catalog and shape) and ``batch`` random
    requests of ``seed``."""
    heads, bands = random_heads(catalog, hidden_size, dtype, device, seed=0)
    fn = random_hidden_fn(batch, hidden_size, catalog.codebook_sizes, dtype, device, seed=seed + 1)
    return DecodeInputs(heads, bands, fn, ("random", hidden_size, dtype, str(device)))


def study_inputs(study, users, rows: np.ndarray, device, beam_width: int, name: str = "movielens") -> DecodeInputs:
    """A bundled recommender's heads and the test users ``rows`` (of
    :class:`~zerogr_core.app_support.movielens.TestUsers`) as requests, served through the
    model's KV cache (each position computed once) for decodes of ``beam_width`` beams:
    a :class:`~zerogr_core.models.t5.T5StepModel` for the T5 recommender (it offers
    ``step_model()``), a :class:`~zerogr_core.models.tiger.TigerStepModel` otherwise.
    ``name`` (the bundled data set) keys the decoders built on these heads."""
    from ..models.tiger import TigerStepModel

    histories, targets = users.pick(rows)
    model = study.model
    if hasattr(model, "step_model"):
        step_model = model.step_model()
        step_model.prefill(*model.encoder_inputs(histories, study.sids), beam_width=beam_width)
    else:
        step_model = TigerStepModel(model)
        step_model.prefill_rows(histories, study.sids, beam_width=beam_width)
    return DecodeInputs(model.head_weights(), None, step_model, (name, str(device)), targets, users.user_ids[rows])


def history_lists(histories):
    """Deny lists that drop each request's history (item rows) during decoding, under the
    quality study's normalisation (:data:`zerogr_core.recsys.quality.SEEN_NORMALISE`).

    Parameters
    ----------
    histories : sequence of int arrays
        Item rows per request.

    Returns
    -------
    RequestLists
    """
    from ..decode.constraints import RequestLists
    from ..recsys.quality import SEEN_NORMALISE

    return RequestLists.from_rows(deny=histories, normalise=SEEN_NORMALISE)
