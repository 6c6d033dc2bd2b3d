"""The hybrid planner: time the options of every step at warm-up, keep the fastest.

Options per step (:mod:`zerogr_core.decode.options`) are dense+full (dense steps only),
sparse+full, sparse+selective and (batches of two or more) sparse+shared, each with the
small (one program per request, when the request's candidates fit one tile), wide
(torch.topk), split (chunked tl.topk tournament) or prune (threshold, then a small
tournament) selection.

1. A cost model (:class:`CostModel`) predicts each option's time from its work and skips
   the options predicted far slower than the best, before anything compiles.
2. The kernels of the remaining options compile together (:mod:`.precompile`).
3. Every remaining option is timed on the step's real inputs, recorded from one eager
   decode of the serving shape, writing the next prefixes as the decode does (so the
   kernel variants timed are the ones served): on a GPU as the median of CUDA-event timed replays of a
   graph holding that step alone (so launch overhead counts as it will under whole-decode
   replay), on a CPU with a wall clock (:func:`zerogr_core.timing.median_us`).
4. The fastest option is fixed; on a CPU, whose wall clock is noisy, the cost model's pick
   stays unless another option beats it by more than the spread of the samples
   (:func:`beyond_noise`), so options within noise of each other do not flip the plan.

The decode loop then makes no per-request decisions. Plans persist on disk
(:mod:`.plan_store`), so a known shape skips all of this.
"""
from __future__ import annotations

import functools
import statistics
from dataclasses import asdict, dataclass, field
from typing import Callable

import torch

from ..errors import ZeroGRError
from ..timing import median_us, time_runs
from .options import SHARED_GROUP, StepOption

REPEATS = 20
PLAN_SOURCES = ("timed", "store", "fixed")


