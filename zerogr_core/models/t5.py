"""A Hugging Face T5 decoder served with one encoder memory per request and static caches.

Hugging Face ``generate`` repeats the encoder output once per beam and every layer's
cross-attention keys and values with it, then reorders all of them at every step. The
beams of one request share one memory, so :class:`T5StepModel`

* computes each decoder layer's cross-attention keys and values once per request at
  prefill, and lets the ``M`` beams of a request query them together (one (M × T)
  attention per request and head, never a per-beam copy:
  :func:`zerogr_kernels.request_attention`);
* never reorders the self-attention cache: step ``l`` writes its queries, keys and values
  (one GEMM per layer) in its own rows of a preallocated (layers, L, batch · M, 3 · heads ·
  d_kv) buffer, each beam keeps the row of its ancestor at every earlier step (a
  (L, batch · M) int64 table, updated by parent), and the attention reads each beam's
  lineage in place (:func:`zerogr_kernels.cached_self_attention`);
* fuses every residual add with the RMS layer norm after it
  (:func:`zerogr_kernels.rms_layer_norm`) and precomputes the decoder's relative position
  bias for all L positions, per dtype;
* can run its prefill inside the decode (:meth:`T5StepModel.stage`): the inputs go to
  static, length-bucketed buffers and step 0 runs the encoder and the cross-attention
  keys/values there, so a CUDA graph of the decode holds the whole model.

On CUDA tensors these Triton kernels run; elsewhere their PyTorch references (the same
arithmetic). It reads the weights of a ``T5ForConditionalGeneration`` (any size, ReLU or
gated-GELU feed-forward) and reproduces its decoder's output (what ``lm_head`` reads)
within floating-point tolerance (``tests/test_hf.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from zerogr_kernels.beam_attention import cached_self_attention_reference, cached_self_attention_triton
from zerogr_kernels.memory_attention import request_attention_reference, request_attention_triton
from zerogr_kernels.rms_norm import MAX_WIDTH, rms_layer_norm_reference, rms_layer_norm_triton

from ..errors import ZeroGRError
from .hf import step_offsets
from .protocol import StagedRange, defers_range, keep_static, partial_flag, partial_step, safe_parents, token_inputs


class T5StepModel:
    """:class:`~zerogr_core.models.protocol.StepModel` over a ``T5ForConditionalGeneration``.

    Parameters
    ----------
    model : transformers.T5ForConditionalGeneration
        Put in eval mode. Its weights are used in place, except the attention projections,
        which are concatenated into one copy per dtype at the first prefill (a model whose
        weights change afterwards needs a new step model).
    token_offsets : sequence of int
        Vocabulary id of token 0 of each SID level (L = its length); whole numbers whose
        ids lie in the model's vocabulary (:func:`~zerogr_core.models.hf.step_offsets`).
    decoder_start_token_id : int, optional
        Default: ``model.config.decoder_start_token_id``.
    history_bucket : int
        :meth:`stage` pads the input length up to a multiple of it, so histories of
        nearby lengths share static buffers (and one captured graph).
    partial_last_step : bool
        At the last step, run the decoder only on the beams filtering first reads (those whose
        prefix holds more than one item; :mod:`zerogr_core.decode.loop`); the decode returns the
        same beams. Off by default: this small decoder is launch-bound, and the host read between
        the decode's two graphs costs more than the skipped beams save unless few prefixes branch
        (lent H100, bf16, batch 8 and 32 × beam 128: 1.05–1.06× the full last step's time on the
        4 × 256 catalog, 0.90–0.93× on the search-like one, whose last-level prefixes each hold one
        item).

    Attributes
    ----------
    kernels : bool or None
        Whether the Triton kernels run (with the feed-forward's GEMM + ReLU fused); None
        (default): on CUDA tensors, their PyTorch references elsewhere. True on CPU tensors
        needs ``TRITON_INTERPRET=1`` (the tests check the GPU path that way).

    Notes
    -----
    Two prefills: :meth:`prefill` runs Hugging Face's encoder eagerly (outside any graph);
    :meth:`stage` only copies the inputs into static buffers, and step 0 runs the encoder
    (:meth:`encode`) inside the decode, so a CUDA graph of the decode includes it.
    """

    def __init__(self, model, token_offsets, decoder_start_token_id: int | None = None, history_bucket: int = 16,
                 partial_last_step: bool = False):
        self.token_offsets = step_offsets(model, token_offsets)
        self.model = model.eval()
        config = model.config
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
        self.history_bucket = int(history_bucket)
        if self.history_bucket < 1:
            raise ZeroGRError(f"history_bucket: expected an integer ≥ 1, got {history_bucket!r}")
        self.batch = 0
        self.kernels = None
        self.encode_in_step = False
        self.graph_safe = True   # static buffers only: the whole decode may be captured in a CUDA graph
        self.partial_last_step = partial_flag(partial_last_step)
        self._range = StagedRange(self.device)

    @property
    def device(self) -> torch.device:
        return self.model.decoder.embed_tokens.weight.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.decoder.embed_tokens.weight.dtype

    @property
    def vocab(self) -> int:
        """The encoder's input vocabulary size."""
        return int(self.model.encoder.embed_tokens.num_embeddings)

    def _inputs(self, history: torch.Tensor, attention_mask: torch.Tensor | None, check_range: bool = True):
        """Checked (ids, mask) on the model's device (:func:`~.protocol.token_inputs`)."""
        return token_inputs(history, attention_mask, self.vocab, self.device, check_range=check_range)

    def _cross(self, memory: torch.Tensor, mask: torch.Tensor):
        """Every decoder layer's cross-attention keys and values, one (B, T, layers · 2 · heads · d_kv)
        tensor (layer l's keys, then its values, at columns 2l · heads · d_kv on), and the (B, T)
        padding bias, per request."""
        return F.linear(memory, self.w_cross), _padding_bias(mask, memory.dtype)

    def _allocate(self, b: int, beam_width: int, dtype: torch.dtype) -> None:
        """The decode's static buffers for ``b`` requests of ``beam_width`` beams.

        ``qkv`` (layers, L, b · M, 3 · heads · d_kv) holds every step's self-attention
        queries, keys and values in that step's rows; ``ancestors`` (L, b · M) int64 the
        row of each earlier step a beam descends from; ``step_bias`` (L, heads, L) float32
        the position bias of each query position, rounded to ``dtype`` as Hugging Face adds it.
        """
        n, hd = b * beam_width, self.heads * self.d_kv
        self.qkv = torch.zeros(len(self.blocks), self.n_levels, n, 3 * hd, dtype=dtype, device=self.device)
        self.ancestors = torch.zeros(self.n_levels, n, dtype=torch.int64, device=self.device)
        # a partial last step's own ancestry (the step leaves ``ancestors`` as it found it)
        self.last_ancestors = torch.zeros_like(self.ancestors)
        self.step_bias = self.position_bias[0].to(dtype).float().transpose(0, 1).contiguous()
        self.batch, self.beam_width = b, beam_width

    def _fuse(self, dtype: torch.dtype) -> None:
        """The attention projections concatenated, so one GEMM computes what three (or 2 · layers)
        would: ``w_qkv`` and ``w_enc_qkv`` per decoder and encoder layer, (3 · heads · d_kv,
        d_model) (query, key, value); ``w_cross`` (layers · 2 · heads · d_kv, d_model), every
        decoder layer's cross-attention key and value; ``ff_zero`` (d_ff,) zeros. Made once
        per dtype, so a captured graph keeps reading the same tensors."""
        if getattr(self, "_fused_dtype", None) == dtype:
            return
        qkv = lambda a: torch.cat([a.q.weight, a.k.weight, a.v.weight]).to(dtype)  # noqa: E731
        self.w_qkv = [qkv(block.layer[0].SelfAttention) for block in self.blocks]
        self.w_enc_qkv = [qkv(block.layer[0].SelfAttention) for block in self.model.encoder.block]
        self.w_cross = torch.cat([w for block in self.blocks for w in (block.layer[1].EncDecAttention.k.weight,
                                                                       block.layer[1].EncDecAttention.v.weight)])
        self.w_cross = self.w_cross.to(dtype)
        # the bias a GEMM with a ReLU epilogue takes (T5's feed-forward has none)
        self.ff_zero = torch.zeros(self.model.config.d_ff, dtype=dtype, device=self.device)
        self._fused_dtype = dtype

    def _norm(self, x: torch.Tensor, layer_norm, residual: torch.Tensor | None = None):
        """``layer_norm`` (a ``T5LayerNorm``) of the rows of ``x`` (…, d), after adding
        ``residual`` when given (then returns (normed, x + residual), both shaped like ``x``)."""
        shape = x.shape
        rows = x.reshape(-1, shape[-1])
        res = None if residual is None else residual.reshape(rows.shape)
        kernel = self._kernels(x) and shape[-1] <= MAX_WIDTH
        out = (rms_layer_norm_triton if kernel else rms_layer_norm_reference)(
            rows, layer_norm.weight, layer_norm.variance_epsilon, res)
        if residual is None:
            return out.view(shape)
        return out[0].view(shape), out[1].view(shape)

    def _kernels(self, x: torch.Tensor) -> bool:
        """Whether the Triton kernels (and the fused GEMM + ReLU) serve ``x``: :attr:`kernels`,
        by default on CUDA tensors only."""
        return x.is_cuda if self.kernels is None else self.kernels

    def _feed_forward(self, dense, h: torch.Tensor, fused: bool | None = None) -> torch.Tensor:
        """Hugging Face's feed-forward module ``dense`` on ``h`` (…, d_model).

        With ``fused`` (default: where the kernels run) a ReLU module (``T5DenseActDense``) runs its first
        product and the ReLU as one GEMM with a ReLU epilogue (cuBLASLt on CUDA), so the
        (…, d_ff) activations are written once, not written, read and written again.
        """
        fused = self._kernels(h) if fused is None else fused
        wi = getattr(dense, "wi", None)
        # torch._addmm_activation is private (cuBLASLt's ReLU epilogue): without it, the module runs
        if not (fused and _ADDMM_RELU and isinstance(getattr(dense, "act", None), torch.nn.ReLU) and wi is not None
                and wi.weight.dtype == self.ff_zero.dtype == h.dtype):
            return dense(h)
        a = torch._addmm_activation(self.ff_zero, h.reshape(-1, h.shape[-1]), wi.weight.t())
        return dense.wo(a).view(*h.shape[:-1], -1)

    def _add_norm(self, y: torch.Tensor, x: torch.Tensor, layer_norm, clamp: bool = False):
        """The residual stream ``x + y`` and its norm; ``clamp`` applies T5's FP16 clamp to the sum
        first (the encoder's), which the fused kernel cannot."""
        if clamp and x.dtype == torch.float16:
            x = _clamp_fp16(x + y)
            return self._norm(x, layer_norm), x
        return self._norm(y, layer_norm, residual=x)

    @torch.no_grad()
    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """Encode the requests (Hugging Face's encoder, eagerly) and compute every layer's
        cross-attention keys/values once.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T), int64
            Encoder input ids.
        attention_mask : torch.Tensor, shape (B, T), optional
            1 on tokens, 0 on padding.
        beam_width : int

        See Also
        --------
        stage : the same with the encoder run inside the decode (capturable in a CUDA graph).
        """
        history, mask = self._inputs(history, attention_mask)
        self._range.pending = False
        b, t = history.shape
        memory = self.model.encoder(input_ids=history, attention_mask=mask).last_hidden_state
        self._fuse(memory.dtype)
        cross_kv, cross_bias = self._cross(memory, mask)
        self.encode_in_step = False
        if keep_static(self, (b, t, beam_width, memory.dtype), cross_kv=cross_kv, cross_bias=cross_bias):
            return
        self._allocate(b, beam_width, memory.dtype)

    def bucket(self, t: int) -> int:
        """The padded history length of a ``t``-token input: the next multiple of ``history_bucket``."""
        return -(-t // self.history_bucket) * self.history_bucket

    @torch.no_grad()
    def stage(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
              beam_width: int) -> None:
        """A prefill whose device work runs at step 0, so one CUDA graph holds encoder and decode.

        Copies the requests into static (B, T_b) input buffers (right padding up to the
        bucket ``T_b = bucket(T)``, masked out) and nothing else; ``step(0, …)`` then runs
        :meth:`encode`. Inputs of one batch size and bucket reuse the same buffers (and a
        graph captured on them replays); a new bucket allocates new ones (captured again).

        Parameters
        ----------
        history : torch.Tensor, shape (B, T), int64
        attention_mask : torch.Tensor, shape (B, T), optional
            1 on tokens, 0 on padding (any padding side).
        beam_width : int
        """
        # ids already on the GPU are checked after the launch (StagedRange): a check now would hold
        # the encoder back until the host has read a device reduction
        defer = defers_range(history, self.device)
        history, mask = self._inputs(history, attention_mask, check_range=not defer)
        self._range.pending = defer
        b, t = history.shape
        tb, dtype = self.bucket(t), self.dtype
        self._fuse(dtype)
        key = (b, tb, beam_width, dtype, "staged")
        if getattr(self, "_static_key", None) != key:
            d = self.model.config.d_model
            self.ids = torch.zeros(b, tb, dtype=torch.int64, device=self.device)
            self.ids_mask = torch.zeros(b, tb, dtype=torch.int64, device=self.device)
            self.memory = torch.zeros(b, tb, d, dtype=dtype, device=self.device)
            self.cross_kv = torch.zeros(b, tb, self.w_cross.shape[0], dtype=dtype, device=self.device)
            self.cross_bias = torch.zeros(b, tb, dtype=dtype, device=self.device)
            first = self.model.encoder.block[0].layer[0].SelfAttention
            # (1, heads, T_b, T_b), the encoder's bidirectional relative position bias: fixed per bucket
            self.encoder_bias = first.compute_bias(tb, tb, device=self.device).to(dtype)
            self._allocate(b, beam_width, dtype)
            self._static_key = key
        self.ids[:, :t].copy_(history)
        self.ids[:, t:].zero_()
        self.ids_mask[:, :t].copy_(mask)
        self.ids_mask[:, t:].zero_()
        self.encode_in_step = True

    def check_staged(self) -> None:
        """Raise :class:`~zerogr_core.ZeroGRError` if the ids :meth:`stage` took from a GPU tensor
        leave the vocabulary (read after the decode's launch, :class:`~.protocol.StagedRange`);
        :class:`~.protocol.StepDecoder` calls it after each decode."""
        if self._range.pending:  # only a staged call sets it; the prefill outside has no ``ids``
            self._range.verify(self.ids, self.vocab)

    @torch.no_grad()
    def encode(self) -> None:
        """The encoder and the cross-attention keys/values of the staged inputs, into static buffers.

        Reads the weights of the Hugging Face encoder with its own arithmetic (RMS layer
        norms, unscaled attention with the shared relative position bias, feed-forward
        modules) but no host synchronisation, data-dependent shape or Python branch on
        tensor values, so it can be captured.
        """
        encoder = self.model.encoder
        dtype = self.dtype
        pad = (self.ids_mask == 0)[:, None, None, :]
        bias = self.encoder_bias.masked_fill(pad, torch.finfo(dtype).min)          # (B, heads, T_b, T_b)
        self._range.record(self.ids)
        # clamped, so that an id outside the vocabulary cannot fault the gather before the check reads it
        x = encoder.embed_tokens(self.ids.clamp(0, self.vocab - 1))
        b, t, _ = x.shape
        h = self._norm(x, encoder.block[0].layer[0].layer_norm)
        attend = request_attention_triton if self._kernels(x) else request_attention_reference
        hd = self.heads * self.d_kv
        for i, block in enumerate(encoder.block):
            q, k, v = F.linear(h, self.w_enc_qkv[i]).split(hd, dim=-1)
            y = attend(q, k, v, bias, heads=self.heads)
            ff = block.layer[-1]
            h, x = self._add_norm(block.layer[0].SelfAttention.o(y), x, ff.layer_norm, clamp=True)
            following = encoder.block[i + 1].layer[0].layer_norm if i + 1 < len(encoder.block) \
                else encoder.final_layer_norm
            h, x = self._add_norm(self._feed_forward(ff.DenseReluDense, h), x, following, clamp=True)
        self.memory.copy_(h)
        torch.mm(self.memory.view(b * t, -1), self.w_cross.t(), out=self.cross_kv.view(b * t, -1))
        self.cross_bias.copy_(_padding_bias(self.ids_mask, dtype))

    @torch.no_grad()
    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None,
             wanted: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
        """Decoder output (batch * beams, d_model) at position ``step`` (see the protocol).

        At the last step, ``wanted`` ((B, M) bool) with ``rows`` (int, at least the number of wanted
        beams of every request) runs the layers on ``rows`` beams per request, the wanted ones first;
        the rows of the beams left out are zeros, and the beams' ancestry is left as it was (the step
        may run again)."""
        if not self.batch:
            raise ZeroGRError("step model: call prefill before step")
        b = self.batch
        if step == 0:
            if self.encode_in_step:
                self.encode()
            return self._layers(0, torch.full((b,), self.start, dtype=torch.int64, device=self.device),
                                self.ancestors, 1)
        beams = tokens.shape[1]
        prev = 1 if step == 1 else self.beam_width
        parent_rows = safe_parents(parents.to(self.device), prev)
        if wanted is None or rows is None or step + 1 != self.n_levels:
            n = parent_rows.numel()
            if step > 1:
                self.ancestors[:step - 1, :n].copy_(self.ancestors[:step - 1, :b * prev].index_select(1, parent_rows))
            self.ancestors[step - 1, :n].copy_(parent_rows)
            return self._layers(step, self._ids(step, tokens), self.ancestors, beams)

        def compute(order):
            # the computed beams' ancestry in a table of their own, row i for the i-th of them
            n, src = order.numel(), parent_rows.view(b, beams).gather(1, order).reshape(-1)
            table = self.last_ancestors
            if step > 1:
                table[:step - 1, :n].copy_(self.ancestors[:step - 1].index_select(1, src))
            table[step - 1, :n].copy_(src)
            return self._layers(step, self._ids(step, tokens.gather(1, order)), table, order.shape[1])

        return partial_step(wanted, rows, self.hidden_size, self.dtype, compute)

    def _ids(self, step: int, tokens: torch.Tensor) -> torch.Tensor:
        """The vocabulary ids (n,) of the (B, beams) SID tokens of level ``step - 1``."""
        return tokens.to(self.device, torch.int64).reshape(-1).clamp(min=0) + self.token_offsets[step - 1]

    def _layers(self, step: int, ids: torch.Tensor, ancestors: torch.Tensor, beams: int) -> torch.Tensor:
        """The decoder over ``beams`` beams per request at position ``step``, fed ``ids`` (B · beams,),
        whose earlier positions' rows are ``ancestors`` (L, rows) (beam ``i`` writes its query, key
        and value to row ``i`` of position ``step``): (B · beams, d_model)."""
        b = self.batch
        n = b * beams
        x = self.model.decoder.embed_tokens(ids)                                  # (n, d)
        kernels = self._kernels(x)
        attend = cached_self_attention_triton if kernels else cached_self_attention_reference
        attend_memory = request_attention_triton if kernels else request_attention_reference
        hd = self.heads * self.d_kv
        h = self._norm(x, self.blocks[0].layer[0].layer_norm)
        for layer, block in enumerate(self.blocks):
            qkv = self.qkv[layer]
            torch.mm(h, self.w_qkv[layer].t(), out=qkv[step, :n])
            y = attend(qkv, ancestors, self.step_bias[step], step=step, n=n, heads=self.heads)
            ca, ff = block.layer[1], block.layer[2]
            h, x = self._add_norm(block.layer[0].SelfAttention.o(y), x, ca.layer_norm)
            cross = ca.EncDecAttention
            kv = self.cross_kv[..., 2 * layer * hd:2 * (layer + 1) * hd]
            # the beams of a request query its memory together
            y = attend_memory(cross.q(h.view(b, beams, -1)), kv[..., :hd], kv[..., hd:],
                              self.cross_bias[:, None, None, :], heads=self.heads)
            h, x = self._add_norm(cross.o(y).view(n, -1), x, ff.layer_norm)
            following = self.blocks[layer + 1].layer[0].layer_norm if layer + 1 < len(self.blocks) \
                else self.model.decoder.final_layer_norm
            h, x = self._add_norm(self._feed_forward(ff.DenseReluDense, h), x, following)
        if self.out_scale is not None:
            h = h * self.out_scale
        return h


def _padding_bias(mask: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """(B, T) additive attention bias of a (B, T) mask: 0 on tokens, the dtype's lowest value on padding."""
    return torch.zeros(mask.shape, dtype=dtype, device=mask.device).masked_fill(mask == 0, torch.finfo(dtype).min)


_ADDMM_RELU = callable(getattr(torch, "_addmm_activation", None))


def _clamp_fp16(x: torch.Tensor) -> torch.Tensor:
    """Hugging Face T5's clamp of FP16 activations (device-side: no host synchronisation)."""
    if x.dtype != torch.float16:
        return x
    top = torch.finfo(torch.float16).max
    limit = torch.where(torch.isinf(x).any(), top - 1000, top).to(x.dtype)
    return torch.clamp(x, min=-limit, max=limit)
