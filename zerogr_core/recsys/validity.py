"""Which next tokens are valid after a prefix: a host-side lookup for measurements.

The quality study needs, for every beam of a scoring-first decode, the probability mass
the model puts on tokens that lead to no catalog item. This module answers "which tokens
of level l may follow this prefix" with sorted integer keys and binary search, independent
of the decoder's index, so the measurement also cross-checks the decoder.
"""
from __future__ import annotations

import numpy as np
import torch

from ..catalog import Catalog


class PrefixValidity:
    """Valid-next-token masks of a catalog.

    Parameters
    ----------
    catalog : Catalog
        Codebook sizes whose product must fit in 63 bits (true for every real SID table).
    """

    def __init__(self, catalog: Catalog):
        self.codebook_sizes = tuple(int(v) for v in catalog.codebook_sizes)
        sids = catalog.sids.astype(np.int64)
        self._entries = []  # per step: (parent keys (E,), tokens (E,)), sorted by parent then token
        key = np.zeros(sids.shape[0], dtype=np.int64)
        for level, size in enumerate(self.codebook_sizes):
            child = key * size + sids[:, level]
            first = np.ones(child.size, dtype=bool)
            first[1:] = child[1:] != child[:-1]   # rows are sorted, so equal prefixes are adjacent
            self._entries.append((key[first], sids[first, level]))
            key = child

    def keys(self, prefixes: np.ndarray) -> np.ndarray:
        """Mixed-radix key of each prefix: (n, l) int64 → (n,) int64 (tokens < 0 read as 0)."""
        key = np.zeros(prefixes.shape[0], dtype=np.int64)
        for level in range(prefixes.shape[1]):
            key = key * self.codebook_sizes[level] + np.maximum(prefixes[:, level], 0)
        return key

    def mask(self, prefixes: torch.Tensor) -> torch.Tensor:
        """Valid next tokens after each prefix.

        Parameters
        ----------
        prefixes : torch.Tensor, shape (n, l), int64, 0 ≤ l < L
            Rows containing -1 (unfilled beams) get an all-False row.

        Returns
        -------
        torch.Tensor, shape (n, |V_l|), bool, on ``prefixes``' device
        """
        p = prefixes.cpu().numpy()
        step = p.shape[1]
        parents, tokens = self._entries[step]
        keys = self.keys(p)
        lo = np.searchsorted(parents, keys, side="left")
        hi = np.searchsorted(parents, keys, side="right")
        hi = np.where((p < 0).any(axis=1), lo, hi)
        counts = hi - lo
        rows = np.repeat(np.arange(p.shape[0]), counts)
        starts = np.repeat(lo - np.concatenate([[0], np.cumsum(counts)[:-1]]), counts)
        cols = tokens[starts + np.arange(rows.size)]
        out = np.zeros((p.shape[0], self.codebook_sizes[step]), dtype=bool)
        out[rows, cols] = True
        return torch.from_numpy(out).to(prefixes.device)

    def rows(self, sids: np.ndarray) -> np.ndarray:
        """Catalog row of each complete SID, -1 where it is not an item.

        Parameters
        ----------
        sids : np.ndarray, shape (n, L), int64

        Returns
        -------
        np.ndarray, shape (n,), int64
        """
        parents, tokens = self._entries[-1]
        full = parents * self.codebook_sizes[-1] + tokens
        keys = self.keys(sids)
        pos = np.searchsorted(full, keys)
        hit = (pos < full.size) & (full[np.minimum(pos, full.size - 1)] == keys) & (sids >= 0).all(axis=1)
        return np.where(hit, pos, -1)
