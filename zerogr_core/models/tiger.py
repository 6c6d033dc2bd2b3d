"""The bundled TIGER-style recommender (:class:`~zerogr_core.recsys.model.SIDRecommender`) with a KV cache.

:meth:`SIDRecommender.hidden_fn_for` recomputes the whole SID decoder context at every
step. :class:`TigerStepModel` computes each decoder position once:

* prefill: the encoder runs once per request; each decoder layer's cross-attention keys
  and values are computed once per request and read by all its beams (never repeated
  per beam);
* step l: the self-attention cache (≤ L positions per beam) and each beam's running
  SID-tree node key are reordered by parent, the new token's position is appended, and
  only that position goes through the decoder.

Same weights, same arithmetic per position: the outputs equal ``hidden_fn_for``'s within
floating-point tolerance (``tests/test_models.py``).
"""
from __future__ import annotations

from typing import Sequence

import numpy as np
import torch

from ..errors import ZeroGRError
from .protocol import keep_static, reorder_rows, safe_parents


class TigerStepModel:
    """:class:`~zerogr_core.models.protocol.StepModel` of a trained :class:`SIDRecommender`.

    Parameters
    ----------
    model : SIDRecommender
        Switched to eval mode (no dropout).
    """

    def __init__(self, model):
        model.eval()
        self.model = model
        self.n_levels = model.n_levels
        self.hidden_size = model.config.head_dim
        self.batch = 0
        self.graph_safe = True   # a prefill of the same shape writes into the same tensors

    # ------------------------------------------------------------------ prefill
    @torch.no_grad()
    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """Encode a batch of requests and allocate the per-beam caches.

        Parameters
        ----------
        history : torch.Tensor, shape (B, T, L), int64
            SIDs of the history items, oldest first, left-aligned (this encoder's
            positions count from the oldest item), T ≤ ``max_history``.
        attention_mask : torch.Tensor, shape (B, T), bool or int, optional
            1 on the items, 0 on the right padding (default: all items). Each row needs
            at least one item and its items must come first.
        beam_width : int
            M, beams per request after step 0.
        """
        m = self.model
        if history.dim() != 3 or history.shape[2] != self.n_levels:
            raise ZeroGRError(f"history: expected shape (batch, T, {self.n_levels}), got {tuple(history.shape)}")
        if history.shape[1] > m.config.max_history:
            raise ZeroGRError(f"history: {history.shape[1]} items exceed max_history {m.config.max_history}")
        device = m.device
        history = history.to(device)
        b, t = history.shape[:2]
        mask = torch.ones(b, t, dtype=torch.bool, device=device) if attention_mask is None else \
            attention_mask.to(device).bool()
        lengths = mask.sum(dim=1)
        if bool((lengths < 1).any()) or bool((mask != (torch.arange(t, device=device) < lengths[:, None])).any()):
            raise ZeroGRError("attention_mask: every row needs ≥ 1 item, items first (right padding)")
        memory = m.encode(history)
        dtype = memory.dtype
        if keep_static(self, (b, t, beam_width, dtype),
                       newest=memory[torch.arange(b, device=device), lengths - 1],           # (B, d)
                       cross_mask=mask[:, None, None, :],                                    # (B, 1, 1, T)
                       cross_kv=[block.cross_attn.keys_values(memory) for block in m.decoder]):
            return
        n, heads = b * beam_width, m.config.n_heads
        dh = m.config.d_model // heads
        self.cache = [(torch.zeros(n, heads, self.n_levels, dh, dtype=dtype, device=device),
                       torch.zeros(n, heads, self.n_levels, dh, dtype=dtype, device=device))
                      for _ in m.decoder]
        self.node_key = torch.zeros(n, dtype=torch.int64, device=device)
        self.node_bad = torch.zeros(n, dtype=torch.bool, device=device)
        self.batch, self.beam_width = b, beam_width

    @torch.no_grad()
    def prefill_rows(self, histories: Sequence[np.ndarray], sids: torch.Tensor, *, beam_width: int) -> None:
        """:meth:`prefill` from item rows, packed as :meth:`SIDRecommender.hidden_fn_for` packs them.

        Parameters
        ----------
        histories : sequence of np.ndarray (h_b,) int64
            Per request, the item rows (into ``sids``) of the history, oldest first.
        sids : torch.Tensor, shape (N, L), int64
        beam_width : int
        """
        items, lengths = pack_histories(histories, self.model.config.max_history)
        mask = torch.arange(items.shape[1])[None, :] < lengths[:, None]
        self.prefill(sids.to(self.model.device)[items.to(self.model.device)], mask, beam_width=beam_width)

    # ------------------------------------------------------------------ steps
    @torch.no_grad()
    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None) -> torch.Tensor:
        """Hidden states (batch * beams, H) of step ``step`` (see the protocol)."""
        m, b = self.model, self.batch
        if not b:
            raise ZeroGRError("step model: call prefill before step")
        if step == 0:
            x = (self.newest + m.level_emb.weight[0])[:, None, :]                    # (B, 1, d)
            beams = 1
        else:
            beams = tokens.shape[1]
            prev = 1 if step == 1 else self.beam_width
            rows = safe_parents(parents.to(self.node_key.device), prev)
            self._reorder(rows, b * prev, step)
            x = self._token_input(step, tokens.to(self.node_key.device).reshape(-1)).view(b, beams, -1)
        n = b * beams
        for layer, block in enumerate(m.decoder):
            h = block.ln1(x).reshape(n, 1, -1)
            k_new, v_new = block.self_attn.keys_values(h)                            # (n, heads, 1, dh)
            k_cache, v_cache = self.cache[layer]
            k_cache[:n, :, step:step + 1].copy_(k_new)
            v_cache[:n, :, step:step + 1].copy_(v_new)
            kv = (k_cache[:n, :, :step + 1], v_cache[:n, :, :step + 1])
            x = x + block.self_attn(h, kv, None).view(b, beams, -1)
            x = x + block.cross_attn(block.ln2(x), self.cross_kv[layer], self.cross_mask)
            x = x + block.ff(block.ln3(x))
        out = m.head_input(m.decoder_ln(x), step)
        return out.reshape(n, -1).to(m.heads[0].dtype)

    def _reorder(self, rows: torch.Tensor, n_prev: int, step: int) -> None:
        """Gather every per-beam buffer (the first ``step`` cache positions) from the parent rows."""
        reorder_rows([buf for kv in self.cache for buf in kv], rows, n_prev, step)
        reorder_rows([self.node_key, self.node_bad], rows, n_prev)

    def _token_input(self, step: int, tok: torch.Tensor) -> torch.Tensor:
        """Decoder input at position ``step``: token embedding of level step-1, the node
        embedding of the prefix so far (positions 2 … L-1) and the level embedding."""
        m = self.model
        n = tok.numel()
        level = step - 1
        x = m.token_emb[level](tok.clamp(min=0)) + m.level_emb.weight[step]
        key, bad = self.node_key[:n], self.node_bad[:n]
        if step == 1:
            key.copy_(tok.clamp(min=0))
            bad.copy_(tok < 0)
        else:
            key.mul_(m.codebook_sizes[level]).add_(tok.clamp(min=0))
            bad.logical_or_(tok < 0)
            if step - 2 < len(m.node_emb):
                keys = getattr(m, f"node_keys_{step}")
                pos = torch.searchsorted(keys, key).clamp(max=keys.numel() - 1)
                found = (keys[pos] == key) & ~bad
                x = x + m.node_emb[step - 2](torch.where(found, pos, keys.numel()))
        return x


def pack_histories(histories: Sequence[np.ndarray], max_history: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Left-align the newest ``max_history`` items of each history into one padded tensor.

    Parameters
    ----------
    histories : sequence of np.ndarray (h_b,) int64, each h_b ≥ 1
    max_history : int

    Returns
    -------
    items : torch.Tensor, shape (B, T), int64
        T = the longest kept history; padding is 0.
    lengths : torch.Tensor, shape (B,), int64
    """
    kept = [np.asarray(h, dtype=np.int64)[-max_history:] for h in histories]
    if any(k.size == 0 for k in kept):
        raise ZeroGRError("histories: every request needs at least one past item")
    lengths = np.array([k.size for k in kept], dtype=np.int64)
    items = np.zeros((len(kept), int(lengths.max())), dtype=np.int64)
    for row, k in enumerate(kept):
        items[row, :k.size] = k
    return torch.from_numpy(items), torch.from_numpy(lengths)
