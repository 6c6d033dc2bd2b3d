"""How much decode work one request of a client may start: a press of a page's button, a
``compare-orders`` command.

A catalog that passes :class:`~zerogr_core.catalog.limits.LoadLimits` can still be asked
for a decode that runs for minutes: scoring first computes a logit for every token of
every level for every beam of every request. Neither a Streamlit page nor a terminal can
interrupt a tensor op that is already running, so the clients refuse such a run up front,
in one line that says how to shrink it, instead of holding the server or the shell until
it ends.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, replace
from typing import Sequence

from ..errors import UsageError, ZeroGRError

#: Most beams (batch × beam) one decode of a command may hold: the batch 32 × beam 128 shape of
#: the benchmarks, 16 times over, so a typo cannot start hours of work or exhaust memory (a
#: model's cache grows with the beams, whatever the catalog).
MAX_BEAMS = 65_536

#: Largest hidden size a command's random requests take: four times the widest published LLM's
#: (16,384), so a typo cannot ask for heads of gigabytes.
MAX_HIDDEN = 65_536

#: Most timed (or untimed warm-up) runs per measurement a benchmark command takes: a
#: measurement's runs are not interrupted by ``--budget-s``, so a typo (``--repeats 1e9``) would
#: run for days; 10,000 is some 300 times the default of 30.
MAX_REPEATS = 10_000


def check_beams(batches, beams, flags: str = "--batch × --beam") -> None:
    """Refuse a command whose largest decode would hold more than :data:`MAX_BEAMS` beams.

    Parameters
    ----------
    batches, beams : int or sequence of int
        Requests per decode and beam widths (a command's lists: every pair runs).
    flags : str
        The arguments, as the message names them.

    Raises
    ------
    UsageError
        ``--batch × --beam: 1024 × 128 beams is over the 65,536 one decode may hold``.
    """
    batch = max(batches) if isinstance(batches, (list, tuple)) else batches
    beam = max(beams) if isinstance(beams, (list, tuple)) else beams
    if batch * beam > MAX_BEAMS:
        raise UsageError(f"{flags}: {batch} × {beam} beams is over the {MAX_BEAMS:,} one decode may hold")


#: Environment override of :attr:`WorkLimits.max_logits` (a number, e.g. ``2e9``).
ENV_MAX_LOGITS = "ZEROGR_MAX_DECODE_LOGITS"
#: Environment override of :attr:`WorkLimits.max_model_params`.
ENV_MAX_MODEL_PARAMS = "ZEROGR_MAX_MODEL_PARAMS"


@dataclass(frozen=True)
class WorkLimits:
    """Bounds on the decode work one client request starts.

    Attributes
    ----------
    max_logits : int
        Logits one scoring-first decode computes, batch × beam × Σ_l |V_l|: the larger
        of the two orders' work, and what a run's latency and memory grow with. It also
        bounds the hidden-state values of one step, batch × beam × hidden size.
    max_model_params : int
        Parameters in a model's layers (every token's forward multiplies by all of them):
        what a language-model-sized recommender's prefill and steps grow with.
    max_prefill_tokens : int
        Context tokens one prefill runs, batch × context: what its time and the context cache
        grow with (262,144, 32 times the 8 × 1,000 of SID-GR's shapes, takes some 3 s for the tiny
        Qwen3 shape on a CPU, and 30 GB of cache for the 1.7B shape on a GPU).
    """

    max_logits: int
    max_model_params: int = 10**11
    max_prefill_tokens: int = 262_144

    def __post_init__(self):
        for name in ("max_logits", "max_model_params", "max_prefill_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or isinstance(value, bool) or value < 1:
                raise ZeroGRError(f"work limit {name} must be a positive whole number, got {value!r}")

    def check_model(self, name: str, params: int) -> None:
        """Refuse a model of ``params`` layer parameters that is over the limit.

        Raises
        ------
        ZeroGRError
            One line naming the model, its size, the limit and what to do instead.
        """
        if int(params) > self.max_model_params:
            raise ZeroGRError(f"model {name}: {int(params):,} parameters in its layers, over this machine's limit of "
                              f"{self.max_model_params:,} (one decode would run for minutes): pick a smaller shape "
                              f"or run the app on a GPU")

    def check_prefill(self, batch: int, context: int) -> None:
        """Refuse a prefill of ``batch`` contexts of ``context`` tokens that is over the limit.

        Raises
        ------
        ZeroGRError
            One line with the tokens asked for, the limit and what to lower.
        """
        tokens = int(batch) * int(context)
        if tokens > self.max_prefill_tokens:
            raise ZeroGRError(f"batch {batch:,} × context {context:,} is {tokens:,} context tokens to prefill, over "
                              f"the limit of {self.max_prefill_tokens:,}: lower the batch or the context")

    def check_decode(self, batch: int, beam: int, codebook_sizes: Sequence[int], hidden: int | None = None) -> None:
        """Refuse a decode of ``batch`` requests × ``beam`` beams over ``codebook_sizes`` that is over the limit.

        Parameters
        ----------
        batch, beam : int
        codebook_sizes : sequence of int
            |V_l| per level of the catalog.
        hidden : int, optional
            Hidden size of the requests' states, where the client chose it (a random head).

        Raises
        ------
        ZeroGRError
            One line with the work asked for, the limit and what to lower: more than
            :data:`MAX_BEAMS` beams (the commands' limit: beam slots are allocated whatever the
            catalog, so a small catalog does not make a million beams cheap), more logits than
            :attr:`max_logits`, or more hidden-state values per step (batch × beam × hidden,
            counted against the same budget) than that.
        """
        check_beams(batch, beam, "batch × beam")
        beams = int(batch) * int(beam)
        logits = beams * int(sum(codebook_sizes))
        if logits > self.max_logits:
            raise ZeroGRError(f"batch {batch:,} × beam {beam:,} × {sum(codebook_sizes):,} tokens over all levels is "
                              f"{logits:,} logits per decode, over this machine's limit of {self.max_logits:,} (a "
                              f"running decode cannot be stopped half-way): lower the batch or the beam width")
        values = beams * int(hidden or 0)
        if values > self.max_logits:
            raise ZeroGRError(f"batch {batch:,} × beam {beam:,} × hidden size {hidden:,} is {values:,} hidden-state "
                              f"values per step, over this machine's limit of {self.max_logits:,}: lower the batch, "
                              f"the beam width or the hidden size")


#: Named presets: a CPU runs the PyTorch reference (about 10^8 logits a second on one
#: thread), a GPU the engine (two orders of magnitude more).
WORK_PRESETS: dict[str, WorkLimits] = {
    "cpu": WorkLimits(max_logits=400_000_000, max_model_params=50_000_000),
    "gpu": WorkLimits(max_logits=40_000_000_000, max_model_params=20_000_000_000),
}


def work_limits(gpu: bool, environ=None) -> WorkLimits:
    """The preset of this machine (``gpu`` or ``cpu``), with ``ZEROGR_MAX_DECODE_LOGITS`` and
    ``ZEROGR_MAX_MODEL_PARAMS`` applied.

    Raises
    ------
    ZeroGRError
        A variable is not a positive number.
    """
    environ = os.environ if environ is None else environ
    limits = WORK_PRESETS["gpu" if gpu else "cpu"]
    for variable, field in ((ENV_MAX_LOGITS, "max_logits"), (ENV_MAX_MODEL_PARAMS, "max_model_params")):
        text = environ.get(variable)
        if text:
            try:
                limits = replace(limits, **{field: int(float(text))})
            except ValueError:
                raise ZeroGRError(f"{variable}={text!r} is not a number") from None
    return limits
