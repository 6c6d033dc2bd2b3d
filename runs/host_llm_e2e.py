"""Where the host's share of a Qwen3 recommender call goes (1,000 × 1 by default), on a GPU.

Builds the LLM bench's workload (``zerogr_core.bench.llm``: the Qwen3-1.7B shape with random
weights, the 10^7-item catalog), then for the filter-first serving with the prefill inside the
graph: the end-to-end call as the bench times it, the staging alone (synchronised wall clock),
and a cProfile of 20 calls (the host functions by own time).

    python runs/host_llm_e2e.py [CONTEXTxBATCH] [TRACE.json.gz]

With a TRACE path, one more call runs under ``torch.profiler`` (host and GPU activity) and its
Chrome trace is written there: when each host call (staging, the graph's launch, the copy of the
results) ran against the GPU's kernels.
"""
from __future__ import annotations

import cProfile
import io
import pstats
import statistics
import sys
import time

import torch

from zerogr_core.bench.llm import LLM_PRESETS, Workload
from zerogr_core.timing import time_runs


def synced_walls(fn, n: int = 20, synchronise_after: bool = True) -> list[float]:
    """Wall-clock milliseconds of ``fn(i)`` for i < n, each started on an idle GPU; the clock stops
    after a synchronisation, or as soon as ``fn`` returns (the host's share alone)."""
    walls = []
    for i in range(n):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        fn(i)
        if synchronise_after:
            torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e3)
        torch.cuda.synchronize()
    return walls


def main(argv) -> int:
    context, batch = (int(v) for v in (argv[1] if len(argv) > 1 else "1000x1").split("x"))
    cfg = LLM_PRESETS["h200"]
    w = Workload(cfg, print)
    dev = w.device
    sets = [w.inputs(batch, context, 7 + r) for r in range(3)]
    run = w.serving("filter-first", "auto", cfg.beam)

    def e2e(i=0):
        r = run.decode(sets[i % 3])
        return w.catalog.ids_of_rows(r.item_rows.cpu().numpy())

    ms = time_runs(e2e, dev, repeats=20, warmup=5)
    print(f"{context}x{batch}: end to end {statistics.median(ms):.3f} ms (median of 20)")
    # the same ids from host memory, as a server holds a request's tokens: no device reduction to validate them
    host_sets = [s.cpu() for s in sets]

    def e2e_host(i=0):
        r = run.decode(host_sets[i % 3])
        return w.catalog.ids_of_rows(r.item_rows.cpu().numpy())

    for label, fn in (("inputs on the host", e2e_host), ("inputs on the device", e2e)):
        ms = time_runs(fn, dev, repeats=20, warmup=5)
        print(f"{context}x{batch}: end to end, {label}: {statistics.median(ms):.3f} ms (median of 20)")
    for label, src in (("host", host_sets), ("device", sets)):
        walls = synced_walls(lambda i: run.step_model.stage(src[i % 3], beam_width=cfg.beam))
        print(f"stage alone, inputs on the {label}: {statistics.median(walls) * 1e3:.1f} µs (median wall, synchronised)")
    walls = synced_walls(lambda i: run.step_model.stage(sets[i % 3], beam_width=cfg.beam))
    print(f"stage alone: {statistics.median(walls) * 1e3:.1f} µs (median wall, synchronised)")
    walls = synced_walls(lambda i: run.decoder.decode(run.step_model, batch), synchronise_after=False)
    print(f"decoder.decode (staged, prefill inside): {statistics.median(walls):.3f} ms wall")
    prof = cProfile.Profile()
    for i in range(20):
        torch.cuda.synchronize()
        prof.enable()
        e2e(i)
        prof.disable()
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("tottime").print_stats(30)
    print(s.getvalue())
    s = io.StringIO()
    pstats.Stats(prof, stream=s).sort_stats("cumulative").print_stats(40)
    print(s.getvalue())
    if len(argv) > 2:
        from torch.profiler import ProfilerActivity, profile

        e2e(0)
        torch.cuda.synchronize()
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            e2e(1)
            torch.cuda.synchronize()
        prof.export_chrome_trace(argv[2])
        print(f"trace of one call: {argv[2]}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
