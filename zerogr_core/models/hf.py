"""Hugging Face adapter: constrained beam search over a ``transformers`` model's own logits.

Serves ``T5ForConditionalGeneration`` (and other encoder–decoder models) and decoder-only
causal LMs (``GPT2LMHeadModel``, ``LlamaForCausalLM``, …) through the step protocol
(:mod:`zerogr_core.models.protocol`), with the model's own cache classes
(``DynamicCache``/``EncoderDecoderCache``, reordered by parent with ``reorder_cache``).

SID level ``l``, local token ``t`` is vocabulary id ``token_offsets[l] + t``. The model's
output projection (``get_output_embeddings()``, a linear layer without bias) becomes the
decoder's shared head with one band per level, and the adapter reads what goes into it
(:func:`hidden_outputs`): in the decoding thread the projection passes its input through,
so no step computes logits over the whole vocabulary unless the decode order asks for them,
while other threads using the same model get its logits. Models whose forward adds to the
projection's output are refused: BART-style ``final_logits_bias`` (BART, Marian, mBART,
Pegasus, …), zero or not (:func:`check_readable`).

``transformers`` is imported on first use only; ``import zerogr_core`` never needs it.

Example::

    from zerogr_core import build_index
    from zerogr_core.hf import generate

    result = generate(t5, input_ids, build_index(catalog), beam_width=32,
                      token_offsets=[10, 266, 522, 778], attention_mask=mask)
    result.item_ids(catalog)          # (batch, 32) item ids, best first
"""
from __future__ import annotations

import contextlib
import threading
from typing import Sequence

import torch
from torch import nn

from ..arg_types import whole_values
from ..errors import ZeroGRError
from .protocol import StepDecoder, check_band_offsets, safe_parents, token_inputs

ORDERS = ("filter-first", "score-first", "unconstrained")


def output_head(model) -> tuple[nn.Module, str, torch.Tensor]:
    """The model's output projection: (parent module, attribute name, weight (vocab, d)).

    Raises
    ------
    ZeroGRError
        No linear output projection, one with a bias, or logits post-processed after it
        (soft-capping, a logit scale, a non-zero ``final_logits_bias`` or one of another width),
        where the logits are not ``hidden @ weight.T``. An all-zero ``final_logits_bias`` is
        accepted here (it changes no logit); :func:`hidden_outputs` refuses it.
    """
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    name = type(model).__name__
    if not isinstance(head, nn.Linear):
        raise ZeroGRError(f"model: {name} has no linear output projection (get_output_embeddings)")
    if head.bias is not None:
        raise ZeroGRError(f"model: {name}'s output projection has a bias; the decoder's heads take none")
    config = getattr(model, "config", None)
    for field in ("final_logit_softcapping", "logit_scale", "output_multiplier_scale"):
        if getattr(config, field, None) not in (None, 1, 1.0):
            raise ZeroGRError(f"model: {name} sets config.{field}, so its logits are not hidden @ head")
    # BART, Marian, mBART, Pegasus, …: the forward adds this buffer to the projection's output
    bias = getattr(model, "final_logits_bias", None)
    if isinstance(bias, torch.Tensor):
        if bias.numel() != head.out_features:
            raise ZeroGRError(f"model: {name}'s final_logits_bias has shape {tuple(bias.shape)} for "
                              f"{head.out_features} logits")
        if bool(bias.detach().any()):
            raise ZeroGRError(f"model: {name} adds a non-zero final_logits_bias after its output projection, so "
                              f"its logits are not hidden @ head")
    for parent in model.modules():
        for attr, child in parent.named_children():
            if child is head:
                return parent, attr, head.weight
    raise ZeroGRError(f"model: {name}'s output projection is not one of its modules")


