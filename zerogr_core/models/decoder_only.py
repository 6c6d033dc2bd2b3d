"""A decoder-only generative recommender (OneRec/HSTU style) with a KV cache.

One causal sequence per request: the history items (each the sum of its SID's per-level
token embeddings), then the SID tokens of the item being generated, one per level. The
output at the last history position predicts level 1; the output after SID token l
predicts level l+1. One head of ``sum(|V_l|)`` rows holds a band per level.

Histories of different lengths are left-padded: positions count the real items only, and
padding is masked out of every attention, so a request's outputs do not depend on how
much padding its batch needs.

:class:`DecoderOnlyStepModel` serves it through the step protocol. The history's keys and
values are computed once per request at prefill and read by all the request's beams
(never repeated per beam); only the SID part of the cache (≤ L positions per beam) is
reordered by parent. :meth:`DecoderOnlyRecommender.recompute_hidden` is the reference
that recomputes the whole sequence (``tests/test_models.py`` compares the two).
:meth:`DecoderOnlyStepModel.stage` moves the history pass into step 0 (static,
length-bucketed inputs), so a CUDA graph of the decode holds the whole model.

Random weights serve latency studies; the ``deployable`` preset is 12 layers of width
1024 over 256 history items.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import torch
import torch.nn.functional as F
from torch import nn

from ..errors import ZeroGRError
from .protocol import _copy_into, keep_static, partial_flag, partial_step, reorder_rows, safe_parents


@dataclass(frozen=True)
class DecoderOnlyConfig:
    """Shape of a :class:`DecoderOnlyRecommender`.

    Attributes
    ----------
    codebook_sizes : tuple of int
        |V_l| per SID level.
    d_model : int
    n_heads : int
        Must divide ``d_model``.
    n_layers : int
    ff_mult : int
        Feed-forward width as a multiple of ``d_model``.
    max_history : int
        Most history items a request may carry.
    """

    codebook_sizes: tuple[int, ...]
    d_model: int = 1024
    n_heads: int = 16
    n_layers: int = 12
    ff_mult: int = 4
    max_history: int = 256

    def __post_init__(self):
        if not self.codebook_sizes or min(self.codebook_sizes) < 1:
            raise ZeroGRError(f"codebook_sizes: need ≥ 1 level of ≥ 1 token, got {self.codebook_sizes}")
        if self.d_model % self.n_heads:
            raise ZeroGRError(f"d_model {self.d_model} is not a multiple of n_heads {self.n_heads}")

    @classmethod
    def preset(cls, name: str, codebook_sizes: Sequence[int]) -> "DecoderOnlyConfig":
        """``"deployable"`` (12 layers, d 1024, 16 heads, 256 history items) or ``"tiny"`` (tests)."""
        presets = {"deployable": dict(d_model=1024, n_heads=16, n_layers=12, max_history=256),
                   "tiny": dict(d_model=32, n_heads=4, n_layers=2, ff_mult=2, max_history=16)}
        if name not in presets:
            raise ZeroGRError(f"unknown decoder-only preset {name!r} (choose from {', '.join(presets)})")
        return cls(tuple(int(s) for s in codebook_sizes), **presets[name])


class _Block(nn.Module):
    def __init__(self, cfg: DecoderOnlyConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.qkv = nn.Linear(d, 3 * d)
        self.out = nn.Linear(d, d)
        self.ff = nn.Sequential(nn.Linear(d, cfg.ff_mult * d), nn.GELU(), nn.Linear(cfg.ff_mult * d, d))
        self.n_heads = cfg.n_heads

    def qkv_heads(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """(B, n, d) → q, k, v, each (B, heads, n, d/heads), of ``ln1(x)``."""
        b, n, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).view(b, n, 3, self.n_heads, d // self.n_heads).permute(2, 0, 3, 1, 4)
        return q, k, v

    def finish(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        """Residual of the attention output y (B, heads, n, dh), then the feed-forward."""
        b, _, n, _ = y.shape
        x = x + self.out(y.transpose(1, 2).reshape(b, n, -1))
        return x + self.ff(self.ln2(x))


class DecoderOnlyRecommender(nn.Module):
    """History items, then SID tokens, in one causal transformer.

    Parameters
    ----------
    config : DecoderOnlyConfig
    """

    def __init__(self, config: DecoderOnlyConfig):
        super().__init__()
        self.config = config
        sizes = config.codebook_sizes
        self.band_offsets = tuple(int(sum(sizes[:l])) for l in range(len(sizes)))
        d = config.d_model
        self.token_emb = nn.Embedding(sum(sizes), d)
        self.pos_emb = nn.Embedding(config.max_history + len(sizes), d)
        self.blocks = nn.ModuleList(_Block(config) for _ in range(config.n_layers))
        self.ln_f = nn.LayerNorm(d)
        self.head = nn.Parameter(torch.randn(sum(sizes), d) * d ** -0.5)
        # on the model's device, so that embedding a history copies nothing from the host
        # (a host copy cannot be captured in a CUDA graph)
        self.register_buffer("level_offsets", torch.tensor(self.band_offsets, dtype=torch.int64), persistent=False)
        self.register_buffer("level_last", torch.tensor(sizes, dtype=torch.int64) - 1, persistent=False)
        for emb in (self.token_emb, self.pos_emb):
            nn.init.normal_(emb.weight, std=0.02)

    @property
    def n_levels(self) -> int:
        return len(self.config.codebook_sizes)

    def head_weight(self) -> torch.Tensor:
        """The shared head (sum |V_l|, d), detached; its bands start at :attr:`band_offsets`."""
        return self.head.detach()

    def item_embedding(self, sids: torch.Tensor) -> torch.Tensor:
        """Sum of the item's per-level token embeddings: (…, L) → (…, d). Tokens are clamped into
        their level's codebook, so padding may hold anything (:meth:`check_history` refuses such
        tokens on real items)."""
        tokens = torch.minimum(sids.clamp(min=0), self.level_last.to(sids.device))
        return self.token_emb(tokens + self.level_offsets.to(sids.device)).sum(dim=-2)

    def token_embedding(self, tokens: torch.Tensor, level: int) -> torch.Tensor:
        """Embedding of level ``level``'s local tokens (-1 allowed: computed, never used)."""
        return self.token_emb(tokens.clamp(min=0) + self.band_offsets[level])

    def check_history(self, history: torch.Tensor, attention_mask: torch.Tensor | None) -> torch.Tensor:
        """Validate (B, T, L) SIDs and a left-padding mask; returns the mask as bool.

        Every item under the mask must hold integer tokens within its level's codebook: a token past
        a level's codebook would embed as another level's token (silently), or past the table (a
        device-side assert on a GPU). Padding may hold anything. The checks are read on the host
        once, where the history is (one flag read back for tensors on a GPU).
        """
        if history.dim() != 3 or history.shape[2] != self.n_levels:
            raise ZeroGRError(f"history: expected shape (batch, T, {self.n_levels}), got {tuple(history.shape)}")
        if history.is_floating_point() or history.is_complex() or history.dtype == torch.bool:
            raise ZeroGRError(f"history: SID tokens must be integers, got {str(history.dtype).replace('torch.', '')}")
        b, t = history.shape[:2]
        if t > self.config.max_history:
            raise ZeroGRError(f"history: {t} items exceed max_history {self.config.max_history}")
        # from the config, not the model's buffer: a meta model checks its requests on the host
        last = torch.tensor(self.config.codebook_sizes, device=history.device) - 1
        outside = ((history < 0) | (history > last)).any(dim=2)                     # (B, T)
        if attention_mask is None:
            mask = torch.ones(b, t, dtype=torch.bool, device=history.device)
            bad_layout = torch.zeros((), dtype=torch.bool, device=history.device)
        else:
            mask = attention_mask.to(history.device).bool()
            if mask.shape != (b, t):
                raise ZeroGRError(f"attention_mask: shape {tuple(mask.shape)} differs from the history's {(b, t)}")
            lengths = mask.sum(dim=1)
            left_padded = torch.arange(t, device=mask.device) >= t - lengths[:, None]
            bad_layout = (lengths < 1).any() | (mask != left_padded).any()
        outside &= mask
        layout, tokens = torch.stack([bad_layout, outside.any()]).tolist()          # one read on the host
        if layout:
            raise ZeroGRError("attention_mask: every row needs ≥ 1 item, padding on the left")
        if tokens:
            row, item = (int(v) for v in outside.nonzero()[0])
            level = int(((history[row, item] < 0) | (history[row, item] > last)).nonzero()[0, 0])
            raise ZeroGRError(f"history: row {row}, item {item} has token {int(history[row, item, level])} "
                              f"at level {level + 1}, outside its codebook [0, {self.config.codebook_sizes[level]})")
        return mask

    @torch.no_grad()
    def recompute_hidden(self, history: torch.Tensor, attention_mask: torch.Tensor | None,
                         prefixes: torch.Tensor) -> torch.Tensor:
        """Reference path: the whole sequence of every beam, recomputed.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T, L), int64
        attention_mask : torch.Tensor, shape (B, T), optional (left padding)
        prefixes : torch.Tensor, shape (B, n, l), int64
            SID tokens of levels 0 … l-1 per beam (-1 allowed).

        Returns
        -------
        torch.Tensor, shape (B, n, d)
            The output after the last token of each sequence (predicts level l).
        """
        mask = self.check_history(history, attention_mask)
        b, n, level = prefixes.shape
        t = history.shape[1]
        x = self.item_embedding(history)                                             # (B, T, d)
        x = x[:, None].expand(b, n, t, -1)
        if level:
            toks = torch.stack([self.token_embedding(prefixes[..., j], j) for j in range(level)], dim=2)
            x = torch.cat([x, toks], dim=2)
        lengths = mask.sum(dim=1)
        pos = torch.cat([(mask.long().cumsum(1) - 1).clamp(min=0),
                         lengths[:, None] + torch.arange(level, device=mask.device)], dim=1)
        x = (x + self.pos_emb(pos)[:, None]).reshape(b * n, t + level, -1)
        valid = torch.cat([mask, mask.new_ones(b, level)], dim=1)
        s = t + level
        causal = torch.ones(s, s, dtype=torch.bool, device=mask.device).tril()
        allowed = (causal[None] & valid[:, None, :]) | torch.eye(s, dtype=torch.bool, device=mask.device)
        allowed = allowed.repeat_interleave(n, dim=0)[:, None]                        # (B·n, 1, s, s)
        for block in self.blocks:
            q, k, v = block.qkv_heads(x)
            x = block.finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
        return self.ln_f(x[:, -1]).view(b, n, -1)

    def to_hf(self):
        """The same network as a Hugging Face ``GPT2LMHeadModel`` (weights copied).

        The architectures coincide: pre-norm blocks, fused Q/K/V and output projections
        with biases, exact-GELU feed-forward, learned absolute positions, a final layer
        norm and an untied head without bias over ``sum(|V_l|)`` tokens, which are this
        model's token ids (level ``l``'s band at :attr:`band_offsets` ``[l]``). Feed the
        history as ``inputs_embeds=`` :meth:`item_embedding` ``(history)`` with its
        left-padding mask; ``generate`` then derives the same positions from the mask, so
        its logits equal this model's (``tests/test_models.py``). This is what the
        end-to-end bench runs Hugging Face ``generate`` on for the decoder-only model.

        Returns
        -------
        transformers.GPT2LMHeadModel
            In eval mode, on this model's device and dtype.
        """
        import transformers

        cfg = self.config
        d = cfg.d_model
        hf_cfg = transformers.GPT2Config(
            vocab_size=sum(cfg.codebook_sizes), n_positions=self.pos_emb.num_embeddings, n_embd=d,
            n_layer=cfg.n_layers, n_head=cfg.n_heads, n_inner=cfg.ff_mult * d, activation_function="gelu",
            resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0, layer_norm_epsilon=self.ln_f.eps,
            tie_word_embeddings=False, bos_token_id=None, eos_token_id=None, pad_token_id=0)
        ref = next(self.parameters())
        hf = transformers.GPT2LMHeadModel(hf_cfg).to(ref.device, ref.dtype).eval()
        with torch.no_grad():
            hf.transformer.wte.weight.copy_(self.token_emb.weight)
            hf.transformer.wpe.weight.copy_(self.pos_emb.weight)
            for mine, theirs in zip(self.blocks, hf.transformer.h):
                pairs = ((mine.ln1, theirs.ln_1), (mine.ln2, theirs.ln_2), (mine.qkv, theirs.attn.c_attn),
                         (mine.out, theirs.attn.c_proj), (mine.ff[0], theirs.mlp.c_fc), (mine.ff[2], theirs.mlp.c_proj))
                for a, b in pairs:
                    # GPT-2's Conv1D stores (in, out), the transpose of nn.Linear's weight
                    b.weight.copy_(a.weight.t() if isinstance(a, nn.Linear) else a.weight)
                    b.bias.copy_(a.bias)
            hf.transformer.ln_f.weight.copy_(self.ln_f.weight)
            hf.transformer.ln_f.bias.copy_(self.ln_f.bias)
            hf.lm_head.weight.copy_(self.head)
        return hf

    def step_model(self, history_bucket: int = 16, partial_last_step: bool = True) -> "DecoderOnlyStepModel":
        """This model served through the step protocol (see :class:`DecoderOnlyStepModel`)."""
        return DecoderOnlyStepModel(self, history_bucket, partial_last_step)


