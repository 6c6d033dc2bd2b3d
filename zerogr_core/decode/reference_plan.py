"""The per-step plan of the reference (CPU) path: full GEMM or selective projection.

The GPU engine times every option of every step at warm-up (:mod:`.planner`); the
reference path makes the same kind of choice between its two projections. Which one wins
depends on the machine and the shape: a gather per candidate (selective) against one GEMM
over the level's codebook whose valid logits are then copied into the slots (full). A CPU
with few cores and a small codebook often prefers the GEMM even on sparse steps.

Both options give the same logits (the numeric contract of :mod:`zerogr_kernels`), so the plan
changes the latency, never the beams. The plan is a :class:`~.planner.Plan` whose options
are ``"<kind>+full"`` / ``"<kind>+selective"`` with the ``"reference"`` top-k path
(``kind`` is the step's representation in the index, which the reference ops read).
"""
from __future__ import annotations

import statistics

import torch

from ..index.layout import StepIndex
from .options import StepOption
from .heads import Heads
from .ops import DISPATCH, KernelOps
from .orders import PROJECTIONS, FilterFirst
from ..timing import interleaved_us
from .planner import Plan, StepChoice, beyond_noise
from .search import HiddenFn, beam_search

REFERENCE_TOPK = "reference"
"""Top-k path of every reference option: the ops' ``topk`` (a stable sort on a CPU)."""
ROUNDS = 6
"""Timed calls per option, the two projections taking turns (:func:`~zerogr_core.timing.fastest_us`)."""


def reference_options(index: StepIndex, step: int) -> list[StepOption]:
    """The reference path's options at ``step``: its representation with either projection."""
    kind = index.steps[step].kind
    return [StepOption(f"{kind}+{p}", REFERENCE_TOPK) for p in PROJECTIONS]


def default_projection(index: StepIndex) -> tuple[str, ...]:
    """Reference projection per step: a GEMM on dense steps, selective on sparse ones.

    What the reference path runs unplanned, and what a plan keeps unless the other
    projection is faster beyond the timing noise (:func:`~.planner.beyond_noise`).
    """
    return tuple("full" if s.kind == "dense" else "selective" for s in index.steps)


def projection_of(option: StepOption) -> str:
    """``"full"`` or ``"selective"``: the projection of a (reference or engine) option."""
    return "full" if option.mode.endswith("full") else "selective"


@torch.no_grad()
def make_reference_plan(index: StepIndex, heads: Heads, beam_width: int, hidden_fn: HiddenFn, batch: int,
                        ops: KernelOps = DISPATCH, rounds: int = ROUNDS) -> Plan:
    """Time both projections of every step on its real inputs; keep the default unless beaten beyond noise.

    One decode records each step's beam states, hidden
    states and scores; each option then runs the step's filtering, projection and
    normalisation on them, the two taking turns for ``rounds`` calls each
    (:func:`zerogr_core.timing.interleaved_us`: a CPU shared with other work slows single
    calls, never all of them). The step keeps :func:`default_projection` unless the other
    projection's median time beats it by more than the spread of the samples
    (:func:`~.planner.beyond_noise`), so options within noise of each other do not make
    the plan differ from run to run.

    Parameters
    ----------
    index : StepIndex
    heads : Heads
    beam_width : int
    hidden_fn : callable(step, prefixes) -> (batch, beams, H)
    batch : int
    ops : KernelOps
        The ops the decode will run (the references on a CPU).
    rounds : int

    Returns
    -------
    Plan
        One :class:`~.planner.StepChoice` per step with both options' times (µs).
    """
    runners = {p: FilterFirst(index, heads, (p,) * index.n_levels, ops) for p in PROJECTIONS}
    record: list[tuple] = []

    def recorder(step, states, hidden, scores, timer):
        record.append((states.clone(), hidden.clone(), scores.clone()))
        return runners["full"](step, states, hidden, scores, timer)

    # any projection sees the same beams (one numeric contract), so any one records them
    beam_search(recorder, hidden_fn, batch_size=batch, beam_width=beam_width, n_levels=index.n_levels,
                hidden_size=heads.hidden_size, device=index.device, ops=ops)
    defaults = default_projection(index)
    steps = []
    for level, (states, hidden, scores) in enumerate(record):
        options = reference_options(index, level)
        samples = interleaved_us({o.label: (lambda run=runners[projection_of(o)]: run(level, states, hidden, scores))
                                  for o in options}, index.device, rounds)
        times = {label: statistics.median(v) for label, v in samples.items()}
        default = next(o for o in options if projection_of(o) == defaults[level])
        label = beyond_noise(samples, default.label)
        steps.append(StepChoice(level, next(o for o in options if o.label == label), times))
    return Plan(heads.shape_key(batch, beam_width), tuple(steps), str(index.device))


def plan_projection(plan: Plan) -> tuple[str, ...]:
    """The projection per step that ``plan`` fixes."""
    return tuple(projection_of(s.option) for s in plan.steps)


def plan_rows(plan: Plan) -> list[dict]:
    """Rows for the app: step, representation, chosen projection, µs of each projection."""
    rows = []
    for s in plan.steps:
        row = {"step": s.step + 1, "representation": s.option.mode.split("+")[0],
               "projection": projection_of(s.option)}
        # a label is "<kind>+<projection> / reference"
        row.update({f"{label.split(' / ')[0].split('+')[1]} (µs)": round(t, 1) for label, t in s.times_us.items()})
        rows.append(row)
    return rows


__all__ = ["REFERENCE_TOPK", "default_projection", "make_reference_plan", "plan_projection", "plan_rows",
           "projection_of", "reference_options"]