def check_readable(model) -> None:
    """Refuse a model whose forward adds to its output projection's output, even nothing.

    Within :func:`hidden_outputs` that addition would meet the hidden states: BART-style
    models add their (1, vocab) ``final_logits_bias`` to them, a shape error unless the hidden
    size equals the vocabulary (then a silent shift by a non-zero bias). A zero bias leaves the
    logits ``hidden @ head`` (:func:`output_head` accepts it) but not the hidden states readable.

    Raises
    ------
    ZeroGRError
        One line naming the model and the buffer.
    """
    if isinstance(getattr(model, "final_logits_bias", None), torch.Tensor):
        raise ZeroGRError(f"model: {type(model).__name__} adds final_logits_bias to its output projection's output "
                          f"(zero or not), so the adapter cannot read the hidden states it projects")


# Heads switched on for some thread: id(head) -> [its _HeadSwitch, threads inside hidden_outputs].
_switched: dict[int, list] = {}
_switch_lock = threading.Lock()
# Per thread: id(head) -> depth of that thread's hidden_outputs blocks on it.
_reading = threading.local()


class _HeadSwitch:
    """The head's ``forward`` while some thread is inside :func:`hidden_outputs`: the input
    itself in those threads, the head's own output in every other."""

    def __init__(self, head: nn.Module, previous):
        # ``previous``: a forward already set on the instance (accelerate's device hooks set one)
        self.head, self.previous = head, previous

    def __call__(self, input, *args, **kwargs):
        if getattr(_reading, "depth", {}).get(id(self.head)):
            return input
        if self.previous is not None:
            return self.previous(input, *args, **kwargs)
        return type(self.head).forward(self.head, input, *args, **kwargs)


@contextlib.contextmanager
def hidden_outputs(model):
    """Within the block, in the calling thread, ``model(...).logits`` are the hidden states
    the output projection reads.

    The projection module stays in place (``get_output_embeddings()``, ``state_dict`` and
    its weights are untouched); while any thread is inside a block its instance ``forward``
    is a switch that returns its input in those threads and the logits in all others, and
    the last thread to leave removes it. So one model may serve ZeroGR decodes and its own
    forward or ``generate`` from several threads at once, and blocks may nest and interleave.
    The switch is per thread, not per asyncio task: do not await inside the block.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        A model whose logits are its output projection's output (:func:`output_head`).

    Raises
    ------
    ZeroGRError
        From :func:`output_head`, or a model that adds a ``final_logits_bias`` after the
        projection (:func:`check_readable`).
    """
    parent, attr, _ = output_head(model)
    check_readable(model)
    head = getattr(parent, attr)
    key = id(head)
    with _switch_lock:
        entry = _switched.get(key)
        if entry is None:
            entry = _switched[key] = [_HeadSwitch(head, vars(head).get("forward")), 0]
            head.forward = entry[0]
        entry[1] += 1
    depth = getattr(_reading, "depth", None)
    if depth is None:
        depth = _reading.depth = {}
    depth[key] = depth.get(key, 0) + 1
    try:
        yield
    finally:
        depth[key] -= 1
        if not depth[key]:
            del depth[key]
        with _switch_lock:
            entry[1] -= 1
            if not entry[1]:
                del _switched[key]
                # a forward set over ours meanwhile stays (it chains to ours, now a pass-through)
                if vars(head).get("forward") is entry[0]:
                    if entry[0].previous is None:
                        del head.forward
                    else:
                        head.forward = entry[0].previous


def _whole_offsets(token_offsets) -> tuple[int, ...]:
    # int() would truncate 3.7 to 3 and shift a level's ids silently: whole numbers only
    offsets = whole_values(token_offsets)
    if offsets is None:
        raise ZeroGRError(f"token_offsets: expected one integer per SID level, got {token_offsets!r}")
    return offsets


