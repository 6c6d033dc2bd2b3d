"""Where a Qwen3 recommender call's time goes outside its kernels: the host's work before the
first graph, the partial last step's mid-decode read, and the results' read back.

    python runs/probe_llm_host_gaps.py [SHAPES] [REPEATS]     (on a GPU; SHAPES like 1000x1,1000x8)

The LLM benchmark's workload (Qwen3-1.7B shape, random bf16 weights, the 10^7-item catalog, beam
256, filtering first, prefill inside the graph). Per shape, these calls take turns
(:func:`zerogr_core.timing.paired_runs`: CUDA events around each, each on an idle device, medians):

* ``e2e``: ``run.decode(ids)`` and the item ids mapped on the host (``Catalog.ids_of_rows`` of the
  rows read back);
* ``rows``: ``run.decode(ids).item_rows.cpu()`` (no id mapping);
* ``e2e-gpu-ids``: what the benchmark times, ``run.decode(ids).item_ids(catalog)``: the rows mapped
  to ids on the GPU (:mod:`zerogr_core.decode.item_table`), so the host never reads the 80 MB id table;
* ``e2e-small-table``: ``e2e`` with the host's gather reading a 512 KB table instead (the same numpy
  work on memory that stays in cache): whether the mapping's cost is the table's cache misses;
* ``e2e-check-first``: ``e2e`` with the inputs' range check read before the prefill (the GPU idle
  while the host waits for a device reduction), where ``qwen3.defers_range`` reads it after the launch;
* ``stage``: the model's ``stage`` alone (the inputs' check and copy into the static buffers);
* ``graphs+read``: the captured graphs alone on the staged inputs, with the host's read of the
  last step's row count between them, as a call runs them;
* ``graphs``: the same two graphs back to back, the count of the previous call reused (no read);
* ``first`` / ``last``: each graph alone.

Then one call's timeline: host clock and device events at each boundary (ms from the call's
start), so the device's idle stretches show where they are.
"""
import itertools
import statistics
import sys
import time

import numpy as np
import torch

from zerogr_core.bench.llm import LLM_PRESETS, Workload
from zerogr_core.decode.loop import partial_rows
from zerogr_core.models import qwen3
from zerogr_core.models.protocol import right_padded
from zerogr_core.timing import paired_runs



def host_us(fn, n=200):
    """Median host microseconds of ``fn`` (each call synchronised after)."""
    out = []
    for _ in range(n):
        torch.cuda.synchronize()
        t = time.perf_counter()
        fn()
        out.append((time.perf_counter() - t) * 1e6)
    return statistics.median(out)


def _partial(run):
    shapes = [s for s in run.decoder.gpu_engine._shapes.values() if s.partial is not None]
    return shapes[0].partial if shapes else None


def timeline(run, ids, beam):
    """Host times and device event times (ms after the call's first event) of one call."""
    p = _partial(run)
    ev = {k: torch.cuda.Event(enable_timing=True) for k in ("start", "staged", "first", "read", "last", "done")}
    host = {}
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    ev["start"].record()
    run.step_model.stage(ids, beam_width=beam)
    host["staged"] = time.perf_counter()
    ev["staged"].record()
    p.first.replay()
    host["first launched"] = time.perf_counter()
    ev["first"].record()
    p.ready.record()
    p.ready.synchronize()
    host["count read"] = time.perf_counter()
    rows = partial_rows(int(p.most), run.decoder.beam_width)
    ev["read"].record()
    graph, out = p.graphs[rows]
    graph.replay()
    host["last launched"] = time.perf_counter()
    ev["last"].record()
    items = out[2].clone().cpu()
    host["rows read"] = time.perf_counter()
    ev["done"].record()
    torch.cuda.synchronize()
    dev = {k: ev["start"].elapsed_time(e) for k, e in ev.items()}
    return {k: (v - t0) * 1e3 for k, v in host.items()}, dev, rows, items