@dataclass(frozen=True)
class StepChoice:
    """The option fixed for one step, what every option measured (µs), the options that
    failed to run (label -> error), which the plan never picks, and the options the cost
    model skipped (label -> predicted µs)."""

    step: int
    option: StepOption
    times_us: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)
    skipped: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A per-step plan for one serving shape (batch, beam, dtype, hidden size).

    ``graph_error`` is why the CUDA-graph capture of the shape failed (the shape then
    runs eagerly and is never captured again); ``None`` while it did not fail.
    ``source``: ``"timed"`` (planned in this process), ``"store"`` (loaded from the plan
    store) or ``"fixed"`` (one option per step: nothing to time).
    """

    key: tuple
    steps: tuple
    device: str
    source: str = "timed"
    graph_error: str | None = None

    @property
    def total_us(self) -> float:
        return sum(s.times_us.get(s.option.label, 0.0) for s in self.steps)

    def table(self) -> list[dict]:
        """Rows for the CLI and the app: step, chosen mode and top-k path, µs per option."""
        rows = []
        for s in self.steps:
            row = {"step": s.step + 1, "mode": s.option.mode, "topk": s.option.topk,
                   "chosen_us": s.times_us.get(s.option.label)}
            row.update({f"{label} (µs)": round(t, 2) for label, t in s.times_us.items()})
            if s.failed:
                row["failed"] = "; ".join(f"{label}: {err}" for label, err in s.failed.items())
            if s.skipped:
                row["skipped by cost model"] = ", ".join(s.skipped)
            rows.append(row)
        return rows

    def to_dict(self) -> dict:
        """A JSON-ready form (what the plan store writes)."""
        return dict(key=list(self.key), device=self.device, source=self.source,
                    steps=[dict(step=s.step, option=s.option.label, times_us=s.times_us, failed=s.failed,
                                skipped=s.skipped) for s in self.steps])

    @classmethod
    def from_dict(cls, data: dict, source: str | None = None) -> "Plan":
        """Inverse of :meth:`to_dict`; raises ``ZeroGRError``, ``KeyError`` or ``TypeError`` on bad data."""
        steps = tuple(StepChoice(int(s["step"]), StepOption.parse(s["option"]),
                                 {str(k): float(v) for k, v in s.get("times_us", {}).items()},
                                 {str(k): str(v) for k, v in s.get("failed", {}).items()},
                                 {str(k): float(v) for k, v in s.get("skipped", {}).items()})
                      for s in data["steps"])
        return cls(tuple(data["key"]), steps, str(data["device"]), source or str(data.get("source", "timed")))


# ---------------------------------------------------------------------------- cost model
@dataclass(frozen=True)
class CostModel:
    """Predicted µs of a step option, to skip options far slower than the best before timing.

    For ``n`` beams entering the step (batch × beams per request), hidden size ``H``,
    codebook ``V``, ``K`` slots per beam (``V`` for dense+full, the longest segment
    otherwise) and ``s`` the mean segment length (valid tokens per state):

    * every option pays ``floor_us`` (launches, top-k) plus writing ``n·K`` slots of
      ``slot_bytes`` at ``slot_gbps``;
    * a full projection adds a GEMM of ``2·n·V·H`` flops at ``gemm_tflops`` of the head dtype;
    * a selective projection adds ``2·n·s·H`` flops of gathered dot products at
      ``gather_tflops``; a shared one (``sparse+shared``) at a step with one state (where
      the ``n`` beams form groups of up to ``SHARED_GROUP``) divides it by the group
      size, and elsewhere, where the sharing depends on the requests, costs the same.

    Top-k paths cost the same here (their differences are within the planner's timing).
    The rule: keep every option predicted at most ``ratio`` × the best prediction of its
    step, and always at least the ``keep`` best (ties kept together). If every kept
    option then fails to run, the planner times the skipped ones, so a step's only option
    that runs is never lost. The defaults are fitted to H200 plans (FP16/H1024 and
    FP32/H4096, batches 1–32); only their ratios matter.
    """

    ratio: float = 4.0
    keep: int = 2
    floor_us: float = 20.0
    slot_bytes: int = 16
    slot_gbps: float = 3000.0
    gemm_tflops: tuple = (("float16", 300.0), ("bfloat16", 300.0), ("float32", 50.0))
    gather_tflops: float = 6.0

    def predict_us(self, option: StepOption, mapping, n_beams: int, hidden: int, dtype: str) -> float:
        """Predicted µs of ``option`` on ``mapping`` for ``n_beams`` beams of hidden size ``hidden``."""
        width = mapping.codebook if option.mode == "dense+full" else mapping.max_segment
        t = self.floor_us + n_beams * width * self.slot_bytes / (self.slot_gbps * 1e3)
        if option.mode.endswith("full"):
            rate = dict(self.gemm_tflops).get(dtype, min(r for _, r in self.gemm_tflops))
            t += 2.0 * n_beams * mapping.codebook * hidden / (rate * 1e6)
        else:
            mean_segment = mapping.n_entries / max(1, mapping.n_states)
            # a shared projection gathers a row once per group; only at the root is the
            # sharing known in advance (every beam is in its one state)
            share = min(n_beams, SHARED_GROUP) if option.mode == "sparse+shared" and mapping.n_states == 1 else 1
            t += 2.0 * n_beams * mean_segment * hidden / (self.gather_tflops * 1e6 * share)
        return t

    def select(self, options: list, predicted: dict) -> tuple[list, list]:
        """Split ``options`` into (kept, skipped) by ``predicted`` (label -> µs), skipped cheapest first."""
        if len(options) <= self.keep:
            return list(options), []
        order = sorted(options, key=lambda o: predicted[o.label])
        best = predicted[order[0].label]
        floor_of_keep = predicted[order[self.keep - 1].label]
        kept = [o for o in options if predicted[o.label] <= max(self.ratio * best, floor_of_keep)]
        skipped = [o for o in order if o not in kept]
        return kept, skipped


DEFAULT_COST_MODEL = CostModel()
COST_MODELS = {"default": DEFAULT_COST_MODEL, "off": None}
"""Named presets: ``off`` times every option."""


def cost_model_summary(model: CostModel | None) -> dict | None:
    """The model's parameters (part of a stored plan's key), or ``None`` when off."""
    return None if model is None else {k: (list(map(list, v)) if isinstance(v, tuple) else v)
                                       for k, v in asdict(model).items()}


# ---------------------------------------------------------------------------- planning
@dataclass(frozen=True, eq=False)
class PlanShape:
    """What the planner needs of one serving shape (``GpuEngine.plan_shape`` makes it).

    Attributes
    ----------
    key : tuple
        The shape's key (batch, beam width, dtype, hidden size).
    device : torch.device
    options : list of list of StepOption
        Candidate options per step.
    work : list of (StepMapping, int)
        Per step, its mapping and the number of beams that enter it (what the cost model reads).
    hidden_size : int
    dtype : str
        The heads' dtype, e.g. ``"float16"``.
    step_runner : callable(level, option) -> StepRunner
        A fresh runner of step ``level`` (its own buffers), called as
        ``runner(states, hidden, scores, prefixes)``.
    zero_inputs : callable(level) -> (states, hidden, scores, prefixes)
        Zero inputs of the step's shapes, for compiling ahead of real inputs.
    record_inputs : callable(options, compile_also) -> list of (states, hidden, scores)
        Real inputs of every step, from one eager decode of the shape's requests with one
        option per step; the calls ``compile_also`` compile with its kernels first.
    """

    key: tuple
    device: torch.device
    options: list
    work: list
    hidden_size: int
    dtype: str
    step_runner: Callable
    zero_inputs: Callable
    record_inputs: Callable


def make_plan(shape: PlanShape, *, cost_model: CostModel | None = DEFAULT_COST_MODEL,
              progress: Callable[[float, str], None] | None = None, repeats: int = REPEATS) -> Plan:
    """Time the options per step of ``shape`` (after the cost model's cut) and fix the fastest.

    Parameters
    ----------
    shape : PlanShape
    cost_model : CostModel or None
        ``None`` times every option.
    progress : callable(fraction, text), optional
        Told what is being planned (compiling, recording, timing step l).
    repeats : int
        Timed replays per option.
    """
    say = progress or (lambda fraction, text: None)
    options, dev = shape.options, shape.device
    if all(len(o) == 1 for o in options):
        steps = tuple(StepChoice(level, o[0]) for level, o in enumerate(options))
        return Plan(shape.key, steps, str(dev), "fixed")
    n_levels = len(options)
    kept, skipped, predicted = [], [], []
    for level, opts in enumerate(options):
        mapping, n_beams = shape.work[level]
        pred = {o.label: (cost_model or DEFAULT_COST_MODEL).predict_us(o, mapping, n_beams, shape.hidden_size,
                                                                       shape.dtype)
                for o in opts}
        k, s = cost_model.select(opts, pred) if cost_model is not None else (list(opts), [])
        kept.append(k)
        skipped.append(s)
        predicted.append(pred)
    # the probe decode runs each step's best-predicted option; all kept options compile with it
    probe = [min(k, key=lambda o, p=p: p[o.label]) for k, p in zip(kept, predicted)]
    n_kept = sum(len(k) for k in kept)
    say(0.0, f"compiling the kernels of {n_kept} options over {n_levels} steps"
        + (f" ({sum(len(s) for s in skipped)} skipped by the cost model)" if cost_model is not None else ""))
    calls = [functools.partial(_run_on_zeros, shape, level, o) for level, k in enumerate(kept) for o in k]
    record = shape.record_inputs(probe, calls)
    steps = []
    for level, opts in enumerate(kept):
        say(0.4 + 0.6 * level / n_levels, f"step {level + 1} of {n_levels}: timing {len(opts)} options")
        states, hidden, scores = record[level]
        times, failed, samples = _time_options(shape, level, opts, (states, hidden, scores), repeats)
        rest = skipped[level]
        if not times and rest:  # every kept option failed: the cost model must not lose the step
            t2, f2, s2 = _time_options(shape, level, rest, (states, hidden, scores), repeats)
            times.update(t2)
            failed.update(f2)
            samples.update(s2)
            rest = []
        if not times:
            raise ZeroGRError(f"step {level + 1}: no option ran ({'; '.join(f'{k}: {v}' for k, v in failed.items())})")
        best = min((o for o in options[level] if o.label in times), key=lambda o: times[o.label])
        if dev.type != "cuda" and probe[level].label in samples:
            # a CPU's wall clock is noisy: the cost model's pick stays unless beaten beyond noise
            label = beyond_noise(samples, probe[level].label)
            best = next(o for o in options[level] if o.label == label)
        steps.append(StepChoice(level, best, times, failed,
                                {o.label: round(predicted[level][o.label], 2) for o in rest}))
    say(1.0, "plan fixed")
    return Plan(shape.key, tuple(steps), str(dev))


def beyond_noise(samples_us: dict, default: str) -> str:
    """The option to keep: ``default``, unless another is faster by more than the timing noise.

    The options are compared by their median (the time the plan reports); the noise is the
    larger spread (median − least) of the two options' samples: a CPU shared with other
    work stretches single calls, so medians within that spread of each other say nothing
    about which option is faster, and picking the least of them would pick on noise (and
    differ from run to run).

    Parameters
    ----------
    samples_us : dict of str to list of float
        Every timed call of each option (µs), e.g. :func:`zerogr_core.timing.interleaved_us`.
    default : str
        The label of the option kept unless beaten; must be in ``samples_us``.

    Returns
    -------
    str
        A label of ``samples_us``.
    """
    def median(label):
        return statistics.median(samples_us[label])

    def spread(label):
        return median(label) - min(samples_us[label])

    best = min(samples_us, key=median)
    if best == default:
        return default
    noise = max(spread(best), spread(default))
    return best if median(best) + noise < median(default) else default


def _run_on_zeros(shape: PlanShape, level: int, option: StepOption) -> None:
    """One call of a fresh runner on zero inputs (what the compile-only pass makes)."""
    shape.step_runner(level, option)(*shape.zero_inputs(level))


def _time_options(shape: PlanShape, level: int, options, inputs: tuple, repeats: int) -> tuple[dict, dict, dict]:
    """µs of each option on ``inputs`` (one runner at a time, so their buffers never pile
    up); an option that cannot compile or run here is reported (label -> error), never chosen.
    Also every CPU sample (label -> µs list; empty on CUDA), for :func:`beyond_noise`."""
    times, failed, samples = {}, {}, {}
    # with prefix buffers, as a decode calls the step: the kernels timed are the kernels served
    prefixes = shape.zero_inputs(level)[3]
    for opt in options:
        try:
            runner = shape.step_runner(level, opt)
            if shape.device.type == "cuda":
                times[opt.label] = median_us(lambda r=runner: r(*inputs, prefixes), shape.device, repeats)
            else:  # the wall-clock samples median_us takes on a CPU, kept
                ms = time_runs(lambda r=runner: r(*inputs, prefixes), shape.device,
                               repeats=max(3, repeats // 4), warmup=1)
                samples[opt.label] = [m * 1e3 for m in ms]
                times[opt.label] = statistics.median(samples[opt.label])
        except Exception as exc:  # noqa: BLE001
            failed[opt.label] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
    return times, failed, samples
