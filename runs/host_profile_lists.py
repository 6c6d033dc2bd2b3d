"""Where the host time of a constrained public-API decode goes: ``Decoder.decode(..., deny_items=)``
(or ``allow_items=``) against the same decoder without lists, on the constraints suite's
search-like catalog (smaller scale: the host work of a deny list does not grow with the catalog).

    python runs/host_profile_lists.py --scale 1000000 --batch 1 --deny 100 [--calls 300]
    python runs/host_profile_lists.py --scale 20000000 --batch 32 --allow-share 0.01 --calls 20 --kernels

(from the repository root, with the package installed by ``make install``, or ``PYTHONPATH=.``).

Prints the median wall time of each condition (synchronised after every call) and, for the
lists, the cProfile table of the calls (cumulative time per function), so the host cost of
building, staging and launching can be read apart from the GPU's. ``--kernels`` adds the device
time of one call's kernels and copies (torch.profiler).
"""
from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import statistics
import time


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--scale", type=int, default=1_000_000)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--deny", type=int, default=100, help="ids denied per request")
    p.add_argument("--allow-share", type=float, default=0.0,
                   help="allow this share of the catalog per request (ids as numpy arrays) instead of denying")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--kernels", action="store_true", help="the device time of one call, per kernel")
    p.add_argument("--top", type=int, default=30)
    args = p.parse_args()

    import numpy as np
    import torch

    from zerogr_core.bench.methods import ReplayModel
    from zerogr_core.bench.workload import CatalogSpec, Workload
    from zerogr_core.decode.decoder import Decoder

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    wl = Workload(CatalogSpec("search-like", args.scale, 0, None), device)
    ctx = wl.context("fp16", 1024, 128, args.batch, 1)
    dec = Decoder(wl.index, beam_width=128, catalog=wl.catalog, **wl.decoder_heads(ctx.heads))
    if dec.gpu_engine is not None:
        dec.gpu_engine = ctx.engine
    model = ReplayModel(ctx.sets, args.batch)
    rng = np.random.default_rng(0)
    cat = wl.catalog
    if args.allow_share > 0:
        n = max(1, int(args.allow_share * cat.n_items))
        ids = [cat.item_ids[rng.choice(cat.n_items, n, replace=False)] for _ in range(args.batch)]
        condition = (f"allow {n}", {"allow_items": ids})
    else:
        ids = [cat.item_ids[rng.integers(0, cat.n_items, args.deny)] for _ in range(args.batch)]
        condition = (f"deny {args.deny}", {"deny_items": ids})
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)

    def call(kwargs):
        dec.decode(model, args.batch, **kwargs)
        sync()

    for label, kwargs in (("none", {}), condition):
        for _ in range(5):
            call(kwargs)
        times = []
        for _ in range(args.calls):
            t = time.perf_counter()
            call(kwargs)
            times.append(time.perf_counter() - t)
        print(f"{label}: median {statistics.median(times) * 1e6:.1f} us over {args.calls} calls", flush=True)
        prof = cProfile.Profile()
        prof.enable()
        for _ in range(args.calls):
            call(kwargs)
        prof.disable()
        out = io.StringIO()
        pstats.Stats(prof, stream=out).sort_stats("cumulative").print_stats(args.top)
        print(out.getvalue(), flush=True)
        if args.kernels and device.type == "cuda":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                    torch.profiler.ProfilerActivity.CPU]) as prof:
                call(kwargs)
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top), flush=True)
    if device.type == "cuda" and args.allow_share == 0:
        _replay_times(dec, args, ids, sync)


def _replay_times(dec, args, ids, sync) -> None:
    """Host time of each captured graph's ``replay()`` alone (synchronised between calls, not
    timed), and of the constrained one right after its lists' copy."""
    import statistics
    import time

    from zerogr_core.decode.list_buffers import load_lists

    lists = dec.request_lists(args.batch, None, ids)
    for key, shape in dec.gpu_engine._shapes.items():
        if shape.graph is None:
            continue
        for after_copy in ((False, True) if shape.capacity else (False,)):
            times = []
            for _ in range(args.calls):
                if after_copy:
                    load_lists(shape.lists, lists)
                t = time.perf_counter()
                shape.graph.replay()
                times.append(time.perf_counter() - t)
                sync()
            print(f"graph {key}: replay() host {statistics.median(times) * 1e6:.1f} us"
                  + (" right after the lists' copy" if after_copy else ""), flush=True)


if __name__ == "__main__":
    main()
