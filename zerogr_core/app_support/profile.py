"""A stage-timed decode of either order, and the comparison metrics.

:func:`profiled_decode` runs the same beam search as :class:`zerogr_core.Decoder`'s
reference path — the same kernel ops in the same order as
:mod:`zerogr_core.decode.orders` — with a timer around each stage of each step:

* ``model``: the ``hidden_fn`` call (the recommender's forward pass);
* ``filter``: slot rows from the index (plus the copy of valid logits after a full GEMM);
* ``project``: selective projection, or the full GEMM;
* ``normalise``: log-softmax (over the valid slots for filter-first, over everything
  the model projects for score-first);
* ``select``: top-M per request and the gather of the next beams.

On a CPU it calls the ops' PyTorch references directly (what the Decoder runs there);
on a GPU the dispatching ops (Triton kernels), synchronising around each stage, so the
breakdown is an eager profile — the CUDA-graph latency is measured separately.
"""
from __future__ import annotations

import contextlib
import statistics
import time
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import torch

import kernels

from ..decode.decoder import default_projection
from ..decode.heads import Heads
from ..decode.orders import full_logits
from ..decode.search import DecodeResult, HiddenFn, check_hidden
from ..errors import ZeroGRError
from ..index.layout import StepIndex

STAGES = ("model", "filter", "project", "normalise", "select")


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


class _Ops:
    """The four kernel ops: references on CPU, dispatching (Triton) on CUDA."""

    def __init__(self, device: torch.device):
        ref = device.type != "cuda"
        self.filter = kernels.filter_slots_reference if ref else kernels.filter_slots
        self.selective = kernels.selective_proj_reference if ref else kernels.selective_proj
        self.log_softmax = kernels.log_softmax_slots_reference if ref else kernels.log_softmax_slots
        self.topk = kernels.topk_gather_reference if ref else kernels.topk_gather
        self.path = "PyTorch reference (CPU)" if ref else "Triton kernels, eager (GPU)"


class _Timer:
    def __init__(self, device: torch.device):
        self.cuda = device.type == "cuda"
        self.rows: list[dict] = []

    def __call__(self, step: int, stage: str):
        return _Span(self, step, stage)


class _Span:
    def __init__(self, timer: _Timer, step: int, stage: str):
        self.timer, self.step, self.stage = timer, step, stage

    def __enter__(self):
        if self.timer.cuda:
            torch.cuda.synchronize()
        self.t0 = time.perf_counter()

    def __exit__(self, *exc):
        if self.timer.cuda:
            torch.cuda.synchronize()
        self.timer.rows.append(dict(step=self.step + 1, stage=self.stage,
                                    ms=(time.perf_counter() - self.t0) * 1e3))


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
                    band_offsets: Sequence[int] | None = None, projection: Sequence[str] | None = None
                    ) -> DecodeRun:
    """Beam search of ``order`` with per-stage timings.

    Parameters
    ----------
    index : StepIndex
    heads : Heads, torch.Tensor (shared head) or list of torch.Tensor (per level)
    beam_width : int
    order : {"filter-first", "score-first"}
    hidden_fn : callable(step, prefixes) -> (batch, beams, H)
    batch : int
    band_offsets : sequence of int, optional
        For a shared head.
    projection : sequence of {"full", "selective"}, optional
        Filter-first projection per step (default: full on dense steps, selective on sparse).

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
    ops, timer = _Ops(device), _Timer(device)
    levels, hidden_size = index.n_levels, heads.hidden_size
    states = torch.zeros(batch, 1, dtype=torch.int64, device=device)
    scores = torch.zeros(batch, 1, dtype=torch.float32, device=device)
    prefixes = torch.empty(batch, 1, 0, dtype=torch.int64, device=device)
    seen_states = []
    for step in range(levels):
        beams = states.shape[1]
        with timer(step, "model"):
            hidden = hidden_fn(step, prefixes)
        check_hidden(hidden, batch, beams, hidden_size, step)
        hidden = hidden.reshape(batch * beams, hidden_size)
        flat_states, flat_scores = states.reshape(-1), scores.reshape(-1)
        seen_states.append(flat_states.clone())
        mapping = index.steps[step]
        width = mapping.slot_width
        if order == "filter-first":
            band = heads.bands[step]
            if proj[step] == "full":
                with timer(step, "project"):
                    logits = full_logits(hidden, band)
                with timer(step, "filter"):
                    slots = ops.filter(flat_states, width, **mapping.filter_args(), logits=logits)
            else:
                with timer(step, "filter"):
                    slots = ops.filter(flat_states, width, **mapping.filter_args())
                with timer(step, "project"):
                    ops.selective(hidden.to(band.dtype), band, slots.slot_tokens, slots.tasks, slots.slot_logits)
            with timer(step, "normalise"):
                cand = ops.log_softmax(slots.slot_logits, flat_scores)
        else:
            weight, band_start = heads.normaliser(step)
            with timer(step, "project"):
                logits = full_logits(hidden, weight)
            with timer(step, "normalise"):
                logprobs = torch.log_softmax(logits, dim=-1)
            with timer(step, "filter"):
                slots = ops.filter(flat_states, width, **mapping.filter_args(),
                                   logits=logprobs.narrow(1, band_start, mapping.codebook))
                cand = slots.slot_logits + flat_scores[:, None]
        with timer(step, "select"):
            top = ops.topk(cand.contiguous(), slots.slot_tokens.to(torch.int32), slots.slot_succ, batch, beam_width)
            flat_prefix = prefixes.reshape(batch * beams, step)
            kept = flat_prefix[top.parents.clamp(min=0)]
            kept = torch.where((top.parents >= 0)[..., None], kept, -1)
            prefixes = torch.cat([kept, top.tokens.to(torch.int64)[..., None]], dim=2)
            states, scores = top.succ, top.scores
    result = DecodeResult(prefixes, scores, states)
    return DecodeRun(order, result, timer.rows, seen_states, proj if order == "filter-first" else (), ops.path)


def time_decoder(decoder, hidden_fn: HiddenFn, batch: int, repeats: int = 5) -> tuple[DecodeResult, dict]:
    """Warm up a :class:`~zerogr_core.Decoder` and time whole decodes (synchronised).

    Returns
    -------
    result : DecodeResult
        Of the last run.
    timing : dict
        ``warmup_ms`` (first call: planning and graph capture on a GPU), ``median_ms``,
        ``min_ms``, ``runs``.
    """
    cuda = decoder.index.device.type == "cuda"

    def once():
        if cuda:
            torch.cuda.synchronize()
        t0 = time.perf_counter()
        out = decoder.decode(hidden_fn, batch)
        if cuda:
            torch.cuda.synchronize()
        return out, (time.perf_counter() - t0) * 1e3

    result, warm = once()
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
