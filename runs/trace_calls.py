"""Chrome traces (CPU and CUDA) of synchronised public-API calls: no list, 100 and 10,000 deny ids per
request, and a deny set of 10,000 registered once and named by every request, at batch 1 and 32
(search-like catalog of 2·10^7 SIDs, FP16, H 1,024, beam 128: the constraints suite's engine).

    python runs/trace_calls.py OUT      (on a GPU, from runs/)

Prints each condition's median wall time over 60 calls, then writes ``OUT/trace-b{1,32}.json.gz``:
four calls of each condition under ``torch.profiler``, each inside a ``call:NAME:ROUND`` range. The
profiler slows the host several times over, so read the order of the device's work from them, not
host durations.
"""
import gzip
import os
import sys

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile, record_function

from zerogr_core.bench.workload import CatalogSpec, Workload

from host_timeline_lists import deny_setup, wall_us  # runs/, the script's folder

out = sys.argv[1]
wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), torch.device("cuda"))
for batch in (1, 32):
    ctx, _, dec, model, _, _ = deny_setup(wl, batch)
    rng = np.random.default_rng(1)
    cat = wl.catalog
    ids100 = [cat.item_ids[rng.integers(0, cat.n_items, 100)] for _ in range(batch)]
    ids10k = [cat.item_ids[rng.integers(0, cat.n_items, 10000)] for _ in range(batch)]
    dec.register_items("reg", ids10k[0], kind="deny")
    conds = {
        "none": lambda: dec.decode(model, batch).item_rows.cpu(),
        "deny100": lambda: dec.decode(model, batch, deny_items=ids100).item_rows.cpu(),
        "deny10k": lambda: dec.decode(model, batch, deny_items=ids10k).item_rows.cpu(),
        "registered10k": lambda: dec.decode(model, batch, deny_items="reg").item_rows.cpu(),
    }
    for name, fn in conds.items():
        print(f"batch {batch} {name:14s} {wall_us(fn, 60, warmup=10):8.1f} us", flush=True)
    for name, fn in conds.items():
        for _ in range(5):
            fn()
    torch.cuda.synchronize()
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        for r in range(4):
            for name, fn in conds.items():
                with record_function(f"call:{name}:{r}"):
                    fn()
                torch.cuda.synchronize()
    path = os.path.join(out, f"trace-b{batch}.json")
    prof.export_chrome_trace(path)
    with open(path, "rb") as f, gzip.open(path + ".gz", "wb") as g:
        g.write(f.read())
    os.remove(path)
    dec.unregister_items("reg")
    ctx.release()
