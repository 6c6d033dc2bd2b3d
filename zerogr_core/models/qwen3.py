"""A Qwen3 causal LM served as a generative recommender: context KV once per request.

The request is a token sequence (the user's context); the item is its SID, L tokens
appended to the model's vocabulary (level ``l``, local token ``t`` is vocabulary id
``token_offsets[l] + t``). :class:`Qwen3StepModel` wraps a ``transformers``
``Qwen3ForCausalLM`` of any size (it reads the module's parameters and calls its MLPs and
rotary module; the norms run in the project's fused kernels, which on a GPU return
``Qwen3RMSNorm``'s bits) and serves it through the step protocol (:mod:`zerogr_core.models.protocol`):

* **Prefill.** Each request's context runs once through the layers with causal SDPA
  (flash on a GPU). Contexts are right-padded up to a length bucket: with a causal mask
  the real tokens never attend to the padding behind them, so no mask is needed; only
  the hidden state at position ``len_b - 1`` is kept (final RMS norm applied, it predicts
  level 1). The context keys/values are stored once per request, never per beam.
* **Decode step l.** The M beams of a request attend to the request's context KV plus
  their own lineage (the SID tokens chosen so far: each token's key stays in the slot of
  the beam that chose it, after the context, and an ancestor table of (B, M, L - 1) indices,
  gathered from the parent beams each step, says which slots are a beam's). Grouped-query attention: the
  ``g = heads / kv_heads`` query heads of a KV head and all M beams form one
  ``(g·M, head_dim)`` query matrix per (request, KV head) attended over the request's
  context and each row's own lineage slots, so the context is read once per request:
  on a GPU :func:`zerogr_kernels.beam_context_attention` (splits over the context, the
  padding past ``len_b`` skipped, the own lineage keys scored apart, no mask tensor);
  elsewhere its reference, one SDPA call with an additive bias that masks the padding and
  every lineage slot but the beam's own. Context and lineage share one float32 softmax.
* **Fused projections.** Each layer's query/key/value weights are stacked into one matrix,
  and its gate/up weights into another, once at wrap time; the module's own parameters
  become views into them (no second copy), so a layer runs 4 GEMMs instead of 7 and the
  SwiGLU gate reads the gate/up output once (:func:`zerogr_kernels.silu_mul`).
* **FP8 projections (opt-in).** ``projections="fp8"`` runs the four weight GEMMs of a layer on
  float8 e4m3 weights and activations with one scale per row (:mod:`.fp8_projections`).
* **Head.** The SID rows of the tied embedding, one shared head with a band per level
  (as the generic adapter :mod:`.hf` builds it), so filtering first reads only valid rows.

Static shapes: :meth:`Qwen3StepModel.stage` copies the requests into length-bucketed
buffers and ``step(0, …)`` runs the prefill, so the GPU engine can capture prefill and the
L decode steps in one CUDA graph (``graph_safe``).

:func:`build_random` builds the named shapes (:data:`QWEN3_PRESETS`) with random weights.
``transformers`` is imported on first use only.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F

from zerogr_kernels._common import use_triton
from zerogr_kernels.context_attention import beam_context_attention_reference, beam_context_attention_triton
from zerogr_kernels.head_norm_rope import qk_norm_rope
from zerogr_kernels.rms_norm import rms_layer_norm
from zerogr_kernels.swiglu import silu_mul

from ..arg_types import whole_value
from ..errors import ZeroGRError
from . import fp8_projections
from .protocol import StagedRange, defers_range, partial_flag, partial_step, right_padded, safe_parents

__all__ = ["PROJECTIONS", "QWEN3_PRESETS", "Qwen3Preset", "Qwen3StepModel", "build_random", "projections_problem"]

PROJECTIONS = ("model", "fp8")
"""How :class:`Qwen3StepModel` runs a layer's weight GEMMs (its ``projections`` argument)."""


def projections_problem(projections, dtype) -> str | None:
    """Why ``projections`` cannot run a model of ``dtype`` (a ``torch.dtype`` or its name), in one line
    starting ``projections:``; ``None`` when it can. FP8 needs bfloat16 (the row-scaled GEMM's output)."""
    if projections not in PROJECTIONS:
        return f"projections: expected {' or '.join(PROJECTIONS)}, got {projections!r}"
    name = str(dtype).replace("torch.", "")
    if projections == "fp8" and name != "bfloat16":
        return f"projections: fp8 needs a bfloat16 model, got {name}"
    return None


