"""The step-sliced index: one independent mapping per decoding step.

Sparse mapping of step l (0-based)
    ``tokens`` A_l, shape (E_l,), the valid tokens of every state, segment by segment in
    state order; ``offsets`` R_l, shape (S_l + 1,), delimiting the segments. The *position*
    e of an entry in A_l is the successor state at step l + 1; at the last step it is the
    row of the item in the sorted SID table, so no item ids are stored in the index.
Dense mapping of step l
    ``table`` D_l, shape (S_l, |V_l|): the successor state of (state, token) or -1.

Per step, the representation is chosen by :class:`~.config.IndexConfig`'s memory-aware density rule
and can be overridden. Every byte is accounted in :meth:`StepIndex.report`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..catalog.catalog import token_dtype
from ..errors import ZeroGRError
from .config import IndexConfig, dense_bytes, sparse_bytes


def torch_dtype(dtype: np.dtype) -> torch.dtype:
    """The torch dtype of a numpy dtype."""
    return torch.from_numpy(np.empty(0, dtype=dtype)).dtype


def static_style_step_bytes(entries: Sequence[int], vocab: int, dense_levels: int = 2) -> list[int]:
    """Bytes of the STATIC-style index laid out as published, attributed to each step.

    Parameters
    ----------
    entries : sequence of int
        E_l per step (distinct length-(l+1) prefixes).
    vocab : int
        The model's whole output vocabulary V.
    dense_levels : int
        d: steps served by the dense V^d tables.

    Returns
    -------
    list of int
        One figure per step: the first-step bool mask (d = 2), the dense bool mask and
        int32 states of step d, then each CSR step's int32 [token, next] pairs and row
        pointers.
    """
    d = min(dense_levels, len(entries))
    out = []
    for level in range(len(entries)):
        if level < d:
            out.append(vocab ** d * (1 + 4) if level == d - 1 else vocab)
        else:
            out.append(entries[level] * 8 + (entries[level - 1] + 1) * 4)
    return out


def static_style_bytes(entries: Sequence[int], vocab: int, dense_levels: int = 2) -> int:
    """Total bytes of the STATIC-style index (:func:`static_style_step_bytes` summed)."""
    return int(sum(static_style_step_bytes(entries, vocab, dense_levels)))


@dataclass(eq=False)
class StepMapping:
    """The mapping of one step.

    Attributes
    ----------
    step : int
        0-based step.
    kind : {"sparse", "dense"}
    codebook : int
        |V_l|.
    n_states, n_entries, max_segment : int
    tokens : torch.Tensor or None, shape (E_l,), int8/int16/int32 — sparse only.
    offsets : torch.Tensor or None, shape (S_l + 1,), int32/int64 — sparse only.
    table : torch.Tensor or None, shape (S_l, |V_l|), int32/int64, -1 sentinel — dense only.
    """

    step: int
    kind: str
    codebook: int
    n_states: int
    n_entries: int
    max_segment: int
    tokens: torch.Tensor | None = None
    offsets: torch.Tensor | None = None
    table: torch.Tensor | None = None

    @property
    def slot_width(self) -> int:
        """K_l: slots per beam (longest segment for sparse, |V_l| for dense)."""
        return self.codebook if self.kind == "dense" else self.max_segment

    @property
    def nbytes(self) -> int:
        return sum(t.numel() * t.element_size() for t in self.tensors())

    def tensors(self) -> list[torch.Tensor]:
        return [t for t in (self.tokens, self.offsets, self.table) if t is not None]

    def filter_args(self) -> dict:
        """Keyword arguments of :func:`zerogr_kernels.filter_slots` for this mapping."""
        if self.kind == "dense":
            return {"table": self.table}
        return {"tokens": self.tokens, "offsets": self.offsets}

    def sparse_view(self) -> tuple[torch.Tensor, torch.Tensor]:
        """(tokens, offsets) of this step; derived from the table for a dense step.

        The derivation allocates; the engine calls it once at warm-up.
        """
        if self.kind == "sparse":
            return self.tokens, self.offsets
        valid = self.table >= 0
        tokens = valid.nonzero()[:, 1].to(torch_dtype(token_dtype(self.codebook)))
        counts = valid.sum(dim=1)
        offsets = torch.zeros(self.n_states + 1, dtype=self.table.dtype, device=self.table.device)
        offsets[1:] = counts.cumsum(0)
        return tokens, offsets

    def branches(self, states: torch.Tensor) -> torch.Tensor:
        """Whether each beam's state has more than one valid token.

        Filtering first gives a state's only token log-probability 0, so a beam in a state that
        does not branch needs no logits at the last step (:mod:`zerogr_core.decode.loop`).

        Parameters
        ----------
        states : torch.Tensor, shape (n,), int64
            States of this step, -1 for unfilled beams; on the mapping's device.

        Returns
        -------
        torch.Tensor, shape (n,), bool
            False for unfilled beams. The per-state table behind it is computed once.
        """
        table = getattr(self, "_branching", None)
        if table is None:
            counts = (self.offsets[1:] - self.offsets[:-1]) if self.kind == "sparse" else (self.table >= 0).sum(dim=1)
            table = self._branching = counts > 1
        return (states >= 0) & table[states.clamp(min=0)]

    def lookup(self, state: int, token: int) -> int:
        """Successor of (state, token) or -1 (host-side; for CLI and tests)."""
        if self.kind == "dense":
            return int(self.table[state, token]) if 0 <= token < self.codebook else -1
        lo, hi = int(self.offsets[state]), int(self.offsets[state + 1])
        seg = self.tokens[lo:hi].to(torch.int64)
        pos = int(torch.searchsorted(seg, torch.tensor(token, dtype=torch.int64, device=seg.device)))
        return lo + pos if pos < seg.numel() and int(seg[pos]) == token else -1

    def next_tokens(self, state: int) -> np.ndarray:
        """Valid tokens after ``state`` (host-side), shape (n,), int64, ascending."""
        if self.kind == "dense":
            return torch.nonzero(self.table[state] >= 0).flatten().cpu().numpy()
        lo, hi = int(self.offsets[state]), int(self.offsets[state + 1])
        return self.tokens[lo:hi].to(torch.int64).cpu().numpy()


@dataclass(eq=False)
class StepIndex:
    """The whole step-sliced index: ``steps[l]`` maps step-l states to successors.

    Attributes
    ----------
    steps : list of StepMapping, length L
    codebook_sizes : tuple of int
    n_items : int
    build : dict
        Timings of the build that produced the index (seconds) and its builder name.
    config : IndexConfig
    """

    steps: list[StepMapping]
    codebook_sizes: tuple[int, ...]
    n_items: int
    config: IndexConfig
    build: dict = field(default_factory=dict)

    @property
    def n_levels(self) -> int:
        return len(self.steps)

    @property
    def device(self) -> torch.device:
        return self.steps[0].tensors()[0].device

    @property
    def nbytes(self) -> int:
        return sum(s.nbytes for s in self.steps)

    def to(self, device) -> "StepIndex":
        """Copy of the index on ``device``."""
        steps = [StepMapping(s.step, s.kind, s.codebook, s.n_states, s.n_entries, s.max_segment,
                             *(None if t is None else t.to(device) for t in (s.tokens, s.offsets, s.table)))
                 for s in self.steps]
        return StepIndex(steps, self.codebook_sizes, self.n_items, self.config, dict(self.build))

    def walk(self, prefix: Sequence[int]) -> int:
        """State reached after ``prefix`` (0 for the empty prefix).

        Raises
        ------
        ZeroGRError
            When the prefix is longer than L or leaves the catalog.
        """
        if len(prefix) > self.n_levels:
            raise ZeroGRError(f"prefix has {len(prefix)} tokens but SIDs have {self.n_levels} levels")
        state = 0
        for level, token in enumerate(prefix):
            state = self.steps[level].lookup(state, int(token))
            if state < 0:
                shown = ",".join(str(int(t)) for t in prefix[:level + 1])
                raise ZeroGRError(f"prefix {shown} is not in the catalog (token {int(token)} at step {level + 1})")
        return state

    def next_tokens(self, prefix: Sequence[int]) -> np.ndarray:
        """Valid next tokens after ``prefix``, shape (n,), int64, ascending.

        Raises
        ------
        ZeroGRError
            Prefix off the catalog, or a complete SID (nothing follows it).
        """
        state = self.walk(prefix)
        if len(prefix) == self.n_levels:
            raise ZeroGRError(f"prefix {','.join(map(str, prefix))} is a complete SID (item row {state})")
        return self.steps[len(prefix)].next_tokens(state)

    def report(self, vocab_size: int | None = None) -> dict:
        """Per-step layout and byte accounting.

        Parameters
        ----------
        vocab_size : int, optional
            Output vocabulary of the model for the STATIC-style estimate (default: the sum
            of the codebooks, i.e. one shared head with a band per level).
        """
        rows = []
        for s in self.steps:
            rows.append(dict(step=s.step + 1, codebook=s.codebook, states=s.n_states, entries=s.n_entries,
                             density=s.n_entries / (s.n_states * s.codebook), max_segment=s.max_segment,
                             kind=s.kind, bytes=s.nbytes,
                             sparse_bytes=sparse_bytes(s.codebook, s.n_states, s.n_entries),
                             dense_bytes=dense_bytes(s.codebook, s.n_states, s.n_entries)))
        entries = [s.n_entries for s in self.steps]
        vocab = vocab_size or sum(self.codebook_sizes)
        return dict(steps=rows, total_bytes=self.nbytes, n_items=self.n_items,
                    sid_table_int16_bytes=self.n_items * self.n_levels * 2,
                    static_style_bytes=static_style_bytes(entries, vocab),
                    static_vocab=vocab, build=dict(self.build))
