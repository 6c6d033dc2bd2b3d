"""Every measurement of the project: CUDA-graph capture, timed replays, timed eager calls, a stopwatch.

* :func:`capture` records a function in a CUDA graph after warm-up runs on a side stream
  (which compiles every Triton variant the function launches);
* :func:`time_runs` times calls of a function (a graph's ``replay`` or eager code) with
  CUDA events on a GPU and the wall clock on a CPU, each call starting on an idle device;
  :func:`paired_runs` times several functions so, taking turns call by call;
* :func:`time_graph` captures a function and times its replays, so launch overhead counts
  as it will under whole-decode replay;
* :func:`median_us` is the planner's figure of merit for one option;
* :class:`Stopwatch` is a synchronised wall clock around a block (first decodes, stage
  spans, whole decodes seen by a caller);
* :class:`StageTimer` keeps a stopwatch row per stage of a decode
  (``Decoder.decode(..., timer=)``).
"""
from __future__ import annotations

import contextlib
import statistics
import time
from typing import Callable

import numpy as np
import torch


def synchronize(device) -> None:
    """Wait for the device's queued work (no-op on a CPU)."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def warm_up(fn: Callable[[], object], runs: int = 2) -> None:
    """Run ``fn`` ``runs`` times on a side stream, as CUDA-graph capture wants before it."""
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(runs):
            fn()
    torch.cuda.current_stream().wait_stream(side)


def capture(fn: Callable[[], object], warmup: int = 2, pool=None):
    """Capture ``fn`` in a CUDA graph after ``warmup`` runs on a side stream; ``pool`` (another
    graph's ``pool()``) shares that graph's memory, for graphs never replayed at the same time.

    Returns
    -------
    (torch.cuda.CUDAGraph, object)
        The graph and what ``fn`` returned during capture (static outputs that each replay
        overwrites).
    """
    if warmup:
        warm_up(fn, warmup)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph, pool=pool):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def time_runs(fn: Callable[[], object], device, *, repeats: int, warmup: int,
              before: Callable[[int], None] | None = None) -> list[float]:
    """Time ``repeats`` calls of ``fn`` after ``warmup`` untimed ones; milliseconds each.

    Every call starts on an idle device: ``before(i)`` (e.g. copying a fresh set of hidden
    states into the static inputs) runs first, outside the timed region, then the device
    is synchronised, so host launch overhead counts in eager runs. On CUDA each call is
    bracketed by CUDA events; on a CPU by the wall clock.
    """
    device = torch.device(device)
    samples = []
    for i in range(warmup + repeats):
        elapsed = _timed_call(fn, device, before, i)
        if i >= warmup:
            samples.append(elapsed)
    return samples


def paired_runs(fns: dict, device, *, repeats: int, warmup: int,
                before: Callable[[int], None] | None = None) -> dict:
    """:func:`time_runs` of several functions taking turns call by call, each call on an idle
    device (``before(i)`` first, outside the timed region, for the ``i``-th call of each).

    A ratio of two latencies of a few hundred microseconds moves with the host: a lent machine's
    list-free call drifted by 10 % within a minute (runs/results/constraints/session-2026-12-06c/).
    Calls that alternate see the same drift, so the ratio of their medians measures the code;
    round ``i`` starts with function ``i mod n``, so neither always runs right after the other.

    Parameters
    ----------
    fns : dict of str to callable
    device : torch.device or str
    repeats, warmup : int
        Timed and untimed calls of each function.
    before : callable(int), optional

    Returns
    -------
    dict of str to list of float
        Each function's timed calls, in milliseconds, in the order they ran.
    """
    device = torch.device(device)
    names = list(fns)
    samples: dict = {name: [] for name in names}
    for i in range(warmup + repeats):
        for name in names[i % len(names):] + names[:i % len(names)]:
            elapsed = _timed_call(fns[name], device, before, i)
            if i >= warmup:
                samples[name].append(elapsed)
    return samples


def _timed_call(fn: Callable[[], object], device: torch.device, before, i: int) -> float:
    """Milliseconds of one call of ``fn`` started on an idle device (:func:`time_runs`)."""
    if before is not None:
        before(i)
    synchronize(device)
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        end.synchronize()
        return start.elapsed_time(end)
    t0 = time.perf_counter()
    fn()
    return (time.perf_counter() - t0) * 1e3


def time_graph(fn: Callable[[], object], device, *, repeats: int, warmup: int = 3,
               before: Callable[[int], None] | None = None) -> list[float]:
    """Capture ``fn`` in a CUDA graph and time ``repeats`` replays (ms each) after ``warmup``."""
    graph, _ = capture(fn)
    try:
        return time_runs(graph.replay, device, repeats=repeats, warmup=warmup, before=before)
    finally:
        del graph


def median_us(fn: Callable[[], object], device, repeats: int = 20) -> float:
    """Median time of ``fn()`` in µs: graph replays timed with events on CUDA, else the wall
    clock over ``max(3, repeats // 4)`` calls after one untimed call."""
    device = torch.device(device)
    if device.type == "cuda":
        samples = time_graph(fn, device, repeats=repeats, warmup=3)
    else:
        samples = time_runs(fn, device, repeats=max(3, repeats // 4), warmup=1)
    return statistics.median(samples) * 1e3


def fastest_us(fns: dict, device, rounds: int = 6) -> dict:
    """Least time (µs) of each of several alternatives, timed in interleaved rounds.

    Every function runs once untimed, then ``rounds`` times, the alternatives taking turns
    (each round starting with the next one). On a CPU shared with other work a call can be
    descheduled mid-way: taking turns exposes the alternatives to the same load, and the
    least time of each is the one nothing else interrupted. CUDA: the median of graph replays
    (:func:`median_us`), which other processes do not disturb.

    Parameters
    ----------
    fns : dict of str to callable
    device : torch.device or str
    rounds : int

    Returns
    -------
    dict of str to float
    """
    return {k: min(v) for k, v in interleaved_us(fns, device, rounds).items()}


def interleaved_us(fns: dict, device, rounds: int = 6) -> dict:
    """Every timed call (µs) of each alternative of :func:`fastest_us`, in the order they ran.

    On CUDA one sample per alternative: the median of its graph replays.

    Returns
    -------
    dict of str to list of float
    """
    device = torch.device(device)
    if device.type == "cuda":
        return {k: [median_us(fn, device, 4 * rounds)] for k, fn in fns.items()}
    names = list(fns)
    samples: dict = {name: [] for name in names}
    for fn in fns.values():
        fn()
    for r in range(rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            t0 = time.perf_counter()
            fns[name]()
            samples[name].append((time.perf_counter() - t0) * 1e6)
    return samples


def time_step(fn: Callable[[], object], device, repeats: int, *, graph: bool) -> dict:
    """Median, p10 and p90 µs of one step function: graph replays (CUDA) or eager calls."""
    device = torch.device(device)
    if graph and device.type == "cuda":
        samples = time_graph(fn, device, repeats=repeats, warmup=3)
    else:
        samples = time_runs(fn, device, repeats=repeats, warmup=2)
    stats = summarize(samples)
    return dict(median_us=stats["median_ms"] * 1e3, p10_us=stats["p10_ms"] * 1e3, p90_us=stats["p90_ms"] * 1e3,
                n=stats["n"])


def summarize(samples_ms) -> dict:
    """Median, p10, p90, p99, p99.9, mean, min and max (ms) of the samples, and their count."""
    arr = np.asarray(list(samples_ms), dtype=np.float64)
    if arr.size == 0:
        return dict(n=0)
    q = np.percentile(arr, [10, 50, 90, 99, 99.9])
    return dict(median_ms=float(q[1]), p10_ms=float(q[0]), p90_ms=float(q[2]), p99_ms=float(q[3]),
                p999_ms=float(q[4]),
                mean_ms=float(arr.mean()), min_ms=float(arr.min()), max_ms=float(arr.max()), n=int(arr.size))


class Stopwatch:
    """Wall-clock milliseconds of a ``with`` block, the device synchronised at both ends.

    ``with Stopwatch(device) as sw: ...`` then ``sw.ms`` (also ``sw.seconds``). The
    synchronisation makes queued GPU work count inside the block and not after it.
    """

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.ms: float | None = None

    def __enter__(self) -> "Stopwatch":
        synchronize(self.device)
        self._t0 = time.perf_counter()
        return self

    def __exit__(self, *exc) -> bool:
        synchronize(self.device)
        self.ms = (time.perf_counter() - self._t0) * 1e3
        return False

    @property
    def seconds(self) -> float | None:
        return None if self.ms is None else self.ms / 1e3


class StageTimer:
    """A decode timer (``timer(step, stage)``, see :mod:`zerogr_core.decode.ops`) that keeps a row per span.

    Each span is a :class:`Stopwatch`, so on a GPU the device is synchronised around every
    stage: the rows are an eager profile, not the latency of an uninterrupted decode.

    Attributes
    ----------
    rows : list of dict
        ``step`` (1-based), ``stage``, ``ms``, in the order the spans ran.
    """

    def __init__(self, device="cpu"):
        self.device = torch.device(device)
        self.rows: list[dict] = []

    @contextlib.contextmanager
    def __call__(self, step: int, stage: str):
        with Stopwatch(self.device) as watch:
            yield
        self.rows.append(dict(step=step + 1, stage=stage, ms=watch.ms))

    @property
    def total_ms(self) -> float:
        """The sum of every span (ms)."""
        return sum(r["ms"] for r in self.rows)
