"""The beam-search loop: the one loop that every decode runs through.

:class:`BeamLoop` owns a decode's static buffers (initial states and scores, the token
prefixes of every step) and runs the L steps: it asks the model for the hidden states of
the beams, hands them to the step of that level, which filters, scores and selects the
next beams (and writes their prefixes), and moves on. The GPU engine captures
:meth:`BeamLoop.run` in one CUDA graph; the reference path and the benchmark's baselines
run the same method eagerly.

The model is either

* a ``hidden_fn(step, prefixes) -> (batch, beams, H)``, or
* a step model (:class:`zerogr_core.models.StepModel`, already prefilled): the loop calls
  ``model.step(l, tokens, parents)`` with the (batch, M) tokens and flat parent rows the
  previous step selected, straight from that step's output buffers, so a KV-cache model
  reorders its caches by parent and runs inside the same captured decode.

A step is any callable with the :class:`Step` signature. The ones provided here:

:class:`SelectStep`
    A candidate function of :mod:`zerogr_core.decode.orders` (filtering first, scoring
    first, unconstrained), then the top-M selection of :class:`~zerogr_core.decode.ops.KernelOps`.
:class:`PrefixStep`
    A function that already selects (returns a :class:`~zerogr_kernels.TopkOut`), the
    prefixes written with :func:`zerogr_kernels.extend_prefixes` (the benchmark's baselines).

The engine's :class:`~zerogr_core.decode.engine.StepRunner` is a step too.

**The last step's wanted beams.** Filtering first normalises a beam's log-probabilities over its
valid next tokens, so at the last level a beam whose prefix holds a single item gets log-probability
0 for it whatever the model says (and a list can only take that item away). A step that knows this
offers ``wanted_rows(states) -> (n,) bool``: the beams whose hidden states it reads. A step model
that sets ``partial_last_step = True`` is then asked at the last level for those beams only
(``model.step(l, tokens, parents, wanted=(batch, M) bool, rows=r)``, at most ``r`` wanted beams per
request, ``r`` a multiple of :data:`ROW_GRANULE`), and may return zeros for the others: the step
selects exactly the beams and scores of a full last step. :meth:`BeamLoop.begin` runs every level
but the last and counts the wanted beams (``most``, on the device); :meth:`BeamLoop.finish` runs the
last level for a given ``r`` (eagerly: read from ``most``), so the engine can capture the two apart.
"""
from __future__ import annotations

from typing import Callable, Protocol

import torch

from zerogr_kernels import TopkOut, extend_prefixes

from ..errors import ZeroGRError
from .ops import DISPATCH, KernelOps, no_timer

__all__ = ["BeamLoop", "PrefixStep", "ROW_GRANULE", "SelectStep", "Step", "is_step_model", "partial_rows"]

ROW_GRANULE = 16
"""A partial last step computes its wanted beams in multiples of this many rows per request, so
that a captured decode needs at most ``M / ROW_GRANULE + 1`` graphs of its last step (0 rows included)."""


