"""How much work one press of a page's button may start.

A catalog that passes :class:`~zerogr_core.catalog.limits.LoadLimits` can still be asked
for a decode that runs for minutes: scoring first computes a logit for every token of
every level for every beam of every request. A Streamlit page cannot interrupt a tensor
op that is already running, so the app refuses such a run up front, in one line that
says how to shrink it, instead of holding the server until it ends.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Sequence

from ..errors import ZeroGRError

#: Environment override of :attr:`WorkLimits.max_logits` (a number, e.g. ``2e9``).
ENV_MAX_LOGITS = "ZEROGR_MAX_DECODE_LOGITS"


@dataclass(frozen=True)
class WorkLimits:
    """Bounds on the decode work one page run starts.

    Attributes
    ----------
    max_logits : int
        Logits one scoring-first decode computes, batch × beam × Σ_l |V_l|: the larger
        of the two orders' work, and what a run's latency and memory grow with.
    """

    max_logits: int

    def __post_init__(self):
        if not isinstance(self.max_logits, int) or self.max_logits < 1:
            raise ZeroGRError(f"work limit max_logits must be a positive whole number, got {self.max_logits!r}")

    def check_decode(self, batch: int, beam: int, codebook_sizes: Sequence[int]) -> None:
        """Refuse a decode of ``batch`` requests × ``beam`` beams over ``codebook_sizes`` that is over the limit.

        Parameters
        ----------
        batch, beam : int
        codebook_sizes : sequence of int
            |V_l| per level of the catalog.

        Raises
        ------
        ZeroGRError
            One line with the work asked for, the limit and what to lower.
        """
        logits = int(batch) * int(beam) * int(sum(codebook_sizes))
        if logits > self.max_logits:
            raise ZeroGRError(f"batch {batch:,} × beam {beam:,} × {sum(codebook_sizes):,} tokens over all levels is "
                              f"{logits:,} logits per decode, over this machine's limit of {self.max_logits:,} (a "
                              f"running decode cannot be stopped half-way): lower the batch or the beam width")


#: Named presets: a CPU runs the PyTorch reference (about 10^8 logits a second on one
#: thread), a GPU the engine (two orders of magnitude more).
WORK_PRESETS: dict[str, WorkLimits] = {
    "cpu": WorkLimits(max_logits=400_000_000),
    "gpu": WorkLimits(max_logits=40_000_000_000),
}


def work_limits(gpu: bool, environ=None) -> WorkLimits:
    """The preset of this machine (``gpu`` or ``cpu``), with ``ZEROGR_MAX_DECODE_LOGITS`` applied.

    Raises
    ------
    ZeroGRError
        The variable is not a positive number.
    """
    environ = os.environ if environ is None else environ
    limits = WORK_PRESETS["gpu" if gpu else "cpu"]
    text = environ.get(ENV_MAX_LOGITS)
    if text:
        try:
            limits = replace(limits, max_logits=int(float(text)))
        except ValueError:
            raise ZeroGRError(f"{ENV_MAX_LOGITS}={text!r} is not a number") from None
    return limits
