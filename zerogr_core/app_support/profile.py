"""A stage-timed decode of either order, and the comparison metrics.

:func:`profiled_decode` runs :class:`zerogr_core.Decoder`'s reference path — the
beam-search loop of :mod:`zerogr_core.decode.search` with the step functions of
:mod:`zerogr_core.decode.orders` — with a timer around each stage of each step
(:data:`zerogr_core.decode.ops.STAGES`):

* ``model``: the ``hidden_fn`` call (the recommender's forward pass);
* ``filter``: slot rows from the index (plus the copy of valid logits after a full GEMM);
* ``project``: selective projection, or the full GEMM;
* ``normalise``: log-softmax (over the valid slots for filter-first, over everything
  the model projects for score-first);
* ``select``: top-M per request and the gather of the next beams.

On a CPU it calls the ops' PyTorch references (what the Decoder runs there); on a GPU the
dispatching ops (Triton kernels), synchronising around each stage, so the breakdown is an
eager profile — the CUDA-graph latency is measured separately.
"""
from __future__ import annotations

import contextlib
import statistics
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..decode.decoder import default_projection
from ..decode.heads import Heads
from ..decode.ops import DISPATCH, REFERENCE, STAGES
from ..decode.orders import FilterFirst, ScoreFirst
from ..decode.search import DecodeResult, HiddenFn, beam_search
from ..errors import ZeroGRError
from ..index.layout import StepIndex
from ..timing import Stopwatch

__all__ = ["STAGES", "PROFILED_ORDERS", "DecodeRun", "comparison", "invalid_mass", "k_values", "profiled_decode",
           "steady_cpu_timing", "time_decoder"]


@contextlib.contextmanager
def steady_cpu_timing(device):
    """On a CPU, run with one torch intra-op thread, then restore the setting.

    Decode ops at the app's sizes are tiny: a thread pool only adds scheduling stalls (on a
    busy machine, p99 outliers tens of times the median). No effect on a GPU.
    """
    if torch.device(device).type != "cpu":
        yield
        return
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


PROFILED_ORDERS = ("filter-first", "score-first")


class _Timer:
    """``timer(step, stage)`` spans, synchronised on CUDA, collected as rows."""

    def __init__(self, device: torch.device):
        self.device = device
        self.rows: list[dict] = []

    @contextlib.contextmanager
    def __call__(self, step: int, stage: str):
        with Stopwatch(self.device) as watch:
            yield
        self.rows.append(dict(step=step + 1, stage=stage, ms=watch.ms))


@dataclass
class DecodeRun:
    """One profiled decode.

    Attributes
    ----------
    order : str
    result : DecodeResult
    stage_ms : list of dict
        ``step`` (1-based), ``stage``, ``ms`` (summed over the step's spans).
    states : list of torch.Tensor
        Per step, the input state of every beam (``(batch · beams_at_step,)``, -1 = dead).
    projection : tuple of str
        Filter-first projection per step (``()`` for score-first).
    path : str
        Which ops ran.
    """

    order: str
    result: DecodeResult
    stage_ms: list[dict]
    states: list[torch.Tensor] = field(default_factory=list)
    projection: tuple[str, ...] = ()
    path: str = ""

    @property
    def total_ms(self) -> float:
        return sum(r["ms"] for r in self.stage_ms)

    def per_step(self) -> list[dict]:
        """Rows ``step, stage, ms`` with stages summed per step (for stacked bars)."""
        acc: dict[tuple[int, str], float] = {}
        for r in self.stage_ms:
            acc[(r["step"], r["stage"])] = acc.get((r["step"], r["stage"]), 0.0) + r["ms"]
        return [dict(step=s, stage=g, ms=ms, order=self.order) for (s, g), ms in sorted(
            acc.items(), key=lambda kv: (kv[0][0], STAGES.index(kv[0][1])))]


@torch.no_grad()
def profiled_decode(index: StepIndex, heads, beam_width: int, order: str, hidden_fn: HiddenFn, batch: int, *,
                    band_offsets: Sequence[int] | None = None, projection: Sequence[str] | None = None,
                    lists=None) -> DecodeRun:
    """Beam search of ``order`` with per-stage timings.

    Parameters
    ----------
    index : StepIndex
    heads : Heads, torch.Tensor (shared head) or list of torch.Tensor (per level)
    beam_width : int
    order : {"filter-first", "score-first"}
    hidden_fn : callable(step, prefixes) -> (batch, beams, H), or a prefilled StepModel
    batch : int
    band_offsets : sequence of int, optional
        For a shared head.
    projection : sequence of {"full", "selective"}, optional
        Filter-first projection per step (default: full on dense steps, selective on sparse).
    lists : RequestLists, optional
        Per-request allow/deny rows, enforced during decoding
        (:mod:`zerogr_core.decode.constraints`).

    Returns
    -------
    DecodeRun
    """
    if order not in PROFILED_ORDERS:
        raise ZeroGRError(f"order must be one of {', '.join(PROFILED_ORDERS)}, got {order!r}")
    if not isinstance(beam_width, int) or beam_width < 1:
        raise ZeroGRError(f"beam width must be a positive integer, got {beam_width!r}")
    if batch < 1:
        raise ZeroGRError(f"batch must be ≥ 1, got {batch}")
    heads = heads if isinstance(heads, Heads) else Heads.build(heads, index.codebook_sizes, band_offsets)
    device = index.device
    if heads.device != device:
        raise ZeroGRError(f"heads are on {heads.device} but the index is on {device}")
    proj = tuple(projection) if projection is not None else default_projection(index)
    ops = DISPATCH if device.type == "cuda" else REFERENCE
    step = FilterFirst(index, heads, proj, ops) if order == "filter-first" else ScoreFirst(index, heads, ops)
    if lists is not None:
        from ..decode.constraints import SlotConstraint

        step.constraint = SlotConstraint(index, lists)
    timer, seen_states = _Timer(device), []

    def step_fn(level, states, hidden, scores, timer):
        seen_states.append(states.clone())
        return step(level, states, hidden, scores, timer)

    result = beam_search(step_fn, hidden_fn, batch_size=batch, beam_width=beam_width, n_levels=index.n_levels,
                         hidden_size=heads.hidden_size, device=device, ops=ops, timer=timer)
    path = "PyTorch reference (CPU)" if ops is REFERENCE else "Triton kernels, eager (GPU)"
    return DecodeRun(order, result, timer.rows, seen_states, proj if order == "filter-first" else (), path)


