"""Models served through the step protocol (:mod:`.protocol`): KV caches reordered by parent.

* :mod:`.protocol` - the :class:`StepModel` protocol (what :class:`~zerogr_core.Decoder`
  and the GPU engine take in place of a ``hidden_fn``: the beam loop hands it tokens and
  parents), :class:`StepDecoder`, and :class:`PrefixTracker` (a step model as a
  ``hidden_fn(step, prefixes)``);
* :mod:`.tiger` - the bundled TIGER-style recommender with a KV cache;
* :mod:`.decoder_only` - a decoder-only generative recommender (history, then SID tokens);
* :mod:`.t5` - a Hugging Face T5 decoder with per-request cross-attention memory;
* :mod:`.hf` - the Hugging Face adapter (``zerogr_core.hf``);
* :mod:`.checkpoint_folder` - a user's ``transformers`` checkpoint folder (SID token offsets in
  ``zerogr.json``) through that adapter, for the Decode page and ``compare-orders``.

Imports torch only; :mod:`.t5`, :mod:`.hf` and :mod:`.checkpoint_folder` need ``transformers`` when used.
"""
from .protocol import (PrefixTracker, StepDecoder, StepModel, keep_static, parents_from_prefixes, reorder_rows,
                       safe_parents)

__all__ = ["PrefixTracker", "StepDecoder", "StepModel", "keep_static", "parents_from_prefixes", "reorder_rows",
           "safe_parents"]
