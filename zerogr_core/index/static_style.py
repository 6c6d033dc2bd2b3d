"""A STATIC-style index, written from the STATIC paper's description (not its code).

STATIC keeps dense tables over the model's *whole* output vocabulary for the first ``d``
steps (a validity mask and the state reached, each of shape V^d) and CSR rows of
``[token, next_state]`` int32 pairs for the later steps. Tokens are global head rows
(band offset + local id). It is the scoring-first baseline and the memory yardstick.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..catalog.catalog import Catalog
from ..errors import ZeroGRError
from .builders import serial_arrays


@dataclass(eq=False)
class StaticIndex:
    """Dense V^d tables for the first ``dense_levels`` steps, then CSR [token, next] rows.

    Attributes
    ----------
    vocab : int
    band_offsets : tuple of int
        Global head row of each level's token 0.
    dense_levels : int
    first_mask : torch.Tensor, shape (V,), bool — tokens valid at step 1.
    dense_mask : torch.Tensor, shape (V,)*d, bool
    dense_states : torch.Tensor, shape (V,)*d, int32 — CSR row reached after d tokens, or -1.
    indptr : list of torch.Tensor, shape (S_l + 1,), int32 — for steps d … L-1.
    pairs : list of torch.Tensor, shape (E_l, 2), int32 — [global token, next state].
    max_row : list of int
    """

    vocab: int
    band_offsets: tuple[int, ...]
    dense_levels: int
    first_mask: torch.Tensor
    dense_mask: torch.Tensor
    dense_states: torch.Tensor
    indptr: list[torch.Tensor]
    pairs: list[torch.Tensor]
    max_row: list[int]
    n_levels: int
    build: dict = field(default_factory=dict)

    @property
    def nbytes(self) -> int:
        tensors = [self.dense_mask, self.dense_states] + self.indptr + self.pairs
        if self.dense_levels > 1:
            tensors.append(self.first_mask)
        return sum(t.numel() * t.element_size() for t in tensors)

    def slot_width(self, step: int) -> int:
        return self.vocab if step < self.dense_levels else self.max_row[step - self.dense_levels]

    def candidates(self, step: int, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Valid (global token, next state) slots of each beam.

        Parameters
        ----------
        step : int
            0-based step.
        states : torch.Tensor, shape (n,), int64
            STATIC state per beam: unused at step 0, the global first token at step 1 of a
            d = 2 index, a CSR row afterwards; -1 for dead beams.

        Returns
        -------
        tokens : torch.Tensor, shape (n, K), int64 — global token or -1.
        succ : torch.Tensor, shape (n, K), int64 — next STATIC state or -1.
        """
        n = states.shape[0]
        dev = states.device
        alive = (states >= 0)[:, None]
        if step < self.dense_levels:
            vocab_ids = torch.arange(self.vocab, device=dev).expand(n, -1)
            if step == 0:
                valid = self.first_mask.expand(n, -1) if self.dense_levels > 1 else self.dense_mask.expand(n, -1)
                succ = vocab_ids if self.dense_levels > 1 else self.dense_states.to(torch.int64).expand(n, -1)
            else:  # step 1 of a d = 2 index: the row of the first token
                row = states.clamp(min=0)
                valid = self.dense_mask[row]
                succ = self.dense_states[row].to(torch.int64)
            valid = valid & alive
            return torch.where(valid, vocab_ids, -1), torch.where(valid, succ, -1)
        level = step - self.dense_levels
        indptr, pairs, width = self.indptr[level], self.pairs[level], self.max_row[level]
        row = states.clamp(min=0)
        start = indptr[row].to(torch.int64)
        length = (indptr[row + 1] - indptr[row]).to(torch.int64)
        k = torch.arange(width, device=dev)
        valid = (k[None, :] < length[:, None]) & alive
        pos = torch.where(valid, start[:, None] + k[None, :], 0)
        got = pairs[pos].to(torch.int64)
        return torch.where(valid, got[..., 0], -1), torch.where(valid, got[..., 1], -1)


def build_static_index(catalog: Catalog, device=None, dense_levels: int = 2,
                       band_offsets: Sequence[int] | None = None) -> StaticIndex:
    """Build the STATIC-style index of ``catalog`` (sort-based NumPy construction).

    Parameters
    ----------
    catalog : Catalog
    device : str or torch.device, optional
    dense_levels : int
        d ∈ {1, 2}.
    band_offsets : sequence of int, optional
        Global head row of each level's token 0 (default: ``catalog.band_offsets`` or the
        cumulative codebook sizes).
    """
    if dense_levels not in (1, 2) or dense_levels > catalog.n_levels:
        raise ZeroGRError(f"dense_levels must be 1 or 2 and at most L={catalog.n_levels}, got {dense_levels}")
    t0 = time.perf_counter()
    sizes = catalog.codebook_sizes
    offsets_ = band_offsets or catalog.band_offsets or tuple(np.concatenate([[0], np.cumsum(sizes)[:-1]]).tolist())
    vocab = int(max(o + s for o, s in zip(offsets_, sizes)))
    tokens, offsets = serial_arrays(catalog.sids, sizes)
    g0 = tokens[0].astype(np.int64) + offsets_[0]
    if dense_levels == 1:
        dense_mask = np.zeros(vocab, dtype=bool)
        dense_states = np.full(vocab, -1, dtype=np.int32)
        dense_mask[g0] = True
        dense_states[g0] = np.arange(g0.size, dtype=np.int32)
        first_mask = dense_mask
    else:
        seg1 = np.diff(offsets[1]).astype(np.int64)
        parent_tok = np.repeat(g0, seg1)
        g1 = tokens[1].astype(np.int64) + offsets_[1]
        dense_mask = np.zeros((vocab, vocab), dtype=bool)
        dense_states = np.full((vocab, vocab), -1, dtype=np.int32)
        dense_mask[parent_tok, g1] = True
        dense_states[parent_tok, g1] = np.arange(g1.size, dtype=np.int32)
        first_mask = np.zeros(vocab, dtype=bool)
        first_mask[g0] = True
    indptr, pairs, max_row = [], [], []
    for level in range(dense_levels, catalog.n_levels):
        ptr = offsets[level].astype(np.int32)
        indptr.append(ptr)
        tok = tokens[level].astype(np.int32) + np.int32(offsets_[level])
        pairs.append(np.stack([tok, np.arange(tok.size, dtype=np.int32)], axis=1))
        max_row.append(int(np.diff(ptr).max()))
    dev = torch.device(device or "cpu")
    to = lambda a: torch.from_numpy(np.ascontiguousarray(a)).to(dev)  # noqa: E731
    index = StaticIndex(vocab, tuple(int(o) for o in offsets_), dense_levels, to(first_mask), to(dense_mask),
                        to(dense_states), [to(p) for p in indptr], [to(p) for p in pairs], max_row,
                        catalog.n_levels)
    index.build = {"builder": "static-style", "total_s": time.perf_counter() - t0}
    return index
