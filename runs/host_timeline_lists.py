"""Host and device timeline of a constrained engine decode (prebuilt lists) against an
unconstrained one, at batch 1 and 32 on the constraints suite's search-like catalog.

    python runs/host_timeline_lists.py [SCALE]     (on a GPU, from the repository root)

For each condition (no lists, deny 0 rows, deny 100 rows per request) prints the median wall
time of ``GpuEngine.decode`` synchronised after each call, the captured graph's ``replay()``
alone (wall, and back to back on the GPU), then the torch.profiler timeline of the last
call: host runtime calls (``cudaGraphLaunch``, ``cudaMemcpyAsync``, event calls) and device
kernels, in microseconds from the first event shown.
"""
import statistics
import sys
import time

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from zerogr_core.bench.live import _random_lists
from zerogr_core.bench.methods import ReplayModel
from zerogr_core.bench.workload import CatalogSpec, Workload


def wall_us(fn, calls: int = 50, warmup: int = 0) -> float:
    """Median wall time of ``fn`` in microseconds, the device synchronised after each call."""
    for _ in range(warmup):
        fn()
        torch.cuda.synchronize()
    times = []
    for _ in range(calls):
        t = time.perf_counter()
        fn()
        torch.cuda.synchronize()
        times.append((time.perf_counter() - t) * 1e6)
    return statistics.median(times)


def deny_setup(wl, batch: int, per_request: int = 100):
    """``(ctx, engine, decoder, model, ids, lists)`` of the scripts here: the suite's engine for
    ``batch`` (FP16, H 1,024, beam 128), a public-API decoder over it, and ``per_request``
    random catalog ids per request with their prebuilt lists."""
    from zerogr_core.decode.decoder import Decoder

    ctx = wl.context("fp16", 1024, 128, batch, n_sets=1)
    dec = Decoder(wl.index, beam_width=128, catalog=wl.catalog, **wl.decoder_heads(ctx.heads))
    dec.gpu_engine = ctx.engine
    rng = np.random.default_rng(0)
    cat = wl.catalog
    ids = [cat.item_ids[rng.integers(0, cat.n_items, per_request)] for _ in range(batch)]
    return ctx, ctx.engine, dec, ReplayModel(ctx.sets, batch), ids, dec.request_lists(batch, deny_items=ids)


def main() -> None:
    scale = int(sys.argv[1]) if len(sys.argv) > 1 else 20_000_000
    wl = Workload(CatalogSpec("search-like", scale, 0, None), torch.device("cuda"))
    for batch in (1, 32):
        ctx = wl.context("fp16", 1024, 128, batch, n_sets=1)
        engine, rng = ctx.engine, np.random.default_rng(0)
        for kind, count in (("none", 0), ("deny", 0), ("deny", 100)):
            model = ReplayModel(ctx.sets, batch)
            lists = None if kind == "none" else _random_lists(wl.catalog.n_items, batch, kind, count, rng)

            def call():
                engine.decode(model, batch, lists=lists)
            for _ in range(5):
                call()
            print(f"batch {batch} {kind}:{count}: wall median {wall_us(call):.1f} us", flush=True)
            key = engine.key(batch) + (("lists", lists.normalise) if lists is not None else ())
            graph = engine._shapes[key].graph
            if graph is not None:
                start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
                start.record()
                for _ in range(20):
                    graph.replay()
                end.record()
                torch.cuda.synchronize()
                print(f"    replay alone: wall {wall_us(graph.replay):.1f} us, back-to-back GPU "
                      f"{start.elapsed_time(end) / 20 * 1e3:.1f} us", flush=True)
            with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
                for _ in range(3):
                    call()
                    torch.cuda.synchronize()
            events = sorted(prof.events(), key=lambda e: e.time_range.start)[-160:]
            t0 = events[0].time_range.start
            for e in events:
                dur = e.time_range.end - e.time_range.start
                gpu = e.device_type == torch.autograd.DeviceType.CUDA
                if gpu or dur >= 2 or e.name.startswith("cuda"):
                    print(f"      {'GPU' if gpu else 'cpu'} {e.time_range.start - t0:9.1f} +{dur:7.1f} {e.name[:70]}")
        ctx.release()


if __name__ == "__main__":
    main()
