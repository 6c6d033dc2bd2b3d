import sys, time, statistics, numpy as np, torch
from zerogr_core.bench.workload import CatalogSpec, Workload
from host_timeline_lists import deny_setup
wl = Workload(CatalogSpec("search-like", 20_000_000, 0, None), torch.device("cuda"))
for batch in (8, 32):
    ctx, eng, dec, model, ids, _ = deny_setup(wl, batch)
    cat = wl.catalog
    rng = np.random.default_rng(0)
    big = cat.item_ids[rng.integers(0, cat.n_items, 10000)]
    dec.register_items("reg", big, kind="deny")
    for name, kw in (("none", {}), ("deny100", dict(deny_items=ids)), ("registered", dict(deny_items="reg"))):
        f = lambda: dec.decode(model, batch, **kw).item_rows.cpu()
        for _ in range(10): f()
        ts = []
        for _ in range(300):
            t = time.perf_counter(); f(); ts.append((time.perf_counter() - t) * 1e6)
        ts.sort()
        print(f"{sys.argv[1]} batch {batch} {name:10s} median {statistics.median(ts):7.1f} p90 {ts[269]:7.1f} "
              f"p99 {ts[296]:7.1f} max {ts[-1]:8.1f} us", flush=True)
    ctx.release()
