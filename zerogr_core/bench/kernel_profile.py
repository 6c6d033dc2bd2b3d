"""Kernel tables from ``torch.profiler`` events of repeated, identical decodes (graph replays or
eager calls), for ``python -m zerogr_core.bench.profile_decode`` and ``python -m zerogr_core.bench.profile_e2e``."""
from __future__ import annotations

import statistics
from collections import defaultdict


def union_us(intervals) -> float:
    """Length of the union of ``(start, end)`` intervals (µs)."""
    total, end = 0.0, float("-inf")
    for s, e in sorted(intervals):
        if e <= end:
            continue
        total += e - max(s, end)
        end = e
    return total


def idle_stretches(events) -> list[dict]:
    """Where the GPU sat idle between ``events`` (GPU events sorted by start): one entry per
    stretch with no event running, longest first: ``us``, and the names of the event that ended
    last before it (``after``) and the one that starts it (``before``)."""
    out, end, last = [], float("-inf"), None
    for ev in events:
        if last is not None and ev.time_range.start > end:
            out.append(dict(us=round(ev.time_range.start - end, 1), after=last.name[:80], before=ev.name[:80]))
        if ev.time_range.end > end:
            end, last = ev.time_range.end, ev
    return sorted(out, key=lambda g: -g["us"])


def kernel_table(events, reps: int, top: int) -> dict:
    """Per-decode figures of the GPU events of ``reps`` identical decodes.

    Parameters
    ----------
    events : sequence of torch.autograd.profiler_util.FunctionEvent
        ``prof.events()`` of a profile around the ``reps`` decodes (only GPU events count:
        kernels and memsets).
    reps : int
        Decodes profiled.
    top : int
        Kernel names kept, largest total first.

    Returns
    -------
    dict
        ``kernels_per_decode``, ``kernel_us_sum`` (summed kernel time per decode), ``busy_us``
        (time at least one kernel ran: with programmatic dependent launch neighbours overlap,
        and a kernel's time includes its wait for the one before), ``span_us`` (first start
        to last end), ``gap_us`` (``span - busy``: launch latency and waits between kernels;
        medians over the decodes), ``widest_gaps`` (the first decode's five longest idle
        stretches: µs, and the kernels before and after) and ``kernels`` (name, µs and calls
        per decode). When the events do not split into ``reps`` equal decodes, only
        ``kernels_per_decode`` and ``note``.
    """
    gpu = sorted((ev for ev in events if ev.device_type.name == "CUDA"), key=lambda ev: ev.time_range.start)
    if not gpu or len(gpu) % reps:
        return dict(kernels_per_decode=len(gpu) / reps, note="events do not split into equal decodes")
    n = len(gpu) // reps
    spans, busy = [], []
    for r in range(reps):
        chunk = [(ev.time_range.start, ev.time_range.end) for ev in gpu[r * n:(r + 1) * n]]
        spans.append(max(e for _, e in chunk) - min(s for s, _ in chunk))
        busy.append(union_us(chunk))
    widest = idle_stretches(gpu[:n])[:5]
    total, count = defaultdict(float), defaultdict(int)
    for ev in gpu:
        total[ev.name] += ev.device_time / reps
        count[ev.name] += 1
    return dict(kernels_per_decode=n, kernel_us_sum=round(sum(total.values()), 1),
                busy_us=round(statistics.median(busy), 1), span_us=round(statistics.median(spans), 1),
                gap_us=round(statistics.median(s - b for s, b in zip(spans, busy)), 1), widest_gaps=widest,
                kernels=[dict(name=k[:160], us=round(total[k], 1), calls=count[k] / reps)
                         for k in sorted(total, key=total.get, reverse=True)[:top]])
