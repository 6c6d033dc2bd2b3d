"""A Hugging Face T5 decoder served with one encoder memory per request and static caches.

Hugging Face ``generate`` repeats the encoder output once per beam and every layer's
cross-attention keys and values with it, then reorders all of them at every step. The
beams of one request share one memory, so :class:`T5StepModel`

* computes each decoder layer's cross-attention keys and values once per request at
  prefill, and lets the ``M`` beams of a request query them together (one (M × T)
  attention per request and head, never a per-beam copy);
* reorders by parent only the self-attention cache, which holds at most L positions, in
  preallocated (batch · M, heads, L, d_kv) buffers;
* precomputes the decoder's relative position bias for all L positions.

It reads the weights of a ``T5ForConditionalGeneration`` (any size, ReLU or gated-GELU
feed-forward) and reproduces its decoder's output (what ``lm_head`` reads) within
floating-point tolerance (``tests/test_hf.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from ..errors import ZeroGRError
from .protocol import keep_static, reorder_rows, safe_parents


class T5StepModel:
    """:class:`~zerogr_core.models.protocol.StepModel` over a ``T5ForConditionalGeneration``.

    Parameters
    ----------
    model : transformers.T5ForConditionalGeneration
        Put in eval mode; its weights are used in place (not copied).
    token_offsets : sequence of int
        Vocabulary id of token 0 of each SID level (L = its length).
    decoder_start_token_id : int, optional
        Default: ``model.config.decoder_start_token_id``.
    """

    def __init__(self, model, token_offsets, decoder_start_token_id: int | None = None):
        self.model = model.eval()
        config = model.config
        self.token_offsets = tuple(int(o) for o in token_offsets)
        self.n_levels = len(self.token_offsets)
        self.hidden_size = int(config.d_model)
        start = config.decoder_start_token_id if decoder_start_token_id is None else decoder_start_token_id
        if start is None:
            raise ZeroGRError("decoder_start_token_id: the model does not set one; pass it")
        self.start = int(start)
        self.heads, self.d_kv = int(config.num_heads), int(config.d_kv)
        scale = getattr(config, "scale_decoder_outputs", getattr(config, "tie_word_embeddings", True))
        self.out_scale = config.d_model ** -0.5 if scale else None
        self.blocks = list(model.decoder.block)
        first = self.blocks[0].layer[0].SelfAttention
        with torch.no_grad():
            # (1, heads, L, L): row l is the bias of query position l over key positions
            self.position_bias = first.compute_bias(self.n_levels, self.n_levels,
                                                    device=model.decoder.embed_tokens.weight.device)
        self.batch = 0
        self.graph_safe = True   # static buffers only: the whole decode may be captured in a CUDA graph

    @property
    def device(self) -> torch.device:
        return self.model.decoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.decoder.embed_tokens.weight.dtype

    def _split(self, x: torch.Tensor) -> torch.Tensor:
        """(B, n, heads · d_kv) → (B, heads, n, d_kv)."""
        b, n, _ = x.shape
        return x.view(b, n, self.heads, self.d_kv).transpose(1, 2)

    @torch.no_grad()
    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """Encode the requests and compute every layer's cross-attention keys/values once.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T), int64
            Encoder input ids.
        attention_mask : torch.Tensor, shape (B, T), optional
            1 on tokens, 0 on padding.
        beam_width : int
        """
        if history.dim() != 2:
            raise ZeroGRError(f"input_ids: expected shape (batch, T), got {tuple(history.shape)}")
        history = history.to(self.device)
        b, t = history.shape
        mask = torch.ones_like(history) if attention_mask is None else attention_mask.to(self.device)
        if mask.shape != history.shape:
            raise ZeroGRError(f"attention_mask: shape {tuple(mask.shape)} differs from input_ids "
                              f"{tuple(history.shape)}")
        memory = self.model.encoder(input_ids=history, attention_mask=mask).last_hidden_state
        cross_kv = []
        for block in self.blocks:
            attn = block.layer[1].EncDecAttention
            cross_kv.append((self._split(attn.k(memory)), self._split(attn.v(memory))))
        dtype = memory.dtype
        cross_bias = torch.zeros(b, 1, 1, t, dtype=dtype, device=self.device).masked_fill(
            mask[:, None, None, :] == 0, torch.finfo(dtype).min)
        if keep_static(self, (b, t, beam_width, dtype), cross_kv=cross_kv, cross_bias=cross_bias):
            return
        n = b * beam_width
        self.cache = [tuple(torch.zeros(n, self.heads, self.n_levels, self.d_kv, dtype=dtype, device=self.device)
                            for _ in range(2)) for _ in self.blocks]
        self.batch, self.beam_width = b, beam_width

    @torch.no_grad()
    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None) -> torch.Tensor:
        """Decoder output (batch * beams, d_model) at position ``step`` (see the protocol)."""
        if not self.batch:
            raise ZeroGRError("step model: call prefill before step")
        b = self.batch
        if step == 0:
            beams = 1
            ids = torch.full((b,), self.start, dtype=torch.int64, device=self.device)
        else:
            beams = tokens.shape[1]
            prev = 1 if step == 1 else self.beam_width
            rows = safe_parents(parents.to(self.device), prev)
            reorder_rows([buf for kv in self.cache for buf in kv], rows, b * prev, step)
            ids = tokens.to(self.device, torch.int64).reshape(-1).clamp(min=0) + self.token_offsets[step - 1]
        n = b * beams
        x = self.model.decoder.embed_tokens(ids)[:, None, :]                       # (n, 1, d)
        bias = self.position_bias[:, :, step:step + 1, :step + 1]
        for layer, block in enumerate(self.blocks):
            sa = block.layer[0]
            attn = sa.SelfAttention
            h = sa.layer_norm(x)
            k_cache, v_cache = self.cache[layer]
            k_cache[:n, :, step:step + 1].copy_(self._split(attn.k(h)))
            v_cache[:n, :, step:step + 1].copy_(self._split(attn.v(h)))
            y = F.scaled_dot_product_attention(self._split(attn.q(h)), k_cache[:n, :, :step + 1],
                                               v_cache[:n, :, :step + 1], attn_mask=bias.to(h.dtype), scale=1.0)
            x = x + attn.o(y.transpose(1, 2).reshape(n, 1, -1))
            ca = block.layer[1]
            cross = ca.EncDecAttention
            h = ca.layer_norm(x).view(b, beams, -1)                               # beams of a request together
            y = F.scaled_dot_product_attention(self._split(cross.q(h)), *self.cross_kv[layer],
                                               attn_mask=self.cross_bias, scale=1.0)
            x = x + cross.o(y.transpose(1, 2).reshape(b, beams, -1)).view(n, 1, -1)
            x = block.layer[2](x)
        x = self.model.decoder.final_layer_norm(x)
        if self.out_scale is not None:
            x = x * self.out_scale
        return x.view(n, -1)
