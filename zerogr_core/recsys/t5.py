"""A TIGER-style recommender on the Hugging Face T5 encoder-decoder.

The history items enter the encoder as their SID tokens (item after item, oldest first,
then an end-of-sequence token), as TIGER does; the decoder emits the L SID tokens of the
next item. One token vocabulary covers every level: ``PAD`` (also the decoder start
token), ``EOS``, then level ``l``'s codebook at offset ``2 + sum(|V_0| … |V_{l-1}|)``.
The output projection is not tied to the embeddings, so level ``l``'s decoding head is
simply its band of ``lm_head`` rows.

For constrained beam search through :class:`zerogr_core.Decoder`, :meth:`T5Recommender.hidden_fn_for`
encodes a batch of histories once and, at every step, recomputes the decoder over the
step's prefixes with the T5 weights. It folds the beams of a request into the query axis
of cross-attention, so the encoder keys and values are projected once per request, not
once per beam; the result equals the Hugging Face decoder's (checked by the tests).

``transformers`` is imported when a model is built, so ``import zerogr_core`` works without it.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ZeroGRError

PAD, EOS = 0, 1


@dataclass(frozen=True)
class T5Config:
    """Architecture of the recommender.

    Attributes
    ----------
    encoder_layers, decoder_layers : int
    d_model : int
    n_heads : int
    d_kv : int
        Per-head width (T5 keeps it independent of ``d_model / n_heads``).
    d_ff : int
        Feed-forward width (ReLU, as the original T5).
    dropout : float
    max_items : int
        Newest history items fed to the encoder (each is L tokens).
    """

    encoder_layers: int = 4
    decoder_layers: int = 4
    d_model: int = 128
    n_heads: int = 6
    d_kv: int = 64
    d_ff: int = 1024
    dropout: float = 0.1
    max_items: int = 20


def _require_transformers():
    try:
        import transformers
    except ImportError:
        raise ZeroGRError("the T5 recommender needs transformers (pip install transformers==5.17.0)") from None
    return transformers


class T5Recommender(nn.Module):
    """SID-token T5 over item histories.

    Parameters
    ----------
    config : T5Config
    codebook_sizes : sequence of int
        |V_l| per SID level (collision level included).
    """

    def __init__(self, config: T5Config, codebook_sizes: Sequence[int]):
        super().__init__()
        transformers = _require_transformers()
        self.config = config
        self.codebook_sizes = tuple(int(v) for v in codebook_sizes)
        self.offsets = tuple(2 + int(v) for v in np.cumsum((0,) + self.codebook_sizes[:-1]))
        vocab = 2 + sum(self.codebook_sizes)
        hf_config = transformers.T5Config(
            vocab_size=vocab, d_model=config.d_model, d_kv=config.d_kv, d_ff=config.d_ff,
            num_layers=config.encoder_layers, num_decoder_layers=config.decoder_layers,
            num_heads=config.n_heads, dropout_rate=config.dropout, feed_forward_proj="relu",
            tie_word_embeddings=False, pad_token_id=PAD, eos_token_id=EOS, decoder_start_token_id=PAD,
            use_cache=False)
        self.t5 = transformers.T5ForConditionalGeneration(hf_config)
        # T5 draws an untied lm_head with std 1, which puts the first logits at std √d_model
        # (a loss near 30); scale it like the other projections so training starts at ~log|V|.
        nn.init.normal_(self.t5.lm_head.weight, std=config.d_model ** -0.5)
        self.register_buffer("level_offsets", torch.tensor(self.offsets, dtype=torch.int64), persistent=False)

    @property
    def n_levels(self) -> int:
        return len(self.codebook_sizes)

    @property
    def device(self) -> torch.device:
        return self.t5.lm_head.weight.device

    def describe(self) -> dict:
        """Config, codebook sizes and parameter count, for reports."""
        return dict(config=asdict(self.config), codebook_sizes=list(self.codebook_sizes), kind="hf-t5",
                    parameters=int(sum(p.numel() for p in self.parameters())))

    # ------------------------------------------------------------------ tokens
    def tokens(self, sids: torch.Tensor) -> torch.Tensor:
        """Vocabulary ids of SID tokens: (…, l) int64 → (…, l); -1 stays -1."""
        l = sids.shape[-1]
        return torch.where(sids >= 0, sids + self.level_offsets[:l], sids)

    def encoder_inputs(self, histories: Sequence[np.ndarray], sids: torch.Tensor
                       ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and attention mask of a batch of histories.

        Parameters
        ----------
        histories : sequence of np.ndarray (h_b,) int64
            Item rows (into ``sids``), oldest first, each non-empty; the newest
            ``max_items`` are kept.
        sids : torch.Tensor, shape (N, L), int64

        Returns
        -------
        input_ids : torch.Tensor, shape (B, T), int64
            ``T = L · max kept items + 1``; right-padded with ``PAD``.
        attention_mask : torch.Tensor, shape (B, T), int64
        """
        kept = [np.asarray(h, dtype=np.int64)[-self.config.max_items:] for h in histories]
        if any(k.size == 0 for k in kept):
            raise ZeroGRError("histories: every request needs at least one past item")
        lengths = torch.tensor([k.size for k in kept], dtype=torch.int64)
        width = int(lengths.max())
        rows = torch.zeros(len(kept), width, dtype=torch.int64)
        for b, k in enumerate(kept):
            rows[b, :k.size] = torch.from_numpy(k)
        return self.pack(rows.to(sids.device), lengths.to(sids.device), sids)

    def pack(self, rows: torch.Tensor, lengths: torch.Tensor, sids: torch.Tensor
             ) -> tuple[torch.Tensor, torch.Tensor]:
        """Token ids and mask from left-aligned item rows (B, W) and their lengths (B,)."""
        b, w = rows.shape
        L = self.n_levels
        toks = self.tokens(sids[rows]).reshape(b, w * L)
        n_tok = lengths * L
        pos = torch.arange(w * L + 1, device=rows.device)
        ids = torch.full((b, w * L + 1), PAD, dtype=torch.int64, device=rows.device)
        ids[:, :w * L] = toks
        ids = torch.where(pos[None, :] < n_tok[:, None], ids, PAD)
        ids = torch.where(pos[None, :] == n_tok[:, None], EOS, ids)
        return ids, (pos[None, :] <= n_tok[:, None]).long()

    def loss(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, target_sids: torch.Tensor
             ) -> torch.Tensor:
        """Teacher-forced cross-entropy per target token (mean over the batch and levels).

        Parameters
        ----------
        input_ids, attention_mask : torch.Tensor, shape (B, T), int64
        target_sids : torch.Tensor, shape (B, L), int64
        """
        out = self.t5(input_ids=input_ids, attention_mask=attention_mask, labels=self.tokens(target_sids))
        return out.loss

    def level_logits(self, input_ids: torch.Tensor, attention_mask: torch.Tensor, *target_sids: torch.Tensor
                     ) -> tuple[torch.Tensor, list[list[torch.Tensor]]]:
        """Teacher-forced logits of several target sets under one encoder pass.

        Parameters
        ----------
        input_ids, attention_mask : torch.Tensor, shape (B, T), int64
        *target_sids : torch.Tensor, shape (B, L), int64
            Each set is decoded teacher-forced against the same encoder output.

        Returns
        -------
        loss : torch.Tensor, scalar
            :meth:`loss` of the first set.
        bands : list (one per set) of list of torch.Tensor, level l: (B, |V_l|)
            Each level's logits over its own codebook (what its decoding head scores).
        """
        from transformers.modeling_outputs import BaseModelOutput

        memory = self.t5.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        encoded = BaseModelOutput(last_hidden_state=memory)
        loss, bands = None, []
        for tgt in target_sids:
            out = self.t5(encoder_outputs=encoded, attention_mask=attention_mask, labels=self.tokens(tgt))
            loss = out.loss if loss is None else loss
            bands.append([out.logits[:, level, o:o + v]
                          for level, (o, v) in enumerate(zip(self.offsets, self.codebook_sizes))])
        return loss, bands

    # ------------------------------------------------------------------ decoding
    def head_weights(self) -> list[torch.Tensor]:
        """Per-level output projections for the Decoder: L × (|V_l|, d_model), detached."""
        w = self.t5.lm_head.weight.detach()
        return [w[o:o + v] for o, v in zip(self.offsets, self.codebook_sizes)]

    def step_model(self):
        """This model as a :class:`~zerogr_core.models.protocol.StepModel` (KV cache, one encoder
        memory per request): prefill it with :meth:`encoder_inputs`; its hidden states equal
        :meth:`hidden_fn_for`'s.

        Returns
        -------
        zerogr_core.models.t5.T5StepModel
            Reads this model's weights in place (eval mode).
        """
        from ..models.t5 import T5StepModel

        self.eval()
        return T5StepModel(self.t5, self.offsets, decoder_start_token_id=PAD)

    def _scale(self) -> float:
        return self.config.d_model ** -0.5 if getattr(self.t5.config, "scale_decoder_outputs", False) else 1.0

    @torch.no_grad()
    def hidden_fn_for(self, histories: Sequence[np.ndarray], sids: torch.Tensor
                      ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """The ``hidden_fn`` of a batch of requests, for :meth:`zerogr_core.Decoder.decode`.

        Switches the model to eval mode and encodes the histories once.

        Parameters
        ----------
        histories : sequence of np.ndarray (h_b,) int64
            Item rows (into ``sids``) of each request, oldest first, each non-empty.
        sids : torch.Tensor, shape (N, L), int64

        Returns
        -------
        callable(step, prefixes) -> torch.Tensor
            ``prefixes`` (B, beams, step) int64 (-1 for unfilled beams) → decoder hidden
            states (B, beams, d_model) at position ``step``, in the heads' dtype.
        """
        self.eval()
        return self._hidden_fn(*self.encoder_inputs(histories, sids.to(self.device)))

    def staged(self, batch: int, sids: torch.Tensor):
        """A ``hidden_fn`` over static request buffers that ``load`` refills
        (:class:`~zerogr_core.recsys.model.StagedRequests`): one object for a whole run of
        ``batch``-request calls, so the decode engine captures one graph (the encoder
        included, at step 0) and replays it for every batch."""
        from .model import StagedRequests

        sids = sids.to(self.device)

        def build(rows: torch.Tensor, lengths: torch.Tensor):
            self.eval()
            return self._hidden_fn(*self.pack(rows, lengths, sids))

        return StagedRequests(batch, self.config.max_items, self.device, build)

    def _hidden_fn(self, input_ids: torch.Tensor, mask: torch.Tensor):
        """The ``hidden_fn`` of encoder inputs (B, T) and their mask (B, T)."""
        memory = self.t5.encoder(input_ids=input_ids, attention_mask=mask).last_hidden_state
        decoder = self.t5.decoder
        cross_kv = []
        for block in decoder.block:
            att = block.layer[1].EncDecAttention
            cross_kv.append((_heads(att.k(memory), att.n_heads), _heads(att.v(memory), att.n_heads)))
        # Additive mask over encoder positions: (B, 1, 1, T).
        cross_bias = torch.zeros(mask.shape, dtype=memory.dtype, device=memory.device)
        cross_bias = cross_bias.masked_fill(mask == 0, torch.finfo(memory.dtype).min)[:, None, None, :]
        scale, dtype = self._scale(), self.t5.lm_head.weight.dtype

        @torch.no_grad()
        def hidden_fn(step: int, prefixes: torch.Tensor) -> torch.Tensor:
            b, m = prefixes.shape[:2]
            prev = self.tokens(prefixes.to(memory.device)).clamp(min=PAD)
            ids = torch.cat([torch.full((b, m, 1), PAD, dtype=torch.int64, device=memory.device), prev], dim=2)
            hidden = _decoder_forward(decoder, ids, cross_kv, cross_bias)
            return (hidden[:, :, step] * scale).to(dtype)

        return hidden_fn


def _heads(x: torch.Tensor, n_heads: int) -> torch.Tensor:
    """(B, T, H·dk) → (B, H, T, dk)."""
    b, t, _ = x.shape
    return x.view(b, t, n_heads, -1).transpose(1, 2)


def _decoder_forward(decoder, ids: torch.Tensor, cross_kv, cross_bias: torch.Tensor) -> torch.Tensor:
    """The T5 decoder stack (eval mode) on M prefixes per request against one memory each.

    Parameters
    ----------
    decoder : transformers T5Stack (decoder)
    ids : torch.Tensor, shape (B, M, S), int64
    cross_kv : list of (keys, values), each (B, heads, T, dk)
        Encoder keys and values of every decoder block.
    cross_bias : torch.Tensor, shape (B, 1, 1, T)
        0 for real encoder positions, a large negative number for padding.

    Returns
    -------
    torch.Tensor, shape (B, M, S, d_model)
        After the final layer norm.
    """
    b, m, s = ids.shape
    x = decoder.embed_tokens(ids)
    first = decoder.block[0].layer[0].SelfAttention
    causal = torch.ones(s, s, dtype=torch.bool, device=ids.device).tril()
    self_bias = first.compute_bias(s, s, device=ids.device).to(x.dtype)          # (1, H, S, S)
    self_bias = self_bias.masked_fill(~causal, torch.finfo(x.dtype).min)
    for block, (ck, cv) in zip(decoder.block, cross_kv):
        sa = block.layer[0].SelfAttention
        h = block.layer[0].layer_norm(x).reshape(b * m, s, -1)
        q, k, v = (_heads(proj(h), sa.n_heads) for proj in (sa.q, sa.k, sa.v))
        y = F.scaled_dot_product_attention(q, k, v, attn_mask=self_bias, scale=1.0)
        x = x + sa.o(y.transpose(1, 2).reshape(b, m, s, -1))
        ca = block.layer[1].EncDecAttention
        h = block.layer[1].layer_norm(x).reshape(b, m * s, -1)
        y = F.scaled_dot_product_attention(_heads(ca.q(h), ca.n_heads), ck, cv, attn_mask=cross_bias, scale=1.0)
        x = x + ca.o(y.transpose(1, 2).reshape(b, m, s, -1))
        ff = block.layer[2]
        x = x + ff.DenseReluDense(ff.layer_norm(x))
    return decoder.final_layer_norm(x)
