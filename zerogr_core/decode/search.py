"""What every decode returns and takes: :class:`DecodeResult`, the model (:data:`DecodeModel`:
a ``hidden_fn`` or a :class:`StepModel`), candidate functions.

The loop itself is :class:`zerogr_core.decode.loop.BeamLoop`; :func:`beam_search` runs it
eagerly with one candidate function per step (the reference path's entry point).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Protocol, Union, runtime_checkable

import numpy as np
import torch

from ..errors import ZeroGRError
from .item_table import ids_of_rows
from .loop import BeamLoop, SelectStep
from .ops import DISPATCH, KernelOps, no_timer

HiddenFn = Callable[[int, torch.Tensor], torch.Tensor]
"""``hidden_fn(step, prefixes)``: ``prefixes`` int64 (batch, beams_at_step, step), -1 for
unfilled beams, to hidden states (batch, beams_at_step, H)."""


@runtime_checkable
class StepModel(Protocol):
    """A KV-cache model the beam loop drives step by step (:mod:`zerogr_core.models.protocol`).

    Attributes
    ----------
    hidden_size : int
        H, the width of the hidden states the heads read.
    n_levels : int
        L, the SID length; ``step`` is called for steps 0 … L-1.
    """

    hidden_size: int
    n_levels: int

    def prefill(self, history: torch.Tensor, attention_mask: torch.Tensor | None = None, *,
                beam_width: int) -> None:
        """Read a batch of requests and size every buffer for ``beam_width`` beams."""

    def step(self, step: int, tokens: torch.Tensor | None, parents: torch.Tensor | None) -> torch.Tensor:
        """Hidden states of step ``step``: (batch, H) at step 0, (batch * M, H) after. A model with
        ``partial_last_step = True`` also takes ``wanted=`` and ``rows=`` at the last step
        (:mod:`zerogr_core.models.protocol`)."""


DecodeModel = Union[HiddenFn, StepModel]
"""What a decode runs: a ``hidden_fn`` (:data:`HiddenFn`), or a :class:`StepModel` prefilled
with the batch's requests (the loop hands it the tokens and parents each step selected)."""


@dataclass
class DecodeResult:
    """Beams of a finished decode.

    Attributes
    ----------
    tokens : torch.Tensor, shape (batch, beam_width, L), int64
        Per-level local token ids; -1 for unfilled beams.
    scores : torch.Tensor, shape (batch, beam_width), float32
        Accumulated log-probabilities; -inf for unfilled beams.
    item_rows : torch.Tensor, shape (batch, beam_width), int64
        Row of each beam's item in the sorted catalog; -1 for unfilled beams and for
        sequences that are not catalog items (unconstrained decoding only).
    """

    tokens: torch.Tensor
    scores: torch.Tensor
    item_rows: torch.Tensor

    def item_ids(self, catalog, fill=-1) -> np.ndarray:
        """Item ids (batch, beam_width) of the beams' rows in ``catalog``.

        Parameters
        ----------
        catalog : Catalog
        fill : int, optional
            The id written where there is no item, for integer ids (default -1; where -1 is an
            item's id, pass another, or tell padding by ``item_rows < 0``).

        Returns
        -------
        np.ndarray
            int64 with ``fill`` where there is no item (padding), for integer ids; object
            (Python ``str``) with ``None`` for padding, for string ids.

        Notes
        -----
        On a GPU, integer ids are gathered there from a copy of the catalog's ids made on first
        use (8 bytes per item, kept while the catalog lives: :mod:`zerogr_core.decode.item_table`).
        """
        return ids_of_rows(catalog, self.item_rows, fill)


class StepFn(Protocol):
    def __call__(self, step: int, states: torch.Tensor, hidden: torch.Tensor,
                 scores: torch.Tensor, timer=no_timer) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
        """Candidates of every beam.

        Parameters
        ----------
        states : (n,) int64, -1 for dead beams
        hidden : (n, H)
        scores : (n,) float32, accumulated log-probability (-inf for dead beams)
        timer : callable(step, stage) -> context manager
            Wraps the ``filter``, ``project`` and ``normalise`` stages
            (:mod:`zerogr_core.decode.ops`).

        Returns
        -------
        slot_scores (n, K) float32, -inf for invalid slots; slot_tokens (n, K) int32/int64;
        slot_succ (n, K) int64.
        """


def beam_search(step_fn: StepFn, hidden_fn: HiddenFn, *, batch_size: int, beam_width: int, n_levels: int,
                hidden_size: int, device: torch.device, ops: KernelOps = DISPATCH,
                timer=no_timer) -> DecodeResult:
    """Run L steps of beam search eagerly with a candidate function per step.

    A thin wrapper: each level's ``step_fn`` becomes a
    :class:`~zerogr_core.decode.loop.SelectStep` of :class:`~zerogr_core.decode.loop.BeamLoop`.

    Parameters
    ----------
    step_fn : StepFn
    hidden_fn : callable(step, prefixes) -> (batch, beams_at_step, H), or a prefilled step model
        ``prefixes`` is int64 (batch, beams_at_step, step); unfilled beams carry -1.
    batch_size, beam_width, n_levels, hidden_size : int
    device : torch.device
    ops : KernelOps
        Whose ``topk`` selects the beams (and writes the next prefixes).
    timer : callable(step, stage) -> context manager
        Wraps the ``model`` and ``select`` stages and is passed on to ``step_fn``.

    Returns
    -------
    DecodeResult
    """
    if batch_size < 1:
        raise ZeroGRError(f"batch_size must be ≥ 1, got {batch_size}")
    steps = [SelectStep(step_fn, level, batch_size, beam_width, ops) for level in range(n_levels)]
    loop = BeamLoop(steps, batch_size, beam_width, hidden_size, None, device)
    tokens, scores, rows = loop.run(hidden_fn, timer=timer)
    return DecodeResult(tokens, scores, rows)
