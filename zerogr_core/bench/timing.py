"""Timing primitives: CUDA-event timed runs (wall clock on a CPU), graph capture, statistics."""
from __future__ import annotations

import statistics
import time
from typing import Callable

import numpy as np
import torch


def summarize(samples_ms) -> dict:
    """Median, p10, p90, p99, p99.9, mean, min and max (ms) of the samples, and their count."""
    arr = np.asarray(list(samples_ms), dtype=np.float64)
    if arr.size == 0:
        return dict(n=0)
    q = np.percentile(arr, [10, 50, 90, 99, 99.9])
    return dict(median_ms=float(q[1]), p10_ms=float(q[0]), p90_ms=float(q[2]), p99_ms=float(q[3]),
                p999_ms=float(q[4]),
                mean_ms=float(arr.mean()), min_ms=float(arr.min()), max_ms=float(arr.max()), n=int(arr.size))


def synchronize(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def time_runs(fn: Callable[[], object], device: torch.device, *, repeats: int, warmup: int,
              before: Callable[[int], None] | None = None) -> list[float]:
    """Time ``repeats`` calls of ``fn`` after ``warmup`` untimed ones; milliseconds each.

    Every call starts on an idle device: ``before(i)`` (e.g. copying a fresh set of hidden
    states into the static inputs) runs first, outside the timed region, then the device
    is synchronised, so host launch overhead counts in eager runs. On CUDA each call is
    bracketed by CUDA events; on a CPU by the wall clock.
    """
    samples = []
    for i in range(warmup + repeats):
        if before is not None:
            before(i)
        synchronize(device)
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            fn()
            end.record()
            end.synchronize()
            elapsed = start.elapsed_time(end)
        else:
            t0 = time.perf_counter()
            fn()
            elapsed = (time.perf_counter() - t0) * 1e3
        if i >= warmup:
            samples.append(elapsed)
    return samples


def capture(fn: Callable[[], object], warmup: int = 2):
    """Capture ``fn`` in a CUDA graph after ``warmup`` runs on a side stream.

    Returns
    -------
    (torch.cuda.CUDAGraph, object)
        The graph and what ``fn`` returned during capture (static outputs that each replay
        overwrites).
    """
    side = torch.cuda.Stream()
    side.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(side):
        for _ in range(warmup):
            fn()
    torch.cuda.current_stream().wait_stream(side)
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = fn()
    torch.cuda.synchronize()
    return graph, out


def time_step(fn: Callable[[], object], device: torch.device, repeats: int, *, graph: bool) -> dict:
    """Median µs of one step function: graph replays (CUDA) or eager calls."""
    if graph and device.type == "cuda":
        g, _ = capture(fn)
        samples = time_runs(g.replay, device, repeats=repeats, warmup=3)
        del g
    else:
        samples = time_runs(fn, device, repeats=repeats, warmup=2)
    stats = summarize(samples)
    return dict(median_us=stats["median_ms"] * 1e3, p10_us=stats["p10_ms"] * 1e3, p90_us=stats["p90_ms"] * 1e3,
                n=stats["n"])


def median(values) -> float:
    return float(statistics.median(values))
