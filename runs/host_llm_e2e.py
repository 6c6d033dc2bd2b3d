"""Where the host's share of a Qwen3 recommender call goes (1,000 × 1 by default), on a GPU.

Builds the LLM bench's workload (``zerogr_core.bench.llm``: the Qwen3-1.7B shape with random
weights, the 10^7-item catalog), then for the filter-first serving with the prefill inside the
graph: the end-to-end call as the bench times it, the staging alone (synchronised wall clock),
and a cProfile of 20 calls (the host functions by own time).

    python runs/host_llm_e2e.py [CONTEXTxBATCH]
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
    walls = []
    for i in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run.step_model.stage(sets[i % 3], beam_width=cfg.beam)
        torch.cuda.synchronize()
        walls.append((time.perf_counter() - t0) * 1e6)
    print(f"stage alone: {statistics.median(walls):.1f} µs (median wall, synchronised)")
    walls = []
    for i in range(20):
        torch.cuda.synchronize()
        t0 = time.perf_counter()
        run.decoder.decode(run.step_model, batch)
        t1 = time.perf_counter()
        torch.cuda.synchronize()
        walls.append((t1 - t0) * 1e3)
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
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
