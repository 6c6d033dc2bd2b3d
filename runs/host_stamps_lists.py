"""Where the time of a synchronised public-API call goes, with and without a deny list: host
timestamps inside the call, and the captured graph's device time alone.

    python runs/host_stamps_lists.py [BATCHES] [--ids=100] [--calls=300]      (on a GPU, from runs/)

Search-like catalog of 2·10^7 SIDs, FP16, H 1,024, beam 128 (the constraints suite's engine),
``--ids`` random catalog ids denied per request. Each call is
``Decoder.decode(model, batch, deny_items=ids).item_rows.cpu()``; wrappers stamp
``time.perf_counter_ns`` where the call enters ``deny_ids``' result, the engine's
``constrained_shape`` and the list buffers' ``load``, and around ``CUDAGraph.replay``. Printed per
segment: the median over the calls, in microseconds. ``device`` is the graph's replay alone, 50
back to back between two CUDA events, per replay: the rest of a call's wall time is host work
the device waits for, or the copy back.
"""
import statistics
import sys
import time

import numpy as np
import torch

from zerogr_core.bench.workload import CatalogSpec, Workload
from zerogr_core.decode import engine as engine_mod
from zerogr_core.decode import id_lists, list_buffers

from host_timeline_lists import deny_setup  # runs/, the script's folder

STAMPS: dict = {}


def stamped(owner, name: str, before: str | None, after: str | None):
    """Wrap ``owner.name`` so that each call stamps ``before`` on entry and ``after`` on return."""
    inner = getattr(owner, name)

    def wrapper(*args, **kwargs):
        if before:
            STAMPS[before] = time.perf_counter_ns()
        out = inner(*args, **kwargs)
        if after:
            STAMPS[after] = time.perf_counter_ns()
        return out

    setattr(owner, name, wrapper)


def segments(fn, calls: int, order: list[str]) -> dict:
    """Median microseconds between consecutive stamps of ``order`` over ``calls`` synchronised calls."""
    for _ in range(20):
        fn()
    rows = {f"{a} -> {b}": [] for a, b in zip(order, order[1:])}
    for _ in range(calls):
        STAMPS.clear()
        STAMPS["start"] = time.perf_counter_ns()
        fn()
        STAMPS["done"] = time.perf_counter_ns()
        for a, b in zip(order, order[1:]):
            if a in STAMPS and b in STAMPS:
                rows[f"{a} -> {b}"].append((STAMPS[b] - STAMPS[a]) / 1e3)
    return {k: statistics.median(v) for k, v in rows.items() if v}


def device_us(graph, reps: int = 50) -> float:
    """Device time of one replay of ``graph``, ``reps`` replays back to back between two events."""
    for _ in range(5):
        graph.replay()
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    times = []
    for _ in range(5):
        start.record()
        for _ in range(reps):
            graph.replay()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e3 / reps)
    return statistics.median(times)


def main() -> None:
    args = [a for a in sys.argv[1:] if not a.startswith("--")]
    opts = dict(a[2:].split("=", 1) for a in sys.argv[1:] if a.startswith("--") and "=" in a)
    batches = [int(b) for b in args[0].split(",")] if args else [1, 8, 32]
    per_request, calls = int(opts.get("ids", 100)), int(opts.get("calls", 300))
    stamped(id_lists, "deny_ids", None, "ids")
    stamped(engine_mod.GpuEngine, "constrained_shape", "shape", None)
    stamped(list_buffers.ListBuffers, "load", "load", "loaded")
    stamped(torch.cuda.CUDAGraph, "replay", "replay", "launched")
    wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), torch.device("cuda"))
    for batch in batches:
        ctx, eng, dec, model, ids, _ = deny_setup(wl, batch, per_request)
        rng = np.random.default_rng(2)
        rotated = [[wl.catalog.item_ids[rng.integers(0, wl.catalog.n_items, per_request)] for _ in range(batch)]
                   for _ in range(4)]
        turn = [0]

        def deny():
            turn[0] += 1
            return dec.decode(model, batch, deny_items=rotated[turn[0] % 4]).item_rows.cpu()

        def plain():
            return dec.decode(model, batch).item_rows.cpu()

        for name, fn, order in (("none", plain, ["start", "replay", "launched", "done"]),
                                ("deny", deny, ["start", "ids", "shape", "load", "loaded", "replay", "launched",
                                                "done"])):
            seg = segments(fn, calls, order)
            walls = []
            for _ in range(calls):
                t = time.perf_counter_ns()
                fn()
                walls.append((time.perf_counter_ns() - t) / 1e3)
            wall = statistics.median(walls)
            shape = [s for k, s in eng._shapes.items() if ("lists" in k) == (name == "deny") and k[0] == batch][0]
            dev = device_us(shape.graph)
            print(f"--- batch {batch} {name}: wall {wall:.1f} us (median of {calls}), device {dev:.1f} us a replay",
                  flush=True)
            for k, v in seg.items():
                print(f"   {k:22s} {v:8.1f} us", flush=True)
        ctx.release()


if __name__ == "__main__":
    main()
