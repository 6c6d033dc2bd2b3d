"""A small TIGER-style generative recommender over semantic-ID tokens.

The vocabulary is the SID tokens only (one embedding table per level, no item-id table).

* **History encoder**: each past item enters as the sum of its L per-level token
  embeddings plus a position embedding; a causal pre-LN transformer reads the sequence.
* **SID decoder**: for one target it reads ``[c, t_1, …, t_{l-1}]`` with causal
  self-attention, where ``c`` is the encoder's state at the newest visible item, and
  cross-attends to every visible encoder state. From position 2 on, the input also gets
  an embedding of the whole prefix so far (its node in the catalog's SID tree). The
  output at position l-1, widened per level (d → H, GELU), is the hidden state of step
  l; level l's own head ``W_l`` (|V_l| × H, no bias) turns it into logits.

Training is teacher-forced on whole sequences at once: every position of a history window
is a target, its SID decoder sees only the items before it. At decode time the encoder
runs once per request and :meth:`SIDRecommender.hidden_fn_for` returns the callable that
:class:`zerogr_core.Decoder` calls once per step with the beams' chosen prefixes.

Imports torch and numpy only.
"""
from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Callable, Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from ..catalog import Catalog
from ..errors import ZeroGRError
from ..models.tiger import pack_histories


@dataclass(frozen=True)
class ModelConfig:
    """Model shape.

    Attributes
    ----------
    d_model : int
        Width of the transformer.
    n_heads : int
        Attention heads (must divide ``d_model``).
    encoder_layers, decoder_layers : int
    ff_mult : int
        Feed-forward width as a multiple of ``d_model``.
    max_history : int
        Items of history the encoder reads (the newest ones).
    dropout : float
        Dropout on embeddings, residual branches and inside the feed-forward layers.
    node_embeddings : bool
        Add to the SID decoder's input at position l ≥ 2 an embedding of the whole
        prefix t_1 … t_l (a node of the catalog's SID tree), so the model can store where
        the catalog continues after each node instead of inferring it from token
        embeddings alone.
    head_dim : int
        Width H of the hidden states the heads read. Each level widens the decoder's
        output with its own ``Linear(d_model, H)`` + GELU, so the logits are not limited
        to rank ``d_model`` (the softmax bottleneck) and can follow the catalog's prefix
        structure more closely.
    """

    d_model: int = 96
    n_heads: int = 4
    encoder_layers: int = 2
    decoder_layers: int = 1
    ff_mult: int = 4
    max_history: int = 50
    dropout: float = 0.2
    node_embeddings: bool = True
    head_dim: int = 512

    @classmethod
    def preset(cls, name: str) -> "ModelConfig":
        """Named presets: ``"shipped"`` (the study) and ``"tiny"`` (CI)."""
        presets = {
            "shipped": cls(),
            "tiny": cls(d_model=32, n_heads=2, encoder_layers=1, decoder_layers=1, ff_mult=2,
                        max_history=12, dropout=0.0, head_dim=48),
        }
        if name not in presets:
            raise ZeroGRError(f"unknown model preset {name!r} (choose from {', '.join(presets)})")
        return presets[name]