def step_offsets(model, token_offsets: Sequence[int]) -> tuple[int, ...]:
    """A step model's ``token_offsets``, checked where the catalog is not known.

    Each offset must be a whole number and its level's first id must lie in the model's
    vocabulary (input embeddings and output projection), since the step model feeds the
    chosen tokens back as ids ``token_offsets[l] + t``. :func:`check_vocabulary` checks
    each level's last id too, against the catalog's codebook sizes.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    token_offsets : sequence of int
        Vocabulary id of token 0 of each SID level.

    Returns
    -------
    tuple of int

    Raises
    ------
    ZeroGRError
        One line naming ``token_offsets``.
    """
    offsets = _whole_offsets(token_offsets)
    if not offsets:
        raise ZeroGRError(f"token_offsets: expected one integer per SID level, got {token_offsets!r}")
    sizes = [getattr(model.get_input_embeddings(), "num_embeddings", None)]
    head = model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None
    sizes.append(getattr(head, "out_features", None))
    vocab = min((int(n) for n in sizes if n is not None), default=None)
    for level, o in enumerate(offsets):
        if vocab is not None and not 0 <= o < vocab:
            raise ZeroGRError(f"token_offsets: level {level + 1} starts at id {o}, outside the model's vocabulary "
                              f"[0, {vocab})")
    return offsets


def check_vocabulary(vocab: int, codebook_sizes: Sequence[int], token_offsets: Sequence[int]) -> tuple[int, ...]:
    """Validate ``token_offsets`` against the catalog's levels and the model's vocabulary."""
    offsets = _whole_offsets(token_offsets)
    if len(offsets) != len(codebook_sizes):
        raise ZeroGRError(f"token_offsets: {len(offsets)} offsets for a catalog of {len(codebook_sizes)} levels")
    for level, (o, size) in enumerate(zip(offsets, codebook_sizes)):
        if o < 0 or o + size > vocab:
            raise ZeroGRError(f"token_offsets: level {level + 1} needs vocabulary ids [{o}, {o + size}) but the "
                              f"model's vocabulary has {vocab} ids")
    return offsets


