"""Where a constrained public-API call spends the host time that an engine call with prebuilt
lists does not (search-like catalog of 2·10^7 SIDs, FP16, H 1,024, beam 128, 100 denied ids per
request, batch 1 / 8 / 32).

    python runs/host_api_lists.py [BATCHES] [--no-cprofile] [--ids=100,10000] [--calls=200] [--kernels] [--profile]
                                  [--device-ids] [--registered]
                                  [--pdl-max-batch=N] [--split]   (on a GPU, from runs/)

``--pdl-max-batch`` sets the largest batch whose constrained graphs launch with PDL
(``zerogr_core.decode.engine.CONSTRAINED_PDL_MAX_BATCH``), for an A/B of that choice in one tree.

``--split`` (with ``--ids``) splits each condition's call without a profiler: the host's time before the
graph's launch, the launch itself, the rest until ``decode`` returns, the whole synchronised call, and the
device time of the graph replayed alone with the call's lists in place (CUDA events).

``--ids`` also times deny lists of other lengths through the public API, in both normalisations
(``--device-ids``: also with each request's ids in a CUDA tensor; ``--registered``: also as a deny
set registered once and named by every request, request-normalised)
(the split calls and the profile are then skipped; ``--kernels`` prints each call's kernel table, ``--profile`` a ``cProfile`` of 100 request-normalised calls).

Per batch: whole calls synchronised after each (``Decoder.decode`` with ``deny_items``; the same
call split by hand into ``request_lists`` and ``GpuEngine.decode``; the engine with prebuilt lists),
then ``cProfile`` of 200 public-API calls, the functions with the most own time first, and the
kernels of 20 public-API calls with and without lists (``torch.profiler``, device time per call).
"""
import cProfile
import pstats
import statistics
import sys
import time
from collections import defaultdict

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from zerogr_core.bench.workload import CatalogSpec, Workload
from zerogr_core.timing import paired_runs


from host_timeline_lists import deny_setup, wall_us  # runs/, the script's folder


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    batches = [int(b) for b in args[0].split(",")] if args else [1, 8, 32]
    lengths = [int(k) for k in opts.get("ids", "100").split(",")]
    calls = int(opts.get("calls", 200))
    if "pdl-max-batch" in opts:
        from zerogr_core.decode import engine

        engine.CONSTRAINED_PDL_MAX_BATCH = int(opts["pdl-max-batch"])
    wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), torch.device("cuda"))
    for batch in batches:
        if lengths != [100]:
            public_api_rows(wl, batch, lengths, calls)
            continue
        ctx, eng, dec, model, ids, lists = deny_setup(wl, batch)

        def api():
            return dec.decode(model, batch, deny_items=ids).item_rows.cpu()

        def split():
            built = dec.request_lists(batch, deny_items=ids)
            return eng.decode(model, batch, lists=built).item_rows.cpu()

        rows = {
            "api none": lambda: dec.decode(model, batch).item_rows.cpu(),
            "api deny100": api,
            "request_lists + engine": split,
            "engine prebuilt": lambda: eng.decode(model, batch, lists=lists).item_rows.cpu(),
            "engine none": lambda: eng.decode(model, batch).item_rows.cpu(),
        }
        print(f"--- batch {batch}, 100 denied ids per request (median of 200 synchronised calls)", flush=True)
        for name, fn in rows.items():
            print(f"   {name:28s} {wall_us(fn, 200, warmup=10):8.1f} us", flush=True)
        if "--no-cprofile" not in sys.argv:
            host_profile(api, 200, 18)
        for name, fn in (("none", rows["api none"]), ("deny100", api)):
            kernel_table(f"batch {batch} api {name}", fn)
        ctx.release()


def host_profile(fn, calls: int, top: int) -> None:
    """``cProfile`` of ``calls`` calls of ``fn``: the ``top`` functions with the most own time."""
    prof = cProfile.Profile()
    prof.enable()
    for _ in range(calls):
        fn()
    prof.disable()
    pstats.Stats(prof).sort_stats("tottime").print_stats(top)