class _Attention(nn.Module):
    """Multi-head attention with separate query and key/value inputs."""

    def __init__(self, d: int, n_heads: int):
        super().__init__()
        if d % n_heads:
            raise ZeroGRError(f"model config: d_model {d} is not a multiple of n_heads {n_heads}")
        self.n_heads = n_heads
        self.q = nn.Linear(d, d)
        self.kv = nn.Linear(d, 2 * d)
        self.out = nn.Linear(d, d)

    def split(self, x: torch.Tensor) -> torch.Tensor:
        b, n, d = x.shape
        return x.view(b, n, self.n_heads, d // self.n_heads).transpose(1, 2)

    def keys_values(self, memory: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Per-head keys and values of ``memory`` (B, T, d) → 2 × (B, heads, T, d/heads)."""
        k, v = self.kv(memory).chunk(2, dim=-1)
        return self.split(k), self.split(v)

    def forward(self, x: torch.Tensor, kv: tuple[torch.Tensor, torch.Tensor],
                mask: torch.Tensor) -> torch.Tensor:
        """x (B, n, d); kv from :meth:`keys_values`; mask bool, broadcastable to (B, heads, n, T)."""
        b, n, d = x.shape
        y = F.scaled_dot_product_attention(self.split(self.q(x)), *kv, attn_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, n, d))


class _FeedForward(nn.Sequential):
    def __init__(self, d: int, mult: int, dropout: float):
        super().__init__(nn.Linear(d, mult * d), nn.GELU(), nn.Dropout(dropout), nn.Linear(mult * d, d))


class _EncoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
        self.attn = _Attention(d, cfg.n_heads)
        self.ff = _FeedForward(d, cfg.ff_mult, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, mask: torch.Tensor) -> torch.Tensor:
        h = self.ln1(x)
        x = x + self.drop(self.attn(h, self.attn.keys_values(h), mask))
        return x + self.drop(self.ff(self.ln2(x)))


class _DecoderBlock(nn.Module):
    def __init__(self, cfg: ModelConfig):
        super().__init__()
        d = cfg.d_model
        self.ln1, self.ln2, self.ln3 = nn.LayerNorm(d), nn.LayerNorm(d), nn.LayerNorm(d)
        self.self_attn = _Attention(d, cfg.n_heads)
        self.cross_attn = _Attention(d, cfg.n_heads)
        self.ff = _FeedForward(d, cfg.ff_mult, cfg.dropout)
        self.drop = nn.Dropout(cfg.dropout)

    def forward(self, x: torch.Tensor, memory_kv: tuple[torch.Tensor, torch.Tensor],
                cross_mask: torch.Tensor) -> torch.Tensor:
        """x (B, Q, S, d): Q query groups (targets or beams) of S prefix tokens each.

        Self-attention is causal within a group; cross-attention flattens the groups
        against the shared memory with ``cross_mask`` broadcastable to (B, 1, Q·S, T).
        """
        b, q, s, d = x.shape
        h = self.ln1(x).reshape(b * q, s, d)
        causal = torch.ones(s, s, dtype=torch.bool, device=x.device).tril()
        x = x + self.drop(self.self_attn(h, self.self_attn.keys_values(h), causal)).view(b, q, s, d)
        h = self.ln2(x).reshape(b, q * s, d)
        x = x + self.drop(self.cross_attn(h, memory_kv, cross_mask)).view(b, q, s, d)
        return x + self.drop(self.ff(self.ln3(x)))


class SIDRecommender(nn.Module):
    """Encoder over SID-token histories, autoregressive SID decoder, one head per level.

    Parameters
    ----------
    config : ModelConfig
    catalog : Catalog
        The SID catalog: its codebook sizes (collision level included) and, for node
        embeddings, its prefix tree.
    """

    def __init__(self, config: ModelConfig, catalog: Catalog):
        super().__init__()
        self.config = config
        self.codebook_sizes = tuple(int(s) for s in catalog.codebook_sizes)
        d = config.d_model
        # Node embeddings: one vector per distinct prefix of length 2 … L-1 (a node of the
        # SID tree), plus one row for prefixes outside the catalog.
        self.node_emb = nn.ModuleList()
        sids = torch.from_numpy(catalog.sids.astype(np.int64))
        key = sids[:, 0].clone()
        for length in range(2, self.n_levels if config.node_embeddings else 2):
            key = key * self.codebook_sizes[length - 1] + sids[:, length - 1]
            keys = torch.unique_consecutive(key)             # rows are sorted, so keys are too
            self.register_buffer(f"node_keys_{length}", keys, persistent=False)
            self.node_emb.append(nn.Embedding(keys.numel() + 1, d))
        self.token_emb = nn.ModuleList(nn.Embedding(v, d) for v in self.codebook_sizes)
        self.pos_emb = nn.Embedding(config.max_history, d)
        self.level_emb = nn.Embedding(self.n_levels, d)
        self.encoder = nn.ModuleList(_EncoderBlock(config) for _ in range(config.encoder_layers))
        self.encoder_ln = nn.LayerNorm(d)
        self.decoder = nn.ModuleList(_DecoderBlock(config) for _ in range(config.decoder_layers))
        self.decoder_ln = nn.LayerNorm(d)
        self.widen = nn.ModuleList(nn.Linear(d, config.head_dim) for _ in self.codebook_sizes)
        self.heads = nn.ParameterList(nn.Parameter(torch.randn(v, config.head_dim) * config.head_dim ** -0.5)
                                      for v in self.codebook_sizes)
        self.drop = nn.Dropout(config.dropout)
        for emb in (*self.token_emb, *self.node_emb, self.pos_emb, self.level_emb):
            nn.init.normal_(emb.weight, std=0.02)

    @property
    def n_levels(self) -> int:
        return len(self.codebook_sizes)

    @property
    def device(self) -> torch.device:
        return self.pos_emb.weight.device

    def head_weights(self) -> list[torch.Tensor]:
        """Per-level output projections for the Decoder: L × (|V_l|, H), detached."""
        return [w.detach() for w in self.heads]

    # ------------------------------------------------------------------ encoder
    def item_embedding(self, sids: torch.Tensor) -> torch.Tensor:
        """Sum of per-level token embeddings: (…, L) int64 → (…, d)."""
        return sum(emb(sids[..., level]) for level, emb in enumerate(self.token_emb))

    def encode(self, history: torch.Tensor) -> torch.Tensor:
        """Causal encoding of left-aligned histories.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T, L), int64, T ≤ max_history
            SIDs of the history items, oldest first. Right padding (any value ≥ -1) only
            affects the states at padded positions, since attention is causal.

        Returns
        -------
        torch.Tensor, shape (B, T, d)
            State after each item (position t sees items 0…t).
        """
        t = history.shape[1]
        x = self.item_embedding(history.clamp(min=0)) + self.pos_emb.weight[:t]
        x = self.drop(x)
        causal = torch.ones(t, t, dtype=torch.bool, device=x.device).tril()
        for block in self.encoder:
            x = block(x, causal)
        return self.encoder_ln(x)

    # ------------------------------------------------------------------ decoder
    def decode_hidden(self, context: torch.Tensor, prefix: torch.Tensor, memory: torch.Tensor,
                      cross_mask: torch.Tensor) -> torch.Tensor:
        """Hidden states of the SID decoder.

        Parameters
        ----------
        context : torch.Tensor, shape (B, Q, d)
            Encoder state at the newest visible item of each query group.
        prefix : torch.Tensor, shape (B, Q, S - 1), int64
            Tokens of levels 0…S-2 (-1 allowed; such rows are computed, not used).
        memory : torch.Tensor, shape (B, T, d)
            Encoder states to cross-attend to.
        cross_mask : torch.Tensor, bool, broadcastable to (B, 1, Q·S, T)

        Returns
        -------
        torch.Tensor, shape (B, Q, S, d)
            Position s is the hidden state for level s.
        """
        s = prefix.shape[2] + 1
        tokens = [context]
        tokens.extend(self.token_emb[level](prefix[..., level].clamp(min=0)) for level in range(s - 1))
        for length, node in enumerate(self.nodes(prefix), start=2):
            tokens[length] = tokens[length] + self.node_emb[length - 2](node)
        x = torch.stack(tokens, dim=2) + self.level_emb.weight[:s]
        x = self.drop(x)
        for block in self.decoder:
            x = block(x, block.cross_attn.keys_values(memory), cross_mask)
        return self.decoder_ln(x)

    def nodes(self, prefix: torch.Tensor) -> list[torch.Tensor]:
        """Node-embedding rows of the prefixes of length 2 … min(L-1, P).

        Parameters
        ----------
        prefix : torch.Tensor, shape (…, P), int64 (-1 allowed)

        Returns
        -------
        list of torch.Tensor, each (…), int64
            Row of each length-``2 + i`` prefix; the last row (unknown) for prefixes that
            are not in the catalog or contain -1.
        """
        out = []
        if not self.node_emb or prefix.shape[-1] < 2:
            return out
        key = prefix[..., 0].clamp(min=0)
        bad = prefix[..., 0] < 0
        for length in range(2, min(prefix.shape[-1], len(self.node_emb) + 1) + 1):
            tok = prefix[..., length - 1]
            key = key * self.codebook_sizes[length - 1] + tok.clamp(min=0)
            bad = bad | (tok < 0)
            keys = getattr(self, f"node_keys_{length}")
            pos = torch.searchsorted(keys, key).clamp(max=keys.numel() - 1)
            found = (keys[pos] == key) & ~bad
            out.append(torch.where(found, pos, keys.numel()))
        return out

    def head_input(self, hidden: torch.Tensor, level: int) -> torch.Tensor:
        """What level ``level``'s head reads: GELU(widen_l(hidden)), (…, d) → (…, H)."""
        return F.gelu(self.widen[level](hidden))

    def forward(self, history: torch.Tensor, *prefix_sets: torch.Tensor) -> list[list[torch.Tensor]]:
        """Teacher-forced logits for every position of every window.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T, L), int64
            Input items (left-aligned, right padding allowed).
        *prefix_sets : torch.Tensor, shape (B', T, L), int64, B' ≤ B
            SIDs to teacher-force after each position of the first B' windows: the next
            items (``targets[:, t]`` follows ``history[:, t]``), or any other catalog
            items. The encoder runs once for all sets; every set after the first sees it
            detached, so losses on them train the SID decoder, node embeddings and heads
            but not the history encoder.

        Returns
        -------
        list (one per prefix set) of list of torch.Tensor
            Level l: (B', T, |V_l|) float logits of level l after the first l tokens.
        """
        t = history.shape[1]
        memory = self.encode(history)
        # Query group t (its S = L tokens) may attend encoder states 0…t.
        pos = torch.arange(t, device=history.device)
        visible = pos[None, :] <= pos[:, None]
        cross_mask = visible.repeat_interleave(self.n_levels, dim=0)
        out = []
        for i, sids in enumerate(prefix_sets):
            mem = memory[:sids.shape[0]] if i == 0 else memory[:sids.shape[0]].detach()
            hidden = self.decode_hidden(mem, sids[..., :-1], mem, cross_mask)
            out.append([self.head_input(hidden[:, :, level], level) @ self.heads[level].T
                        for level in range(self.n_levels)])
        return out

    # ------------------------------------------------------------------ decoding
    @torch.no_grad()
    def hidden_fn_for(self, histories: Sequence[np.ndarray] | torch.Tensor, sids: torch.Tensor
                      ) -> Callable[[int, torch.Tensor], torch.Tensor]:
        """The ``hidden_fn`` of a batch of requests, for :meth:`zerogr_core.Decoder.decode`.

        Switches the model to eval mode (no dropout) and encodes the histories once.

        Parameters
        ----------
        histories : sequence of np.ndarray (h_b,) int64
            Per request, the item rows (into ``sids``) of the history, oldest first; only
            the newest ``max_history`` are read. Each must be non-empty.
        sids : torch.Tensor, shape (N, L), int64
            SID of every item row.

        Returns
        -------
        callable(step, prefixes) -> torch.Tensor
            ``prefixes`` (B, beams, step) int64 with -1 for unfilled beams; returns the
            hidden states (B, beams, H) in the heads' dtype, on the model's device.
        """
        history, lengths = pack_histories(histories, self.config.max_history)
        self.eval()
        return self._hidden_fn(sids.to(self.device)[history.to(self.device)], lengths.to(self.device))

    def _hidden_fn(self, history_sids: torch.Tensor, lengths: torch.Tensor):
        """The ``hidden_fn`` of encoded requests: (B, T, L) history SIDs and (B,) lengths."""
        device = self.device
        memory = self.encode(history_sids)
        batch = memory.shape[0]
        newest = memory[torch.arange(batch, device=device), lengths - 1]
        valid = torch.arange(memory.shape[1], device=device)[None, :] < lengths[:, None]
        cross_mask = valid[:, None, None, :]
        dtype = self.heads[0].dtype

        @torch.no_grad()
        def hidden_fn(step: int, prefixes: torch.Tensor) -> torch.Tensor:
            beams = prefixes.shape[1]
            context = newest[:, None, :].expand(batch, beams, -1)
            out = self.decode_hidden(context, prefixes.to(device), memory, cross_mask)
            return self.head_input(out[:, :, step], step).to(dtype)

        return hidden_fn

    def staged(self, batch: int, sids: torch.Tensor) -> "StagedRequests":
        """A ``hidden_fn`` over static request buffers that :meth:`StagedRequests.load` refills:
        one object for a whole run of ``batch``-request calls, so the decode engine captures
        one graph (the encoding included, at step 0) and replays it for every batch."""
        sids = sids.to(self.device)

        def build(rows: torch.Tensor, lengths: torch.Tensor):
            self.eval()
            return self._hidden_fn(sids[rows], lengths)

        return StagedRequests(batch, self.config.max_history, self.device, build)

    def describe(self) -> dict:
        """Config, codebook sizes and parameter count, for reports."""
        return dict(config=asdict(self.config), codebook_sizes=list(self.codebook_sizes),
                    parameters=int(sum(p.numel() for p in self.parameters())))


class StagedRequests:
    """The requests of a fixed-size batch in static device buffers, and their ``hidden_fn``.

    Histories are kept to their newest ``width`` items and padded to ``width``, so every
    batch has one shape; ``build(rows, lengths)`` (the model's encoding: item rows (B, width)
    and lengths (B,) in, a ``hidden_fn`` out) runs at step 0 of each decode, inside a
    captured graph, from the buffers :meth:`load` last filled. The models mask padding, so
    padded positions change nothing a request reads.

    Parameters
    ----------
    batch, width : int
    device : torch.device
    build : callable(rows, lengths) -> hidden_fn
    """

    def __init__(self, batch: int, width: int, device, build: Callable):
        self.batch, self.width, self.build = batch, width, build
        self.rows = torch.zeros(batch, width, dtype=torch.int64, device=device)
        self.lengths = torch.ones(batch, dtype=torch.int64, device=device)
        self._fn = None

    def load(self, histories: Sequence[np.ndarray]) -> None:
        """Copy ``batch`` histories (item rows, oldest first, each non-empty) into the buffers."""
        if len(histories) != self.batch:
            raise ZeroGRError(f"histories: {len(histories)} requests, the staged batch is {self.batch}")
        rows, lengths = pack_histories(histories, self.width)
        self.rows.zero_()
        self.rows[:, :rows.shape[1]].copy_(rows)
        self.lengths.copy_(lengths)

    @torch.no_grad()
    def __call__(self, step: int, prefixes: torch.Tensor) -> torch.Tensor:
        if step == 0:
            self._fn = self.build(self.rows, self.lengths)
        return self._fn(step, prefixes)

