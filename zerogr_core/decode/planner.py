"""The hybrid planner: time every option of every step at warm-up, keep the fastest.

Options per step are dense+full (dense steps only), sparse+full and sparse+selective, each
with the small (one program per request, when the request's candidates fit one tile), wide
(torch.topk), split (chunked tl.topk tournament) or prune (split behind a per-request score
threshold, when a request has at least M beams) selection.
Every option is timed on the step's real inputs, recorded from one eager decode of the
serving shape: on a GPU as the median of CUDA-event timed replays of a graph holding that
step alone (so launch overhead counts as it will under whole-decode replay), on a CPU
with a wall clock. The decode loop then makes no per-request decisions.
"""
from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from ..errors import ZeroGRError
from .engine import ShapeState, StepOption, StepRunner

REPEATS = 20


@dataclass(frozen=True)
class StepChoice:
    """The option fixed for one step, what every option measured (µs), and the options
    that failed to run (label -> error), which the plan never picks."""

    step: int
    option: StepOption
    times_us: dict = field(default_factory=dict)
    failed: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Plan:
    """A per-step plan for one serving shape (batch, beam, dtype, hidden size).

    ``graph_error`` is why the CUDA-graph capture of the shape failed (the shape then
    runs eagerly and is never captured again); ``None`` while it did not fail.
    """

    key: tuple
    steps: tuple
    device: str
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
            rows.append(row)
        return rows


def time_call(fn, device: torch.device, repeats: int = REPEATS) -> float:
    """Median time of ``fn()`` in µs: CUDA-graph replays timed with events, or wall clock."""
    if device.type != "cuda":
        fn()
        samples = []
        for _ in range(max(3, repeats // 4)):
            t0 = time.perf_counter()
            fn()
            samples.append((time.perf_counter() - t0) * 1e6)
        return statistics.median(samples)
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        fn()
        fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        fn()
    for _ in range(3):
        graph.replay()
    samples = []
    for _ in range(repeats):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        end.synchronize()
        samples.append(start.elapsed_time(end) * 1e3)
    return statistics.median(samples)


def record_inputs(engine, hidden_fn, batch: int, options) -> list[tuple]:
    """Real (states, hidden, scores) of every step, from one eager decode with ``options``."""
    probe = ShapeState(engine, batch, options)
    record: list[tuple] = []
    probe.run(hidden_fn, engine.heads.hidden_size, engine.heads.dtype, record=record)
    return record


def make_plan(engine, hidden_fn, batch: int) -> Plan:
    """Time every available option per step for ``batch`` and fix the fastest."""
    options = engine.options_for(batch)
    dev = engine.index.device
    if all(len(o) == 1 for o in options):
        steps = tuple(StepChoice(level, o[0]) for level, o in enumerate(options))
        return Plan(engine.key(batch), steps, str(dev))
    record = record_inputs(engine, hidden_fn, batch, [o[0] for o in options])
    steps = []
    heads = engine.heads
    for level, opts in enumerate(options):
        states, hidden, scores = record[level]
        weight, band_start = heads.band(level)
        times, failed = {}, {}
        for opt in opts:
            runner = StepRunner(engine.index.steps[level], engine.sparse_view(level), weight,
                                band_start, opt, batch, 1 if level == 0 else engine.beam_width,
                                engine.beam_width)
            try:  # an option that cannot compile or run here is reported, never chosen
                times[opt.label] = time_call(lambda: runner(states, hidden, scores), dev)
            except Exception as exc:  # noqa: BLE001
                failed[opt.label] = f"{type(exc).__name__}: {str(exc).splitlines()[0] if str(exc) else ''}"
        if not times:
            raise ZeroGRError(f"step {level + 1}: no option ran ({'; '.join(f'{k}: {v}' for k, v in failed.items())})")
        best = min((o for o in opts if o.label in times), key=lambda o: times[o.label])
        steps.append(StepChoice(level, best, times, failed))
    return Plan(engine.key(batch), tuple(steps), str(dev))