def main() -> None:
    shapes = [tuple(int(v) for v in s.split("x")) for s in (sys.argv[1] if len(sys.argv) > 1 else "1000x1,1000x8").split(",")]
    repeats = int(sys.argv[2]) if len(sys.argv) > 2 else 30
    cfg = LLM_PRESETS["h200"]
    w = Workload(cfg, lambda m: print(m, flush=True))
    print(f"{torch.cuda.get_device_name()}, torch {torch.__version__}", flush=True)
    for context, batch in shapes:
        sets = [w.inputs(batch, context, 1000 * batch + context + i) for i in range(cfg.rotations)]
        run = w.serving("filter-first", "auto", cfg.beam)
        for x in sets:  # captures every row count these inputs reach
            run.decode(x).item_rows.cpu()
        p = _partial(run)
        sm = run.step_model
        cur = {"i": 0, "rows": None}

        def before(i):
            cur["i"] = i % len(sets)

        def e2e():
            w.catalog.ids_of_rows(run.decode(sets[cur["i"]]).item_rows.cpu().numpy())

        def e2e_check_first():
            deferred, qwen3.defers_range = qwen3.defers_range, lambda history, device: False
            try:
                e2e()
            finally:
                qwen3.defers_range = deferred

        small = np.arange(1 << 16, dtype=np.int64)

        def e2e_gpu_ids():
            run.decode(sets[cur["i"]]).item_ids(w.catalog)

        def e2e_small_table():
            r = run.decode(sets[cur["i"]]).item_rows.cpu().numpy()
            np.where(r >= 0, small[np.clip(r, 0, None) % small.size], -1)

        def rows():
            run.decode(sets[cur["i"]]).item_rows.cpu()

        def stage():
            sm.stage(sets[cur["i"]], beam_width=cfg.beam)

        def graphs_read():
            p.replay()

        def graphs():
            p.first.replay()
            p.graphs[cur["rows"]][0].replay()

        def first():
            p.first.replay()

        def last():
            p.graphs[cur["rows"]][0].replay()

        fns = {"e2e": e2e, "e2e-gpu-ids": e2e_gpu_ids, "e2e-small-table": e2e_small_table,
               "e2e-check-first": e2e_check_first, "rows": rows, "stage": stage}
        if p is not None:
            cur["rows"] = next(r for r, g in p.graphs.items() if g is not None)
            fns.update({"graphs+read": graphs_read, "graphs": graphs, "first": first, "last": last})
        got = paired_runs(fns, w.device, repeats=repeats, warmup=3, before=before)
        med = {k: statistics.median(v) for k, v in got.items()}
        print(f"{context}x{batch}: " + ", ".join(f"{k} {v:.3f} ms" for k, v in med.items()), flush=True)
        res = run.decode(sets[0])
        rows_np = res.item_rows.cpu().numpy()
        lone = torch.cuda.Event()
        step = itertools.count(1)
        unchecked_us = host_us(lambda: right_padded(sets[0], None, sm.vocab, w.device, check_range=False))
        print(f"{context}x{batch} host µs: ids_of_rows {host_us(lambda: w.catalog.ids_of_rows(rows_np)):.1f}, "
              f"ids_of_rows of other rows each call {host_us(lambda: w.catalog.ids_of_rows((np.abs(rows_np) + 7919 * next(step)) % w.catalog.n_items)):.1f}, "
              f"item_rows.cpu() {host_us(lambda: res.item_rows.cpu()):.1f}, "
              f"right_padded checked {host_us(lambda: right_padded(sets[0], None, sm.vocab, w.device)):.1f}, "
              f"unchecked {unchecked_us:.1f}, "
              f"stage {host_us(lambda: sm.stage(sets[0], beam_width=cfg.beam)):.1f}, "
              f"an event's record and wait {host_us(lambda: (lone.record(), lone.synchronize())):.1f}"
              + (f", first graph's launch {host_us(p.first.replay, 20):.1f}" if p is not None else ""), flush=True)
        if p is not None:
            spun, plain = [], []
            for k in range(20):
                a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                torch.cuda.synchronize()
                if k % 2:
                    torch.cuda._sleep(2_000_000)  # the GPU busy while the host launches the graph
                a.record()
                p.first.replay()
                b.record()
                b.synchronize()
                (spun if k % 2 else plain).append(a.elapsed_time(b))
            print(f"{context}x{batch}: first graph from an idle GPU {statistics.median(plain):.3f} ms, launched "
                  f"behind a spin {statistics.median(spun):.3f} ms (the launch's exposed latency: the difference)",
                  flush=True)
            print(f"{context}x{batch}: the mid-decode read costs {med['graphs+read'] - med['graphs']:.3f} ms; "
                  f"outside the graphs the call spends {med['e2e'] - med['graphs+read']:.3f} ms "
                  f"(stage alone {med['stage']:.3f}, id mapping {med['e2e'] - med['rows']:.3f}); "
                  f"last step's rows per request {sorted(k for k, g in p.graphs.items() if g is not None)}", flush=True)
            for k in range(3):
                host, dev, n, _ = timeline(run, sets[k % len(sets)], cfg.beam)
                print(f"{context}x{batch} timeline {k} ({n} rows): host " +
                      ", ".join(f"{a} {b:.3f}" for a, b in host.items()) + " | device " +
                      ", ".join(f"{a} {b:.3f}" for a, b in dev.items()), flush=True)
        del run, sm, p
        torch.cuda.empty_cache()


if __name__ == "__main__":
    main()
