"""A stage-timed decode of either order, the timed comparison of the two, and its metrics.

:func:`profile_decode` asks a :class:`zerogr_core.Decoder` for one decode with its
``timer`` and ``on_step`` hooks: a row per stage of each step
(:data:`zerogr_core.decode.ops.STAGES`) and the beam states entering each step. The
stages:

* ``model``: the ``hidden_fn`` call (the recommender's forward pass);
* ``filter``: slot rows from the index (plus the copy of valid logits after a full GEMM);
* ``project``: selective projection, or the full GEMM;
* ``normalise``: log-softmax (over the valid slots for filter-first, over everything
  the model projects for score-first);
* ``select``: top-M per request and the gather of the next beams.

On a GPU the stages are synchronised one by one, so the breakdown is an eager profile;
whole-decode latency is :mod:`.latency`'s.
"""
from __future__ import annotations

import contextlib
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

from ..decode.decoder import Decoder
from ..decode.ops import STAGES
from ..decode.search import DecodeResult, HiddenFn
from ..errors import ZeroGRError
from ..timing import StageTimer

__all__ = ["STAGES", "PROFILED_ORDERS", "DecodeRun", "comparison", "invalid_mass", "k_values", "profile_decode",
           "profiled_decode", "steady_cpu_timing"]


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


@dataclass
class DecodeRun:
    """One profiled decode.

    Attributes
    ----------
    order : str
    result : DecodeResult
    stage_ms : list of dict
        ``step`` (1-based), ``stage``, ``ms`` (one row per span).
    states : list of torch.Tensor
        Per step, the input state of every beam (``(batch · beams_at_step,)``, -1 = dead).
    projection : tuple of str
        Projection per step (``()`` for score-first).
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


def profile_decode(decoder: Decoder, hidden_fn: HiddenFn, batch: int, *, lists=None,
                   constraints: dict | None = None) -> DecodeRun:
    """One decode of ``decoder`` with per-stage timings and the beam states of every step.

    Parameters
    ----------
    decoder : Decoder
        Filter-first or score-first.
    hidden_fn : callable(step, prefixes) -> (batch, beams, H), or a prefilled StepModel
    batch : int
    lists : RequestLists, optional
        Per-request allow/deny rows, enforced during decoding.
    constraints : dict, optional
        Other item constraints as :meth:`~zerogr_core.Decoder.decode` takes them
        (``allow_items``, ``deny_items``, ``normalise``), e.g. a registered allow set's name.

    Returns
    -------
    DecodeRun
    """
    if decoder.order not in PROFILED_ORDERS:
        raise ZeroGRError(f"order must be one of {', '.join(PROFILED_ORDERS)}, got {decoder.order!r}")
    timer, states = StageTimer(decoder.index.device), []
    result = decoder.decode(hidden_fn, batch, lists=lists, **(constraints or {}), timer=timer,
                            on_step=lambda step, s: states.append(s.clone()))
    projection = tuple(r["projection"] for r in decoder.plan_table(hidden_fn, batch)) \
        if decoder.order == "filter-first" else ()
    path = ("Triton kernels, eager (GPU)" if decoder.index.device.type == "cuda"
            else "PyTorch reference (CPU)")
    return DecodeRun(decoder.order, result, timer.rows, states, projection, path)


@torch.no_grad()
def profiled_decode(index, heads, beam_width: int, order: str, hidden_fn: HiddenFn, batch: int, *,
                    band_offsets: Sequence[int] | None = None, projection: Sequence[str] | None = None,
                    lists=None) -> DecodeRun:
    """:func:`profile_decode` of a reference-path :class:`~zerogr_core.Decoder` built for this call.

    Parameters
    ----------
    index : StepIndex
    heads : torch.Tensor (shared head) or list of torch.Tensor (per level)
    beam_width : int
    order : {"filter-first", "score-first"}
    hidden_fn : callable(step, prefixes) -> (batch, beams, H), or a prefilled StepModel
    batch : int
    band_offsets : sequence of int, optional
        For a shared head.
    projection : sequence of {"full", "selective"}, optional
        Filter-first projection per step (default: full on dense steps, selective on sparse).
    lists : RequestLists, optional

    Returns
    -------
    DecodeRun
    """
    if order not in PROFILED_ORDERS:
        raise ZeroGRError(f"order must be one of {', '.join(PROFILED_ORDERS)}, got {order!r}")
    if batch < 1:
        raise ZeroGRError(f"batch must be ≥ 1, got {batch}")
    decoder = Decoder(index, heads, beam_width, order=order, band_offsets=band_offsets,
                      projection=projection if order == "filter-first" else None, engine="reference")
    return profile_decode(decoder, hidden_fn, batch, lists=lists)


@torch.no_grad()
def invalid_mass(catalog, decoder: Decoder, hidden_fn: HiddenFn, batch: int) -> list[dict]:
    """Per step, the softmax mass that scoring first puts on invalid tokens.

    Runs one untimed decode of the scoring-first ``decoder`` on the same requests and, for
    every live beam of every step, sums the probability of the tokens that lead to no item
    of ``catalog``.

    Returns
    -------
    list of dict
        Per step (1-based): ``beams``, ``mean``, ``p50``, ``p90``, ``p99``, ``max`` invalid
        mass, ``beam_density`` (mean share of the level's codebook that is valid).
    """
    from ..models import PrefixTracker, StepModel
    from ..recsys.quality import InvalidMass
    from ..recsys.validity import PrefixValidity

    if decoder.order != "score-first":
        raise ZeroGRError(f"invalid mass is measured under score-first, not {decoder.order}")
    if isinstance(hidden_fn, StepModel):  # the recorder reads prefixes: the tracker recovers the parents
        hidden_fn = PrefixTracker(hidden_fn)
    record = InvalidMass()
    decoder.decode(record.wrap(hidden_fn, decoder.heads, PrefixValidity(catalog)), batch)
    return record.summary()


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
