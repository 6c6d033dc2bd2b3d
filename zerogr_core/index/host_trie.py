"""The host-side trie baseline: valid tokens are looked up on the CPU at every step.

It holds the prefix tree in host memory and answers, for the beams' states, the valid
(token, successor) slots, which the caller ships to the GPU. This models CPU-trie
constrained decoders (``prefix_allowed_tokens_fn`` style) with a vectorised lookup.
"""
from __future__ import annotations

from dataclasses import dataclass

import torch

from zerogr_kernels import filter_slots_reference

from ..catalog.catalog import Catalog
from .builders import build_index
from .config import INDEX_PRESETS


@dataclass(eq=False)
class HostTrie:
    """Children of every prefix, per step, in host memory.

    Attributes
    ----------
    tokens : list of torch.Tensor (CPU), shape (E_l,) — children tokens, grouped by parent.
    offsets : list of torch.Tensor (CPU), shape (S_l + 1,) — child range of each parent.
    max_children : list of int
    """

    tokens: list[torch.Tensor]
    offsets: list[torch.Tensor]
    max_children: list[int]

    @classmethod
    def from_catalog(cls, catalog: Catalog) -> "HostTrie":
        index = build_index(catalog, device="cpu", config=INDEX_PRESETS["all-sparse"])
        return cls([s.tokens for s in index.steps], [s.offsets for s in index.steps],
                   [s.max_segment for s in index.steps])

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tokens + self.offsets)

    def children(self, step: int, states: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """Children of each beam's prefix, looked up on the host and shipped to ``states.device``.

        Parameters
        ----------
        step : int
        states : torch.Tensor, shape (n,), int64 (-1 for dead beams), any device

        Returns
        -------
        tokens : torch.Tensor, shape (n, K_l), int32, -1 where there is no child.
        succ : torch.Tensor, shape (n, K_l), int64, -1 where there is no child.
        """
        host = filter_slots_reference(states.cpu(), self.max_children[step], tokens=self.tokens[step],
                                      offsets=self.offsets[step])
        return (host.slot_tokens.to(states.device, non_blocking=True),
                host.slot_succ.to(states.device, non_blocking=True))
