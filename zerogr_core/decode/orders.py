"""Per-step candidate scoring for the three decode orders.

filter-first
    Look up each beam's valid tokens in the step-sliced index, compute only their logits
    (selective projection) or a full GEMM over the level's band whose valid logits are
    copied into the slots, then log-softmax over the valid slots.
score-first
    Full projection over everything the model projects (the level's head, or the whole
    shared head as STATIC does), log-softmax over all of it, then keep the valid tokens,
    found in the step-sliced index, the STATIC-style index or the host trie.
unconstrained
    Full projection and log-softmax with no mask; every token of the level's band competes.
"""
from __future__ import annotations

from typing import Sequence

import torch

from zerogr_kernels import full_proj

from ..errors import ZeroGRError
from ..index.host_trie import HostTrie
from ..index.layout import StepIndex
from ..index.static_style import StaticIndex
from .heads import Heads
from .ops import DISPATCH, KernelOps, no_timer

PROJECTIONS = ("full", "selective")


def full_logits(hidden: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """Logits of every row of ``weight``: (n, H) × (V, H)ᵀ → (n, V), float32.

    The hidden states take the head's dtype; products accumulate in float32 and the logits
    stay float32 (:func:`zerogr_kernels.full_proj`), as in every other projection.
    """
    return full_proj(hidden.to(weight.dtype), weight, 0, weight.shape[0])


class FilterFirst:
    """Filtering first over a :class:`StepIndex`.

    Parameters
    ----------
    index : StepIndex
    heads : Heads
    projection : sequence of {"full", "selective"}, one per step
    ops : KernelOps
        Kernel implementations (:mod:`zerogr_core.decode.ops`).
    """

    def __init__(self, index: StepIndex, heads: Heads, projection: Sequence[str], ops: KernelOps = DISPATCH):
        if len(projection) != index.n_levels or any(p not in PROJECTIONS for p in projection):
            raise ZeroGRError(f"projection must list one of {PROJECTIONS} per step, got {list(projection)}")
        self.index, self.heads, self.projection, self.ops = index, heads, tuple(projection), ops
        #: Optional per-request lists (:class:`~zerogr_core.decode.constraints.SlotConstraint`),
        #: applied to the slots before projection (catalog-normalised lists: after it).
        self.constraint = None

    def wanted_rows(self, step: int, states: torch.Tensor) -> torch.Tensor:
        """The beams whose hidden states step ``step`` reads: (n,) bool, those in a state with more
        than one valid token (the only token of any other state gets log-probability 0, under either
        normalisation and any list)."""
        return self.index.steps[step].branches(states)

    def __call__(self, step, states, hidden, scores, timer=no_timer):
        mapping, ops = self.index.steps[step], self.ops
        band = self.heads.bands[step]
        if self.projection[step] == "full":
            with timer(step, "project"):
                logits = full_logits(hidden, band)
            with timer(step, "filter"):
                slots = ops.filter(states, mapping.slot_width, **mapping.filter_args(), logits=logits)
                if self.constraint is not None:
                    self.constraint(step, *slots[:3], defer=True)
        else:
            with timer(step, "filter"):
                slots = ops.filter(states, mapping.slot_width, **mapping.filter_args())
                if self.constraint is not None:
                    self.constraint(step, *slots[:3], defer=True)
            with timer(step, "project"):
                ops.selective(hidden.to(band.dtype), band, slots.slot_tokens, slots.tasks, slots.slot_logits)
        if self.constraint is not None:
            with timer(step, "filter"):
                scores = self.constraint.rescore(step, *slots[:3], scores)
        with timer(step, "normalise"):
            cand = ops.log_softmax(slots.slot_logits, scores)
        return cand, slots.slot_tokens, slots.slot_succ


class ScoreFirst:
    """Scoring first: full-vocabulary log-softmax, then keep the valid slots.

    Parameters
    ----------
    source : StepIndex, StaticIndex or HostTrie
        Where the valid tokens come from.
    heads : Heads
    ops : KernelOps
        Kernel implementations (:mod:`zerogr_core.decode.ops`).
    """

    def __init__(self, source, heads: Heads, ops: KernelOps = DISPATCH):
        self.source, self.heads, self.ops = source, heads, ops
        #: Optional per-request lists, applied after the full-vocabulary normalisation
        #: (needs a source whose states are the step-sliced index's: StepIndex or HostTrie).
        self.constraint = None

    def __call__(self, step, states, hidden, scores, timer=no_timer):
        weight, band_start = self.heads.normaliser(step)
        with timer(step, "project"):
            logits = full_logits(hidden, weight)
        with timer(step, "normalise"):
            logprobs = torch.log_softmax(logits, dim=-1)
        source = self.source
        with timer(step, "filter"):
            if isinstance(source, StepIndex):
                mapping = source.steps[step]
                band = logprobs.narrow(1, band_start, mapping.codebook)
                slots = self.ops.filter(states, mapping.slot_width, **mapping.filter_args(), logits=band)
                tokens, succ, slot_lp = slots.slot_tokens, slots.slot_succ, slots.slot_logits
            else:
                if isinstance(source, StaticIndex):
                    tokens, succ = source.candidates(step, states)
                    tokens = torch.where(tokens >= 0, tokens - source.band_offsets[step], -1)
                elif isinstance(source, HostTrie):
                    tokens, succ = source.children(step, states)
                else:
                    raise ZeroGRError(f"score-first needs a StepIndex, StaticIndex or HostTrie, "
                                      f"got {type(source).__name__}")
                slot_lp = torch.gather(logprobs, 1, (tokens.long() + band_start).clamp(min=0))
                slot_lp = torch.where(tokens >= 0, slot_lp, float("-inf"))
            if self.constraint is not None:
                tokens, succ, slot_lp = tokens.to(torch.int32).contiguous(), succ.contiguous(), slot_lp.contiguous()
                self.constraint(step, tokens, succ, slot_lp)
            cand = slot_lp + scores[:, None]
        return cand, tokens, succ


class Unconstrained:
    """No mask: log-softmax over what the model projects, top-k over the level's band."""

    def __init__(self, heads: Heads):
        self.heads = heads

    def __call__(self, step, states, hidden, scores, timer=no_timer):
        weight, band_start = self.heads.normaliser(step)
        size = self.heads.bands[step].shape[0]
        with timer(step, "project"):
            logits = full_logits(hidden, weight)
        with timer(step, "normalise"):
            logprobs = torch.log_softmax(logits, dim=-1)[:, band_start:band_start + size]
        n = states.shape[0]
        tokens = torch.arange(size, device=states.device).expand(n, size)
        succ = torch.full((n, size), -1, dtype=torch.int64, device=states.device)
        return logprobs + scores[:, None], tokens, succ


def resolve_rows(index: StepIndex, tokens: torch.Tensor) -> torch.Tensor:
    """Catalog rows of complete SIDs, -1 for sequences that are not items.

    Parameters
    ----------
    tokens : torch.Tensor, shape (n, L), int64 (-1 allowed)

    Returns
    -------
    torch.Tensor, shape (n,), int64
    """
    state = torch.zeros(tokens.shape[0], dtype=torch.int64, device=tokens.device)
    for step, mapping in enumerate(index.steps):
        slots = DISPATCH.filter(state, mapping.slot_width, **mapping.filter_args())
        hit = (slots.slot_tokens.to(torch.int64) == tokens[:, step:step + 1]) & (slots.slot_tokens >= 0)
        found = hit.any(dim=1)
        pos = hit.to(torch.int8).argmax(dim=1, keepdim=True)
        state = torch.where(found, slots.slot_succ.gather(1, pos)[:, 0], -1)
    return state
