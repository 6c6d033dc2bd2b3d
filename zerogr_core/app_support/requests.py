"""What a page decodes: random requests (:mod:`zerogr_core.decode.random_requests`) or test
users of a bundled recommender, with the heads they are scored by."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog.catalog import Catalog
from ..decode.random_requests import DTYPES, random_heads, random_hidden_fn  # noqa: F401 (DTYPES: the pages)


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
    random_weights : bool
        A model of random weights (the Qwen3 shapes): latency only, its lists mean nothing.
    prefill_ms : float or None
        Wall time of the requests' prefill, where it ran before the decodes (Qwen3).
    """

    heads: object
    band_offsets: tuple | None
    hidden_fn: object
    model_key: tuple
    targets: np.ndarray | None = None
    user_ids: np.ndarray | None = None
    random_weights: bool = False
    prefill_ms: float | None = None

    @property
    def random(self) -> bool:
        """Whether the model is random (a random head, or random weights): overlap is meaningless."""
        return self.random_weights or self.model_key[0] == "random"


def random_inputs(catalog: Catalog, hidden_size: int, dtype: str, device, batch: int, seed: int) -> DecodeInputs:
    """Random heads (always seed 0: one model per catalog and shape) and ``batch`` random
    requests of ``seed``."""
    heads, bands = random_heads(catalog, hidden_size, dtype, device, seed=0)
    fn = random_hidden_fn(batch, hidden_size, catalog.codebook_sizes, dtype, device, seed=seed + 1)
    return DecodeInputs(heads, bands, fn, ("random", hidden_size, dtype, str(device)))


def study_inputs(study, users, rows: np.ndarray, device, beam_width: int, name: str = "movielens") -> DecodeInputs:
    """A bundled recommender's heads and the test users ``rows`` (of
    :class:`~zerogr_core.recsys.movielens.TestUsers`) as requests, served through the
    model's KV cache (each position computed once) for decodes of ``beam_width`` beams:
    a :class:`~zerogr_core.models.t5.T5StepModel` for the T5 recommender (it offers
    ``step_model()``), a :class:`~zerogr_core.models.tiger.TigerStepModel` otherwise.
    ``name`` (the bundled data set) keys the decoders built on these heads."""
    from ..recsys.bundled import study_step_model

    histories, targets = users.pick(rows)
    step_model = study_step_model(study, histories, beam_width)
    return DecodeInputs(study.model.head_weights(), None, step_model, (name, str(device)), targets,
                        users.user_ids[rows])


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
