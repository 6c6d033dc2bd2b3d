"""What the planner chooses from: the options of one decoding step.

An option is a mapping representation + projection (``MODES``) and a top-k path
(``zerogr_kernels.TOPK_PATHS``). The engine runs options and the planner ranks them; both import
this module, so neither imports the other's internals.
"""
from __future__ import annotations

from dataclasses import dataclass

from zerogr_kernels import SMALL_MAX, TOPK_PATHS, small_tile

from ..errors import ZeroGRError
from ..index.layout import StepMapping

MODES = ("dense+full", "sparse+full", "sparse+selective", "sparse+shared")
"""``sparse+shared`` is the selective projection that reads a head row once per group of
beams in one state (:func:`zerogr_kernels.shared_selective_proj`); beams of one request
never share a state, so it is available only to batches of two requests or more, and only
where the step has few states for its beams (``SHARED_STATES_PER_BEAM``); the planner times
it only where many beams enter the step (``SHARED_MIN_BEAMS``)."""

SHARED_GROUP = 2
"""Beams per group of the shared projection: pairs (states that three or more requests
reach are rare, and each member's accumulator costs registers)."""
SHARED_MIN_BEAMS = 2048
"""Beams entering a step from which the planner times the shared projection. On the H200,
with the grouping of that time (a stable sort, 46 µs at 4,096 beams), it won step 2 of the
anchor catalog at 2,048 and 4,096 beams (FP32 batches 16 and 32: 640 against 655 µs, 1,065
against 1,230) and lost at 1,024 (batch 8: 428 against 346 µs). The counting sort that
replaced it (12 µs) won again at 2,048 and 4,096 beams (606 against 651, 1,037 against 1,243;
``runs/results/headline/``); 1,024 beams have not been timed with it."""
SHARED_STATES_PER_BEAM = 8
"""The shared projection is offered at a step whose states number at most this many per
beam entering it: beams spread evenly over more states would almost never meet."""


@dataclass(frozen=True)
class StepOption:
    """How one step runs: mapping representation + projection, and top-k path."""

    mode: str
    topk: str

    @property
    def label(self) -> str:
        return f"{self.mode} / {self.topk}"

    @property
    def projection(self) -> str:
        """``"full"`` (band GEMM, dense or sparse filter) or ``"selective"`` (either
        selective kernel): what the reference decoder takes for this step."""
        return "full" if self.mode.endswith("full") else "selective"

    @classmethod
    def parse(cls, text: str) -> "StepOption":
        """Parse ``"sparse+selective/small"`` (spaces ignored)."""
        parts = [p.strip() for p in text.split("/")]
        if len(parts) != 2 or parts[0] not in MODES or parts[1] not in TOPK_PATHS:
            raise ZeroGRError(f"step option must look like 'MODE/TOPK' with MODE in {MODES} and TOPK in "
                              f"{TOPK_PATHS}, got {text!r}")
        return cls(parts[0], parts[1])


PLANNED_TOPK = TOPK_PATHS
"""Top-k paths the warm-up planner times by default: all of them. A narrower set
(``GpuEngine(topk_paths=...)``, ``bench --topk-paths``) measures what one path adds."""


def step_options(mapping: StepMapping, beams_in: int, beam_width: int,
                 paths: tuple = PLANNED_TOPK, batch: int = 1, planned: bool = True) -> list[StepOption]:
    """Every option among ``paths`` that can serve ``mapping`` with ``beams_in`` beams per
    request, for ``batch`` requests; with ``planned``, only those worth timing (the shared
    projection from ``SHARED_MIN_BEAMS`` beams)."""
    modes = (["dense+full"] if mapping.kind == "dense" else []) + ["sparse+full", "sparse+selective"]
    n_beams = batch * beams_in
    meet = batch >= 2 and mapping.n_states <= SHARED_STATES_PER_BEAM * n_beams
    meet &= not planned or n_beams >= SHARED_MIN_BEAMS
    modes += ["sparse+shared"] if meet else []
    out = []
    for mode in modes:
        width = mapping.codebook if mode == "dense+full" else mapping.max_segment
        bm, bk, _ = small_tile(beams_in, width, beam_width)
        # "split" serves every shape; "prune" only pays when a request has at least M beams
        # (otherwise its threshold is -inf)
        fits = (["small"] if bm * bk <= SMALL_MAX else []) + ["wide", "split"]
        fits += ["prune"] if beams_in >= beam_width else []
        out += [StepOption(mode, p) for p in fits if p in paths]
    return out