class HFStepModel:
    """A ``transformers`` model as a :class:`~zerogr_core.models.protocol.StepModel`.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        Encoder–decoder (``config.is_encoder_decoder``) or decoder-only causal LM; put in
        eval mode.
    token_offsets : sequence of int
        Vocabulary id of token 0 of each SID level; whole numbers whose ids lie in the
        model's vocabulary (:func:`step_offsets`).
    decoder_start_token_id : int, optional
        Encoder–decoder models: the decoder's first input (default: the model's
        ``generation_config``/``config`` value).

    Raises
    ------
    ZeroGRError
        An unsupported output projection (:func:`output_head`, :func:`check_readable`) or bad
        ``token_offsets``.

    Notes
    -----
    The model keeps its own caches: encoder–decoder models repeat the encoder memory per
    beam as Hugging Face ``generate`` does. :class:`zerogr_core.models.t5.T5StepModel`
    serves T5 with one memory per request and static buffers instead.

    The model may serve other threads meanwhile, through its own forward or ``generate`` or
    other step models: each step reads the hidden states in its own thread only
    (:func:`hidden_outputs`) and the model is left as it was. One step model holds one
    batch's caches, so it serves one decode at a time.
    """

    def __init__(self, model, token_offsets: Sequence[int], decoder_start_token_id: int | None = None):
        _, _, weight = output_head(model)
        # refused now rather than at the first step, inside the model's forward
        check_readable(model)
        self.token_offsets = step_offsets(model, token_offsets)
        self.model = model.eval()
        self.head = weight.detach()
        self.hidden_size = int(weight.shape[1])
        self.n_levels = len(self.token_offsets)
        self.encoder_decoder = bool(getattr(model.config, "is_encoder_decoder", False))
        if self.encoder_decoder:
            start = decoder_start_token_id
            for source in (getattr(model, "generation_config", None), model.config):
                if start is None:
                    start = getattr(source, "decoder_start_token_id", None)
            if start is None:
                raise ZeroGRError("decoder_start_token_id: the model does not set one; pass it")
            self.start = int(start)
        self.batch = 0

    @property
    def device(self) -> torch.device:
        return self.head.device

    @torch.no_grad()
    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """Read the requests' input ids.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T), int64
            Input ids: the encoder input, or the prompt of a causal LM (left padding).
        attention_mask : torch.Tensor, shape (B, T), optional
            1 on tokens, 0 on padding (default: all ones); a causal LM's rows must end in a
            token (left padding).
        beam_width : int
        """
        vocab = getattr(self.model.get_input_embeddings(), "num_embeddings", None)
        self.input_ids, mask = token_inputs(history, attention_mask, vocab, self.device)
        mask = mask.long()
        # a causal LM's next token is read at the last position, so a right-padded request
        # would continue from padding, silently: refused (one read on the host for both checks)
        empty, right = torch.stack([(mask.sum(dim=1) < 1).any(), (mask[:, -1] == 0).any()]).tolist()
        if empty:
            raise ZeroGRError("attention_mask: every request needs at least one token")
        if right and not self.encoder_decoder:
            row = int((mask[:, -1] == 0).nonzero()[0, 0])
            raise ZeroGRError(f"attention_mask: row {row} ends in padding; a decoder-only model continues from "
                              f"the last position, so pad on the left")
        self.mask = mask
        self.batch, self.beam_width = history.shape[0], beam_width
        if self.encoder_decoder:
            encoder = self.model.get_encoder()
            self.memory = encoder(input_ids=self.input_ids, attention_mask=mask).last_hidden_state
        else:
            # as generate does: positions count the tokens, padding sits at 0
            self.positions = (mask.cumsum(dim=1) - 1).masked_fill(mask == 0, 0)

    @torch.no_grad()
    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None) -> torch.Tensor:
        """Hidden states (batch * beams, H) of step ``step`` (see the protocol)."""
        from transformers import DynamicCache, EncoderDecoderCache
        from transformers.modeling_outputs import BaseModelOutput

        if not self.batch:
            raise ZeroGRError("step model: call prefill before step")
        b, config = self.batch, self.model.config.get_text_config(decoder=True)
        if step == 0:
            rows = torch.arange(b, device=self.device)
            if self.encoder_decoder:
                # no config: T5's decoder may have more layers than the config's num_layers
                self.cache = EncoderDecoderCache(DynamicCache(), DynamicCache())
                ids = torch.full((b, 1), self.start, dtype=torch.int64, device=self.device)
            else:
                self.cache = DynamicCache(config=config)
                ids = self.input_ids
            self.requests = rows
        else:
            prev = 1 if step == 1 else self.beam_width
            rows = safe_parents(parents.to(self.device), prev)
            self.cache.reorder_cache(rows)
            self.requests = self.requests.index_select(0, rows)
            ids = tokens.to(self.device, torch.int64).reshape(-1, 1).clamp(min=0) + self.token_offsets[step - 1]
        req = self.requests
        with hidden_outputs(self.model):
            if self.encoder_decoder:
                out = self.model(encoder_outputs=BaseModelOutput(last_hidden_state=self.memory[req]),
                                 attention_mask=self.mask[req], decoder_input_ids=ids,
                                 past_key_values=self.cache, use_cache=True)
            else:
                mask = self.mask[req]
                if step:
                    mask = torch.cat([mask, mask.new_ones(mask.shape[0], step)], dim=1)
                    positions = self.positions[req, -1:] + step
                else:
                    positions = self.positions
                out = self.model(input_ids=ids, attention_mask=mask, position_ids=positions,
                                 past_key_values=self.cache, use_cache=True)
        self.cache = out.past_key_values
        hidden = out.logits[:, -1]
        if hidden.shape[-1] != self.hidden_size:
            # the model multiplies by the projection's weight without calling it: the switch never ran
            raise ZeroGRError(f"model: {type(self.model).__name__} computes its logits without calling its output "
                              f"projection, so its hidden states cannot be read ({hidden.shape[-1]} outputs, "
                              f"hidden size {self.hidden_size})")
        return hidden


