"""Host cost of each piece of a constrained public-API decode on a GPU, against the list-free call.

    python runs/host_pieces_lists.py        (on a GPU, from the repository root)

Search-like catalog of 2·10^7 SIDs, FP16, H 1,024, beam 128, 100 denied ids per request, batch
1 / 8 / 32. "(synced)" rows are whole calls synchronised after each (``Decoder.decode`` reading
the rows back with ``.cpu()``, or ``GpuEngine.decode`` with prebuilt lists); "host" rows time one
piece on the host alone (median over repeated calls, no synchronisation). At batch 8 it also
times and profiles the device build of 10,000 ids per request (``build_lists_on``).
"""
import time, statistics, numpy as np, torch
from torch.profiler import profile, ProfilerActivity
from zerogr_core.bench.workload import CatalogSpec, Workload
from zerogr_core.decode.list_buffers import load_lists
from zerogr_core.decode.device_lists import build_lists_on

from host_timeline_lists import deny_setup, wall_us  # runs/, the script's folder

def host_us(fn, n=300):
    for _ in range(10): fn()
    ts = []
    for _ in range(n):
        t = time.perf_counter(); fn(); ts.append(time.perf_counter() - t)
    torch.cuda.synchronize()
    return statistics.median(ts) * 1e6


def synced_us(fn, n=200):
    return wall_us(fn, n, warmup=10)


dev = torch.device("cuda")
wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), dev)
cat = wl.catalog
print("torch threads", torch.get_num_threads(), flush=True)
for batch in (1, 8, 32):
    ctx, eng, dec, model, ids, lists = deny_setup(wl, batch)
    rng = np.random.default_rng(1)
    res = {}
    res["api none (synced)"] = synced_us(lambda: dec.decode(model, batch).item_rows.cpu())
    res["api deny100 (synced)"] = synced_us(lambda: dec.decode(model, batch, deny_items=ids).item_rows.cpu())
    res["engine none (synced)"] = synced_us(lambda: eng.decode(model, batch))
    res["engine deny100 prebuilt (synced)"] = synced_us(lambda: eng.decode(model, batch, lists=lists))
    shape = eng.constrained_shape(model, batch, lists)
    plain = eng.shape_state(model, batch)
    torch.cuda.synchronize()
    res["host request_lists"] = host_us(lambda: dec.request_lists(batch, deny_items=ids))
    res["host _nothing_listed+checks"] = host_us(lambda: dec._check_constrainable(lists, batch))
    res["host key"] = host_us(lambda: eng.key(batch))
    res["host shape_state"] = host_us(lambda: eng.shape_state(model, batch))
    res["host constrained_shape (incl load)"] = host_us(lambda: eng.constrained_shape(model, batch, lists))
    res["host load_lists"] = host_us(lambda: load_lists(shape.lists, lists))
    b = shape.lists
    n = b.header + int(lists.rows.size)
    res["host slice+copy_"] = host_us(lambda: b.block[:n].copy_(b.host[:n], non_blocking=True))
    res["host event record"] = host_us(lambda: b.copied.record())
    res["host event sync (done)"] = host_us(lambda: b.copied.synchronize())
    res["host replay constrained"] = host_us(lambda: shape.graph.replay(), 100)
    res["host replay plain"] = host_us(lambda: plain.graph.replay(), 100)
    t = shape.outputs
    res["host 3 clones"] = host_us(lambda: (t[0].clone(), t[1].clone(), t[2].clone()))
    res["host .cpu() of rows"] = synced_us(lambda: t[2].cpu())
    print(f"--- batch {batch} deny 100", flush=True)
    for k, v in res.items():
        print(f"   {k:40s} {v:8.1f} us", flush=True)
    if batch == 8:
        ids10k = [cat.item_ids[rng.integers(0, cat.n_items, 10_000)] for _ in range(batch)]
        f = lambda: build_lists_on(dev, cat, batch, None, ids10k)
        print("   device build 10k x8 synced %.1f us" % synced_us(f, 30), flush=True)
        with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
            for _ in range(5):
                f(); torch.cuda.synchronize()
        print(prof.key_averages().table(sort_by="cpu_time_total", row_limit=25), flush=True)
    ctx.release()
