"""Hidden states keyed by a beam's content, for checks that compare two decodes.

:class:`~zerogr_core.bench.methods.ReplayModel` hands out hidden states by beam position:
the beam in slot m at step l always sees the same row. Two decodes that order one pair of
near-tied beams differently then give every later beam another hidden state, and their
results part far beyond that tie. A real model's hidden state is a function of the
request and the tokens decoded so far; :class:`ContentReplayModel` is one: a hash of
(request, step, prefix) picks a row of a fixed table per step. It runs on the device with
tensor ops only (no host synchronisation, so a CUDA graph can capture it), at the cost of
one gather of (batch, beams, H) per step, which is why latency runs keep the
position-keyed replay and the equality checks use this one.

:class:`StepTrace` records the beams a decode kept at every step (the prefixes it hands
its ``hidden_fn``), and :func:`prefix_score` recomputes a prefix's filter-first score in
float64, independently of any decoder: together they tell a reordered exact tie from a
real difference (:func:`~zerogr_core.bench.checks.compare_sets`).
"""
from __future__ import annotations

import torch

from ..decode.heads import HIDDEN_STD, Heads
from ..index.layout import StepIndex

_MIX = 1_000_003
_MASK = (1 << 40) - 1  # keeps every product below 2**63: no integer overflow on any device


class ContentReplayModel:
    """A ``hidden_fn`` whose hidden state is a function of (request, step, prefix tokens).

    Parameters
    ----------
    tables : list of torch.Tensor
        ``tables[l]``: (rows, H) hidden states of step l; a prefix's hash picks the row.
    batch : int
        Requests served; request ``b`` is row ``b`` of the prefixes passed in.
    """

    def __init__(self, tables: list[torch.Tensor], batch: int):
        self.tables, self.batch = tables, batch

    @classmethod
    def draw(cls, n_levels: int, rows: int, hidden: int, dtype: torch.dtype, device, batch: int,
             seed: int = 0) -> "ContentReplayModel":
        """Tables of ``rows`` Gaussian hidden states (std :data:`HIDDEN_STD`) per step, seeded."""
        gen = torch.Generator(device=device).manual_seed(seed)
        tables = [(HIDDEN_STD * torch.randn(rows, hidden, generator=gen, device=device)).to(dtype)
                  for _ in range(n_levels)]
        return cls(tables, batch)

    def keys(self, step: int, prefixes: torch.Tensor) -> torch.Tensor:
        """Table rows (batch, beams) int64 of ``prefixes`` (batch, beams, step) at ``step``."""
        b, m, length = prefixes.shape
        key = torch.arange(b, device=prefixes.device, dtype=torch.int64)[:, None].expand(b, m) * 7919 + step * 104729
        for j in range(length):
            key = ((key ^ (prefixes[:, :, j] + 2)) * _MIX) & _MASK
        key = key ^ (key >> 17)
        return key % self.tables[step].shape[0]

    def __call__(self, step: int, prefixes: torch.Tensor) -> torch.Tensor:
        return self.tables[step][self.keys(step, prefixes)]

    def hidden_of(self, request: int, prefix) -> torch.Tensor:
        """The hidden state (H,) that request ``request`` sees after ``prefix`` (token ids)."""
        n = len(prefix)
        pre = torch.tensor(list(prefix), dtype=torch.int64, device=self.tables[0].device).reshape(1, 1, n)
        return self.tables[n][self.keys(n, pre.expand(request + 1, 1, n))[request, 0]]

    def load(self, i: int) -> None:
        """One table set: nothing to refill (the interface of the position-keyed replay)."""


class StepTrace:
    """A ``hidden_fn`` wrapper that keeps the prefixes of every step (cloned).

    After a decode of L steps, ``prefixes[l]`` (l ≥ 1) holds the beams kept at step l - 1;
    the decode's own output holds the last step's.
    """

    def __init__(self, model):
        self.model, self.prefixes = model, {}

    def __call__(self, step: int, prefixes: torch.Tensor) -> torch.Tensor:
        self.prefixes[step] = prefixes.clone()
        return self.model(step, prefixes)

    def load(self, i: int) -> None:
        self.model.load(i)

    def kept(self, final_tokens: torch.Tensor, n_levels: int) -> list[torch.Tensor]:
        """Beams kept at each step: ``[prefixes (batch, beams, l + 1) for l in range(L)]``."""
        return [self.prefixes[l + 1] for l in range(n_levels - 1)] + [final_tokens]


def prefix_score(index: StepIndex, heads: Heads, model: ContentReplayModel, request: int, prefix) -> float:
    """Filter-first score of ``prefix`` for ``request``, in float64 (host-side, for a few prefixes).

    At every step: the hidden state of the prefix so far, its logits against the head rows
    of the valid tokens only, their log-softmax; the sum over the steps. ``nan`` when the
    prefix is not in the index.
    """
    state, total = 0, 0.0
    for level, tok in enumerate(prefix):
        mapping = index.steps[level]
        valid = torch.as_tensor(mapping.next_tokens(state), dtype=torch.int64)
        pos = (valid == int(tok)).nonzero()
        if pos.numel() == 0:
            return float("nan")
        weight, band = heads.band(level)
        rows = weight[valid.to(weight.device) + band].double()
        h = model.hidden_of(request, prefix[:level]).to(heads.dtype).double()
        total += float(torch.log_softmax(rows @ h, 0)[int(pos[0, 0])])
        state = mapping.lookup(state, int(tok))
    return total


__all__ = ["ContentReplayModel", "StepTrace", "prefix_score"]
