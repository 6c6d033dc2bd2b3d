"""Where the host time of a constrained public-API decode goes: ``Decoder.decode(..., deny_items=)``
(or ``allow_items=``) against the same decoder without lists, on the constraints suite's
search-like catalog (smaller scale: the host work of a deny list does not grow with the catalog).

    python runs/host_profile_lists.py --scale 1000000 --batch 1 --deny 100 [--calls 300]
    python runs/host_profile_lists.py --scale 20000000 --batch 32 --allow-share 0.01 --calls 20 --kernels

(from the repository root, with the package installed by ``make install``, or ``PYTHONPATH=.``).

Prints the median wall time of each condition (synchronised after every call) and, for the
lists, the cProfile table of the calls (cumulative time per function), so the host cost of
building, staging and launching can be read apart from the GPU's. ``--kernels`` adds the device
time of one call's kernels and copies (torch.profiler); ``--timeline`` when a call returns to the
host, and one call's runtime calls and device work in order, from its start; ``--queued N`` the
time per call of N calls issued back to back:

    python runs/host_profile_lists.py --scale 20000000 --batch 1 --deny 10000 --calls 100 --timeline

``--ids-in pinned`` (or ``device``) hands the decoder each request's ids as a pinned host tensor (or a
tensor on the GPU), as a caller that receives its requests into such buffers would:

    python runs/host_profile_lists.py --scale 20000000 --batch 32 --allow-share 0.01 --calls 20 --ids-in pinned
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
    p.add_argument("--ids-in", choices=("numpy", "pinned", "device"), default="numpy",
                   help="where the caller keeps each request's ids: numpy arrays (pageable), pinned host tensors "
                        "(they cross without being gathered first), or tensors already on the device")
    p.add_argument("--calls", type=int, default=300)
    p.add_argument("--kernels", action="store_true", help="the device time of one call, per kernel")
    p.add_argument("--top", type=int, default=30)
    p.add_argument("--queued", type=int, default=0,
                   help="also time this many calls queued back to back (no synchronisation between them)")
    p.add_argument("--timeline", action="store_true",
                   help="the host's return time of a call, and one call's host and device events in order")
    args = p.parse_args()

    import numpy as np
    import torch

    from zerogr_core.bench.methods import ReplayModel
    from zerogr_core.bench.workload import CatalogSpec, Workload
    from zerogr_core.decode.decoder import Decoder

    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    if args.ids_in != "numpy" and device.type != "cuda":
        raise SystemExit(f"error: --ids-in {args.ids_in} needs a CUDA device")
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
    if args.ids_in != "numpy":
        held = [torch.from_numpy(a) for a in ids]
        held = [t.pin_memory() for t in held] if args.ids_in == "pinned" else [t.to(device) for t in held]
        key = next(iter(condition[1]))
        condition = (f"{condition[0]} ({args.ids_in} tensors)", {key: held})
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
        if args.queued:
            _queued(lambda: dec.decode(model, args.batch, **kwargs), args.queued, sync)
        if args.timeline and device.type == "cuda":
            try:
                _timeline(lambda: dec.decode(model, args.batch, **kwargs), args.calls)
            except Exception as exc:  # a profiler of another version: the rest of the run still counts
                print(f"  timeline failed: {type(exc).__name__}: {exc}", flush=True)
        if args.kernels and device.type == "cuda":
            with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA,
                                                    torch.profiler.ProfilerActivity.CPU]) as prof:
                call(kwargs)
            print(prof.key_averages().table(sort_by="self_device_time_total", row_limit=args.top), flush=True)
    if device.type == "cuda" and args.allow_share == 0:
        _replay_times(dec, args, ids, sync)
        if args.timeline:
            _split_call(dec, model, args, ids, sync)


def _queued(decode, n: int, sync) -> None:
    """Per call, ``n`` calls queued back to back as a serving loop issues them (the device
    synchronised before and after each batch of calls only); median of 20 such batches."""
    times = []
    for _ in range(20):
        sync()
        t = time.perf_counter()
        for _ in range(n):
            decode()
        sync()
        times.append((time.perf_counter() - t) / n)
    print(f"  queued: {statistics.median(times) * 1e6:.1f} us per call ({n} calls back to back)", flush=True)


def _timeline(decode, calls: int) -> None:
    """When ``decode()`` returns to the host (median, the device synchronised after each call,
    not timed), then one call's runtime calls and device work, in microseconds from its start."""
    import torch

    times = []
    for _ in range(calls):
        t = time.perf_counter()
        decode()
        times.append(time.perf_counter() - t)
        torch.cuda.synchronize()
    print(f"  decode() returns after {statistics.median(times) * 1e6:.1f} us (median)", flush=True)
    acts = [torch.profiler.ProfilerActivity.CPU, torch.profiler.ProfilerActivity.CUDA]
    with torch.profiler.profile(activities=acts) as prof:
        with torch.profiler.record_function("call"):
            decode()
            torch.cuda.synchronize()
    events = [e for e in prof.events() if e.time_range.end > e.time_range.start]
    t0 = min(e.time_range.start for e in events if e.name == "call")
    for e in sorted(events, key=lambda e: e.time_range.start):
        device = e.device_type == torch.autograd.DeviceType.CUDA
        if device or e.name.startswith("cuda"):
            where = "device" if device else "host  "
            print(f"  {where} {e.time_range.start - t0:8.1f} +{e.time_range.end - e.time_range.start:6.1f} us  {e.name[:70]}")


def _split_call(dec, model, args, ids, sync) -> None:
    """The engine's part of a deny-ids call cut at each host step (median µs of each, the
    device synchronised after every call): the lists, the shape and their staging, the graph's
    launch, the launched mark and the outputs' clones."""
    engine = dec.gpu_engine
    for listed in (False, True):
        _cut(engine, model, args, ids, sync, dec if listed else None)


def _cut(engine, model, args, ids, sync, dec) -> None:
    marks = ("lists", "stage", "replay", "launched", "clones")
    times = {m: [] for m in marks}
    for _ in range(args.calls):
        t = [time.perf_counter()]
        lists = dec._deny_ids(args.batch, None, ids, "request", None, None) if dec else None
        t.append(time.perf_counter())
        shape = engine.constrained_shape(model, args.batch, lists) if dec else engine.shape_state(model, args.batch)
        t.append(time.perf_counter())
        shape.graph.replay()
        t.append(time.perf_counter())
        shape.launched()
        t.append(time.perf_counter())
        _ = [o.clone() for o in shape.outputs]
        t.append(time.perf_counter())
        sync()
        for m, a, b in zip(marks, t, t[1:]):
            times[m].append(b - a)
    print(("deny ids" if dec else "no lists") + ", the engine's call cut by hand: "
          + ", ".join(f"{m} {statistics.median(v) * 1e6:.1f} us" for m, v in times.items()), flush=True)


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
        # the host's lists fill a row-list shape; an ids shape (deny ids) is timed without them
        for after_copy in ((False, True) if shape.capacity and not shape.lists.width else (False,)):
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