def public_api_rows(wl, batch: int, lengths, calls: int) -> None:
    """Median wall time of public-API calls with deny lists of each length (request- and
    catalog-normalised) against the same decoder without lists, synchronised after each call."""
    ctx, _, dec, model, _, _ = deny_setup(wl, batch)
    rng = np.random.default_rng(1)
    cat = wl.catalog
    def plain():
        return dec.decode(model, batch).item_rows.cpu()

    none = wall_us(plain, calls, warmup=10)
    print(f"--- batch {batch}: api none {none:.1f} us (median of {calls} synchronised calls; each list's "
          f"ratio is to list-free calls taking turns with it)", flush=True)
    if "--split" in sys.argv:
        split_call("none", dec, lambda: dec.decode(model, batch), calls)

    def paired(fn):  # (median µs, ratio to the list-free calls timed in turns with it)
        both = paired_runs({"lists": fn, "none": plain}, "cuda", repeats=calls, warmup=10)
        lists, free = statistics.median(both["lists"]), statistics.median(both["none"])
        return lists * 1e3, lists / free
    if "--kernels" in sys.argv:
        kernel_table(f"batch {batch} api none", plain)
    for k in lengths:
        ids = [cat.item_ids[rng.integers(0, cat.n_items, k)] for _ in range(batch)]
        for normalise in ("request", "catalog"):
            def call():
                return dec.decode(model, batch, deny_items=ids, normalise=normalise).item_rows.cpu()

            t, ratio = paired(call)
            print(f"   api deny {k:6d} {normalise:8s} {t:8.1f} us  {ratio:5.2f}x", flush=True)
            if "--split" in sys.argv:
                split_call(f"deny {k} {normalise}", dec, lambda: dec.decode(model, batch, deny_items=ids,
                                                                            normalise=normalise), calls)
            if "--kernels" in sys.argv:
                kernel_table(f"batch {batch} api deny {k} {normalise}", call)
            if "--profile" in sys.argv and normalise == "request":
                host_profile(call, 100, 14)
            if "--device-ids" in sys.argv:  # the same ids kept on the GPU by the caller
                on_gpu = [torch.from_numpy(i).cuda() for i in ids]

                def call_on_gpu():
                    return dec.decode(model, batch, deny_items=on_gpu, normalise=normalise).item_rows.cpu()

                t, ratio = paired(call_on_gpu)
                print(f"   api gpu-deny {k:6d} {normalise:8s} {t:8.1f} us  {ratio:5.2f}x", flush=True)
        if "--registered" in sys.argv:  # the first request's ids as a standing set every request names
            name = f"deny-{k}"
            dec.register_items(name, ids[0], kind="deny")

            def call_named():
                return dec.decode(model, batch, deny_items=name).item_rows.cpu()

            t, ratio = paired(call_named)
            if "--split" in sys.argv:
                split_call(f"registered deny {k}", dec, lambda: dec.decode(model, batch, deny_items=name), calls)
            same = torch.equal(call_named(), dec.decode(model, batch, deny_items=[ids[0]] * batch).item_rows.cpu())
            print(f"   api registered-deny {k:6d} request {t:8.1f} us  {ratio:5.2f}x  "
                  f"(items as the same ids per call: {same})", flush=True)
            if "--kernels" in sys.argv:
                kernel_table(f"batch {batch} api registered deny {k}", call_named)
            if "--profile" in sys.argv:
                host_profile(call_named, 100, 14)
            dec.unregister_items(name)
    print(f"   api none again {wall_us(plain, calls, warmup=10):8.1f} us", flush=True)
    ctx.release()


def split_call(title: str, dec, fn, calls: int) -> None:
    """Medians, in µs, of one public-API call's parts (``fn`` returns its ``DecodeResult``): host
    work before the graph's launch (split into the decoder's own work, the engine's choice of
    shape with the lists' load into its buffers, and the rest), the launch, the host work after it until ``fn`` returns, the
    whole call synchronised after its result's copy to the host, and the device time of the
    graph that the call replayed, replayed alone (its lists stay in place)."""
    marks, used = {}, []
    original = torch.cuda.CUDAGraph.replay

    def replay(graph):
        marks["launch"] = time.perf_counter()
        original(graph)
        marks["launched"] = time.perf_counter()
        used.append(graph)

    engine_type = type(dec.gpu_engine)
    shape_fns = {name: getattr(engine_type, name) for name in ("constrained_shape", "shape_state")}

    def timed_shape(name):
        def wrapped(self, *args):
            marks["shape"] = time.perf_counter()
            try:
                return shape_fns[name](self, *args)
            finally:
                marks["shaped"] = time.perf_counter()
        return wrapped

    parts = defaultdict(list)
    torch.cuda.CUDAGraph.replay = replay
    for name in shape_fns:
        setattr(engine_type, name, timed_shape(name))
    try:
        for i in range(calls + 10):
            torch.cuda.synchronize()
            t0 = time.perf_counter()
            out = fn()
            t1 = time.perf_counter()
            out.item_rows.cpu()
            torch.cuda.synchronize()
            t2 = time.perf_counter()
            if i >= 10 and "launch" in marks:
                parts["before launch"].append(marks["launch"] - t0)
                parts["(decoder"].append(marks["shape"] - t0)
                parts["shape and lists' load"].append(marks["shaped"] - marks["shape"])
                parts["rest)"].append(marks["launch"] - marks["shaped"])
                parts["launch"].append(marks["launched"] - marks["launch"])
                parts["after launch"].append(t1 - marks["launched"])
                parts["whole call"].append(t2 - t0)
    finally:
        torch.cuda.CUDAGraph.replay = original
        for name, method in shape_fns.items():
            setattr(engine_type, name, method)
    if used:
        graph = used[-1]
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        for i in range(calls + 10):
            torch.cuda.synchronize()
            start.record()
            graph.replay()
            end.record()
            end.synchronize()
            if i >= 10:
                parts["graph alone (device)"].append(start.elapsed_time(end) / 1e3)
    print(f"      split {title}: " + ", ".join(f"{k} {statistics.median(v) * 1e6:.1f}" for k, v in parts.items())
          + " us", flush=True)


def kernel_table(title: str, fn, calls: int = 20) -> None:
    """Device time per call of each kernel (and copy) that ``calls`` calls of ``fn`` ran."""
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        for _ in range(calls):
            fn()
        torch.cuda.synchronize()
    total, count = defaultdict(float), defaultdict(int)
    for ev in prof.events():
        if ev.device_type == torch.autograd.DeviceType.CUDA:
            total[ev.name] += ev.device_time / calls
            count[ev.name] += 1
    print(f"--- kernels of {title}: {sum(total.values()):.1f} us of device time per call", flush=True)
    for name in sorted(total, key=total.get, reverse=True)[:16]:
        print(f"   {total[name]:8.1f} us  {count[name] / calls:5.1f}x  {name[:90]}", flush=True)


if __name__ == "__main__":
    main()
