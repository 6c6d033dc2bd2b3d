"""Index suites: memory per step against the baselines' structures (memory), construction
time of every builder (build), and decode latency while a rebuild runs beside it
(interference)."""
from __future__ import annotations

import threading
import time

import torch

from ..index import IndexConfig, build_index, build_static_index
from ..index.layout import static_style_bytes, static_style_step_bytes
from ..timing import Stopwatch, summarize, synchronize, time_runs
from .methods import ReplayModel, ZeroGRRunner
from .session import Session
from .workload import static_step_bytes


def suite_memory(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    rep = wl.index.report()
    n, L = wl.catalog.n_items, wl.catalog.n_levels
    # Without a STATIC-style method in --methods (e.g. at 10^9 SIDs, where building it
    # would take minutes) its bytes come from the layout formula, which the built index
    # matches exactly (tests/test_index.py); the host trie is counted only for cpu-trie.
    static, trie = wl.baselines(st["methods"])
    vocab, dense_levels = wl.static_layout()
    entries = [x["entries"] for x in rep["steps"]]
    static_steps = (static_step_bytes(static) if static is not None
                    else static_style_step_bytes(entries, vocab, dense_levels))
    narrow: dict = {}
    rows = []
    for row, sb in zip(rep["steps"], static_steps):
        step = row["step"]
        rows.append(dict(structure="zerogr", step=step, bytes=row["bytes"], representation=row["kind"],
                         step_states=row["states"], step_entries=row["entries"], density=row["density"],
                         max_segment=row["max_segment"]))
        rows.append(dict(structure="zerogr (all sparse)", step=step, bytes=row["sparse_bytes"],
                         representation="sparse"))
        rows.append(dict(structure="static-style", step=step, bytes=sb,
                         representation="dense V^%d" % dense_levels if step <= dense_levels else "csr",
                         built=static is not None))
        rows.append(dict(structure="sid-table-int16", step=step, bytes=n * 2, representation="column"))
        if trie is not None:
            rows.append(dict(structure="host-trie", step=step,
                             bytes=trie.tokens[step - 1].numel() * trie.tokens[step - 1].element_size() +
                             trie.offsets[step - 1].numel() * trie.offsets[step - 1].element_size(),
                             representation="sparse (host)"))
    totals = {}
    for r in rows:
        totals[r["structure"]] = totals.get(r["structure"], 0) + r["bytes"]
    for r in rows:
        s.emit(suite, "memory", wl, narrow, **r)
    estimate = static_style_bytes(entries, vocab, dense_levels)
    for name, b in totals.items():
        s.emit(suite, "memory", wl, narrow, structure=name, step="total", bytes=b,
               ratio_to_sid_table=b / (n * L * 2), ratio_to_zerogr=b / totals["zerogr"],
               **({"formula_bytes": estimate, "vocab": vocab, "dense_levels": dense_levels,
                   "built": static is not None} if name == "static-style" else {}))
    s.log(f"[memory] {wl.spec.label}: " + " ".join(f"{k}={v / 2**30:.3f}GiB" for k, v in totals.items()) +
          f"; static/zerogr = {totals['static-style'] / totals['zerogr']:.1f}x")


def _h2d_bandwidth(dev: torch.device, nbytes: int = 256 << 20) -> dict:
    out = {}
    if dev.type != "cuda":
        return out
    dst = torch.empty(nbytes, dtype=torch.uint8, device=dev)
    for label, pin in (("pinned", True), ("pageable", False)):
        src = torch.empty(nbytes, dtype=torch.uint8, pin_memory=pin)
        src.fill_(1)
        times = []
        for _ in range(4):
            with Stopwatch(dev) as watch:
                dst.copy_(src, non_blocking=pin)
            times.append(watch.seconds)
        out[f"h2d_{label}_gbps"] = nbytes / min(times[1:]) / 1e9
    return out


def _same_index(a, b) -> bool:
    for sa, sb in zip(a.steps, b.steps):
        if sa.kind != sb.kind:
            return False
        for ta, tb in zip(sa.tensors(), sb.tensors()):
            if ta.dtype != tb.dtype or not torch.equal(ta, tb.to(ta.device)):
                return False
    return True


def suite_build(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    cuda = dev.type == "cuda"
    reps = s.o.build_repeats if s.o.build_repeats is not None else (1 if s.o.quick else 2)
    bw = _h2d_bandwidth(dev)
    zbytes = wl.index.nbytes
    s.emit(suite, "build", wl, {}, builder="catalog generation", total_s=wl.catalog_s, runs=1,
           note="synthetic generator (numpy), not part of any index build")
    builders = [  # in priority order (a time budget cuts the tail)
        ("layout, 2 staging buffers (streaming)", "layout", IndexConfig(), dev),
        ("static-style (numpy, as published)", "static", None, dev),
        ("serial", "serial", IndexConfig(), dev),
        ("layout, full host then copy", "host-copy", IndexConfig(), dev),
        ("layout, 1 staging buffer", "layout", IndexConfig(staging_buffers=1), dev),
        ("layout, host only (no transfer)", "layout", IndexConfig(), torch.device("cpu")),
    ]
    for label, builder, config, target in builders:
        if s.expired():
            s.skipped(suite, wl, label)
            continue
        if not cuda and label.startswith("layout, 1 staging"):
            s.skipped(suite, wl, label, "staging buffers need a CUDA device")
            continue
        try:
            runs = []
            identical = None
            nbytes = None
            for _ in range(reps):
                if cuda:
                    torch.cuda.empty_cache()
                    torch.cuda.synchronize()
                t0 = time.perf_counter()
                if builder == "static":
                    idx = build_static_index(wl.catalog, device=target, dense_levels=wl.static().dense_levels,
                                             band_offsets=wl.band_offsets)
                else:
                    idx = build_index(wl.catalog, device=target, builder=builder, config=config)
                synchronize(target)
                wall = time.perf_counter() - t0
                info = dict(idx.build, wall_s=wall)
                runs.append(info)
                nbytes = idx.nbytes
                if builder != "static" and identical is None:
                    identical = _same_index(wl.index, idx)
                del idx
            total = sorted(r["wall_s"] for r in runs)[len(runs) // 2]
            last = runs[-1]
            rec = dict(builder=label, builder_name=builder, target=str(target), runs=reps, total_s=total,
                       min_s=min(r["wall_s"] for r in runs), index_bytes=nbytes,
                       sids_per_s=wl.catalog.n_items / max(total, 1e-9), identical_to_zerogr_index=identical,
                       staging_buffers=(config.staging_buffers if config is not None and builder == "layout" and
                                        target.type == "cuda" else None),
                       **{f"build_{k}": v for k, v in last.items() if k.endswith("_s") or k.endswith("_bytes")},
                       **bw)
            s.emit(suite, "build", wl, {}, **rec)
            s.log(f"[build] {wl.spec.label} {label}: {total:.2f} s ({nbytes / 2**20:.0f} MiB, identical="
                  f"{identical})")
        except Exception as exc:  # noqa: BLE001
            s.error(suite, wl, label, exc)
    static_bytes = wl.static().nbytes
    for name, b in (("zerogr", zbytes), ("static-style", static_bytes),
                    ("sid-table-int16", wl.catalog.sid_table_bytes_int16())):
        rec = dict(structure=name, bytes=b, window_60s_gbps=b / 60 / 1e9, window_90s_gbps=b / 90 / 1e9, **bw)
        if "h2d_pinned_gbps" in bw:
            rec["ship_s_at_pinned"] = b / (bw["h2d_pinned_gbps"] * 1e9)
            rec["window_60s_fraction_of_pinned"] = rec["window_60s_gbps"] / bw["h2d_pinned_gbps"]
        s.emit(suite, "bandwidth", wl, {}, **rec)


def suite_interference(s: Session, suite: str) -> None:
    st = s.settings(suite)
    wl = s.workload(s.spec(st["catalog"]))
    dev = s.dev
    seconds = s.o.interference_s if s.o.interference_s is not None else (0.3 if s.o.quick else 3.0)
    dtype, hidden = st["configs"][0]
    beam = st["beams"][0]
    for batch in st["batches"]:
        if s.expired():
            s.skipped(suite, wl, f"batch {batch}")
            continue
        ctx = wl.context(dtype, hidden, beam, batch, s.o.n_sets)
        model = ReplayModel(ctx.sets, batch)
        runner = ZeroGRRunner(ctx.engine, model, batch)
        runner.capture()
        fn = runner.graph.replay if runner.graph is not None else runner.eager
        mode = "graph" if runner.graph is not None else "eager"
        shape = dict(dtype=dtype, hidden=hidden, beam=beam, batch=batch)
        time_runs(fn, dev, repeats=5, warmup=2)

        def serve(stop_when) -> list[float]:
            samples = []
            t_end = time.perf_counter() + seconds
            while True:
                samples += time_runs(fn, dev, repeats=1, warmup=0)
                if stop_when(t_end, len(samples)):
                    return samples

        idle = serve(lambda t_end, k: time.perf_counter() >= t_end and k >= 50)
        stats = summarize(idle)
        s.emit(suite, "interference", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
               condition="idle", rebuilds=0, **stats)
        line = [f"idle p50={stats['median_ms']:.3f} p99={stats['p99_ms']:.3f}"]
        for builder in ("layout", "host-copy"):
            if s.expired():
                break
            stop = threading.Event()
            build_times: list[float] = []
            failure: list = []

            def rebuild():
                try:
                    while not stop.is_set():
                        t0 = time.perf_counter()
                        build_index(wl.catalog, device=dev, builder=builder)  # dropped at once
                        build_times.append(time.perf_counter() - t0)
                except Exception as exc:  # noqa: BLE001
                    failure.append(exc)

            th = threading.Thread(target=rebuild, daemon=True)
            th.start()
            busy = serve(lambda t_end, k: (time.perf_counter() >= t_end and len(build_times) >= 1 and k >= 50)
                         or bool(failure))
            stop.set()
            th.join()
            if failure:
                s.error(suite, wl, f"rebuild {builder}", failure[0])
                continue
            st2 = summarize(busy)
            s.emit(suite, "interference", wl, dict(methods=["zerogr"], **shape), method="zerogr", mode=mode, **shape,
                   condition=f"during {builder} rebuild", builder=builder, rebuilds=len(build_times),
                   rebuild_s=build_times, p99_ratio=st2["p99_ms"] / stats["p99_ms"],
                   p50_ratio=st2["median_ms"] / stats["median_ms"], **st2)
            line.append(f"{builder}: p50={st2['median_ms']:.3f} p99={st2['p99_ms']:.3f} ({len(build_times)} builds)")
        s.log(f"[interference] {wl.spec.label} {ctx.label} batch {batch}: " + "; ".join(line))
        s.release(runner, ctx)