def partial_rows(most: int, beams: int) -> int:
    """Beams per request the last step computes when no request has more than ``most`` wanted ones.

    Parameters
    ----------
    most : int
        The largest number of wanted beams in one request (``BeamLoop.most``).
    beams : int
        M, the beam width.

    Returns
    -------
    int
        ``most`` rounded up to a multiple of :data:`ROW_GRANULE`, at most ``beams`` (0 when no beam
        is wanted).
    """
    return min(int(beams), -(-int(most) // ROW_GRANULE) * ROW_GRANULE)


def check_hidden(hidden: torch.Tensor, batch: int, beams: int, hidden_size: int, step: int,
                 what: str = "hidden_fn", device: torch.device | None = None) -> None:
    """Refuse hidden states of the wrong kind, shape or device in one line naming the model.

    ``device`` (a tensor's, so ``cuda:0`` rather than ``cuda``) is where the decode runs:
    states elsewhere would fail inside a kernel, as that kernel's complaint about its weights.
    """
    if not isinstance(hidden, torch.Tensor) or tuple(hidden.shape) != (batch, beams, hidden_size):
        got = tuple(hidden.shape) if isinstance(hidden, torch.Tensor) else type(hidden).__name__
        raise ZeroGRError(f"{what}(step={step}) returned {got}, expected ({batch}, {beams}, {hidden_size})")
    if device is not None and hidden.device != device:
        raise ZeroGRError(f"{what}(step={step}) returned a tensor on {hidden.device}, but the decode runs on {device} "
                          f"(the index's device)")


class Step(Protocol):
    def __call__(self, states: torch.Tensor, hidden: torch.Tensor, scores: torch.Tensor,
                 prefixes: tuple[torch.Tensor, torch.Tensor], timer=no_timer) -> TopkOut:
        """Select the next beams of one level.

        Parameters
        ----------
        states : torch.Tensor, shape (n,), int64
            Index state of every beam, -1 for unfilled beams (n = batch × beams at this step).
        hidden : torch.Tensor, shape (n, H)
        scores : torch.Tensor, shape (n,), float32
            Accumulated log-probabilities, -inf for unfilled beams.
        prefixes : (prev, nxt)
            ``prev`` (batch, beams, l) int64, the beams' tokens so far; ``nxt`` (batch, M,
            l + 1) int64, to be filled with the selected beams' prefixes.
        timer : callable(step, stage) -> context manager

        Returns
        -------
        TopkOut
            (batch, M) scores, flat parent rows, tokens and successor states; -inf / -1
            for padding.
        """


def is_step_model(model) -> bool:
    """Whether ``model`` is a step model (``prefill`` + ``step``) rather than a ``hidden_fn``."""
    return callable(getattr(model, "step", None)) and callable(getattr(model, "prefill", None))


class SelectStep:
    """A candidate function of one level followed by the top-M selection.

    Parameters
    ----------
    score_fn : callable(step, states, hidden, scores, timer) -> (slot_scores, slot_tokens, slot_succ)
        :class:`~zerogr_core.decode.orders.FilterFirst`, ``ScoreFirst`` or ``Unconstrained``.
    level, batch, beam_width : int
    ops : KernelOps
        Whose ``topk`` selects the beams and writes their prefixes.
    """

    def __init__(self, score_fn, level: int, batch: int, beam_width: int, ops: KernelOps = DISPATCH):
        self.score_fn, self.level, self.batch, self.beam_width, self.ops = score_fn, level, batch, beam_width, ops
        wanted = getattr(score_fn, "wanted_rows", None)
        if wanted is not None:
            self.wanted_rows = lambda states: wanted(level, states)

    def __call__(self, states, hidden, scores, prefixes, timer=no_timer) -> TopkOut:
        slot_scores, slot_tokens, slot_succ = self.score_fn(self.level, states, hidden, scores, timer)
        with timer(self.level, "select"):
            return self.ops.topk(slot_scores.contiguous(), slot_tokens.to(torch.int32), slot_succ, self.batch,
                                 self.beam_width, prefixes=prefixes)


class PrefixStep:
    """A selecting function of one level; the loop's prefixes written after it.

    Parameters
    ----------
    select_fn : callable(level, states, hidden, scores) -> TopkOut
    level : int
    """

    def __init__(self, select_fn: Callable, level: int):
        self.select_fn, self.level = select_fn, level

    def __call__(self, states, hidden, scores, prefixes, timer=no_timer) -> TopkOut:
        with timer(self.level, "select"):
            top = self.select_fn(self.level, states, hidden, scores)
            extend_prefixes(prefixes[0], prefixes[1], top)
        return top


class BeamLoop:
    """L steps of beam search over static buffers.

    Parameters
    ----------
    steps : sequence of Step
        One per level.
    batch, beam_width, hidden_size : int
    dtype : torch.dtype or None
        Dtype the hidden states are cast to before a step (``None``: as the model returns them).
    device : torch.device
    """

    def __init__(self, steps, batch: int, beam_width: int, hidden_size: int, dtype: torch.dtype | None,
                 device: torch.device):
        self.steps = list(steps)
        self.batch, self.beam_width, self.hidden_size, self.dtype = batch, beam_width, hidden_size, dtype
        self.states0 = torch.zeros(batch, dtype=torch.int64, device=device)
        self.scores0 = torch.zeros(batch, dtype=torch.float32, device=device)
        # prefixes[l]: (batch, beams_at_step, l), what a hidden_fn sees at step l
        self.prefixes = [torch.empty(batch, 1 if l == 0 else beam_width, l, dtype=torch.int64, device=device)
                         for l in range(len(self.steps) + 1)]

    def skips_rows(self, model) -> bool:
        """Whether the last step asks ``model`` for its wanted beams only (module docstring)."""
        return (len(self.steps) > 1 and is_step_model(model) and getattr(model, "partial_last_step", False) is True
                and callable(getattr(self.steps[-1], "wanted_rows", None)))

    def hidden(self, model, level: int, top: TopkOut | None, wanted: torch.Tensor | None = None,
               rows: int | None = None) -> torch.Tensor:
        """The model's hidden states of step ``level``, checked, as (batch × beams, H); with ``wanted``
        ((batch × beams,) bool) a partial step model computes at most ``rows`` of them per request."""
        prev = self.prefixes[level]
        batch, beams = prev.shape[:2]
        if is_step_model(model):
            partial = {} if wanted is None else {"wanted": wanted.view(batch, beams), "rows": rows}
            hidden = model.step(level, None if top is None else top.tokens, None if top is None else top.parents,
                                **partial)
            if isinstance(hidden, torch.Tensor) and hidden.dim() == 2 and hidden.shape[0] == batch * beams:
                hidden = hidden.view(batch, beams, hidden.shape[1])
            check_hidden(hidden, batch, beams, self.hidden_size, level, what="model.step", device=prev.device)
        else:
            hidden = model(level, prev)
            check_hidden(hidden, batch, beams, self.hidden_size, level, device=prev.device)
        hidden = hidden.reshape(batch * beams, self.hidden_size)
        return hidden if self.dtype is None else hidden.to(self.dtype)

    def run(self, model, record: list | None = None, timer=no_timer):
        """Decode once.

        Parameters
        ----------
        model : hidden_fn or StepModel
            See the module docstring; a step model must be prefilled with ``batch`` requests.
        record : list, optional
            Gets one ``(states, hidden, scores)`` clone per step (the planner's real inputs).
        timer : callable(step, stage) -> context manager
            Wraps the ``model`` stage here, and is passed on to the steps.

        Returns
        -------
        tokens (batch, M, L) int64, scores (batch, M) float32, final states (batch, M) int64
            Views of the loop's buffers and the last step's outputs (clone to keep them).
        """
        self.begin(model, record, timer)
        return self.finish(model, None, record, timer)

    def begin(self, model, record: list | None = None, timer=no_timer) -> None:
        """Every level but the last (see :meth:`run`). With a partial last step
        (:meth:`skips_rows`) it then sets ``wanted`` ((batch × M,) bool) and ``most`` (a 0-d int64
        tensor on the device: the largest number of wanted beams in one request); else both ``None``."""
        states, scores, top = self.states0, self.scores0, None
        for level, step in enumerate(self.steps[:-1]):
            states, scores, top = self._level(model, level, step, states, scores, top, None, None, record, timer)
        self._carry = (states, scores, top)
        self.wanted = self.most = None
        if self.skips_rows(model):
            self.wanted = self.steps[-1].wanted_rows(states)
            self.most = self.wanted.view(self.batch, -1).sum(dim=1).amax()

    def finish(self, model, rows: int | None = None, record: list | None = None, timer=no_timer):
        """The last level after :meth:`begin`; returns what :meth:`run` does. ``rows``: the wanted
        beams per request a partial last step computes (:func:`partial_rows`; ``None`` reads
        ``most`` on the host). Reads only :meth:`begin`'s outputs, so it may run again."""
        states, scores, top = self._carry
        level = len(self.steps) - 1
        if self.wanted is not None and rows is None:
            rows = partial_rows(int(self.most), self.beam_width)
        states, scores, _ = self._level(model, level, self.steps[-1], states, scores, top, self.wanted, rows,
                                        record, timer)
        return self.prefixes[-1], scores.view(self.batch, -1), states.view(self.batch, -1)

    def _level(self, model, level, step, states, scores, top, wanted, rows, record, timer):
        with timer(level, "model"):
            hidden = self.hidden(model, level, top, wanted, rows)
        if record is not None:
            record.append((states.clone(), hidden.clone(), scores.clone()))
        top = step(states, hidden, scores, (self.prefixes[level], self.prefixes[level + 1]), timer)
        return top.succ.view(-1), top.scores.view(-1), top