class DecoderOnlyStepModel:
    """:class:`~zerogr_core.models.protocol.StepModel` of a :class:`DecoderOnlyRecommender`.

    Parameters
    ----------
    model : DecoderOnlyRecommender
        In any dtype (fp32, bf16, fp16); caches and hidden states follow it.
    history_bucket : int
        :meth:`stage` left-pads the history up to a multiple of it (at most
        ``max_history``), so histories of nearby lengths share static buffers (and one
        captured graph).
    partial_last_step : bool
        At the last step, run the layers only on the beams filtering first reads (those whose
        prefix holds more than one item; :mod:`zerogr_core.decode.loop`); the decode returns the
        same beams. On by default: on a lent H100 it took 0.76–0.79× the full last step's time on
        the search-like catalog, whose last-level prefixes each hold one item, and 0.99–1.00× on
        the 4 × 256 catalog, where 78 % of them branch (``bench-e2e --methods
        zerogr-full,zerogr-partial``, batch 8 and 32 × beam 128, bf16).

    Notes
    -----
    Two prefills: :meth:`prefill` runs the history through the layers now (eagerly,
    outside any graph); :meth:`stage` only copies the requests into static buffers, and
    ``step(0, …)`` runs the history pass (:meth:`run_history`) inside the decode, so a CUDA
    graph of the decode includes it. Both give the same outputs: the extra left padding of
    the bucket is masked out and positions count real items only.
    """

    def __init__(self, model: DecoderOnlyRecommender, history_bucket: int = 16, partial_last_step: bool = True):
        self.model = model.eval()
        self.n_levels = model.n_levels
        self.hidden_size = model.config.d_model
        self.history_bucket = int(history_bucket)
        if self.history_bucket < 1:
            raise ZeroGRError(f"history_bucket: expected an integer ≥ 1, got {history_bucket!r}")
        self.batch = 0
        self.history_in_step = False
        self.graph_safe = True   # static buffers only: the whole decode may be captured in a CUDA graph
        self.partial_last_step = partial_flag(partial_last_step)

    @property
    def device(self) -> torch.device:
        return self.model.head.device

    @property
    def dtype(self) -> torch.dtype:
        return self.model.token_emb.weight.dtype

    def _history_pass(self, history: torch.Tensor, mask: torch.Tensor, kv_out=None):
        """The history through every layer, as device work only: no host synchronisation,
        no data-dependent shape, no branch on tensor values (a staged step 0 runs it inside
        a CUDA graph).

        Parameters
        ----------
        history : torch.Tensor, shape (B, T, L), int64
        mask : torch.Tensor, shape (B, T), bool
            Left padding, already checked (:meth:`DecoderOnlyRecommender.check_history`).
        kv_out : list of (torch.Tensor, torch.Tensor), optional
            Per layer, static (B, heads, T, dh) tensors that receive the keys and values
            (and that the layer's attention then reads).

        Returns
        -------
        history_kv : list of (keys, values), each (B, heads, T, dh)
        first : torch.Tensor, shape (B, d)
            The output at the last history position (predicts level 1).
        bias : torch.Tensor, shape (B, 1, 1, T), float32
            0 on items, -inf on the padding.
        lengths : torch.Tensor, shape (B,), int64
        """
        m = self.model
        device = mask.device
        b, t = mask.shape
        x = m.item_embedding(history) + m.pos_emb((mask.long().cumsum(1) - 1).clamp(min=0))
        causal = torch.ones(t, t, dtype=torch.bool, device=device).tril()
        allowed = ((causal[None] & mask[:, None, :]) | torch.eye(t, dtype=torch.bool, device=device))[:, None]
        history_kv = []
        for layer, block in enumerate(m.blocks):
            q, k, v = block.qkv_heads(x)
            if kv_out is not None:
                _copy_into(kv_out[layer], (k, v))
                k, v = kv_out[layer]
            history_kv.append((k, v))                                                # (B, heads, T, dh)
            x = block.finish(x, F.scaled_dot_product_attention(q, k, v, attn_mask=allowed))
        bias = torch.zeros(b, 1, 1, t, dtype=torch.float32, device=device).masked_fill(
            ~mask[:, None, None, :], float("-inf"))
        return history_kv, m.ln_f(x[:, -1]), bias, mask.sum(dim=1)

    def _allocate(self, b: int, beam_width: int, dtype: torch.dtype) -> None:
        """The per-beam caches of the SID tokens, (b · M, heads, L, dh) per layer."""
        m = self.model
        n, heads = b * beam_width, m.config.n_heads
        dh = m.config.d_model // heads
        self.cache = [tuple(torch.zeros(n, heads, self.n_levels, dh, dtype=dtype, device=self.device)
                            for _ in range(2)) for _ in m.blocks]
        self.batch, self.beam_width = b, beam_width

    @torch.no_grad()
    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """Run the histories once; keep their keys/values per request.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T, L), int64
            SIDs of the history items, oldest first, left-padded.
        attention_mask : torch.Tensor, shape (B, T), optional
            1 on items, 0 on the left padding.
        beam_width : int

        See Also
        --------
        stage : the same with the history pass run inside the decode (capturable in a CUDA graph).
        """
        history = history.to(self.device)
        mask = self.model.check_history(history, attention_mask)
        b, t = mask.shape
        history_kv, first, bias, lengths = self._history_pass(history, mask)
        self.history_in_step = False
        if keep_static(self, (b, t, beam_width, first.dtype), history_kv=history_kv, first=first,
                       history_bias=bias, lengths=lengths):
            return
        self._allocate(b, beam_width, first.dtype)

    def bucket(self, t: int) -> int:
        """The padded length of a ``t``-item history: the next multiple of ``history_bucket``,
        at most ``max_history`` (never below ``t``)."""
        return min(-(-t // self.history_bucket) * self.history_bucket, max(t, self.model.config.max_history))

    @torch.no_grad()
    def stage(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
              beam_width: int) -> None:
        """A prefill whose device work runs at step 0, so one CUDA graph holds history pass and decode.

        Checks the requests where they are (on the host for CPU tensors; a check of device
        tensors reads one flag back, here, outside any graph), then copies them into static
        (B, T_b) buffers, left-padded up to the bucket ``T_b = bucket(T)`` (masked out), and
        nothing else; ``step(0, …)`` then runs :meth:`run_history`. Requests of one batch
        size and bucket reuse the same buffers (and a graph captured on them replays); a
        new bucket allocates new ones (captured again).

        Parameters
        ----------
        history, attention_mask, beam_width
            As for :meth:`prefill`.
        """
        m = self.model
        mask = m.check_history(history, attention_mask)
        b, t = mask.shape
        tb, dtype = self.bucket(t), self.dtype
        key = (b, tb, beam_width, dtype, "staged")
        if getattr(self, "_static_key", None) != key:
            heads, device = m.config.n_heads, self.device
            dh = m.config.d_model // heads
            self.ids = torch.zeros(b, tb, self.n_levels, dtype=torch.int64, device=device)
            self.ids_mask = torch.zeros(b, tb, dtype=torch.bool, device=device)
            self.history_kv = [tuple(torch.zeros(b, heads, tb, dh, dtype=dtype, device=device) for _ in range(2))
                               for _ in m.blocks]
            self.first = torch.zeros(b, m.config.d_model, dtype=dtype, device=device)
            self.history_bias = torch.zeros(b, 1, 1, tb, dtype=torch.float32, device=device)
            self.lengths = torch.zeros(b, dtype=torch.int64, device=device)
            self._allocate(b, beam_width, dtype)
            self._static_key = key
        pad = tb - t
        self.ids[:, :pad].zero_()
        self.ids[:, pad:].copy_(history)
        self.ids_mask[:, :pad].zero_()
        self.ids_mask[:, pad:].copy_(mask)
        self.history_in_step = True

    @torch.no_grad()
    def run_history(self) -> None:
        """The staged requests' history pass, into the static buffers (what step 0 runs after :meth:`stage`)."""
        _, first, bias, lengths = self._history_pass(self.ids, self.ids_mask, kv_out=self.history_kv)
        self.first.copy_(first)
        self.history_bias.copy_(bias)
        self.lengths.copy_(lengths)

    @torch.no_grad()
    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None,
             wanted: torch.Tensor | None = None, rows: int | None = None) -> torch.Tensor:
        """Hidden states (batch * beams, d) of step ``step`` (see the protocol).

        At the last step, ``wanted`` ((B, M) bool) with ``rows`` (int, at least the number of wanted
        beams of every request) runs the layers on ``rows`` beams per request, the wanted ones first;
        the rows of the beams left out are zeros, and the caches are left as they were (the step may
        run again)."""
        if not self.batch:
            raise ZeroGRError("step model: call prefill before step")
        if step == 0:
            if self.history_in_step:
                self.run_history()
            return self.first
        b, beams = self.batch, tokens.shape[1]
        prev = 1 if step == 1 else self.beam_width
        parent_rows = safe_parents(parents.to(self.first.device), prev)
        if wanted is None or rows is None or step + 1 != self.n_levels:
            # SID positions 0 … step-2 are cached; step 1 has none to reorder
            if step > 1:
                reorder_rows([buf for kv in self.cache for buf in kv], parent_rows, b * prev, step - 1)
            return self._layers(step, tokens, None)
        return partial_step(wanted, rows, self.hidden_size, self.dtype,
                            lambda order: self._layers(step, tokens.gather(1, order),
                                                       parent_rows.view(b, beams).gather(1, order).reshape(-1)))

    def _layers(self, step: int, tokens: torch.Tensor, parent_rows: torch.Tensor | None) -> torch.Tensor:
        """The layers over the (B, beams) SID tokens of level ``step - 1``: (B · beams, d). Without
        ``parent_rows`` the caches already hold each beam's earlier positions in its own row, and the
        new ones are written there; with them ((B · beams,) rows of the caches), the earlier positions
        are read from those rows and nothing is written."""
        m, b = self.model, self.batch
        device = self.first.device
        beams = tokens.shape[1]
        n, j = b * beams, step - 1                                                    # SID position of the new token
        pos = (self.lengths + j)[:, None].expand(b, beams)
        x = (m.token_embedding(tokens.to(device), j) + m.pos_emb(pos)).reshape(n, 1, -1)
        scale = 1.0 / math.sqrt(m.config.d_model // m.config.n_heads)
        for layer, block in enumerate(m.blocks):
            q, k, v = block.qkv_heads(x)                                             # (n, heads, 1, dh)
            k_cache, v_cache = self.cache[layer]
            if parent_rows is None:
                k_cache[:n, :, j:j + 1].copy_(k)
                v_cache[:n, :, j:j + 1].copy_(v)
                k_own, v_own = k_cache[:n, :, :j + 1], v_cache[:n, :, :j + 1]        # (n, heads, j+1, dh)
            else:
                k_own = torch.cat([k_cache[parent_rows, :, :j], k], dim=2)
                v_own = torch.cat([v_cache[parent_rows, :, :j], v], dim=2)
            hk, hv = self.history_kv[layer]                                          # (B, heads, T, dh)
            heads, dh = q.shape[1], q.shape[3]
            qr = q.view(b, beams, heads, dh).transpose(1, 2)                         # (B, heads, M, dh)
            # one softmax over [the request's history, the beam's own SID tokens]
            s_hist = (qr @ hk.transpose(2, 3)).float() * scale + self.history_bias   # (B, heads, M, T)
            # the beam's own ≤ L tokens: one query per (beam, head), so a matrix product
            # would be a batched matrix-vector product (slow strided GEMV kernels on a GPU);
            # multiply and sum instead, accumulating in float32
            s_own = (q * k_own).sum(-1, dtype=torch.float32) * scale                 # (n, heads, j+1)
            s_own = s_own.view(b, beams, heads, j + 1).transpose(1, 2)                # (B, heads, M, j+1)
            w = torch.softmax(torch.cat([s_hist, s_own], dim=-1), dim=-1).to(q.dtype)
            t = hk.shape[2]
            y = w[..., :t] @ hv                                                      # (B, heads, M, dh)
            w_own = w[..., t:].transpose(1, 2).reshape(n, heads, j + 1, 1)
            y_own = (w_own * v_own).sum(2, dtype=torch.float32)                      # (n, heads, dh)
            y = y.transpose(1, 2).reshape(n, heads, 1, dh) + y_own.to(q.dtype)[:, :, None]
            x = block.finish(x, y)
        return m.ln_f(x[:, 0])
