"""A user's own model on the Decode page: a ``transformers`` checkpoint folder below a data root.

Reading the folder, its SID token offsets and the model, and building the heads and step
model, is the library's (:mod:`zerogr_core.models.checkpoint_folder`, which the
``compare-orders`` command uses too; the page passes the app's data roots, so folders are
read below them only). What only the page adds is here: the model's heads and seeded random
prompts as the page's :class:`DecodeInputs`.
"""
from __future__ import annotations

from typing import Sequence

from ..models.checkpoint_folder import ModelFolder, checkpoint_model
from .requests import DecodeInputs


def own_model_inputs(model, folder: ModelFolder, token_offsets: Sequence[int], catalog, device, batch: int,
                     beam: int, seed: int) -> DecodeInputs:
    """Heads and requests of the user's model: its output projection as a shared head with a
    band per level, and ``batch`` seeded random prompts through its step model.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        From :func:`zerogr_core.models.checkpoint_folder.load_model`, on ``device``.
    folder : ModelFolder
        Where it came from (with its fingerprint, part of the decoders' cache key).
    token_offsets : sequence of int
    catalog : Catalog
    device : torch.device
    batch, beam, seed : int

    Raises
    ------
    ZeroGRError
        Offsets that do not fit the catalog's levels and the model's vocabulary.
    """
    loaded = checkpoint_model(model, token_offsets, catalog.codebook_sizes)
    loaded.prefill_random(batch, beam, seed)
    return DecodeInputs(loaded.head, loaded.token_offsets, loaded.step_model,
                        ("own", folder.path, folder.fingerprint, loaded.token_offsets, batch, seed, beam))
