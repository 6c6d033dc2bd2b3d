"""The host-side trie baseline: valid tokens are looked up on the CPU at every step.

It holds the sparse prefix tree in host memory (numpy) and answers, for the beams' states,
the valid (token, successor) slots, which the caller ships to the GPU. This models the
CPU-trie constrained decoders (e.g. ``prefix_allowed_tokens_fn``) with a vectorised lookup.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..catalog.catalog import Catalog
from .builders import build_index
from .layout import INDEX_PRESETS


@dataclass(eq=False)
class HostTrie:
    """Children of every prefix, per step, in host memory.

    Attributes
    ----------
    tokens : list of np.ndarray, shape (E_l,) — children tokens, grouped by parent.
    offsets : list of np.ndarray, shape (S_l + 1,) — child range of each parent.
    max_children : list of int
    """

    tokens: list[np.ndarray]
    offsets: list[np.ndarray]
    max_children: list[int]

    @classmethod
    def from_catalog(cls, catalog: Catalog) -> "HostTrie":
        index = build_index(catalog, device="cpu", config=INDEX_PRESETS["all-sparse"])
        return cls([s.tokens.numpy() for s in index.steps], [s.offsets.numpy() for s in index.steps],
                   [s.max_segment for s in index.steps])

    @property
    def nbytes(self) -> int:
        return sum(a.nbytes for a in self.tokens + self.offsets)

    def children(self, step: int, states: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Children of each beam's prefix.

        Parameters
        ----------
        step : int
        states : np.ndarray, shape (n,), int64 (-1 for dead beams)

        Returns
        -------
        tokens, succ : np.ndarray, shape (n, K_l), int64, -1 where there is no child.
        """
        off = self.offsets[step]
        width = self.max_children[step]
        row = np.maximum(states, 0)
        start = off[row].astype(np.int64)
        length = np.where(states >= 0, off[row + 1] - off[row], 0)
        k = np.arange(width)
        valid = k[None, :] < length[:, None]
        pos = np.where(valid, start[:, None] + k[None, :], 0)
        tok = np.where(valid, self.tokens[step][pos].astype(np.int64), -1)
        return tok, np.where(valid, pos, -1)