class HFGenerator:
    """Constrained beam search with a ``transformers`` model, kept across calls.

    Parameters
    ----------
    model : transformers.PreTrainedModel
    index : StepIndex
        The catalog's step-sliced index (:func:`zerogr_core.build_index`), on the model's device.
    beam_width : int
    token_offsets : sequence of int
        Vocabulary id of token 0 of each SID level.
    order : {"filter-first", "score-first", "unconstrained"}
        ``score-first`` normalises over the whole vocabulary, then masks, as Hugging Face
        ``generate`` with ``prefix_allowed_tokens_fn`` does; ``filter-first`` normalises
        over each beam's valid tokens only.
    step_model : StepModel, optional
        What computes the hidden states (default :class:`HFStepModel` of ``model``), e.g.
        :class:`zerogr_core.models.t5.T5StepModel`.
    decoder_start_token_id : int, optional
    prefill : {"auto", "inside", "outside"}
        Where the step model's prefill runs (:class:`~zerogr_core.models.protocol.StepDecoder`).
    """

    def __init__(self, model, index, *, beam_width: int, token_offsets: Sequence[int],
                 order: str = "filter-first", step_model=None, decoder_start_token_id: int | None = None,
                 prefill: str = "auto"):
        if order not in ORDERS:
            raise ZeroGRError(f"order must be one of {', '.join(ORDERS)}, got {order!r}")
        _, _, weight = output_head(model)
        offsets = check_vocabulary(int(weight.shape[0]), index.codebook_sizes, token_offsets)
        if weight.device != index.device:
            raise ZeroGRError(f"the model is on {weight.device} but the index is on {index.device}")
        # before StepDecoder checks the same against its band_offsets: name the argument this caller gave
        check_band_offsets(step_model, offsets, "token_offsets")
        self.step_model = step_model if step_model is not None else \
            HFStepModel(model, offsets, decoder_start_token_id)
        self.serving = StepDecoder(self.step_model, index, weight.detach(), beam_width=beam_width, order=order,
                                   band_offsets=offsets, prefill=prefill)
        self.decoder = self.serving.decoder

    def generate(self, input_ids: torch.Tensor, attention_mask: torch.Tensor | None = None):
        """Decode one batch of requests; returns a :class:`~zerogr_core.DecodeResult`."""
        if not isinstance(input_ids, torch.Tensor):
            raise ZeroGRError(f"input_ids: expected a torch.Tensor, got {type(input_ids).__name__}")
        return self.serving.decode(input_ids, attention_mask)


def generate(model, input_ids: torch.Tensor, index, *, beam_width: int, token_offsets: Sequence[int],
             order: str = "filter-first", attention_mask: torch.Tensor | None = None,
             decoder_start_token_id: int | None = None):
    """Constrained beam search over the catalog with a Hugging Face model.

    Parameters
    ----------
    model : transformers.PreTrainedModel
        ``T5ForConditionalGeneration``-like encoder–decoder or decoder-only causal LM.
    input_ids : torch.Tensor, shape (batch, T), int64
        Encoder input, or the causal LM's prompt (left padding).
    index : StepIndex
        :func:`zerogr_core.build_index` of the catalog, on the model's device.
    beam_width : int
    token_offsets : sequence of int
        SID level ``l``, token ``t`` is vocabulary id ``token_offsets[l] + t``.
    order : {"filter-first", "score-first", "unconstrained"}
    attention_mask : torch.Tensor, shape (batch, T), optional
    decoder_start_token_id : int, optional

    Returns
    -------
    DecodeResult
        ``tokens`` (batch, beam_width, L) local SID tokens, ``scores`` summed
        log-probabilities, ``item_rows`` catalog rows (``result.item_ids(catalog)``).

    Raises
    ------
    ZeroGRError
        A vocabulary that does not hold every level's tokens, an unsupported output
        projection, or bad shapes.
    """
    generator = HFGenerator(model, index, beam_width=beam_width, token_offsets=token_offsets, order=order,
                            decoder_start_token_id=decoder_start_token_id)
    return generator.generate(input_ids, attention_mask)