@dataclass(frozen=True)
class Qwen3Preset:
    """Shape of a Qwen3 recommender with SID tokens appended to its vocabulary.

    Attributes
    ----------
    name : str
    layers, hidden, heads, kv_heads, head_dim, ffn : int
        Transformer shape (``heads`` query heads, ``kv_heads`` key/value heads of ``head_dim``).
    base_vocab : int
        The language model's own vocabulary; SID tokens follow it.
    codebook_sizes : tuple of int
        |V_l| per SID level; level ``l``'s band starts at ``base_vocab + sum(|V_<l|)``.
    rope_theta : float
    max_positions : int
    """

    name: str
    layers: int
    hidden: int
    heads: int
    kv_heads: int
    head_dim: int
    ffn: int
    base_vocab: int
    codebook_sizes: tuple[int, ...]
    rope_theta: float = 1_000_000.0
    max_positions: int = 40_960

    @property
    def token_offsets(self) -> tuple[int, ...]:
        """Vocabulary id of token 0 of each SID level."""
        out, o = [], self.base_vocab
        for size in self.codebook_sizes:
            out.append(o)
            o += size
        return tuple(out)

    @property
    def vocab(self) -> int:
        return self.base_vocab + sum(self.codebook_sizes)

    def hf_config(self):
        """The ``transformers.Qwen3Config`` of this shape (tied embeddings, no dropout)."""
        import transformers

        return transformers.Qwen3Config(
            vocab_size=self.vocab, hidden_size=self.hidden, intermediate_size=self.ffn,
            num_hidden_layers=self.layers, num_attention_heads=self.heads, num_key_value_heads=self.kv_heads,
            head_dim=self.head_dim, max_position_embeddings=self.max_positions, tie_word_embeddings=True,
            rope_parameters={"rope_type": "default", "rope_theta": self.rope_theta}, attention_dropout=0.0,
            pad_token_id=0, bos_token_id=None, eos_token_id=None)

    def non_embedding_params(self) -> int:
        """Parameters of the layers (what a token's forward multiplies by, 2 FLOP each)."""
        attn = self.hidden * self.head_dim * (self.heads * 2 + self.kv_heads * 2)
        return self.layers * (attn + 3 * self.hidden * self.ffn + 2 * self.hidden + 2 * self.head_dim)


#: ``qwen3-1.7b``: Qwen3-1.7B's shape (28 layers, width 2,048, 16 query / 8 KV heads of
#: 128, FFN 6,144, 151,936 tokens) plus 3 × 8,192 SID tokens; ``tiny``: the same
#: architecture for CPU tests and the app.
QWEN3_PRESETS: dict[str, Qwen3Preset] = {
    "qwen3-1.7b": Qwen3Preset("qwen3-1.7b", layers=28, hidden=2048, heads=16, kv_heads=8, head_dim=128, ffn=6144,
                              base_vocab=151_936, codebook_sizes=(8192, 8192, 8192)),
    "tiny": Qwen3Preset("tiny", layers=2, hidden=64, heads=4, kv_heads=2, head_dim=16, ffn=128, base_vocab=64,
                        codebook_sizes=(64, 64, 64), rope_theta=10_000.0, max_positions=4096),
}


def build_random(preset: str | Qwen3Preset = "tiny", *, device="cpu", dtype=torch.float32, seed: int = 0):
    """A ``Qwen3ForCausalLM`` of a preset's shape with random weights, in eval mode.

    Parameters
    ----------
    preset : str or Qwen3Preset
        A key of :data:`QWEN3_PRESETS` or a custom shape.
    device : torch.device or str
        Where the weights are created (on a GPU random initialisation takes seconds).
    dtype : torch.dtype
    seed : int

    Returns
    -------
    (transformers.Qwen3ForCausalLM, Qwen3Preset)
    """
    import transformers

    if isinstance(preset, str):
        if preset not in QWEN3_PRESETS:
            raise ZeroGRError(f"preset: unknown Qwen3 preset {preset!r}; choose one of {', '.join(QWEN3_PRESETS)}")
        preset = QWEN3_PRESETS[preset]
    torch.manual_seed(seed)
    with torch.device(device):
        model = transformers.Qwen3ForCausalLM(preset.hf_config())
    return model.to(dtype).eval(), preset