@torch.no_grad()
def invalid_mass(catalog, index: StepIndex, heads, beam_width: int, hidden_fn: HiddenFn, batch: int, *,
                 band_offsets: Sequence[int] | None = None) -> list[dict]:
    """Per step, the softmax mass that scoring first puts on invalid tokens.

    Runs one untimed scoring-first decode (reference path) of the same requests and, for
    every live beam of every step, sums the probability of the tokens that lead to no item
    of ``catalog``.

    Returns
    -------
    list of dict
        Per step (1-based): ``beams``, ``mean``, ``p50``, ``p90``, ``p99``, ``max`` invalid
        mass, ``beam_density`` (mean share of the level's codebook that is valid).
    """
    from ..decode.decoder import Decoder
    from ..decode.loop import is_step_model
    from ..models.protocol import PrefixTracker
    from ..recsys.quality import InvalidMass
    from ..recsys.validity import PrefixValidity

    h = heads if isinstance(heads, Heads) else Heads.build(heads, index.codebook_sizes, band_offsets)
    if is_step_model(hidden_fn):  # the recorder reads prefixes: the tracker recovers the parents from them
        hidden_fn = PrefixTracker(hidden_fn)
    record = InvalidMass()
    fn = record.wrap(hidden_fn, h, PrefixValidity(catalog))
    shared = h.shared is not None
    Decoder(index, h.shared if shared else list(h.bands), beam_width, order="score-first",
            band_offsets=h.band_offsets if shared else None, engine="reference").decode(fn, batch)
    return record.summary()


def time_decoder(decoder, hidden_fn: HiddenFn, batch: int, repeats: int = 5,
                 progress=None, lists=None) -> tuple[DecodeResult, dict]:
    """Warm up a :class:`~zerogr_core.Decoder` and time whole decodes (synchronised).

    ``progress(fraction, text)``, if given, hears the GPU engine's warm-up (planning and
    compiling) during the first call.

    Returns
    -------
    result : DecodeResult
        Of the last run.
    timing : dict
        ``warmup_ms`` (first call: planning and graph capture on a GPU), ``median_ms``,
        ``min_ms``, ``runs``.
    """
    def once():
        with Stopwatch(decoder.index.device) as watch:
            out = decoder.decode(hidden_fn, batch, lists=lists)
        return out, watch.ms

    engine = getattr(decoder, "gpu_engine", None)
    if engine is not None and progress is not None:
        engine.progress = progress
    try:
        result, warm = once()
    finally:
        if engine is not None and progress is not None:
            engine.progress = None
    samples = []
    for _ in range(max(1, repeats)):
        result, ms = once()
        samples.append(ms)
    return result, dict(warmup_ms=warm, median_ms=statistics.median(samples), min_ms=min(samples),
                        runs=len(samples))


# ---------------------------------------------------------------------------- metrics
def comparison(run_a: DecodeRun, run_b: DecodeRun, ks: Sequence[int], targets=None) -> dict:
    """Overlap@K between two runs (and Recall@K of each when ``targets`` are given).

    Uses the quality study's metrics (:mod:`zerogr_core.recsys.quality`), so the app and the
    study count the same way.

    Returns
    -------
    dict
        ``overlap``, ``share_differ`` (K → float) and, with targets, ``recall_a``,
        ``recall_b``, ``ndcg_a``, ``ndcg_b``.
    """
    from ..recsys.quality import overlap_metrics, ranking_metrics

    a = run_a.result.item_rows.cpu().numpy()
    b = run_b.result.item_rows.cpu().numpy()
    overlap, differ, _ = overlap_metrics(a, b, ks)
    out = dict(overlap=overlap, share_differ=differ)
    if targets is not None:
        targets = np.asarray(targets, dtype=np.int64)
        out["recall_a"], out["ndcg_a"] = ranking_metrics(a, targets, ks)
        out["recall_b"], out["ndcg_b"] = ranking_metrics(b, targets, ks)
    return out


def k_values(beam_width: int) -> list[int]:
    """The study's K values that fit the beam: 1, 5, 10, 20, 50, 128 (≤ M), plus M."""
    ks = [k for k in (1, 5, 10, 20, 50, 128) if k <= beam_width]
    if beam_width not in ks:
        ks.append(beam_width)
    return ks