def _whole_bucket(value) -> int:
    """``context_bucket`` as an int ≥ 1: int() truncated 2.5 to 2 and raised a bare ValueError on "x"."""
    whole = whole_value(value)
    if whole is None or whole < 1:
        raise ZeroGRError(f"context_bucket: expected an integer ≥ 1, got {value!r}")
    return int(whole)


class Qwen3StepModel:
    """:class:`~zerogr_core.models.protocol.StepModel` over a ``transformers`` ``Qwen3ForCausalLM``.

    Parameters
    ----------
    model : transformers.Qwen3ForCausalLM
        Any size, tied or untied output embedding (without bias); fp32, bf16 or fp16.
    token_offsets : sequence of int
        Vocabulary id of token 0 of each SID level; whole numbers whose ids lie in the
        model's vocabulary (:func:`~zerogr_core.models.hf.step_offsets`).
    context_bucket : int
        Contexts are right-padded to a multiple of it, so nearby lengths share static
        buffers (and a captured graph).
    projections : str
        How each layer's four weight GEMMs run: ``"model"`` (the model's dtype, as Hugging Face's
        layers compute them) or ``"fp8"`` (float8 e4m3 weights quantized once and activations
        quantized per call, one scale per row: :mod:`.fp8_projections`; a bfloat16 model on a GPU of
        compute capability 8.9 or later, or on the CPU).
    partial_last_step : bool
        At the last step, run the layers only on the beams filtering first reads (those whose prefix
        holds more than one item), at most ``rows`` per request (:mod:`zerogr_core.decode.loop`); the
        decode returns the same beams. On a GPU the decode is then captured as two graphs with one host
        read between them (:mod:`zerogr_core.decode.last_step`).

    Raises
    ------
    ZeroGRError
        Not a Qwen3 model, an unsupported output projection
        (:func:`~zerogr_core.models.hf.output_head`), bad ``token_offsets``, ``context_bucket`` or
        ``projections``, or FP8 projections where they cannot run.

    Attributes
    ----------
    head : torch.Tensor, shape (vocab, hidden)
        The output projection, the decoder's shared head (bands at ``token_offsets``).
    graph_safe : bool
        Static buffers only: the engine may capture the decode (and a staged prefill).

    Notes
    -----
    Wrapping re-points the module's q/k/v and gate/up parameters at views of one stacked
    weight per layer (same values, no extra memory; Hugging Face's own forward is
    unchanged). Wrapping the same module again reuses the stacks.

    ``history`` is (B, T) int64 token ids with an optional (B, T) mask whose ones are one
    contiguous run per row (left or right padding; any other layout is refused). The
    requests are moved to right padding, positions ``0 … len_b - 1``, as Hugging Face
    ``generate`` numbers a left-padded prompt.
    """

    def __init__(self, model, token_offsets: Sequence[int], context_bucket: int = 256, projections: str = "model",
                 partial_last_step: bool = True):
        from .hf import output_head, step_offsets

        cfg = model.config
        if getattr(cfg, "model_type", "") != "qwen3":
            raise ZeroGRError(f"model: expected a Qwen3ForCausalLM, got {type(model).__name__}")
        _, _, weight = output_head(model)
        self.token_offsets = step_offsets(model, token_offsets)
        self.model = model.eval()
        self.core = model.model
        self.head = weight.detach()
        self.hidden_size = int(cfg.hidden_size)
        self.n_levels = len(self.token_offsets)
        self.heads, self.kv_heads = int(cfg.num_attention_heads), int(cfg.num_key_value_heads)
        self.head_dim = int(getattr(cfg, "head_dim", None) or cfg.hidden_size // cfg.num_attention_heads)
        self.group = self.heads // self.kv_heads
        self.n_layers = len(self.core.layers)
        self.vocab = int(weight.shape[0])
        self.context_bucket = _whole_bucket(context_bucket)
        self._stack_weights()
        self.fp8 = self._fp8_projections(projections)
        self.partial_last_step = partial_flag(partial_last_step)
        self.batch = 0
        self.prefill_in_step = False
        self.graph_safe = True
        self._static_key = None
        self._range = StagedRange(self.device)

    @property
    def device(self) -> torch.device:
        return self.head.device

    @property
    def dtype(self) -> torch.dtype:
        return self.head.dtype

    def bucket(self, t: int) -> int:
        """Padded length of a ``t``-token context (the next multiple of ``context_bucket``)."""
        return -(-t // self.context_bucket) * self.context_bucket

    # ---- requests -------------------------------------------------------------------

    def _allocate(self, b: int, tb: int, beam_width: int) -> None:
        dev, dt = self.device, self.dtype
        self.lineage_len = max(self.n_levels - 1, 1)
        # a request's keys: its context, then its beams' lineage slots (beam m, SID position t
        # at tb + m * lineage_len + t), padded to 16 so the reference's attention bias rows stay aligned
        own = -(-beam_width * self.lineage_len // 16) * 16
        self.ids = torch.zeros(b, tb, dtype=torch.int64, device=dev)
        self.lengths = torch.ones(b, dtype=torch.int64, device=dev)
        # columns of ``ids`` a stage has written past 0 since they were zeroed, and the length every
        # request was last given (``None`` after a mask): what the next stage need not write again
        self._ids_written, self._uniform_length = 0, 1
        # token-major (b, slot, kv_heads, D), the projections' own layout: the prefill's copy is a
        # contiguous run per request, and SDPA reads the (kv_heads, slot) transpose as a view
        self.kv = torch.zeros(2, self.n_layers, b, tb + own, self.kv_heads, self.head_dim, dtype=dt, device=dev)
        self.first = torch.zeros(b, self.hidden_size, dtype=dt, device=dev)
        p = self.lineage_len
        # lineage[b, m, t]: the beam whose slot of position t holds beam m's SID token t
        self.own_slots = torch.arange(beam_width, dtype=torch.int32, device=dev)[None, :, None].expand(
            b, beam_width, p).contiguous()
        self.lineage = self.own_slots.clone()
        # cos and sin of every position a request of this bucket reaches, from the model's own rotary module
        self.rope_table = torch.stack(self._rope(self.first, torch.arange(tb + p, device=dev)))   # (2, tb + P, D)
        self.batch, self.beam_width, self.context_len = b, beam_width, tb

    @torch.no_grad()
    def stage(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
              beam_width: int) -> None:
        """Copy the requests into static, length-bucketed buffers; ``step(0, …)`` runs the prefill.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T), int64
            Context token ids.
        attention_mask : torch.Tensor, shape (B, T), optional
            1 on tokens, 0 on padding (one contiguous run of tokens per row).
        beam_width : int
        """
        if isinstance(beam_width, bool) or not isinstance(beam_width, int) or beam_width < 1:
            raise ZeroGRError(f"beam_width must be a positive integer, got {beam_width!r}")
        # ids already on the GPU are checked after the launch (StagedRange): a check now would hold
        # the prefill back until the host has read a device reduction
        defer = attention_mask is None and defers_range(history, self.device)
        ids, lengths = right_padded(history, attention_mask, self.vocab, self.device, check_range=not defer)
        self._range.pending = defer
        b, t = ids.shape
        tb = self.bucket(t)
        key = (b, tb, beam_width, self.dtype)
        if self._static_key != key:
            self._allocate(b, tb, beam_width)
            self._static_key = key
        # a call of the same length as the last one needs neither launch: each is a few µs of
        # host time before the prefill can start
        if t < self._ids_written:
            self.ids[:, t:self._ids_written].zero_()
        self.ids[:, :t].copy_(ids)
        self._ids_written = t
        if lengths is None:
            if self._uniform_length != t:
                self.lengths.fill_(t)
                self._uniform_length = t
        else:
            self.lengths.copy_(lengths)
            self._uniform_length = None
        self.prefill_in_step = True

    @torch.no_grad()
    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """:meth:`stage` the requests and run the prefill now (eagerly)."""
        self.stage(history, attention_mask, beam_width=beam_width)
        self.run_prefill()
        self.prefill_in_step = False
        self.check_staged()

    def check_staged(self) -> None:
        """Raise :class:`~zerogr_core.ZeroGRError` if the ids :meth:`stage` took from a GPU tensor
        leave the vocabulary (read after the prefill's launch, :class:`~zerogr_core.models.protocol.StagedRange`);
        :class:`~zerogr_core.models.protocol.StepDecoder` calls it after each decode."""
        self._range.verify(self.ids, self.vocab)

    # ---- the network ----------------------------------------------------------------

    def _stack_weights(self) -> None:
        """One (rows, hidden) weight per layer for q/k/v and one for gate/up (+ q/k/v bias if any)."""
        self.qkv_weight, self.qkv_bias, self.gate_up_weight = [], [], []
        act = getattr(self.model.config, "hidden_act", "silu")
        self.fused_mlp = act == "silu"
        for layer in self.core.layers:
            attn, mlp = layer.self_attn, layer.mlp
            projs = (attn.q_proj, attn.k_proj, attn.v_proj)
            self.qkv_weight.append(_stack(projs, "weight"))
            has_bias = [p.bias is not None for p in projs]
            if any(has_bias) and not all(has_bias):
                raise ZeroGRError("model: q/k/v projections must all have a bias or none")
            self.qkv_bias.append(_stack(projs, "bias") if all(has_bias) else None)
            if self.fused_mlp:
                if mlp.gate_proj.bias is not None or mlp.up_proj.bias is not None:
                    self.fused_mlp = False
                else:
                    self.gate_up_weight.append(_stack((mlp.gate_proj, mlp.up_proj), "weight"))

    def _fp8_projections(self, projections: str):
        """The layers' FP8 projections (:mod:`.fp8_projections`) under ``projections="fp8"``, else None."""
        why = projections_problem(projections, self.dtype)
        if why:
            raise ZeroGRError(why)
        if projections == "model":
            return None
        if not self.fused_mlp:
            raise ZeroGRError("projections='fp8' needs a SwiGLU MLP without biases")
        layers = self.core.layers
        weights = {"qkv": self.qkv_weight, "o": [layer.self_attn.o_proj.weight for layer in layers],
                   "gate_up": self.gate_up_weight, "down": [layer.mlp.down_proj.weight for layer in layers]}
        shapes = {tuple(w.shape) for ws in weights.values() for w in ws}
        why = fp8_projections.unsupported(self.device, shapes)
        if why:
            raise ZeroGRError(why)
        return fp8_projections.for_model(self.model, weights)

    def _linear(self, kind: str, i: int, x: torch.Tensor, weight: torch.Tensor, bias=None) -> torch.Tensor:
        """Layer i's ``kind`` projection (:data:`.fp8_projections.KINDS`) of rows x: ``x @ weight.T + bias``,
        in FP8 under ``projections="fp8"``."""
        if self.fp8 is None:
            return F.linear(x, weight, bias)
        return self.fp8(x, kind, i, bias)

    def _rope(self, x: torch.Tensor, positions: torch.Tensor):
        """cos, sin of shape (n, D) for int64 ``positions`` (n,) (the model's own rotary module)."""
        cos, sin = self.core.rotary_emb(x, positions[None])
        return cos[0], sin[0]

    @staticmethod
    def _norm(module, x: torch.Tensor, residual: torch.Tensor | None = None):
        """Qwen3's RMS norm of the rows of ``x`` (n, d) in one kernel, after ``x + residual`` if given
        (then ``(normed, sum)``): the same arithmetic as ``Qwen3RMSNorm`` when weight and input
        share a dtype (:func:`zerogr_kernels.rms_layer_norm`)."""
        return rms_layer_norm(x, module.weight, module.variance_epsilon, residual)

    def _qkv(self, i: int, attn, h: torch.Tensor, cos, sin, cache):
        """Normed, rotated q (n, heads, D) of layer i for the normed hidden states h (n, hidden), one
        GEMM for the three projections; the normed, rotated keys and the values go straight into
        ``cache = (k_dst, v_dst)``, two (blocks, rows, kv_heads, D) views of the KV cache with
        blocks · rows = n, which are returned with q."""
        n, d = h.shape[0], self.head_dim
        a, b = self.heads * d, (self.heads + self.kv_heads) * d
        y = self._linear("qkv", i, h, self.qkv_weight[i], self.qkv_bias[i])
        k_dst, v_dst = cache
        q, _ = qk_norm_rope(y[:, :a].view(n, self.heads, d), y[:, a:b].view(n, self.kv_heads, d),
                            attn.q_norm.weight, attn.k_norm.weight, attn.q_norm.variance_epsilon, cos, sin,
                            k_out=k_dst, v=y[:, b:].view(n, self.kv_heads, d), v_out=v_dst)
        return q, k_dst, v_dst

    def _mlp(self, i: int, layer, h: torch.Tensor) -> torch.Tensor:
        """Layer i's SwiGLU MLP of h (n, hidden): one GEMM for gate and up, one pass for the gate."""
        if not self.fused_mlp:
            return layer.mlp(h)
        a = silu_mul(self._linear("gate_up", i, h, self.gate_up_weight[i]))
        return self._linear("down", i, a, layer.mlp.down_proj.weight)

    def _layers(self, x: torch.Tensor, cos, sin, cache, attend, keep: torch.Tensor | None = None) -> torch.Tensor:
        """The decoder layers over rows x (n, hidden); ``cache(i)`` gives layer i's (k_dst, v_dst)
        cache views for the rows' keys and values (see :meth:`_qkv`), and ``attend(i, q, k, v)``
        -> (n, heads · D) is the attention of layer i over them. Residual adds are fused into the
        following norm. Returns the residual stream after the last layer (not normed).

        With ``keep`` (int64 row indices, (r,)), only those rows' outputs are wanted: the last
        layer still projects and caches every row's key and value, ``attend(i, q, k, v, keep)``
        returns the attention of the kept rows only, (r, heads · D), and the layer's output
        projection, residual and MLP run on them alone. Returns (r, hidden) then."""
        layers = self.core.layers
        h = self._norm(layers[0].input_layernorm, x)
        for i, layer in enumerate(layers):
            attn = layer.self_attn
            q, k, v = self._qkv(i, attn, h, cos, sin, cache(i))
            if keep is not None and i + 1 == len(layers):
                # a prefill reads one row per request from here on: the rest of the layer's work
                # (about 5/6 of its GEMMs, and its attention) is skipped for the other rows
                o, x = attend(i, q, k, v, keep), x[keep]
            else:
                o = attend(i, q, k, v)
            y = self._linear("o", i, o, attn.o_proj.weight, attn.o_proj.bias)
            h, x = self._norm(layer.post_attention_layernorm, y, x)
            m = self._mlp(i, layer, h)
            if i + 1 < len(layers):
                h, x = self._norm(layers[i + 1].input_layernorm, m, x)
            else:
                x = x + m
        return x

    @torch.no_grad()
    def run_prefill(self) -> None:
        """The staged contexts through every layer, into the static buffers: device work only
        (no host synchronisation, static shapes), so a CUDA graph can hold it."""
        b, tb = self.ids.shape
        self._range.record(self.ids)
        # clamped: ids whose range is checked after the launch must not index past the table meanwhile
        x = self.core.embed_tokens(self.ids.clamp(0, self.vocab - 1)).view(b * tb, -1)
        cos, sin = self.rope_table[:, :tb].repeat(1, b, 1)                               # (b · tb, D) each

        last = torch.arange(b, device=self.device) * tb + self.lengths - 1   # each request's last token, flat

        def cache(i):
            return self.kv[0, i, :, :tb], self.kv[1, i, :, :tb]

        def attend(i, q, k, v, rows=None):
            # k, v: the context slots of the cache, (b, tb, kv_heads, D); SDPA reads the transpose
            k, v = k.transpose(1, 2), v.transpose(1, 2)
            if rows is None:
                q = q.view(b, tb, -1, self.head_dim).transpose(1, 2)
                # right padding: causal attention keeps every real token off the padding behind it
                o = F.scaled_dot_product_attention(q, k, v, is_causal=True, enable_gqa=True)
                return o.transpose(1, 2).reshape(b * tb, -1)
            # one query per request: its g query heads of a KV head attend together (head h reads
            # KV head h // g, as Hugging Face's repeat_kv), masked off the padding
            q = q[rows].view(b, self.kv_heads, self.group, self.head_dim)
            mask = (torch.arange(tb, device=self.device)[None, :] < self.lengths[:, None])[:, None, None]
            return F.scaled_dot_product_attention(q, k, v, attn_mask=mask).reshape(b, -1)

        self.first.copy_(self._norm(self.core.norm, self._layers(x, cos, sin, cache, attend, keep=last)))

    def _descend(self, parents: torch.Tensor | None, position: int, keep: bool = True) -> torch.Tensor:
        """The ancestor table (B, M, P) after a step that chose SID position ``position``: positions
        before it inherited from each beam's parent, the new one (and those after) the beam's own
        slot. Kept as the model's table unless ``keep`` is false (the last step, which may run again)."""
        if position == 0:
            table = self.own_slots
        else:
            b, m = self.batch, self.beam_width
            rows = safe_parents(parents.to(self.device), m).view(b, m)
            local = rows - torch.arange(b, device=self.device)[:, None] * m              # parent beam in its request
            table = self.lineage[torch.arange(b, device=self.device)[:, None], local]    # (b, M, P)
            table[:, :, position:] = self.own_slots[:, :, position:]
        if keep:
            self.lineage.copy_(table)
            return self.lineage
        return table

    @torch.no_grad()
    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None,
             wanted: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
        """Hidden states of step ``step``: (B, hidden) at 0, (B · M, hidden) after (see the protocol).

        At the last step, ``wanted`` ((B, M) bool) with ``rows`` (int, at least the number of wanted
        beams of every request) runs the layers on ``rows`` beams per request, the wanted ones first;
        the rows of the beams left out are zeros."""
        if not self.batch:
            raise ZeroGRError("step model: call prefill before step")
        if step == 0:
            if self.prefill_in_step:
                self.run_prefill()
            return self.first
        m, p = tokens.shape[1], self.lineage_len
        if m != self.beam_width:
            raise ZeroGRError(f"step model: {m} beams per request at step {step}, prefilled for {self.beam_width}")
        last = step + 1 == self.n_levels
        lineage = self._descend(parents, step - 1, keep=not last)
        if not last or wanted is None or rows is None or rows >= m:
            return self._beams(step, tokens, lineage)

        def compute(order):
            # each computed beam takes the lineage slots of its new place
            table = lineage.gather(1, order[:, :, None].expand(*order.shape, p))
            table[:, :, step - 1:] = self.own_slots[:, :order.shape[1], step - 1:]
            return self._beams(step, tokens.gather(1, order), table)

        return partial_step(wanted, rows, self.hidden_size, self.dtype, compute)

    def _beams(self, step: int, tokens: torch.Tensor, lineage: torch.Tensor) -> torch.Tensor:
        """The layers over the beams ``tokens`` (B, m) just chose, whose ancestors are ``lineage``
        (B, m, P) (beam ``i`` writes its new key and value to its own slot ``i``): (B · m, hidden)."""
        b, m, tb, p = self.batch, tokens.shape[1], self.context_len, self.lineage_len
        n, j, d = b * m, step - 1, self.head_dim                       # j: SID position of the new token
        ids = tokens.to(self.device, torch.int64).clamp(min=0).reshape(n) + self.token_offsets[j]
        x = self.core.embed_tokens(ids)                                                  # (n, hidden)
        rope = self.rope_table[:, self.lengths + j]                                      # (2, b, D)
        cos, sin = rope[:, :, None].expand(2, b, m, d).contiguous().view(2, n, d)       # (n, D) each
        # the kernel on a GPU; on the CPU its reference (SDPA with a mask), even under the interpreter
        attention = (beam_context_attention_triton if self.kv.is_cuda and use_triton(self.kv)
                     else beam_context_attention_reference)

        def cache(i):
            # the new token's key/value go to its beam's lineage slot of position j, in every request
            return self.kv[0, i][:, tb + j:tb + m * p:p], self.kv[1, i][:, tb + j:tb + m * p:p]

        def attend(i, q, k, v):
            # all m beams and g query heads of a KV head attend together: the context is read once per request
            o = attention(q.view(b, m, self.heads, d), self.kv[0, i], self.kv[1, i], self.lengths, context_len=tb,
                          lineage_len=p, step=step, lineage=lineage)
            return o.view(n, self.heads * d)

        return self._norm(self.core.norm, self._layers(x, cos, sin, cache, attend))


def _stack(linears, name: str) -> torch.Tensor:
    """The ``name`` tensors (weight or bias) of ``linears`` stacked along dim 0, the modules' own
    parameters re-pointed at views of the stack. Tensors already adjacent in one storage (an
    earlier wrap) are viewed in place, not copied."""
    parts = [getattr(m, name) for m in linears]
    first = parts[0]
    rows = sum(p.shape[0] for p in parts)
    adjacent = all(p.is_contiguous() and p.dtype == first.dtype and p.device == first.device for p in parts) and all(
        a.untyped_storage().data_ptr() == b.untyped_storage().data_ptr()
        and a.data_ptr() + a.numel() * a.element_size() == b.data_ptr() for a, b in zip(parts, parts[1:]))
    if adjacent:
        return first.detach().as_strided((rows,) + tuple(first.shape[1:]), first.stride())
    stacked = torch.cat([p.detach() for p in parts], dim=0)
    start = 0
    for m, p in zip(linears, parts):
        setattr(m, name, torch.nn.Parameter(stacked[start:start + p.shape[0]], requires_grad=p.requires_grad))
        start += p.shape[0]
    return stacked
